#include "server/server.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "server/service_internal.h"
#include "server/share_sender.h"
#include "server/udp_receiver.h"
#include "spdlog/spdlog.h"

namespace ps::server {
namespace {

std::string HostPort(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos && host.front() != '[') {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

absl::Status WritePortFile(const std::string& path, uint16_t port) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << port << "\n";
    if (!out.good()) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<aggregators::AggregatorOptions> RuleOptions(const ServerOptions& o) {
  aggregators::AggregatorOptions a;
  a.num_workers = static_cast<int>(o.num_workers);
  a.num_byzantine = static_cast<int>(o.num_byzantine);
  a.multi_krum_m = static_cast<int>(o.multi_krum_m);
  a.krum_neighbours = o.krum_neighbours == "byzfl" ? aggregators::KrumNeighbours::kByzFL
                                                   : aggregators::KrumNeighbours::kPaper;
  if (o.even_median == "lower") {
    a.even_median = aggregators::EvenMedian::kLower;
  } else if (o.even_median == "upper") {
    a.even_median = aggregators::EvenMedian::kUpper;
  } else {
    a.even_median = aggregators::EvenMedian::kMidpoint;
  }
  return a;
}

class ServerImpl final : public Server {
 public:
  ServerImpl(const ServerOptions& options, core::Clock* clock,
             std::unique_ptr<aggregators::Aggregator> rule)
      : options_(options),
        clock_(clock),
        pool_(options.threads),
        shard_(options, static_cast<uint32_t>(options.shard_id), std::move(rule), clock, &pool_),
        worker_service_(&shard_),
        peer_service_(Identity(options), &shard_) {}

  ~ServerImpl() override { Shutdown(); }

  absl::Status Listen() {
    if (options_.udp_port >= 0) {
      PS_ASSIGN_OR_RETURN(udp_, UdpReceiver::Start(options_.host, static_cast<uint16_t>(options_.udp_port),
                                                   options_.udp_receive_buffer, &shard_));
      worker_service_.set_udp_port(udp_->port());
    }
    if (options_.metrics_port >= 0) {
      metrics_ = std::make_unique<Metrics>(&shard_, udp_.get());
      worker_service_.set_metrics(metrics_.get());
      shard_.SetAggregationObserver([m = metrics_.get()](AggregationStage stage, core::Duration d) {
        m->ObserveAggregation(stage, d);
      });
    }
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    int bound = 0;
    const std::string addr = HostPort(options_.host, options_.port);
    builder.AddListeningPort(addr, grpc::InsecureServerCredentials(), &bound);
    builder.SetMaxReceiveMessageSize(static_cast<int>(options_.max_message_bytes));
    builder.SetMaxSendMessageSize(static_cast<int>(options_.max_message_bytes));
    builder.RegisterService(&worker_service_);
    builder.RegisterService(&peer_service_);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || bound == 0) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", addr,
                                                 " (address in use or not local?)"));
    }
    port_ = static_cast<uint16_t>(bound);
    if (metrics_ != nullptr) {
      PS_RETURN_IF_ERROR(metrics_->Serve(options_.host, static_cast<uint16_t>(options_.metrics_port)));
    }
    SetServing(true);
    if (!options_.port_file.empty()) PS_RETURN_IF_ERROR(WritePortFile(options_.port_file, port_));

