#include "worker_lib/transport/tcp/channel.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/status.h"
#include "net/address.h"
#include "net/data_frame.h"
#include "worker_lib/transport/tcp/connection_internal.h"

namespace ps::internal::tcp_plane {

std::shared_ptr<IoThread> StartIoThread() { return std::make_shared<IoThread>(); }

namespace {

class TcpPush final : public DataChannel::PushCall {
 public:
  TcpPush(std::shared_ptr<Connection> conn, asio::io_context& io,
          std::vector<const OutgoingPush*> pushes, RpcClock::time_point deadline)
      : conn_(std::move(conn)),
        io_(io),
        epoch_(conn_->epoch()),
        pushes_(std::move(pushes)),
        deadline_(deadline),
        batch_(std::make_shared<PushBatch>()) {}

  uint64_t epoch() const override { return epoch_; }

  void Start(std::function<void(size_t, absl::Status)> done) override {
    // The frames are made here, on the caller's thread: the pushes are only borrowed
    // until their answers, and the I/O thread keeps just their shared payloads.
    std::vector<OutFrame> frames(pushes_.size());
    std::vector<absl::Status> refused(pushes_.size());
    batch_->done = std::move(done);
    batch_->tags.resize(pushes_.size());
    for (size_t i = 0; i < pushes_.size(); ++i) {
      const OutgoingPush& p = *pushes_[i];
      batch_->tags[i] = conn_->NextTag();
      // Framed on the I/O thread (Flush), alone or with the pushes queued after it.
      refused[i] = net::CheckPayload(net::FrameType::kPush, p.codec, p.payload_size());
      frames[i].body = p.payload;
      frames[i].borrowed = p.borrowed;
      frames[i].borrowed_guard = p.borrowed_guard;
      frames[i].push = OutFrame::Push{.layout_hash = p.layout_hash,
                                      .round = p.round,
                                      .codec = p.codec,
                                      .entry = {.tag = batch_->tags[i],
                                                .slice_id = p.slice_id,
                                                .body_bytes = static_cast<uint32_t>(p.payload_size()),
                                                .loss = p.loss,
                                                .lr = p.lr}};
    }
    bool start;
    {
      absl::MutexLock lock(&mu_);
      start = started_ = !cancelled_;
    }
    if (!start) {
      for (size_t i = 0; i < pushes_.size(); ++i) {
        batch_->done(i, absl::CancelledError("push cancelled"));
      }
      return;
    }
    asio::post(io_, [conn = conn_, batch = batch_, frames = std::move(frames),
                     refused = std::move(refused), deadline = deadline_]() mutable {
      conn->StartPushes(std::move(batch), std::move(frames), std::move(refused), deadline);
    });
  }

  void Cancel() override {
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      if (!started_) return;  // Start answers CANCELLED
    }
    asio::post(io_, [conn = conn_, batch = batch_] { conn->CancelPushes(batch); });
  }

 private:
  const std::shared_ptr<Connection> conn_;
  asio::io_context& io_;
  const uint64_t epoch_;
  const std::vector<const OutgoingPush*> pushes_;
  const RpcClock::time_point deadline_;
  const std::shared_ptr<PushBatch> batch_;
  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

class TcpChannel final : public DataChannel {
 public:
  TcpChannel(std::shared_ptr<IoThread> io, TcpChannelOptions options,
             std::shared_ptr<net::TlsContext> tls)
      : io_(std::move(io)),
        options_(options),
        conn_(std::make_shared<Connection>(io_->io(), std::move(options), std::move(tls))) {}
  ~TcpChannel() override {
    asio::post(io_->io(), [conn = conn_] { conn->Close(); });
  }

  absl::Status SetRoute(const DataRoute& route) override {
    Connection::Route r{.data = route};
    if (route.data_port == 0) {
      r.why_none = absl::FailedPreconditionError(absl::StrCat(
          ShardName(options_.shard, options_.address),
          " runs no TCP data plane (its Join answer named no data port)"));
    } else {
      absl::StatusOr<net::HostPort> control = net::SplitHostPort(options_.address, "shard address");
      const std::string host =
          !route.data_host.empty() ? route.data_host : (control.ok() ? control->host : "");
      absl::StatusOr<asio::ip::address> ip = net::ResolveHost(host, "the shard's data host");
      // TLS checks the certificate for the name the gRPC channel checks.
      r.server_name = options_.credentials.tls_server_name.empty()
                          ? host
                          : options_.credentials.tls_server_name;
      if (ip.ok()) {
        r.endpoint = tcp::endpoint(*ip, static_cast<uint16_t>(route.data_port));
        absl::StatusOr<tcp::endpoint> shaped = Shaped(*r.endpoint);
        if (shaped.ok()) {
          r.endpoint = *shaped;
        } else {
          r.why_none = shaped.status();
        }
      } else {
        r.why_none = ip.status();
      }
    }
    absl::Status status = r.why_none;
    conn_->SetRoute(std::move(r));
    return status;
  }

