// The ps-server process's shard: wiring over its parts (docs/architecture.md). The constructor
// and Listen() build them in the order each needs the others; Shutdown() stops them in the
// order written there; Release() frees them in the reverse of construction.
#include "server/server.h"

#include <chrono>

#include "core/resource_limits.h"
#include "core/status.h"
#include "net/tcp_options.h"
#include "server/auth_internal.h"
#include "server/checkpointer.h"
#include "server/control_plane.h"
#include "server/deadline_ticker.h"
#include "server/memory_estimate.h"
#include "server/peers.h"
#include "server/port_file.h"
#include "server/server_settings.h"
#include "server/shard_front.h"
#include "server/tarpit.h"
#include "server/transport/backend.h"
#include "server/transport/udp/receiver.h"
#include "spdlog/spdlog.h"

namespace ps::server {
namespace {

// --tcp-rto-min-ms -1 (auto) made concrete, once, before anything reads it (the data
// backend sets it, the Join answer names it): kAutoTcpRtoMin where this kernel can set it
// on a TCP socket, else 0 (the kernel's), said in the log either way.
ServerOptions WithTcpRtoMinResolved(ServerOptions o) {
  if (o.tcp_rto_min.count() >= 0) return o;
  o.tcp_rto_min = std::chrono::milliseconds(0);
  if (o.data_plane != core::DataPlane::kTcp) return o;
  const absl::Status st = net::TryTcpRtoMin(kAutoTcpRtoMin);
  if (st.ok()) {
    o.tcp_rto_min = kAutoTcpRtoMin;
    spdlog::info("data plane: least TCP retransmission timeout {} ms (--tcp-rto-min-ms -1, "
                 "auto; 0 keeps the kernel's)",
                 kAutoTcpRtoMin.count());
  } else {
    spdlog::info("data plane: the kernel's least TCP retransmission timeout (--tcp-rto-min-ms "
                 "-1, auto): {}",
                 std::string(st.message()));
  }
  return o;
}

class ServerImpl final : public Server {
 public:
  ServerImpl(const ServerOptions& options, core::Clock* clock,
             std::unique_ptr<aggregators::Aggregator> rule, std::unique_ptr<Authenticator> auth)
      : options_(options), clock_(clock), auth_(std::move(auth)) {
    limiter_ = std::make_unique<RateLimiter>(options.rate_limit, options.rate_burst, clock);
    tarpit_ = std::make_unique<Tarpit>(TarpitSettings(options), clock);
    pool_ = std::make_unique<core::ThreadPool>(options.threads, "ps-agg");
    shard_ = std::make_unique<Shard>(options, static_cast<uint32_t>(options.shard_id),
                                     std::move(rule), clock, pool_.get());
    shard_front_ = std::make_unique<ShardFront>(shard_.get(), limiter_.get(), tarpit_.get());
    if (!options_.checkpoint_dir.empty()) {
      checkpointer_ = std::make_unique<Checkpointer>(
          options_, shard_.get(), clock_, [this](int64_t unix_s) {
            if (metrics_ != nullptr) metrics_->SetCheckpointTime(TimeOf(unix_s));
          });
    }
    control_ = std::make_unique<ControlPlane>(ControlPlane::Parts{
        &options_, clock_, auth_.get(), shard_.get(), shard_front_.get(), tarpit_.get(),
        checkpointer_.get()});
  }

  ~ServerImpl() override {
    Shutdown();
    Release();
  }

  // Restores the newest usable checkpoint, if any, before Listen(). With peers, rounds
  // must agree with theirs before workers come back: Peers catches up first.
  absl::Status RestoreCheckpoint() {
    if (checkpointer_ == nullptr) return absl::OkStatus();
    PS_ASSIGN_OR_RETURN(const bool restored, checkpointer_->Restore());
    if (restored && options_.num_shards > 1) control_->serving().SetAdmitting(false);
    return absl::OkStatus();
  }

