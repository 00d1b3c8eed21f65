#include "worker_lib/grpc_transport_internal.h"

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

namespace ps::internal {

namespace {

// One unary Push on the generic stub: the request is its header (net/wire.h) followed by
// the payload's own buffer, which gRPC references instead of copying into a message.
class GrpcPushCall final : public ShardTransport::PushCall {
 public:
  GrpcPushCall(grpc::GenericStub* stub, net::ChannelAuth* auth, RpcClock::time_point deadline)
      : stub_(stub), auth_(auth), deadline_(deadline) {
    ctx_.set_deadline(deadline);
    ctx_.set_wait_for_ready(true);
  }

  void Start(const ShardTransport::PushMessage* message,
             std::function<void(absl::Status)> done) override {
    // Without a proof the call is cancelled as it starts (so that `done` runs on gRPC's
    // thread, as always) and reports why.
    const grpc::Status attached = auth_->Attach(&ctx_, deadline_, /*wait_for_ready=*/true);
    if (!attached.ok()) ctx_.TryCancel();
    const v1::PushRequest& f = message->fields;
    req_ = net::HeaderAndBody(net::PushRequestHeader(f.session(), f.layout_hash(), f.round(),
                                                     f.slice_id(), f.codec(),
                                                     message->payload_size(),
                                                     f.has_loss() ? std::optional<float>(f.loss())
                                                                  : std::nullopt),
                              message->payload);
    stub_->UnaryCall(&ctx_, "/ps.v1.WorkerService/Push", grpc::StubOptions(), &req_, &resp_,
                     [auth = auth_, attached, done = std::move(done)](grpc::Status s) {
                       if (!attached.ok()) s = attached;
                       auth->Stale(s);  // after a restart: the next call runs the challenge
                       done(net::FromGrpc(s));
                     });
  }

  // ClientContext::TryCancel before the call started cancels it as it starts.
  void Cancel() override { ctx_.TryCancel(); }

 private:
  grpc::GenericStub* stub_;
  net::ChannelAuth* auth_;
  const RpcClock::time_point deadline_;
  grpc::ClientContext ctx_;
  grpc::ByteBuffer req_, resp_;
};

// One server-streaming Pull, on the generic stub so that each message's bytes are read
// where gRPC received them (net/wire.h): the slice's values are copied once, by the
// caller, straight to their destination. Owns itself: created with new, deleted at the
// end of OnDone (gRPC's last call into it).
class GrpcPullStream final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  static void Start(grpc::GenericStub* stub, net::ChannelAuth* auth, const v1::PullRequest& req,
                    RpcClock::time_point deadline,
                    std::function<bool(const net::PullFrame&)> on_slice,
                    std::function<void(absl::Status)> on_done) {
    auto* stream = new GrpcPullStream(auth, net::SerializeMessage(req), std::move(on_slice),
                                      std::move(on_done));
    // Without a proof the stream is cancelled as it starts and ends reporting why.
    stream->attached_ = auth->Attach(&stream->ctx_, deadline, /*wait_for_ready=*/true);
    if (!stream->attached_.ok()) stream->ctx_.TryCancel();
    stream->ctx_.set_deadline(deadline);
    stream->ctx_.set_wait_for_ready(true);
    stub->PrepareBidiStreamingCall(&stream->ctx_, "/ps.v1.WorkerService/Pull",
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
    if (!frame.ok()) {
      // The stream ends CANCELLED; the caller's error names the malformed message.
      protocol_error_ = frame.status();
      ctx_.TryCancel();
      return;
    }
    if (!on_slice_(*frame)) {
      ctx_.TryCancel();
      return;
    }
    resp_.Clear();
    StartRead(&resp_);
  }

  void OnDone(const grpc::Status& s) override {
    std::function<void(absl::Status)> on_done = std::move(on_done_);
    auth_->Stale(s);  // after a restart: the next call runs the challenge
    const absl::Status status = !attached_.ok()         ? net::FromGrpc(attached_)
                                : protocol_error_.ok() ? net::FromGrpc(s)
                                                       : protocol_error_;
    delete this;
    on_done(status);
  }

 private:
  GrpcPullStream(net::ChannelAuth* auth, grpc::ByteBuffer req,
                 std::function<bool(const net::PullFrame&)> on_slice,
                 std::function<void(absl::Status)> on_done)
      : auth_(auth),
        req_(std::move(req)),
        on_slice_(std::move(on_slice)),
        on_done_(std::move(on_done)) {}

  net::ChannelAuth* const auth_;
  grpc::Status attached_;  // Attach's outcome
  grpc::ClientContext ctx_;
  grpc::ByteBuffer req_;
  grpc::ByteBuffer resp_;
  absl::Status protocol_error_;  // a message that did not parse
  std::function<bool(const net::PullFrame&)> on_slice_;
  std::function<void(absl::Status)> on_done_;
};

class GrpcShardTransport final : public ShardTransport {
 public:
  // `address` is shard `shard_id`'s (the channel may go through a shaping relay).
  GrpcShardTransport(const core::ClientCredentials& creds, uint32_t shard_id,
                     const std::string& address, std::unique_ptr<net::ShapingRelay> relay,
                     std::shared_ptr<grpc::Channel> channel)
      : relay_(std::move(relay)),
        channel_(std::move(channel)),
        auth_(channel_, creds, address, core::Identity{core::Identity::Kind::kShard, shard_id}),
        stub_(v1::WorkerService::NewStub(channel_)),
        generic_(channel_) {}