  std::unique_ptr<PushCall> NewPush(std::vector<const OutgoingPush*> pushes,
                                    RpcClock::time_point deadline) override {
    return std::make_unique<TcpPush>(conn_, io_->io(), std::move(pushes), deadline);
  }

  void FillStats(WorkerStats& stats) const override {
    stats.tcp_rto_min_unset += conn_->rto_min_unset();
  }

  uint64_t Pull(PullAsk ask, RpcClock::time_point deadline,
                std::shared_ptr<PullSink> sink) override {
    const uint64_t epoch = conn_->epoch();
    const uint64_t tag = conn_->NextTag();
    OutFrame frame;
    absl::Status st = net::AppendPull(tag,
                                      net::PullMeta{.layout_hash = ask.layout_hash,
                                                    .min_version = ask.min_version,
                                                    .held_epoch = ask.held_epoch,
                                                    .count = static_cast<uint32_t>(
                                                        ask.slice_ids.size()),
                                                    .held = !ask.held_versions.empty()},
                                      ask.slice_ids, ask.held_versions, &frame.head);
    if (!st.ok()) {
      sink->Done(st);
      return epoch;
    }
    asio::post(io_->io(), [conn = conn_, tag, frame = std::move(frame), sink = std::move(sink),
                           deadline]() mutable {
      conn->StartPull(tag, std::move(frame), std::move(sink), deadline);
    });
    return epoch;
  }

 private:
  // Where the connection dials for the shard's data `endpoint`: the endpoint itself, or
  // with shaping the local end of a relay to it (kept while the endpoint stays the same;
  // a new one replaces it, which ends a connection through the old one).
  absl::StatusOr<tcp::endpoint> Shaped(const tcp::endpoint& endpoint) {
    if (!options_.shaping.enabled()) return endpoint;
    absl::MutexLock lock(&relay_mu_);
    if (relay_ == nullptr || relay_upstream_ != endpoint) {
      const std::string upstream =
          endpoint.address().is_v6()
              ? absl::StrCat("[", endpoint.address().to_string(), "]:", endpoint.port())
              : absl::StrCat(endpoint.address().to_string(), ":", endpoint.port());
      absl::StatusOr<std::unique_ptr<net::ShapingRelay>> relay =
          net::ShapingRelay::Start(upstream, options_.shaping);
      if (!relay.ok()) {
        return absl::Status(relay.status().code(),
                            absl::StrCat("shaping the data link to ",
                                         ShardName(options_.shard, options_.address), ": ",
                                         relay.status().message()));
      }
      relay_ = *std::move(relay);
      relay_upstream_ = endpoint;
    }
    absl::StatusOr<net::HostPort> local = net::SplitHostPort(relay_->address(), "relay address");
    if (!local.ok()) return local.status();
    return tcp::endpoint(asio::ip::make_address(local->host), local->port);
  }

  const std::shared_ptr<IoThread> io_;
  const TcpChannelOptions options_;
  const std::shared_ptr<Connection> conn_;
  absl::Mutex relay_mu_;
  std::unique_ptr<net::ShapingRelay> relay_ ABSL_GUARDED_BY(relay_mu_);
  tcp::endpoint relay_upstream_ ABSL_GUARDED_BY(relay_mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<DataChannel>> MakeTcpChannel(std::shared_ptr<IoThread> io,
                                                            TcpChannelOptions options) {
  std::shared_ptr<net::TlsContext> tls;
  if (options.credentials.tls()) {
    absl::StatusOr<std::shared_ptr<net::TlsContext>> made =
        net::ClientTlsContext(options.credentials);
    if (!made.ok()) {
      return absl::Status(made.status().code(),
                          absl::StrCat("TLS toward ", ShardName(options.shard, options.address),
                                       "'s data port: ", made.status().message()));
    }
    tls = *std::move(made);
  }
  return std::unique_ptr<DataChannel>(
      std::make_unique<TcpChannel>(std::move(io), std::move(options), std::move(tls)));
}

}  // namespace ps::internal::tcp_plane