  absl::Status Listen() {
    // The data backends with ports of their own, before the control port, whose Join
    // answers name their ports.
    const ConnectionLimits limits = ConnectionBounds(options_);
    transport::BackendContext context{.options = &options_, .limits = limits,
                                      .front = shard_front_.get(), .clock = clock_,
                                      .tls_cert_pem = auth_->cert_pem(),
                                      .tls_key_pem = auth_->key_pem(),
                                      .tls_ca_pem = auth_->ca_pem()};
    PS_ASSIGN_OR_RETURN(backends_, transport::StartDataBackends(context));
    if (options_.metrics_port >= 0) StartMetrics();
    PS_RETURN_IF_ERROR(control_->Start(limits, udp_port(), data_port()));
    if (metrics_ != nullptr) {
      // Every port is up: scrapes read their connections, calls and watches from here
      // (detached in Release(), before the ports go).
      metrics_->SetPortSource([c = control_.get()] { return c->PortStatsNow(); });
      std::vector<const transport::DataBackend*> backends;
      for (const auto& b : backends_) backends.push_back(b.get());
      metrics_->SetBackends(std::move(backends));
      PS_RETURN_IF_ERROR(metrics_->Serve(options_.host, static_cast<uint16_t>(options_.metrics_port)));
    }
    control_->serving().SetPeersAgree(true);
    if (!options_.port_file.empty()) PS_RETURN_IF_ERROR(WritePortFile(options_.port_file, port()));
    LogServing();  // before the ticker's and the peers' threads, which log too
    ticker_ = std::make_unique<DeadlineTicker>(
        clock_, [s = shard_.get()] { return s->NextDeadline(); },
        [this, ready = false](core::SteadyTime now) mutable {
          shard_->Tick(now);
          if (shard_->ready() != ready) {  // the model's health follows
            ready = !ready;
            control_->serving().Refresh();
          }
        });
    shard_->SetDeadlineListener([t = ticker_.get()] { t->Wake(); });
    if (options_.num_shards > 1) {
      PS_ASSIGN_OR_RETURN(peers_, Peers::Start(options_, *auth_, shard_.get(), &control_->serving(), clock_));
    }
    ticker_->Start();
    if (checkpointer_ != nullptr) checkpointer_->Start();
    return absl::OkStatus();
  }

  uint16_t port() const override { return control_->port(); }
  uint16_t udp_port() const override { return PortOf("udp"); }
  uint16_t data_port() const override { return PortOf("tcp"); }
  std::optional<transport::udp::Stats> udp_stats() const override {
    const auto* udp = dynamic_cast<const transport::udp::Receiver*>(transport::FindBackend(backends_, "udp"));
    if (udp == nullptr) return std::nullopt;
    return udp->stats();
  }
  uint16_t metrics_port() const override { return metrics_ != nullptr ? metrics_->port() : 0; }
  uint16_t health_port() const override { return control_->health_port(); }
  Metrics* metrics() override { return metrics_.get(); }
  Shard& shard() override { return *shard_; }
  bool serving() const override { return control_->serving().serving(); }

  void Shutdown() override {
    if (stopped_.exchange(true) || !control_->started()) return;
    spdlog::info("shard {}: shutting down (drain up to {} ms)", options_.shard_id,
                 options_.drain_timeout.count());
    control_->serving().Stop();
    const auto until = std::chrono::system_clock::now() + options_.drain_timeout;
    shard_->Drain(std::chrono::duration_cast<core::Duration>(options_.drain_timeout));
    if (checkpointer_ != nullptr) WriteFinalCheckpoint();
    // No new connections from here; those open drain with the servers.
    control_->StopAccepting();
    // Held refusals go out now: the servers wait for their calls.
    tarpit_->Stop();
    // After the tarpit, whose held answers would be written to their connections: every
    // data connection closed (its pulls and buffers freed), every backend thread joined.
    for (const auto& b : backends_) b->Stop();
    control_->Shutdown(until);
    control_->StopFronts();
    if (ticker_ != nullptr) ticker_->Stop();
    if (peers_ != nullptr) peers_->Stop();
    // Scrapes read the shard, the backends and the ports: they end before any goes.
    if (metrics_ != nullptr) metrics_->Stop();
    LogStopped();
  }

 private:
  uint16_t PortOf(std::string_view backend) const {
    const transport::DataBackend* b = transport::FindBackend(backends_, backend);
    return b != nullptr ? b->port() : 0;
  }

  static std::chrono::system_clock::time_point TimeOf(int64_t unix_s) {
    return std::chrono::system_clock::time_point(std::chrono::seconds(unix_s));
  }

