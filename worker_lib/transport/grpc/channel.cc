#include "worker_lib/transport/grpc/channel.h"

#include <mutex>
#include <utility>

#include <grpc/grpc.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "net/channel_auth.h"
#include "net/grpc_bytes.h"
#include "net/grpc_credentials.h"
#include "net/grpc_status.h"
#include "net/shaper.h"
#include "ps/v1/ps.grpc.pb.h"

namespace ps::internal::grpc_plane {

namespace {

// What a shard's control and data channel share: the relay, the channel through it,
// the proof of the token, and the stubs over the channel.
struct Connection {
  Connection(const core::ClientCredentials& creds, uint32_t shard_id, const std::string& address,
             std::unique_ptr<net::ShapingRelay> relay_in, std::shared_ptr<grpc::Channel> channel_in)
      : relay(std::move(relay_in)),
        channel(std::move(channel_in)),
        auth(channel, creds, address, core::Identity{core::Identity::Kind::kShard, shard_id}),
        stub(v1::WorkerService::NewStub(channel)),
        generic(channel) {}

  // Declared before the channel: the channel goes first, then the relay it went through.
  std::unique_ptr<net::ShapingRelay> relay;
  std::shared_ptr<grpc::Channel> channel;
  net::ChannelAuth auth;  // the worker's proof of its token on every call
  std::unique_ptr<v1::WorkerService::Stub> stub;
  grpc::GenericStub generic;  // Push and Pull, whose tensor bytes are never copied
};

class GrpcControl final : public ShardControl {
 public:
  explicit GrpcControl(std::shared_ptr<Connection> conn) : conn_(std::move(conn)) {}

  absl::Status Join(const v1::JoinRequest& req, RpcClock::time_point deadline,
                    v1::JoinResponse* resp) override {
    return net::FromGrpc(conn_->auth.Unary(deadline, /*wait_for_ready=*/true,
                                           [&](grpc::ClientContext* ctx) {
                                             return conn_->stub->Join(ctx, req, resp);
                                           }));
  }

  absl::Status RegisterLayout(const v1::RegisterLayoutRequest& req, RpcClock::time_point deadline,
                              v1::RegisterLayoutResponse* resp) override {
    return net::FromGrpc(conn_->auth.Unary(deadline, /*wait_for_ready=*/false,
                                           [&](grpc::ClientContext* ctx) {
                                             return conn_->stub->RegisterLayout(ctx, req, resp);
                                           }));
  }

  absl::Status InitSlice(const v1::InitSliceRequest& req, RpcClock::time_point deadline,
                         v1::InitSliceResponse* resp) override {
    return net::FromGrpc(conn_->auth.Unary(deadline, /*wait_for_ready=*/false,
                                           [&](grpc::ClientContext* ctx) {
                                             return conn_->stub->InitSlice(ctx, req, resp);
                                           }));
  }

  absl::Status PutObject(const v1::PutObjectRequest& req, RpcClock::time_point deadline,
                         v1::PutObjectResponse* resp) override {
    return net::FromGrpc(conn_->auth.Unary(deadline, /*wait_for_ready=*/false,
                                           [&](grpc::ClientContext* ctx) {
                                             return conn_->stub->PutObject(ctx, req, resp);
                                           }));
  }

  absl::Status GetObject(const v1::GetObjectRequest& req, RpcClock::time_point deadline,
                         v1::GetObjectResponse* resp) override {
    return net::FromGrpc(conn_->auth.Unary(deadline, /*wait_for_ready=*/false,
                                           [&](grpc::ClientContext* ctx) {
                                             return conn_->stub->GetObject(ctx, req, resp);
                                           }));
  }

  absl::Status Leave(const v1::LeaveRequest& req, RpcClock::time_point deadline,
                     v1::LeaveResponse* resp) override {
    return net::FromGrpc(conn_->auth.Unary(deadline, /*wait_for_ready=*/false,
                                           [&](grpc::ClientContext* ctx) {
                                             return conn_->stub->Leave(ctx, req, resp);
                                           }));
  }

  absl::Status Adopt(const v1::AdoptRequest& req, RpcClock::time_point deadline,
                     v1::AdoptResponse* resp) override {
    return net::FromGrpc(conn_->auth.Unary(deadline, /*wait_for_ready=*/false,
                                           [&](grpc::ClientContext* ctx) {
                                             return conn_->stub->Adopt(ctx, req, resp);
                                           }));
  }

  absl::Status AdoptSlice(const v1::AdoptSliceRequest& req, RpcClock::time_point deadline,
                          v1::AdoptSliceResponse* resp) override {
    return net::FromGrpc(conn_->auth.Unary(deadline, /*wait_for_ready=*/false,
                                           [&](grpc::ClientContext* ctx) {
                                             return conn_->stub->AdoptSlice(ctx, req, resp);
                                           }));
  }

  absl::Status Probe(const v1::ProbeRequest& req, RpcClock::time_point deadline,
                     v1::ProbeResponse* resp) override {
    return net::FromGrpc(conn_->auth.Unary(deadline, /*wait_for_ready=*/false,
                                           [&](grpc::ClientContext* ctx) {
                                             return conn_->stub->Probe(ctx, req, resp);
                                           }));
  }

