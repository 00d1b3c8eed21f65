// ps::Worker's front: checks the arguments of Start and wires the parts together, in
// the manner of LevelDB's DBImpl over its VersionSet and log::Writer. The parts, each
// with its own header, locks and tests (docs/architecture.md, "Inside ps::Worker"):
//   ShardClient   (shard_client_internal.h)   sessions: join, rejoin, layout, slices
//   PushPipeline  (push_pipeline_internal.h)  encode, P3 queue, credit, retry, replay, chunks
//   PullStreams   (pull_streams_internal.h)   pull streams, destinations, PullTicket
// They reach the shards through ShardControl (transport/shard_control.h) and a
// DataChannel per path (transport/data_channel.h), made by the list in
// transport/channels.h: gRPC (transport/grpc/) and the UDP path (transport/udp/).
#include "worker_lib/worker.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "worker_lib/pull_streams_internal.h"
#include "worker_lib/push_pipeline_internal.h"
#include "worker_lib/push_planner_internal.h"
#include "worker_lib/shard_client_internal.h"
#include "worker_lib/slice_size_internal.h"
#include "worker_lib/transport/channels.h"

namespace ps {
namespace {

// A pull ticket whose Wait() also reports the pull's end (Espresso's round clock).
class TimedTicket final : public PullTicket {
 public:
  using OnEnd = std::function<absl::StatusOr<uint64_t>(absl::StatusOr<uint64_t>)>;
  TimedTicket(std::unique_ptr<PullTicket> inner, OnEnd on_end)
      : inner_(std::move(inner)), on_end_(std::move(on_end)) {}
  absl::Status WaitTensor(size_t tensor) override { return inner_->WaitTensor(tensor); }
  bool TensorReady(size_t tensor) const override { return inner_->TensorReady(tensor); }
  absl::StatusOr<uint64_t> Wait() override {
    absl::StatusOr<uint64_t> v = inner_->Wait();
    // Once: a second Wait returns the same without timing the round again.
    if (!reported_.exchange(true)) return on_end_(std::move(v));
    return v;
  }

 private:
  std::unique_ptr<PullTicket> inner_;
  OnEnd on_end_;
  std::atomic<bool> reported_{false};
};

// INVALID_ARGUMENT unless `values` holds one span per tensor of `layout`'s sizes.
absl::Status CheckSizesOf(const core::ModelLayout& layout,
                          std::span<const std::span<const float>> values, const char* what) {
  if (values.size() != layout.tensors().size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " for ", values.size(),
                                                   " tensors; the layout has ",
                                                   layout.tensors().size()));
  }
  for (size_t t = 0; t < values.size(); ++t) {
    if (values[t].size() != layout.tensors()[t].numel) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": tensor '", layout.tensors()[t].name, "' has ", values[t].size(),
                       " elements; the layout says ", layout.tensors()[t].numel));
    }
  }
  return absl::OkStatus();
}

class WorkerImpl final : public Worker {
 public:
  WorkerImpl(WorkerOptions options, core::ModelLayout layout)
      : options_(std::move(options)), layout_(std::move(layout)) {}

  // The pipeline goes first (it waits for its calls), then the pulls, then the client
  // with the channels they used; the members' order would do the same. A transport may
  // read a borrowed push's bytes (PushOptions::borrow) until its channel is gone, so
  // the caller's buffers are free only once the last of their guards went with it.
  ~WorkerImpl() override {
    std::shared_ptr<internal::BorrowCount> borrows =
        pushes_ != nullptr ? pushes_->borrows() : nullptr;
    planner_.reset();
    pushes_.reset();
    pulls_.reset();
    client_.reset();
    if (borrows != nullptr) borrows->AwaitNone();
  }