  absl::Status Join(const v1::JoinRequest& req, RpcClock::time_point deadline,
                    v1::JoinResponse* resp) override {
    return net::FromGrpc(auth_.Unary(deadline, /*wait_for_ready=*/true,
                                     [&](grpc::ClientContext* ctx) {
                                       return stub_->Join(ctx, req, resp);
                                     }));
  }

  absl::Status RegisterLayout(const v1::RegisterLayoutRequest& req, RpcClock::time_point deadline,
                              v1::RegisterLayoutResponse* resp) override {
    return net::FromGrpc(auth_.Unary(deadline, /*wait_for_ready=*/false,
                                     [&](grpc::ClientContext* ctx) {
                                       return stub_->RegisterLayout(ctx, req, resp);
                                     }));
  }

  absl::Status InitSlice(const v1::InitSliceRequest& req, RpcClock::time_point deadline,
                         v1::InitSliceResponse* resp) override {
    return net::FromGrpc(auth_.Unary(deadline, /*wait_for_ready=*/false,
                                     [&](grpc::ClientContext* ctx) {
                                       return stub_->InitSlice(ctx, req, resp);
                                     }));
  }

  std::unique_ptr<PushCall> NewPush(RpcClock::time_point deadline) override {
    return std::make_unique<GrpcPushCall>(&generic_, &auth_, deadline);
  }

  void Pull(v1::PullRequest req, RpcClock::time_point deadline,
            std::function<bool(const net::PullFrame&)> on_slice,
            std::function<void(absl::Status)> on_done) override {
    GrpcPullStream::Start(&generic_, &auth_, req, deadline, std::move(on_slice),
                          std::move(on_done));
  }

 private:
  // Declared before the channel: the channel goes first, then the relay it went through.
  std::unique_ptr<net::ShapingRelay> relay_;
  std::shared_ptr<grpc::Channel> channel_;
  net::ChannelAuth auth_;  // the worker's proof of its token on every call
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  grpc::GenericStub generic_;  // Push and Pull, whose tensor bytes are never copied
};

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<ShardTransport>>> ConnectGrpcShards(
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
  std::vector<std::unique_ptr<ShardTransport>> out;
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
    out.push_back(std::make_unique<GrpcShardTransport>(options.credentials, i, address,
                                                       std::move(relay), std::move(channel)));
  }
  return out;
}

}  // namespace ps::internal