 private:
  const std::shared_ptr<Connection> conn_;
};

// Pushes as unary Push calls on the generic stub, one per push (gRPC writes each call
// on its own; several pushes per write are the TCP plane's): the request is its header
// (net/wire.h) followed by the payload's own buffer, which gRPC references instead of
// copying into a message.
class GrpcPushCall final : public DataChannel::PushCall {
 public:
  GrpcPushCall(Connection* conn, std::string session, uint64_t epoch,
               std::vector<const OutgoingPush*> pushes, RpcClock::time_point deadline)
      : conn_(conn), session_(std::move(session)), epoch_(epoch), deadline_(deadline) {
    for (const OutgoingPush* p : pushes) {
      auto call = std::make_unique<Call>();
      call->push = p;
      call->ctx.set_deadline(deadline);
      call->ctx.set_wait_for_ready(true);
      calls_.push_back(std::move(call));
    }
  }

  uint64_t epoch() const override { return epoch_; }

  void Start(std::function<void(size_t, absl::Status)> done) override {
    auto shared_done = std::make_shared<std::function<void(size_t, absl::Status)>>(std::move(done));
    // Once the last call started, its answer may destroy this object at any moment.
    const size_t n = calls_.size();
    for (size_t i = 0; i < n; ++i) {
      Call& c = *calls_[i];
      // Without a proof the call is cancelled as it starts (so that `done` runs on
      // gRPC's thread, as always) and reports why.
      const grpc::Status attached = conn_->auth.Attach(&c.ctx, deadline_, /*wait_for_ready=*/true);
      if (!attached.ok()) c.ctx.TryCancel();
      const OutgoingPush& p = *c.push;
      // A borrowed push's bytes are copied here, and gRPC is never handed the caller's
      // buffer: it may keep a message's bytes queued behind a shard that stopped reading
      // for as long as the connection lives (the worker's channels send no keepalive),
      // which would hold WaitPushes as long (docs/data_path.md, "Borrowed pushes").
      c.req = net::HeaderAndBody(
          net::PushRequestHeader(session_, p.layout_hash, p.round, p.slice_id, p.codec,
                                 p.payload_size(), p.loss, p.lr),
          p.borrowed.empty() ? p.payload : std::make_shared<const std::string>(p.Bytes()));
      conn_->generic.UnaryCall(&c.ctx, "/ps.v1.WorkerService/Push", grpc::StubOptions(), &c.req,
                               &c.resp,
                               [auth = &conn_->auth, attached, i, shared_done](grpc::Status s) {
                                 if (!attached.ok()) s = attached;
                                 auth->Stale(s);  // after a restart: the next call runs the challenge
                                 (*shared_done)(i, net::FromGrpc(s));
                               });
    }
  }

  // ClientContext::TryCancel before the call started cancels it as it starts.
  void Cancel() override {
    for (auto& c : calls_) c->ctx.TryCancel();
  }

 private:
  struct Call {
    const OutgoingPush* push = nullptr;
    grpc::ClientContext ctx;
    grpc::ByteBuffer req, resp;
  };

  Connection* const conn_;
  const std::string session_;
  const uint64_t epoch_;
  const RpcClock::time_point deadline_;
  std::vector<std::unique_ptr<Call>> calls_;
};

// One server-streaming Pull, on the generic stub so that each message's bytes are read
// where gRPC received them (net/wire.h): the slice's values are copied once, into the
// place the sink gives (DeliverPullFrame). Owns itself: created with new, deleted at
// the end of OnDone (gRPC's last call into it).
class GrpcPullStream final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  static void Start(Connection* conn, const v1::PullRequest& req, RpcClock::time_point deadline,
                    std::shared_ptr<PullSink> sink) {
    auto* stream = new GrpcPullStream(&conn->auth, net::SerializeMessage(req), std::move(sink));
    // Without a proof the stream is cancelled as it starts and ends reporting why.
    stream->attached_ = conn->auth.Attach(&stream->ctx_, deadline, /*wait_for_ready=*/true);
    if (!stream->attached_.ok()) stream->ctx_.TryCancel();
    stream->ctx_.set_deadline(deadline);
    stream->ctx_.set_wait_for_ready(true);
    conn->generic.PrepareBidiStreamingCall(&stream->ctx_, "/ps.v1.WorkerService/Pull",
                                           grpc::StubOptions(), stream);
    stream->StartWriteLast(&stream->req_, grpc::WriteOptions());
    stream->StartRead(&stream->resp_);
    stream->StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // end of stream; OnDone follows
    net::ReceivedBytes bytes;
    absl::Status s = bytes.Take(resp_);
    absl::StatusOr<net::PullFrame> frame =
        s.ok() ? net::ParsePullResponse(bytes.pieces()) : absl::StatusOr<net::PullFrame>(s);
    // A message that did not parse, or that the sink refused, ends the stream, which
    // reports that error instead of CANCELLED.
    s = frame.ok() ? DeliverPullFrame(*frame, *sink_) : frame.status();
    if (!s.ok()) {
      protocol_error_ = std::move(s);
      ctx_.TryCancel();
      return;
    }
    resp_.Clear();
    StartRead(&resp_);
  }