  // `links`: ConnectShards(options_)'s.
  absl::Status Init(std::span<const std::span<const float>> initial,
                    std::vector<internal::ShardLink> links) {
    internal::ShardClient::Options client_options;
    client_options.worker_id = options_.worker_id;
    client_options.rpc_timeout = options_.rpc_timeout;
    client_options.join_policy = internal::JoinRetryPolicy(options_);
    client_options.data_plane = options_.data_plane;
    client_options.run_id = options_.run_id;
    client_options.may_register = options_.may_register;
    // Rejoins happen only once Init is done, so the pipeline exists by then.
    client_ = std::make_unique<internal::ShardClient>(
        std::move(client_options), layout_, options_.shard_addresses, std::move(links),
        [this](uint32_t shard, const v1::JoinResponse& join) { pushes_->OnRejoined(shard, join); });
    const core::RetryPolicy call_policy = internal::CallRetryPolicy(options_);
    PS_ASSIGN_OR_RETURN(pushes_,
                        internal::PushPipeline::Create(options_, call_policy, layout_, *client_));
    pulls_ = std::make_unique<internal::PullStreams>(call_policy, layout_, *client_);
    if (options_.plan.enabled) {
      PS_ASSIGN_OR_RETURN(std::vector<internal::PlanOption> candidates,
                          internal::PushPlanner::MakeCandidates(options_.plan, layout_));
      std::vector<std::string> current;
      std::vector<core::Device> devices;
      for (const core::TensorSpec& t : layout_.tensors()) {
        auto it = options_.tensor_push.find(t.name);
        const PushOptions& push = it != options_.tensor_push.end() ? it->second : options_.push;
        current.push_back(push.codec);
        devices.push_back(push.device);
      }
      planner_ = std::make_unique<internal::PushPlanner>(options_.plan, options_.objective,
                                                         layout_, std::move(candidates),
                                                         std::move(current), std::move(devices));
    }
    return client_->Connect(initial, internal::RpcClock::now() + options_.connect_timeout);
  }

  absl::Status CheckSizes(std::span<const std::span<const float>> values,
                          const char* what) const {
    return CheckSizesOf(layout_, values, what);
  }

  const core::ModelLayout& layout() const override { return layout_; }
  const std::vector<ShardInfo>& shards() const override { return client_->infos(); }
  uint64_t start_version() const override { return client_->start_version(); }

  absl::Status Push(size_t tensor, uint64_t round, std::span<const float> grad) override {
    if (planner_ != nullptr && tensor < layout_.tensors().size() &&
        planner_->PushQueued(tensor, round)) {
      Replan(round);
    }
    return pushes_->Push(tensor, round, grad);
  }

  absl::Status SetLearningRate(size_t tensor, double lr) override {
    return pushes_->SetLearningRate(tensor, lr);
  }

  absl::StatusOr<uint64_t> PutObject(std::string_view key, std::string_view value) override {
    return client_->PutObject(/*shard=*/0, key, value);
  }

