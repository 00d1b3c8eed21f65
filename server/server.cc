#include "server/server.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "core/status.h"
#include "net/channel_auth.h"
#include "server/auth_internal.h"
#include "server/checkpointer.h"
#include "server/grpc_front.h"
#include "server/health.h"
#include "server/listener.h"
#include "server/metadata_auth.h"
#include "server/metrics.h"
#include "server/service_internal.h"
#include "server/share_sender.h"
#include "server/transport/grpc/data_methods.h"
#include "server/transport/tcp/backend.h"
#include "server/transport/udp/receiver.h"
#include "spdlog/spdlog.h"

namespace ps::server {
namespace {

// The initial HTTP/2 window of a stream on the shard's ports (ApplyTransportBounds): what
// a stream the front has not started to read can hold. HTTP/2's default; a larger one
// (320 KiB, 1 MiB, 4 MiB) measured no faster in ps-bench e2e (docs/bench.md).
constexpr int kStreamWindowBytes = 64 << 10;

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
  a.krum_neighbours = o.krum_neighbours;
  a.even_median = o.even_median;
  a.device = o.device;
  return a;
}

// The port's connection bounds (docs/connections.md). `fd_limit`: the open-file limit.
ConnectionLimits ConnectionBounds(const ServerOptions& o, uint64_t fd_limit) {
  ConnectionLimits l;
  uint64_t max = o.max_connections;
  if (max == 0) {
    // What descriptors allow after the shard's own files, sockets and gRPC's internals.
    max = std::clamp<uint64_t>(fd_limit > 2048 ? fd_limit - 1024 : fd_limit / 2, 64, 4096);
  }
  l.max_connections = static_cast<uint32_t>(max);
  l.reserved_for_proven = l.max_connections / 4;
  l.max_unproven_per_source = o.max_connections_per_source;
  l.max_per_identity = o.max_connections_per_client;
  l.proof_timeout = std::chrono::duration_cast<core::Duration>(o.connection_proof_timeout);
  return l;
}

// The front's budgets (docs/connections.md): a body being received costs up to
// --max-message-bytes, so --max-request-memory-bytes / --max-message-bytes of them at once.
CallLimits CallBounds(const ServerOptions& o) {
  CallLimits l;
  l.max_calls_per_client = o.max_calls_per_client;
  l.max_reads_per_client = o.max_reads_per_client;
  l.max_reads = static_cast<uint32_t>(
      std::clamp<uint64_t>(o.max_request_memory_bytes / o.max_message_bytes, 2, 1u << 16));
  l.read_timeout = std::chrono::duration_cast<core::Duration>(o.request_read_timeout);
  return l;
}

// HTTP/2 and connection settings of both ports.
void ApplyTransportBounds(const ServerOptions& o, grpc::ServerBuilder* builder) {
  // Streams a connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS).
  builder->AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                              static_cast<int>(o.max_streams_per_connection));
  // A stream the front has not started to read holds at most its initial window: a
  // fixed one, since the bandwidth-delay probe would grow it to megabytes per stream.
  // A read opens the window to the message's size, so throughput does not depend on it.
  builder->AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kStreamWindowBytes);
  // Idle and dead connections go away (each holds buffers and a slot): a connection
  // without calls for --max-connection-idle-ms is closed, and keepalive pings find
  // peers that vanished without closing theirs.
  builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                              static_cast<int>(o.max_connection_idle.count()));
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 60000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
}

TarpitOptions TarpitSettings(const ServerOptions& o) {
  TarpitOptions t;
  t.rate = o.refusal_rate;
  t.burst = o.refusal_burst;
  t.hold = o.refusal_hold;
  // A held answer keeps its request alive: in all at most the request memory quota's
  // worth of the largest messages.
  t.max_held = static_cast<uint32_t>(
      std::clamp<uint64_t>(o.max_request_memory_bytes / o.max_message_bytes, 8, 4096));
  t.max_held_per_client = std::min<uint32_t>(8, t.max_held);
  return t;
}