  // The reverse of construction: each part after those that call into it.
  void Release() {
    if (metrics_ != nullptr) {
      metrics_->SetPortSource(nullptr);
      metrics_->SetBackends({});
    }
    ticker_.reset();
    control_.reset();  // its ports, then its services and health
    checkpointer_.reset();
    backends_.clear();  // their connections hold pulls of shard_front_
    shard_front_.reset();
    shard_.reset();  // its last aggregation jobs may still hand peers_ a share, metrics_ a time
    peers_.reset();
    metrics_.reset();
    pool_.reset();
    tarpit_.reset();
    limiter_.reset();
  }

  void StartMetrics() {
    metrics_ = std::make_unique<Metrics>(shard_.get(), tarpit_.get());
    shard_front_->set_metrics(metrics_.get());
    if (checkpointer_ != nullptr && checkpointer_->info().restored_unix_s != 0) {
      metrics_->SetCheckpointTime(TimeOf(checkpointer_->info().restored_unix_s));
    }
    shard_->SetAggregationObserver([m = metrics_.get()](AggregationStage stage, core::Duration d) {
      m->ObserveAggregation(stage, d);
    });
  }

  void WriteFinalCheckpoint() {
    checkpointer_->Stop();
    if (!shard_->ready()) return;
    // Aggregations have finished: nothing changes any more.
    absl::StatusOr<std::pair<std::string, uint64_t>> written = checkpointer_->Write("final");
    if (!written.ok()) {
      spdlog::error("shard {}: final checkpoint failed: {}", options_.shard_id,
                    std::string(written.status().message()));
    }
  }

  void LogServing() const;
  void LogStopped() const;

  const ServerOptions options_;
  core::Clock* const clock_;
  std::atomic<bool> stopped_{false};
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<RateLimiter> limiter_;
  std::unique_ptr<Tarpit> tarpit_;
  std::unique_ptr<core::ThreadPool> pool_;
  std::unique_ptr<Shard> shard_;
  std::unique_ptr<ShardFront> shard_front_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::unique_ptr<ControlPlane> control_;
  std::unique_ptr<Metrics> metrics_;
  std::vector<std::unique_ptr<transport::DataBackend>> backends_;
  std::unique_ptr<DeadlineTicker> ticker_;
  std::unique_ptr<Peers> peers_;
};

void ServerImpl::LogServing() const {
  const uint32_t id = static_cast<uint32_t>(options_.shard_id);
  spdlog::info("{}", ServingLine(options_, port(), shard_->quorum(), shard_->model_scope()));
  const core::ResourceLimits& limits = core::ProcessResourceLimits();
  spdlog::info("shard {}: {} aggregation threads ({}; CPUs from {}), model state up to {} MiB "
               "({}; memory from {})",
               id, pool_->num_threads(), options_.threads == 0 ? "--threads 0" : "--threads",
               limits.cpus_from, EffectiveMaxShardBytes(options_) >> 20,
               options_.max_shard_bytes == 0 ? "--max-shard-bytes 0: half" : "--max-shard-bytes",
               limits.memory_from);
  for (const auto& b : backends_) spdlog::info("shard {}: {}", id, b->ServingLine());
  if (metrics_ != nullptr) {
    spdlog::info("shard {}: metrics on http://{}/metrics", id, HostPort(options_.host, metrics_port()));
  }
}

void ServerImpl::LogStopped() const {
  const ShardStats st = shard_->stats();
  for (const auto& b : backends_) {
    const std::string line = b->TotalsLine(st);
    if (!line.empty()) spdlog::info("shard {}: {}", options_.shard_id, line);
  }
  spdlog::info("shard {}: stopped after {}", options_.shard_id, TotalsLine(st, shard_->model_scope()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& given,
                                                      core::Clock* clock) {
  PS_RETURN_IF_ERROR(given.Validate());
  const ServerOptions options = WithTcpRtoMinResolved(given);
  PS_ASSIGN_OR_RETURN(std::unique_ptr<aggregators::Aggregator> rule, MakeRule(options));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Authenticator> auth, Authenticator::Create(options));
  auto server = std::make_unique<ServerImpl>(options, clock != nullptr ? clock : core::Clock::Real(),
                                             std::move(rule), std::move(auth));
  PS_RETURN_IF_ERROR(server->RestoreCheckpoint());
  PS_RETURN_IF_ERROR(server->Listen());
  return server;
}

}  // namespace ps::server