  absl::StatusOr<StoredObject> GetObject(uint32_t owner, std::string_view key, uint64_t min_version,
                                         std::chrono::milliseconds timeout) override {
    const auto deadline = internal::RpcClock::now() + timeout;
    const core::RetryPolicy policy = internal::JoinRetryPolicy(options_);
    uint64_t seen = 0;
    for (int attempt = 0;; ++attempt) {
      const auto backoff = policy.Backoff(attempt);
      absl::StatusOr<v1::GetObjectResponse> got = client_->GetObject(0, owner, key);
      if (got.ok() && got->version() >= min_version) {
        return StoredObject{got->version(), std::move(*got->mutable_value())};
      }
      if (!got.ok() && got.status().code() != absl::StatusCode::kNotFound) return got.status();
      if (got.ok()) seen = got->version();
      if (internal::RpcClock::now() + backoff >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "worker ", owner, "'s object '", core::AsAbsl(key), "' did not reach version ",
            min_version, " within ", timeout.count(), " ms (",
            seen == 0 ? std::string("none stored") : absl::StrCat("version ", seen), ")"));
      }
      std::this_thread::sleep_for(backoff);
    }
  }

  absl::Status Leave(std::chrono::milliseconds timeout) override {
    return client_->Leave(internal::RpcClock::now() + timeout);
  }

  absl::Status Adopt(uint64_t round, uint32_t root, std::span<const std::span<const float>> values,
                     std::chrono::milliseconds timeout) override {
    const uint32_t workers = client_->infos().empty() ? 1 : client_->infos()[0].num_workers;
    if (root >= workers) {
      return absl::InvalidArgumentError(absl::StrCat("root ", root, " outside [0, ", workers, ")"));
    }
    if (!values.empty()) {
      if (root != options_.worker_id) {
        return absl::InvalidArgumentError(absl::StrCat(
            "worker ", options_.worker_id, " passed values to adopt, but the root is worker ",
            root, ": only the root uploads its values"));
      }
      PS_RETURN_IF_ERROR(CheckSizes(values, "values to adopt"));
    } else if (root == options_.worker_id) {
      return absl::InvalidArgumentError(
          "this worker is the root of the adoption and passed no values to adopt");
    }
    return client_->Adopt(round, root, values, internal::RpcClock::now() + timeout);
  }

  absl::Status WaitPushes() override { return pushes_->Wait(); }

  absl::Status ReportLoss(uint64_t round, double loss) override {
    return pushes_->ReportLoss(round, loss);
  }
  std::optional<PublishedLoss> published_loss() const override { return pulls_->published_loss(); }

  absl::StatusOr<uint64_t> Pull(size_t tensor, uint64_t min_version, std::span<float> out,
                                std::chrono::milliseconds timeout) override {
    return Pulled(min_version, out.size(), pulls_->Pull(tensor, min_version, out, timeout));
  }

  absl::StatusOr<uint64_t> PullAll(uint64_t min_version, std::span<const std::span<float>> outs,
                                   std::chrono::milliseconds timeout) override {
    return Pulled(min_version, layout_.total_elems(), pulls_->PullAll(min_version, outs, timeout));
  }

  absl::StatusOr<std::unique_ptr<PullTicket>> StartPullAll(
      uint64_t min_version, std::span<const std::span<float>> outs,
      std::chrono::milliseconds timeout) override {
    PS_ASSIGN_OR_RETURN(std::unique_ptr<PullTicket> ticket,
                        pulls_->StartPullAll(min_version, outs, timeout));
    if (planner_ == nullptr) return ticket;
    return std::unique_ptr<PullTicket>(
        new TimedTicket(std::move(ticket), [this, min_version](absl::StatusOr<uint64_t> v) {
          return Pulled(min_version, layout_.total_elems(), std::move(v));
        }));
  }

  std::string device_note(size_t tensor) const override { return pushes_->device_note(tensor); }

  WorkerStats stats() const override {
    WorkerStats s;
    pushes_->FillStats(s);
    pulls_->FillStats(s);
    s.retries = client_->retries() + pushes_->retries() + pulls_->retries();
    s.plan = plan_stats();
    return s;
  }

  PlanStats plan_stats() const override {
    return planner_ != nullptr ? planner_->stats() : PlanStats{};
  }

 private:
  // Espresso (PlanOptions): a pull of `min_version` (`values` values) ended with
  // `result`; its end starts round min_version's clock (the gradients' ready times are
  // counted from it).
  absl::StatusOr<uint64_t> Pulled(uint64_t min_version, uint64_t values,
                                  absl::StatusOr<uint64_t> result) {
    if (planner_ == nullptr || !result.ok()) return result;
    values_pulled_ += values;
    planner_->PullTotals(pulls_->pull_bytes(), values_pulled_);
    planner_->RoundStarted(min_version);
    return result;
  }

  // At a round's first push: plans when a plan is due and sets the tensors' codecs and
  // encode devices.
  void Replan(uint64_t round) {
    auto link = [](const internal::LinkCost& c) {
      return internal::PlanLink{c.valid ? c.alpha_seconds : 0, c.valid ? c.seconds_per_byte : 0};
    };
    std::vector<internal::PlanLink> up, down;
    for (uint32_t s = 0; s < layout_.num_shards(); ++s) {
      up.push_back(link(pushes_->LinkOf(s)));
      down.push_back(link(pulls_->LinkOf(s)));
    }
    const uint32_t workers = client_->infos().empty() ? 1 : client_->infos()[0].num_workers;
    std::optional<std::vector<internal::PlanOption>> plan =
        planner_->Replan(round, up, workers, down);
    if (!plan.has_value()) return;
    // The candidates were made once at Start, so setting them cannot fail.
    for (size_t t = 0; t < plan->size(); ++t) {
      pushes_->SetCodec(t, (*plan)[t].name, (*plan)[t].device).IgnoreError();
    }
  }

  const WorkerOptions options_;
  const core::ModelLayout layout_;
  std::unique_ptr<internal::ShardClient> client_;
  std::unique_ptr<internal::PullStreams> pulls_;
  std::unique_ptr<internal::PushPipeline> pushes_;
  std::unique_ptr<internal::PushPlanner> planner_;  // PlanOptions::enabled
  std::atomic<uint64_t> values_pulled_{0};          // requested by the pulls so far
};

}  // namespace