class ServerImpl final : public Server {
 public:
  ServerImpl(const ServerOptions& options, core::Clock* clock,
             std::unique_ptr<aggregators::Aggregator> rule, std::unique_ptr<Authenticator> auth)
      : options_(options),
        clock_(clock),
        auth_(std::move(auth)),
        limiter_(options.rate_limit, options.rate_burst, clock),
        tarpit_(TarpitSettings(options), clock),
        pool_(options.threads, "ps-agg"),
        shard_(options, static_cast<uint32_t>(options.shard_id), std::move(rule), clock, &pool_),
        worker_service_(Gate()),
        grpc_data_(Gate()),
        peer_service_(Identity(options), Gate()),
        admin_service_(Gate(), AdminHooks()) {
    if (!options_.checkpoint_dir.empty()) {
      checkpointer_ = std::make_unique<Checkpointer>(
          options_, &shard_, clock_, [this](int64_t unix_s) {
            if (metrics_ != nullptr) {
              metrics_->SetCheckpointTime(
                  std::chrono::system_clock::time_point(std::chrono::seconds(unix_s)));
            }
          });
    }
  }

  // Restores the newest usable checkpoint, if any. Before Listen().
  absl::Status RestoreCheckpoint() {
    if (checkpointer_ == nullptr) return absl::OkStatus();
    PS_ASSIGN_OR_RETURN(const bool restored, checkpointer_->Restore());
    // With peers, round numbers must agree with theirs before workers come back.
    if (restored && options_.num_shards > 1) admitting_.store(false);
    return absl::OkStatus();
  }

  ~ServerImpl() override {
    Shutdown();
    // The listeners, fronts and health states are destroyed before metrics_ (declared
    // after it): a Render() from here on no longer reads them.
    if (metrics_ != nullptr) {
      metrics_->SetPortSource(nullptr);
      metrics_->SetDataPlaneSource(nullptr);
    }
  }