  void OnDone(const grpc::Status& s) override {
    std::shared_ptr<PullSink> sink = std::move(sink_);
    auth_->Stale(s);  // after a restart: the next call runs the challenge
    const absl::Status status = !attached_.ok()         ? net::FromGrpc(attached_)
                                : protocol_error_.ok() ? net::FromGrpc(s)
                                                       : protocol_error_;
    delete this;
    sink->Done(status);
  }

 private:
  GrpcPullStream(net::ChannelAuth* auth, grpc::ByteBuffer req, std::shared_ptr<PullSink> sink)
      : auth_(auth), req_(std::move(req)), sink_(std::move(sink)) {}

  net::ChannelAuth* const auth_;
  grpc::Status attached_;  // Attach's outcome
  grpc::ClientContext ctx_;
  grpc::ByteBuffer req_;
  grpc::ByteBuffer resp_;
  absl::Status protocol_error_;  // a message that did not parse or was refused
  std::shared_ptr<PullSink> sink_;
};

class GrpcDataChannel final : public DataChannel {
 public:
  explicit GrpcDataChannel(std::shared_ptr<Connection> conn) : conn_(std::move(conn)) {}

  absl::Status SetRoute(const DataRoute& route) override {
    std::lock_guard<std::mutex> lock(mu_);
    session_ = route.session;
    epoch_ = route.epoch;
    return absl::OkStatus();
  }

  std::unique_ptr<PushCall> NewPush(std::vector<const OutgoingPush*> pushes,
                                    RpcClock::time_point deadline) override {
    std::lock_guard<std::mutex> lock(mu_);
    return std::make_unique<GrpcPushCall>(conn_.get(), session_, epoch_, std::move(pushes),
                                          deadline);
  }

  uint64_t Pull(PullAsk ask, RpcClock::time_point deadline,
                std::shared_ptr<PullSink> sink) override {
    v1::PullRequest req;
    uint64_t epoch;
    {
      std::lock_guard<std::mutex> lock(mu_);
      req.set_session(session_);
      epoch = epoch_;
    }
    req.set_layout_hash(ask.layout_hash);
    req.set_min_version(ask.min_version);
    req.mutable_slice_ids()->Add(ask.slice_ids.begin(), ask.slice_ids.end());
    req.set_held_epoch(ask.held_epoch);
    req.mutable_held_versions()->Add(ask.held_versions.begin(), ask.held_versions.end());
    GrpcPullStream::Start(conn_.get(), req, deadline, std::move(sink));
    return epoch;
  }

 private:
  const std::shared_ptr<Connection> conn_;
  std::mutex mu_;
  std::string session_;  // of the shard's latest join
  uint64_t epoch_ = 0;
};

}  // namespace

absl::StatusOr<std::vector<GrpcShard>> ConnectGrpcShards(
    const WorkerOptions& options) {
  // Keep gRPC initialised for the life of the process: when the last channel goes
  // away gRPC otherwise shuts its callback machinery down, which races with its own
  // threads at exit (seen as rare aborts in grpc_cq_internal_unref; grpc#32584).
  static const bool grpc_pinned = (grpc_init(), true);
  (void)grpc_pinned;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              static_cast<int>(options.initial_backoff.count()));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, static_cast<int>(options.initial_backoff.count()));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(options.max_backoff.count()));
  if (options.receive_window_bytes > 0) {
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                static_cast<int>(options.receive_window_bytes));
  }
  net::ApplyChannelArguments(options.credentials, &args);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds_or =
      net::MakeChannelCredentials(options.credentials);
  if (!creds_or.ok()) {
    return absl::Status(creds_or.status().code(),
                        absl::StrCat("worker credentials: ", creds_or.status().message()));
  }
  const std::shared_ptr<grpc::ChannelCredentials> channel_creds = *std::move(creds_or);
  std::vector<GrpcShard> out;
  for (uint32_t i = 0; i < options.shard_addresses.size(); ++i) {
    const std::string& address = options.shard_addresses[i];
    std::string target = address;
    std::unique_ptr<net::ShapingRelay> relay;
    if (options.shaping.enabled()) {
      auto started = net::ShapingRelay::Start(address, options.shaping);
      if (!started.ok()) {
        return absl::Status(started.status().code(),
                            absl::StrCat("shaping the link to ", ShardName(i, address), ": ",
                                         started.status().message()));
      }
      relay = *std::move(started);
      target = relay->address();
    }
    auto channel = grpc::CreateCustomChannel(target, channel_creds, args);
    auto conn = std::make_shared<Connection>(options.credentials, i, address, std::move(relay),
                                             std::move(channel));
    out.push_back(GrpcShard{std::make_unique<GrpcControl>(conn),
                            std::make_unique<GrpcDataChannel>(conn)});
  }
  return out;
}

}  // namespace ps::internal::grpc_plane