namespace {

// Start's checks of the arguments, before anything connects.
absl::Status CheckStart(const WorkerOptions& options, const core::ModelLayout& layout,
                        std::span<const std::span<const float>> initial) {
  if (options.shard_addresses.size() != layout.num_shards()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the layout is cut for ", layout.num_shards(), " shards but ",
                     options.shard_addresses.size(), " shard addresses were given"));
  }
  return initial.empty() ? absl::OkStatus() : CheckSizesOf(layout, initial, "initial values");
}

absl::StatusOr<std::unique_ptr<Worker>> StartWith(WorkerOptions options,
                                                  core::ModelLayout layout,
                                                  std::span<const std::span<const float>> initial,
                                                  std::vector<internal::ShardLink> links) {
  auto w = std::make_unique<WorkerImpl>(std::move(options), std::move(layout));
  PS_RETURN_IF_ERROR(w->Init(initial, std::move(links)));
  return w;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Worker>> Worker::Start(
    WorkerOptions options, core::ModelLayout layout,
    std::span<const std::span<const float>> initial) {
  PS_RETURN_IF_ERROR(CheckStart(options, layout, initial));
  PS_ASSIGN_OR_RETURN(std::vector<internal::ShardLink> links, internal::ConnectShards(options));
  return StartWith(std::move(options), std::move(layout), initial, std::move(links));
}

absl::StatusOr<std::unique_ptr<Worker>> Worker::Start(
    WorkerOptions options, std::vector<core::TensorSpec> tensors, uint32_t slice_elems,
    std::span<const std::span<const float>> initial) {
  const auto shards = static_cast<uint32_t>(options.shard_addresses.size());
  if (slice_elems != kJobSliceElems) {
    PS_ASSIGN_OR_RETURN(core::ModelLayout layout,
                        core::ModelLayout::Create(std::move(tensors), slice_elems, shards));
    return Start(std::move(options), std::move(layout), initial);
  }
  // The tensors are checked before anything connects (with the default size: whether
  // they pass does not depend on it beyond the slice count).
  PS_ASSIGN_OR_RETURN(core::LayoutSummary summary,
                      core::ModelLayout::Check(tensors, core::kDefaultSliceElems, shards));
  for (int attempt = 0;; ++attempt) {
    PS_ASSIGN_OR_RETURN(std::vector<internal::ShardLink> links, internal::ConnectShards(options));
    PS_ASSIGN_OR_RETURN(
        internal::JobSliceElems job,
        internal::ResolveJobSliceElems(*links[0].control, options, summary.total_elems,
                                       internal::RpcClock::now() + options.connect_timeout));
    PS_ASSIGN_OR_RETURN(core::ModelLayout layout,
                        core::ModelLayout::Create(tensors, job.slice_elems, shards));
    PS_RETURN_IF_ERROR(CheckStart(options, layout, initial));
    absl::StatusOr<std::unique_ptr<Worker>> w =
        StartWith(options, std::move(layout), initial, std::move(links));
    // Another worker registered another size between this one's look and its join.
    if (w.ok() || job.adopted || attempt > 0 ||
        core::RefusalOf(w.status()) != core::Refusal::kLayoutMismatch) {
      return w;
    }
  }
}

}  // namespace ps