  absl::Status Listen() {
    if (options_.udp_port >= 0) {
      PS_ASSIGN_OR_RETURN(udp_, transport::udp::Receiver::Start(
                                    options_.host, static_cast<uint16_t>(options_.udp_port),
                                    options_.udp_receive_buffer, options_.udp_threads,
                                    &shard_front_));
      worker_service_.set_udp_port(udp_->port());
    }
    if (options_.metrics_port >= 0) {
      metrics_ = std::make_unique<Metrics>(&shard_, udp_.get(), &tarpit_);
      shard_front_.set_metrics(metrics_.get());
      if (checkpointer_ != nullptr && checkpointer_->info().restored_unix_s != 0) {
        metrics_->SetCheckpointTime(std::chrono::system_clock::time_point(
            std::chrono::seconds(checkpointer_->info().restored_unix_s)));
      }
      shard_.SetAggregationObserver([m = metrics_.get()](AggregationStage stage, core::Duration d) {
        m->ObserveAggregation(stage, d);
      });
    }
    const ConnectionLimits limits = ConnectionBounds(options_, RaiseOpenFileLimit());
    if (options_.data_plane == core::DataPlane::kTcp) {
      // Before the control port: a Join answer names the data port. It serves TLS as the
      // control port does, with the same certificate, key and client CA.
      transport::tcp::Options data = transport::tcp::OptionsFrom(options_, limits);
      data.tls_cert_pem = auth_->cert_pem();
      data.tls_key_pem = auth_->key_pem();
      data.tls_ca_pem = auth_->ca_pem();
      PS_ASSIGN_OR_RETURN(
          tcp_, transport::tcp::Backend::Start(
                    data, &shard_front_,
                    [auth = auth_.get()](uint32_t worker, uint64_t session, std::string_view secret) {
                      return auth->DataKeyOf(worker, session, secret);
                    },
                    clock_));
      worker_service_.set_data_port(tcp_->port());
    }
    // The port is this process's own (server/listener.h): gRPC gets each admitted
    // connection through an external acceptor, with the same credentials, and every call
    // through the front (server/grpc_front.h), which reads request bodies under budgets.
    PS_ASSIGN_OR_RETURN(listener_, Listener::Bind(options_.host, static_cast<uint16_t>(options_.port),
                                                  limits, "port", clock_));
    auto on_refused = [this](Refusal kind, absl::string_view message) {
      (void)shard_.Refuse(kind, message);
    };
    front_ = std::make_unique<GrpcFront>(auth_.get(), CallBounds(options_), clock_, on_refused);
    worker_service_.AddTo(front_.get());
    grpc_data_.AddTo(front_.get());
    peer_service_.AddTo(front_.get());
    admin_service_.AddTo(front_.get());
    AddHealthMethods(front_.get(), &health_, /*anonymous=*/false);
    front_->set_listener(listener_.get());
    grpc::ServerBuilder builder;
    auto acceptor = builder.experimental().AddExternalConnectionAcceptor(
        grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
        ListeningCredentials(*auth_, &tarpit_, [this](const absl::Status& refused) {
          (void)shard_.Refuse(Refusal::kUnauthenticated, refused.message());
        }));
    builder.SetMaxReceiveMessageSize(static_cast<int>(options_.max_message_bytes));
    builder.SetMaxSendMessageSize(static_cast<int>(options_.max_message_bytes));
    ApplyTransportBounds(options_, &builder);
    // Messages in flight are bounded in memory (the front bounds how many are read at
    // once; this is gRPC's own backstop).
    grpc::ResourceQuota quota("ps-server");
    quota.Resize(static_cast<size_t>(options_.max_request_memory_bytes));
    builder.SetResourceQuota(quota);
    builder.RegisterCallbackGenericService(front_.get());
    server_ = builder.BuildAndStart();
    if (server_ == nullptr) {
      return absl::UnavailableError(absl::StrCat("cannot start the gRPC server for ",
                                                 HostPort(options_.host, listener_->port())));
    }
    listener_->Start(std::move(acceptor));
    port_ = listener_->port();
    if (options_.health_port >= 0) {
      // Only grpc.health.v1, without credentials, requests of at most 4 KiB; every other
      // method is UNIMPLEMENTED. The statuses are the main port's (SetServing), the
      // watches and calls bounded on their own.
      PS_ASSIGN_OR_RETURN(health_listener_,
                          Listener::Bind(options_.host, static_cast<uint16_t>(options_.health_port),
                                         limits, "health port", clock_));
      health_front_ = std::make_unique<GrpcFront>(auth_.get(), CallBounds(options_), clock_, on_refused);
      AddHealthMethods(health_front_.get(), &health_port_state_, /*anonymous=*/true);
      health_front_->set_listener(health_listener_.get());
      grpc::ServerBuilder health_builder;
      auto health_acceptor = health_builder.experimental().AddExternalConnectionAcceptor(
          grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
          grpc::InsecureServerCredentials());
      health_builder.SetMaxReceiveMessageSize(4096);
      ApplyTransportBounds(options_, &health_builder);
      health_builder.RegisterCallbackGenericService(health_front_.get());
      health_server_ = health_builder.BuildAndStart();
      if (health_server_ == nullptr) {
        return absl::UnavailableError(absl::StrCat(
            "--health-port: cannot start the gRPC server for ",
            HostPort(options_.host, health_listener_->port())));
      }
      health_listener_->Start(std::move(health_acceptor));
      health_port_ = health_listener_->port();
    }
    if (metrics_ != nullptr) {
      // Every port is up: scrapes read their connections, calls and watches from here
      // (detached in the destructor, before the ports go).
      metrics_->SetPortSource([this] { return PortStatsNow(); });
      if (tcp_ != nullptr) metrics_->SetDataPlaneSource([this] { return tcp_->stats(); });
      PS_RETURN_IF_ERROR(metrics_->Serve(options_.host, static_cast<uint16_t>(options_.metrics_port)));
    }
    SetServing(true);
    if (!options_.port_file.empty()) PS_RETURN_IF_ERROR(WritePortFile(options_.port_file, port_));

    shard_.SetDeadlineListener([this] {
      absl::MutexLock lock(&mu_);
      wake_ticker_ = true;
    });
    for (uint32_t i = 0; i < options_.num_shards && options_.num_shards > 1; ++i) {
      peer_channels_.emplace_back();
      peer_auths_.emplace_back();
      if (static_cast<int>(i) == options_.shard_id) continue;
      PS_ASSIGN_OR_RETURN(peer_channels_.back(),
                          PeerChannel(options_.peers[i], PeerCredentials(), options_));
      // Peer i proves it is shard-i of this run before this shard proves its own token.
      peer_auths_.back() = std::make_shared<net::ChannelAuth>(
          peer_channels_.back(), PeerCredentials(), options_.peers[i],
          core::Identity{core::Identity::Kind::kShard, i});
    }
    if (options_.num_shards > 1 && shard_.model_scope()) {
      sender_ = std::make_unique<ShareSender>(options_, peer_channels_, peer_auths_);
      shard_.SetShareSender([this](std::shared_ptr<const RoundShare> share) {
        sender_->Send(std::move(share));
      });
    }
    ticker_ = std::thread([this] { TickerLoop(); });
    if (options_.num_shards > 1) peer_checker_ = std::thread([this] { PeerLoop(); });
    if (checkpointer_ != nullptr) checkpointer_->Start();
    spdlog::info("shard {}/{} serving on {} ({}): {} workers, f = {}, quorum {}, aggregator {} "
                 "({} scope){}{}",
                 options_.shard_id, options_.num_shards, HostPort(options_.host, port_),
                 SecuritySummary(), options_.num_workers, options_.num_byzantine,
                 shard_.quorum(), options_.aggregator, shard_.model_scope() ? "model" : "slice",
                 options_.aggregate_only ? " (aggregate-only)" : "",
                 options_.pull_codec.empty()
                     ? ""
                     : absl::StrCat(", pulls send each change as ", options_.pull_codec));
    if (udp_ != nullptr) {
      spdlog::info("shard {}: UDP gradient path on {}", options_.shard_id,
                   HostPort(options_.host, udp_->port()));
    }
    if (tcp_ != nullptr) {
      spdlog::info("shard {}: TCP data plane on {} ({} threads)", options_.shard_id,
                   HostPort(options_.host, tcp_->port()), options_.data_threads);
    }
    if (metrics_ != nullptr) {
      spdlog::info("shard {}: metrics on http://{}/metrics", options_.shard_id,
                   HostPort(options_.host, metrics_->port()));
    }
    return absl::OkStatus();
  }

