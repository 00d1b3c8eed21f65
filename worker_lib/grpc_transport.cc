#include "worker_lib/grpc_transport_internal.h"

#include <utility>

#include <grpc/grpc.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "net/grpc_credentials.h"
#include "net/grpc_status.h"
#include "net/shaper.h"
#include "ps/v1/ps.grpc.pb.h"

namespace ps::internal {

namespace {

class GrpcPushCall final : public ShardTransport::PushCall {
 public:
  GrpcPushCall(v1::WorkerService::Stub* stub, const core::ClientCredentials& creds,
               RpcClock::time_point deadline)
      : stub_(stub) {
    net::AttachCredentials(creds, &ctx_);
    ctx_.set_deadline(deadline);
    ctx_.set_wait_for_ready(true);
  }

  void Start(const v1::PushRequest* req, v1::PushResponse* resp,
             std::function<void(absl::Status)> done) override {
    stub_->async()->Push(&ctx_, req, resp,
                         [done = std::move(done)](grpc::Status s) { done(net::FromGrpc(s)); });
  }

  // ClientContext::TryCancel before the call started cancels it as it starts.
  void Cancel() override { ctx_.TryCancel(); }

 private:
  v1::WorkerService::Stub* stub_;
  grpc::ClientContext ctx_;
};

// One server-streaming Pull. Owns itself: created with new, deleted at the end of
// OnDone (gRPC's last call into it).
class GrpcPullStream final : public grpc::ClientReadReactor<v1::PullResponse> {
 public:
  static void Start(v1::WorkerService::Stub* stub, const core::ClientCredentials& creds,
                    v1::PullRequest req, RpcClock::time_point deadline,
                    std::function<bool(const v1::PullResponse&)> on_slice,
                    std::function<void(absl::Status)> on_done) {
    auto* stream = new GrpcPullStream(std::move(req), std::move(on_slice), std::move(on_done));
    net::AttachCredentials(creds, &stream->ctx_);
    stream->ctx_.set_deadline(deadline);
    stream->ctx_.set_wait_for_ready(true);
    stub->async()->Pull(&stream->ctx_, &stream->req_, stream);
    stream->StartRead(&stream->resp_);
    stream->StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // end of stream; OnDone follows
    if (!on_slice_(resp_)) {
      ctx_.TryCancel();
      return;
    }
    StartRead(&resp_);
  }

  void OnDone(const grpc::Status& s) override {
    std::function<void(absl::Status)> on_done = std::move(on_done_);
    delete this;
    on_done(net::FromGrpc(s));
  }

 private:
  GrpcPullStream(v1::PullRequest req, std::function<bool(const v1::PullResponse&)> on_slice,
                 std::function<void(absl::Status)> on_done)
      : req_(std::move(req)), on_slice_(std::move(on_slice)), on_done_(std::move(on_done)) {}

  grpc::ClientContext ctx_;
  v1::PullRequest req_;
  v1::PullResponse resp_;
  std::function<bool(const v1::PullResponse&)> on_slice_;
  std::function<void(absl::Status)> on_done_;
};

class GrpcShardTransport final : public ShardTransport {
 public:
  GrpcShardTransport(const core::ClientCredentials& creds,
                     std::unique_ptr<net::ShapingRelay> relay,
                     std::shared_ptr<grpc::Channel> channel)
      : creds_(creds),
        relay_(std::move(relay)),
        channel_(std::move(channel)),
        stub_(v1::WorkerService::NewStub(channel_)) {}

  absl::Status Join(const v1::JoinRequest& req, RpcClock::time_point deadline,
                    v1::JoinResponse* resp) override {
    grpc::ClientContext ctx;
    Prepare(deadline, &ctx);
    ctx.set_wait_for_ready(true);
    return net::FromGrpc(stub_->Join(&ctx, req, resp));
  }

  absl::Status RegisterLayout(const v1::RegisterLayoutRequest& req, RpcClock::time_point deadline,
                              v1::RegisterLayoutResponse* resp) override {
    grpc::ClientContext ctx;
    Prepare(deadline, &ctx);
    return net::FromGrpc(stub_->RegisterLayout(&ctx, req, resp));
  }

  absl::Status InitSlice(const v1::InitSliceRequest& req, RpcClock::time_point deadline,
                         v1::InitSliceResponse* resp) override {
    grpc::ClientContext ctx;
    Prepare(deadline, &ctx);
    return net::FromGrpc(stub_->InitSlice(&ctx, req, resp));
  }

  std::unique_ptr<PushCall> NewPush(RpcClock::time_point deadline) override {
    return std::make_unique<GrpcPushCall>(stub_.get(), creds_, deadline);
  }

  void Pull(v1::PullRequest req, RpcClock::time_point deadline,
            std::function<bool(const v1::PullResponse&)> on_slice,
            std::function<void(absl::Status)> on_done) override {
    GrpcPullStream::Start(stub_.get(), creds_, std::move(req), deadline, std::move(on_slice),
                          std::move(on_done));
  }

 private:
  void Prepare(RpcClock::time_point deadline, grpc::ClientContext* ctx) const {
    net::AttachCredentials(creds_, ctx);
    ctx->set_deadline(deadline);
  }

  const core::ClientCredentials creds_;
  // Declared before the channel: the channel goes first, then the relay it went through.
  std::unique_ptr<net::ShapingRelay> relay_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
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
    out.push_back(std::make_unique<GrpcShardTransport>(options.credentials, std::move(relay),
                                                       std::move(channel)));
  }
  return out;
}

}  // namespace ps::internal