    shard_.SetDeadlineListener([this] {
      absl::MutexLock lock(&mu_);
      wake_ticker_ = true;
    });
    if (options_.num_shards > 1 && shard_.model_scope()) {
      sender_ = std::make_unique<ShareSender>(options_);
      shard_.SetShareSender([this](std::shared_ptr<const RoundShare> share) {
        sender_->Send(std::move(share));
      });
    }
    ticker_ = std::thread([this] { TickerLoop(); });
    if (options_.num_shards > 1) peer_checker_ = std::thread([this] { PeerLoop(); });
    spdlog::info("shard {}/{} serving on {}: {} workers, f = {}, quorum {}, aggregator {} ({} "
                 "scope){}",
                 options_.shard_id, options_.num_shards, HostPort(options_.host, port_),
                 options_.num_workers, options_.num_byzantine, shard_.quorum(),
                 options_.aggregator, shard_.model_scope() ? "model" : "slice",
                 options_.aggregate_only ? " (aggregate-only)" : "");
    if (udp_ != nullptr) {
      spdlog::info("shard {}: UDP gradient path on {}", options_.shard_id,
                   HostPort(options_.host, udp_->port()));
    }
    if (metrics_ != nullptr) {
      spdlog::info("shard {}: metrics on http://{}/metrics", options_.shard_id,
                   HostPort(options_.host, metrics_->port()));
    }
    return absl::OkStatus();
  }

  uint16_t port() const override { return port_; }
  uint16_t udp_port() const override { return udp_ != nullptr ? udp_->port() : 0; }
  std::optional<UdpStats> udp_stats() const override {
    if (udp_ == nullptr) return std::nullopt;
    return udp_->stats();
  }
  uint16_t metrics_port() const override { return metrics_ != nullptr ? metrics_->port() : 0; }
  Metrics* metrics() override { return metrics_.get(); }
  Shard& shard() override { return shard_; }
  bool serving() const override {
    absl::MutexLock lock(&mu_);
    return serving_;
  }

  void Shutdown() override {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    if (server_ == nullptr) return;
    spdlog::info("shard {}: shutting down (drain up to {} ms)", options_.shard_id,
                 options_.drain_timeout.count());
    SetServing(false);
    const auto until = std::chrono::system_clock::now() + options_.drain_timeout;
    shard_.Drain(std::chrono::duration_cast<core::Duration>(options_.drain_timeout));
    server_->Shutdown(until);
    if (ticker_.joinable()) ticker_.join();
    if (peer_checker_.joinable()) peer_checker_.join();
    if (sender_ != nullptr) sender_->Stop();
    // Scrapes read the shard and the UDP receiver: end them before either goes.
    if (metrics_ != nullptr) metrics_->Stop();
    if (udp_ != nullptr) {
      const UdpStats u = udp_->stats();
      spdlog::info("shard {}: UDP: {} chunks taken, {} lost, {} malformed, {} unknown session, "
                   "{} forged, {} replayed, {} stale, {} refused",
                   options_.shard_id, u.received, shard_.stats().udp_chunks_lost, u.malformed,
                   u.unknown_session, u.forged, u.replayed, u.stale, u.refused);
    }
    const ShardStats st = shard_.stats();
    uint64_t refused = 0;
    for (uint64_t r : st.refusals) refused += r;
    spdlog::info("shard {}: stopped after {} slice rounds ({} at the deadline), {} pushes accepted, "
                 "{} refused{}",
                 options_.shard_id, st.rounds_closed, st.rounds_closed_at_deadline,
                 st.pushes_accepted, refused,
                 shard_.model_scope()
                     ? absl::StrCat("; ", st.model_rounds, " model-scope rounds (",
                                    st.model_rounds_dropped, " dropped), ", st.shares_refused,
                                    " peer shares refused")
                     : std::string());
  }

 private:
  static PeerIdentity Identity(const ServerOptions& o) {
    PeerIdentity id;
    id.shard_id = static_cast<uint32_t>(o.shard_id);
    id.num_shards = o.num_shards;
    id.config_summary = o.ConsistencySummary();
    id.config_fingerprint = Fingerprint(id.config_summary);
    return id;
  }

  void SetServing(bool serving) {
    {
      absl::MutexLock lock(&mu_);
      serving_ = serving && !stopping_;
      serving = serving_;
    }
    grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
    if (health != nullptr) {
      health->SetServingStatus(serving);
      health->SetServingStatus(v1::WorkerService::service_full_name(), serving);
    }
  }

  // Closes rounds at their deadlines: sleeps until the earliest one (or a new one
  // registered, or at most 200 ms).
  void TickerLoop() {
    for (;;) {
      std::optional<core::SteadyTime> next = shard_.NextDeadline();
      const auto now = clock_->Now();
      auto wait = std::chrono::milliseconds(200);
      if (next.has_value()) {
        wait = std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(*next - now) +
                                  std::chrono::milliseconds(1));
      }
      {
        absl::MutexLock lock(&mu_);
        if (wait.count() > 0) {
          mu_.AwaitWithTimeout(absl::Condition(
                                   +[](ServerImpl* s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                     return s->stopping_ || s->wake_ticker_;
                                   },
                                   this),
                               absl::FromChrono(wait));
        }
        wake_ticker_ = false;
        if (stopping_) return;
      }
      shard_.Tick(clock_->Now());
    }
  }

  // Greets every peer until shutdown: at start with quick retries, then every few
  // seconds. Any disagreement turns health to NOT_SERVING with the reason logged.
  void PeerLoop() {
    const PeerIdentity self = Identity(options_);
    std::vector<std::unique_ptr<v1::PeerService::Stub>> stubs(options_.num_shards);
    for (uint32_t i = 0; i < options_.num_shards; ++i) {
      if (i == self.shard_id) continue;
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(static_cast<int>(options_.max_message_bytes));
      stubs[i] = v1::PeerService::NewStub(grpc::CreateCustomChannel(
          options_.peers[i], grpc::InsecureChannelCredentials(), args));
    }
    std::string last_problem = "unchecked";
    for (int iteration = 0;; ++iteration) {
      std::string problem;
      for (uint32_t i = 0; i < options_.num_shards && problem.empty(); ++i) {
        if (stubs[i] == nullptr) continue;
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
        v1::PeerHelloRequest req;
        req.set_shard_id(self.shard_id);
        req.set_num_shards(self.num_shards);
        req.set_config_fingerprint(self.config_fingerprint);
        req.set_config_summary(self.config_summary);
        req.set_layout_hash(shard_.layout_hash());
        v1::PeerHelloResponse resp;
        grpc::Status s = stubs[i]->Hello(&ctx, req, &resp);
        if (!s.ok()) {
          // An unreachable peer is not a configuration error (it may be starting);
          // keep serving and keep asking.
          if (s.error_code() != grpc::StatusCode::UNAVAILABLE &&
              s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
            problem = absl::StrCat("peer shard ", i, " at ", options_.peers[i], ": ", s.error_message());
          }
          continue;
        }
        absl::Status c = CheckPeer(self, shard_.layout_hash(), i, resp);
        if (!c.ok()) problem = std::string(c.message());
      }
      if (problem != last_problem) {
        if (problem.empty()) {
          spdlog::info("shard {}: peers agree on the configuration", self.shard_id);
        } else {
          spdlog::error("shard {}: not serving: {}", self.shard_id, problem);
        }
        SetServing(problem.empty());
        last_problem = problem;
      }
      absl::MutexLock lock(&mu_);
      const auto period = iteration < 20 ? absl::Milliseconds(250) : absl::Seconds(5);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), period);
      if (stopping_) return;
    }
  }

  const ServerOptions options_;
  core::Clock* const clock_;
  core::ThreadPool pool_;
  // Declared before shard_ so that it outlives the shard's last aggregation job,
  // which may still hand it a share during shutdown.
  std::unique_ptr<ShareSender> sender_;
  // Declared before shard_ so that it outlives the shard's aggregation jobs, which
  // report their times to it; serving stops in Shutdown().
  std::unique_ptr<Metrics> metrics_;
  Shard shard_;
  // Declared after shard_, so destroyed (its thread stopped) before it.
  std::unique_ptr<UdpReceiver> udp_;
  WorkerServiceImpl worker_service_;
  PeerServiceImpl peer_service_;
  std::unique_ptr<grpc::Server> server_;
  uint16_t port_ = 0;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool serving_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ticker_ ABSL_GUARDED_BY(mu_) = false;
  std::thread ticker_;
  std::thread peer_checker_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options,
                                                      core::Clock* clock) {
  PS_RETURN_IF_ERROR(options.Validate());
  PS_ASSIGN_OR_RETURN(aggregators::AggregatorOptions rule_options, RuleOptions(options));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<aggregators::Aggregator> rule,
                      aggregators::MakeAggregator(options.aggregator, rule_options));
  // An explicit quorum must meet the rule's bound; the default is raised to it (Shard).
  const uint32_t quorum = options.quorum;
  if (quorum != 0 && static_cast<int>(quorum) < rule->MinInputs()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quorum ", quorum, " is below what ", core::AsAbsl(rule->name()), " needs (",
        core::AsAbsl(rule->Bound()), " = ",
        rule->MinInputs(), " with f = ", options.num_byzantine,
        "): a round closed at its deadline could not be aggregated; raise --quorum or lower "
        "--byzantine"));
  }
  auto server = std::make_unique<ServerImpl>(options, clock != nullptr ? clock : core::Clock::Real(),
                                             std::move(rule));
  PS_RETURN_IF_ERROR(server->Listen());
  return server;
}

}  // namespace ps::server