  uint16_t port() const override { return port_; }
  uint16_t udp_port() const override { return udp_ != nullptr ? udp_->port() : 0; }
  uint16_t data_port() const override { return tcp_ != nullptr ? tcp_->port() : 0; }
  std::optional<transport::udp::Stats> udp_stats() const override {
    if (udp_ == nullptr) return std::nullopt;
    return udp_->stats();
  }
  uint16_t metrics_port() const override { return metrics_ != nullptr ? metrics_->port() : 0; }
  uint16_t health_port() const override { return health_port_; }
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
    if (checkpointer_ != nullptr) checkpointer_->Stop();
    if (checkpointer_ != nullptr && shard_.ready()) {
      // The final checkpoint: aggregations have finished, nothing changes any more.
      absl::StatusOr<std::pair<std::string, uint64_t>> written = checkpointer_->Write("final");
      if (!written.ok()) {
        spdlog::error("shard {}: final checkpoint failed: {}", options_.shard_id,
                      std::string(written.status().message()));
      }
    }
    // No new connections from here; those open drain with the server.
    if (listener_ != nullptr) listener_->Stop();
    if (health_listener_ != nullptr) health_listener_->Stop();
    // Held refusals go out now: the server waits for their calls.
    tarpit_.Stop();
    // After the tarpit, whose held answers would be written to its connections: every
    // connection closed (its pulls and buffers freed), its threads joined, before the
    // front goes.
    if (tcp_ != nullptr) tcp_->Stop();
    ShutdownGrpc(until);
    if (health_server_ != nullptr) health_server_->Shutdown(std::chrono::system_clock::now());
    if (front_ != nullptr) front_->Stop();
    if (health_front_ != nullptr) health_front_->Stop();
    if (ticker_.joinable()) ticker_.join();
    if (peer_checker_.joinable()) peer_checker_.join();
    if (sender_ != nullptr) sender_->Stop();
    // Scrapes read the shard, the UDP receiver and the ports: end them before any goes.
    if (metrics_ != nullptr) metrics_->Stop();
    if (udp_ != nullptr) {
      const transport::udp::Stats u = udp_->stats();
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
  // gRPC's shutdown of the main port by `until`: it answers what is in flight and sends
  // every connection a GOAWAY, then waits for each connection to go. A worker whose
  // channel has no call open reads the GOAWAY only when gRPC next polls it (seconds; on
  // the TCP data plane its control channel is idle between Joins), so once no call is
  // open the listener closes what is left (Listener::CloseAll).
  void ShutdownGrpc(std::chrono::system_clock::time_point until) {
    absl::Notification done;
    std::thread closer([&] {
      while (!done.WaitForNotificationWithTimeout(absl::Milliseconds(20))) {
        if (front_->stats().budget.calls == 0) {
          const size_t closed = listener_->CloseAll();
          if (closed > 0) {
            spdlog::info("shard {}: closed {} idle connection(s) of the port at shutdown",
                         options_.shard_id, closed);
          }
          return;
        }
      }
    });
    server_->Shutdown(until);
    done.Notify();
    closer.join();
  }

  // What the metrics read about the ports (Metrics::SetPortSource): the main port, and
  // --health-port when set. Only once Listen() has set up every port.
  std::vector<PortStats> PortStatsNow() const {
    std::vector<PortStats> out;
    out.push_back(PortStats{"main", listener_->stats(), front_->stats(), health_.watches()});
    if (health_listener_ != nullptr) {
      out.push_back(PortStats{"health", health_listener_->stats(), health_front_->stats(),
                              health_port_state_.watches()});
    }
    return out;
  }

  CallGate Gate() {
    return CallGate{&shard_, auth_.get(), &shard_front_, &admitting_};
  }

  core::ClientCredentials PeerCredentials() const {
    return auth_->PeerCredentials(static_cast<uint32_t>(options_.shard_id));
  }

  std::string SecuritySummary() const {
    if (options_.insecure) {
      return "--insecure: no client authentication, anyone who reaches the port may act as any "
             "worker or shard";
    }
    std::vector<std::string> parts;
    parts.push_back(options_.tls_cert.empty() ? "plaintext" : "TLS");
    if (!options_.tls_ca.empty()) parts.push_back("client certificates accepted");
    if (!options_.tokens_file.empty()) parts.push_back("tokens of --tokens accepted");
    if (!options_.secret_file.empty()) {
      parts.push_back(absl::StrCat("tokens derived from the secret ", options_.secret_file));
    } else if (!options_.run_dir.empty()) {
      parts.push_back(absl::StrCat("tokens derived from the secret in ", options_.run_dir,
                                   " (clients' token files there: token-worker-N, token-admin)"));
    }
    return absl::StrJoin(parts, ", ");
  }

  AdminServiceImpl::Hooks AdminHooks() {
    AdminServiceImpl::Hooks hooks;
    hooks.checkpoint = [this]() -> absl::StatusOr<std::pair<std::string, uint64_t>> {
      if (checkpointer_ == nullptr) {
        return absl::FailedPreconditionError("this shard runs without --checkpoint-dir");
      }
      return checkpointer_->Write("on demand");
    };
    hooks.status = [this] {
      v1::StatusResponse r;
      r.set_shard_id(static_cast<uint32_t>(options_.shard_id));
      r.set_num_shards(options_.num_shards);
      r.set_serving(serving());
      r.set_ready(shard_.ready());
      r.set_layout_hash(shard_.layout_hash());
      r.set_min_version(shard_.MinVersion());
      r.set_max_version(shard_.MaxVersion());
      const ShardStats st = shard_.stats();
      r.set_rounds_closed(st.rounds_closed);
      r.set_pushes_accepted(st.pushes_accepted);
      uint64_t refused = 0;
      for (uint64_t n : st.refusals) refused += n;
      r.set_refusals(refused);
      if (checkpointer_ != nullptr) {
        const Checkpointer::Info info = checkpointer_->info();
        r.set_last_checkpoint(info.last_path);
        r.set_last_checkpoint_unix_s(info.last_unix_s);
        r.set_restored_from(info.restored_from);
      }
      return r;
    };
    return hooks;
  }

  static PeerIdentity Identity(const ServerOptions& o) {
    PeerIdentity id;
    id.shard_id = static_cast<uint32_t>(o.shard_id);
    id.num_shards = o.num_shards;
    id.config_summary = o.ConsistencySummary();
    id.config_fingerprint = Fingerprint(id.config_summary);
    return id;
  }

  // Health (docs/operations.md): "" while started and not draining; WorkerService
  // while peers agree, the shard admits workers and is not draining; "ps.v1.Model"
  // once the model is registered and initialized.
  void SetServing(bool peers_agree) {
    bool alive, serving;
    {
      absl::MutexLock lock(&mu_);
      peers_agree_ = peers_agree;
      alive = !stopping_;
      serving_ = peers_agree && admitting_.load() && !stopping_;
      serving = serving_;
    }
    const bool model = alive && shard_.ready();
    for (HealthState* health : {&health_, &health_port_state_}) {
      health->Set("", alive);
      health->Set(v1::WorkerService::service_full_name(), serving);
      health->Set("ps.v1.Model", model);
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
      const bool ready = shard_.ready();
      if (ready != model_ready_) {
        model_ready_ = ready;
        bool agree;
        {
          absl::MutexLock lock(&mu_);
          agree = peers_agree_;
        }
        SetServing(agree);
      }
    }
  }

  // Greets every peer until shutdown: at start with quick retries, then every few
  // seconds. Any disagreement turns health to NOT_SERVING with the reason logged.
  void PeerLoop() {
    const PeerIdentity self = Identity(options_);
    std::vector<std::unique_ptr<v1::PeerService::Stub>> stubs(options_.num_shards);
    for (uint32_t i = 0; i < options_.num_shards; ++i) {
      if (i == self.shard_id) continue;
      stubs[i] = v1::PeerService::NewStub(peer_channels_[i]);
    }
    // After a restore: the peers that answered, and the highest version among them.
    std::vector<bool> heard(options_.num_shards, false);
    uint64_t peers_version = 0;
    const auto catch_up_until = clock_->Now() + std::chrono::duration_cast<core::Duration>(
                                                    options_.peer_timeout);
    std::string last_problem = "unchecked";
    for (int iteration = 0;; ++iteration) {
      std::string problem;
      for (uint32_t i = 0; i < options_.num_shards && problem.empty(); ++i) {
        if (stubs[i] == nullptr) continue;
        v1::PeerHelloRequest req;
        req.set_shard_id(self.shard_id);
        req.set_num_shards(self.num_shards);
        req.set_config_fingerprint(self.config_fingerprint);
        req.set_config_summary(self.config_summary);
        req.set_layout_hash(shard_.layout_hash());
        v1::PeerHelloResponse resp;
        grpc::Status s = peer_auths_[i]->Unary(
            std::chrono::system_clock::now() + std::chrono::seconds(2), /*wait_for_ready=*/false,
            [&](grpc::ClientContext* ctx) { return stubs[i]->Hello(ctx, req, &resp); });
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
        heard[i] = true;
        if (resp.ready()) peers_version = std::max(peers_version, resp.max_version());
      }
      if (!admitting_.load()) CatchUpWithPeers(heard, peers_version, catch_up_until);
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

  // A restored shard admits workers once every peer answered (or --peer-timeout-ms
  // passed), after moving up to the highest version among them: the workers are at
  // that round, and pushes of the rounds in between were lost with the old process.
  void CatchUpWithPeers(const std::vector<bool>& heard, uint64_t peers_version,
                        core::SteadyTime until) {
    uint32_t answered = 0;
    for (uint32_t i = 0; i < heard.size(); ++i) answered += heard[i] ? 1 : 0;
    const bool all = answered + 1 >= options_.num_shards;
    if (!all && clock_->Now() < until) return;
    const uint64_t own = shard_.MaxVersion();
    const uint32_t moved = shard_.FastForward(peers_version);
    if (peers_version > own) {
      spdlog::warn("shard {}: restored at version {}, peers are at {}: moved {} slices up; the "
                   "updates of versions {} to {} are lost on this shard",
                   options_.shard_id, own, peers_version, moved, own + 1, peers_version);
    }
    spdlog::info("shard {}: caught up with {} of {} peers at version {}; admitting workers",
                 options_.shard_id, answered, options_.num_shards - 1,
                 std::max(own, peers_version));
    admitting_.store(true);
    bool agree;
    {
      absl::MutexLock lock(&mu_);
      agree = peers_agree_;
    }
    SetServing(agree);
  }

  const ServerOptions options_;
  core::Clock* const clock_;
  const std::unique_ptr<Authenticator> auth_;
  RateLimiter limiter_;
  // Before the services and the gRPC server, which hand it answers until they are gone.
  Tarpit tarpit_;
  std::atomic<bool> admitting_{true};
  core::ThreadPool pool_;
  // Declared before shard_ so that it outlives the shard's last aggregation job,
  // which may still hand it a share during shutdown.
  std::unique_ptr<ShareSender> sender_;
  // Declared before shard_ so that it outlives the shard's aggregation jobs, which
  // report their times to it; serving stops in Shutdown().
  std::unique_ptr<Metrics> metrics_;
  Shard shard_;
  // What every data plane talks to; after shard_, limiter_ and tarpit_, which it borrows.
  ShardFront shard_front_{&shard_, &limiter_, &tarpit_};
  // Declared after shard_front_, so destroyed (its thread stopped) before it.
  std::unique_ptr<transport::udp::Receiver> udp_;
  // The TCP data plane (--data-plane tcp): after shard_front_, whose pulls its
  // connections hold, so stopped and destroyed before it.
  std::unique_ptr<transport::tcp::Backend> tcp_;
  // After shard_ and metrics_, which its writer thread uses; null without
  // --checkpoint-dir.
  std::unique_ptr<Checkpointer> checkpointer_;
  WorkerServiceImpl worker_service_;
  transport::grpc::DataMethods grpc_data_;
  PeerServiceImpl peer_service_;
  AdminServiceImpl admin_service_;
  std::vector<std::shared_ptr<grpc::Channel>> peer_channels_;
  // The health statuses of the main port and of --health-port, watched separately.
  HealthState health_{static_cast<uint32_t>(options_.max_health_watches)};
  HealthState health_port_state_{static_cast<uint32_t>(options_.max_health_watches)};
  // Before the gRPC servers, which call into them until they are destroyed.
  std::unique_ptr<GrpcFront> front_;
  std::unique_ptr<GrpcFront> health_front_;
  std::unique_ptr<Listener> listener_;
  std::unique_ptr<Listener> health_listener_;
  std::vector<std::shared_ptr<net::ChannelAuth>> peer_auths_;  // by shard id, as the channels
  std::unique_ptr<grpc::Server> server_;
  uint16_t port_ = 0;
  std::unique_ptr<grpc::Server> health_server_;  // --health-port
  uint16_t health_port_ = 0;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool serving_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ticker_ ABSL_GUARDED_BY(mu_) = false;
  bool peers_agree_ ABSL_GUARDED_BY(mu_) = true;
  bool model_ready_ = false;  // ticker thread only
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
  if (!rule->device_note().empty()) {
    spdlog::warn("shard {}: aggregator: {}", options.shard_id, rule->device_note());
  } else if (rule_options.device == core::Device::kCuda) {
    spdlog::info("shard {}: aggregating on {}", options.shard_id, rule->device());
  }
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
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Authenticator> auth, Authenticator::Create(options));
  auto server = std::make_unique<ServerImpl>(options, clock != nullptr ? clock : core::Clock::Real(),
                                             std::move(rule), std::move(auth));
  PS_RETURN_IF_ERROR(server->RestoreCheckpoint());
  PS_RETURN_IF_ERROR(server->Listen());
  return server;
}

}  // namespace ps::server
