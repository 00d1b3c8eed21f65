// ps::Worker's front: checks the arguments of Start and wires the parts together, in
// the manner of LevelDB's DBImpl over its VersionSet and log::Writer. The parts, each
// with its own header, locks and tests (docs/architecture.md, "Inside ps::Worker"):
//   ShardClient   (shard_client_internal.h)   sessions: join, rejoin, layout, slices
//   PushPipeline  (push_pipeline_internal.h)  encode, P3 queue, credit, retry, replay, UDP
//   PullStreams   (pull_streams_internal.h)   pull streams, destinations, PullTicket
// They reach the shards through ShardTransport (shard_transport_internal.h), over
// gRPC in production (grpc_transport_internal.h).
#include "worker_lib/worker.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "worker_lib/grpc_transport_internal.h"
#include "worker_lib/pull_streams_internal.h"
#include "worker_lib/push_pipeline_internal.h"
#include "worker_lib/shard_client_internal.h"

namespace ps {
namespace {

class WorkerImpl final : public Worker {
 public:
  WorkerImpl(WorkerOptions options, core::ModelLayout layout)
      : options_(std::move(options)), layout_(std::move(layout)) {}

  // The members' order makes the pipeline go first (it waits for its calls), then
  // the pulls, then the client with the transports they used.
  ~WorkerImpl() override = default;

  absl::Status Init(std::span<const std::span<const float>> initial) {
    if (options_.shard_addresses.size() != layout_.num_shards()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the layout is cut for ", layout_.num_shards(), " shards but ",
                       options_.shard_addresses.size(), " shard addresses were given"));
    }
    if (!initial.empty()) {
      if (initial.size() != layout_.tensors().size()) {
        return absl::InvalidArgumentError(absl::StrCat("initial values for ", initial.size(),
                                                       " tensors; the layout has ",
                                                       layout_.tensors().size()));
      }
      for (size_t t = 0; t < initial.size(); ++t) {
        if (initial[t].size() != layout_.tensors()[t].numel) {
          return absl::InvalidArgumentError(absl::StrCat(
              "initial value of tensor '", layout_.tensors()[t].name, "' has ", initial[t].size(),
              " elements; the layout says ", layout_.tensors()[t].numel));
        }
      }
    }
    PS_ASSIGN_OR_RETURN(auto transports, internal::ConnectGrpcShards(options_));
    internal::ShardClient::Options client_options;
    client_options.worker_id = options_.worker_id;
    client_options.rpc_timeout = options_.rpc_timeout;
    client_options.join_policy = internal::JoinRetryPolicy(options_);
    // Rejoins happen only once Init is done, so the pipeline exists by then.
    client_ = std::make_unique<internal::ShardClient>(
        std::move(client_options), layout_, options_.shard_addresses, std::move(transports),
        [this](uint32_t shard, const v1::JoinResponse& join) { pushes_->OnRejoined(shard, join); });
    const core::RetryPolicy call_policy = internal::CallRetryPolicy(options_);
    PS_ASSIGN_OR_RETURN(pushes_,
                        internal::PushPipeline::Create(options_, call_policy, layout_, *client_));
    pulls_ = std::make_unique<internal::PullStreams>(call_policy, layout_, *client_);
    return client_->Connect(initial, pushes_->uses_udp(),
                            internal::RpcClock::now() + options_.connect_timeout);
  }

  const core::ModelLayout& layout() const override { return layout_; }
  const std::vector<ShardInfo>& shards() const override { return client_->infos(); }
  uint64_t start_version() const override { return client_->start_version(); }

  absl::Status Push(size_t tensor, uint64_t round, std::span<const float> grad) override {
    return pushes_->Push(tensor, round, grad);
  }

  absl::Status WaitPushes() override { return pushes_->Wait(); }

  absl::Status ReportLoss(uint64_t round, double loss) override {
    return pushes_->ReportLoss(round, loss);
  }
  std::optional<PublishedLoss> published_loss() const override { return pulls_->published_loss(); }

  absl::StatusOr<uint64_t> Pull(size_t tensor, uint64_t min_version, std::span<float> out,
                                std::chrono::milliseconds timeout) override {
    return pulls_->Pull(tensor, min_version, out, timeout);
  }

  absl::StatusOr<uint64_t> PullAll(uint64_t min_version, std::span<const std::span<float>> outs,
                                   std::chrono::milliseconds timeout) override {
    return pulls_->PullAll(min_version, outs, timeout);
  }

  absl::StatusOr<std::unique_ptr<PullTicket>> StartPullAll(
      uint64_t min_version, std::span<const std::span<float>> outs,
      std::chrono::milliseconds timeout) override {
    return pulls_->StartPullAll(min_version, outs, timeout);
  }

  std::string device_note(size_t tensor) const override { return pushes_->device_note(tensor); }

  WorkerStats stats() const override {
    WorkerStats s;
    pushes_->FillStats(s);
    pulls_->FillStats(s);
    s.retries = client_->retries() + pushes_->retries() + pulls_->retries();
    return s;
  }

 private:
  const WorkerOptions options_;
  const core::ModelLayout layout_;
  std::unique_ptr<internal::ShardClient> client_;
  std::unique_ptr<internal::PullStreams> pulls_;
  std::unique_ptr<internal::PushPipeline> pushes_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Worker>> Worker::Start(
    WorkerOptions options, core::ModelLayout layout,
    std::span<const std::span<const float>> initial) {
  auto w = std::make_unique<WorkerImpl>(std::move(options), std::move(layout));
  PS_RETURN_IF_ERROR(w->Init(initial));
  return w;
}

}  // namespace ps
