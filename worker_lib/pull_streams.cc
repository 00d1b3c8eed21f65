#include "worker_lib/pull_streams_internal.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/status.h"

namespace ps::internal {
namespace {

// What one pull stream delivered; shared between the channel's callbacks and the
// thread waiting for the stream, so neither outlives what it touches.
struct PullResult {
  explicit PullResult(SharedLinkEstimate* downlink) : timer(downlink) {}

  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);
  std::vector<uint32_t> received ABSL_GUARDED_BY(mu);
  uint64_t min_version ABSL_GUARDED_BY(mu) = UINT64_MAX;
  uint64_t bytes ABSL_GUARDED_BY(mu) = 0;
  uint64_t changes ABSL_GUARDED_BY(mu) = 0;  // slices that came as a compressed change
  BurstTimer timer ABSL_GUARDED_BY(mu);      // the stream's back-to-back runs

  // Waits for the end of the stream and returns its status.
  absl::Status Await() {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&done));
    return status;
  }
};

// One stream's end: each slice goes to its destination after its id, version and size
// were checked (a compressed slice, from a shard with --pull-codec, is applied to what
// HeldModel holds first). A slice that fails the checks ends the stream with INTERNAL
// "shard sent an unexpected or malformed ...". `dst` and `on_slice` must stay valid
// until `result` reports done.
class StreamSink final : public PullSink {
 public:
  StreamSink(HeldModel* held, PublishedLosses* losses, const PullStreams::Destinations* dst,
             const PullStreams::SliceArrived* on_slice, std::shared_ptr<PullResult> result,
             std::vector<uint32_t> asked, uint64_t min_version)
      : held_(held),
        losses_(losses),
        dst_(dst),
        on_slice_(on_slice),
        result_(std::move(result)),
        asked_(std::move(asked)),
        min_version_(min_version) {}

  absl::StatusOr<std::span<char>> Place(const net::PullHeader& h, size_t bytes) override {
    auto it = dst_->find(h.slice_id);
    const bool wanted = it != dst_->end() &&
                        std::find(asked_.begin(), asked_.end(), h.slice_id) != asked_.end();
    if (!wanted || h.version < min_version_) {
      return Malformed(absl::StrCat("slice ", h.slice_id, " (version ", h.version, ", ", bytes,
                                    " bytes)"));
    }
    // Dense values go straight to the caller's buffer (little-endian fp32 is the host's
    // float layout, core/fp32_bytes.h).
    absl::StatusOr<std::span<char>> place = held_->Place(h, bytes, it->second);
    if (!place.ok()) return Malformed(place.status().message());
    return place;
  }

  absl::Status Arrived(const net::PullHeader& h, net::Pieces bytes) override {
    const absl::Status applied = held_->Arrived(h, bytes, dst_->at(h.slice_id));
    if (!applied.ok()) return Malformed(applied.message());
    size_t size = 0;
    for (std::string_view piece : bytes) size += piece.size();
    const double arrived = SteadySeconds();
    {
      absl::MutexLock lock(&result_->mu);
      result_->timer.Arrived(size, h.queued, arrived);
      result_->received.push_back(h.slice_id);
      result_->min_version = std::min(result_->min_version, h.version);
      result_->bytes += size;
      if (!h.codec.empty()) ++result_->changes;
    }
    losses_->Record(h);
    if (*on_slice_) (*on_slice_)(h.slice_id);
    return absl::OkStatus();
  }

  void Done(absl::Status status) override {
    absl::MutexLock lock(&result_->mu);
    result_->timer.End();
    result_->status = std::move(status);
    result_->done = true;
  }

 private:
  static absl::Status Malformed(absl::string_view what) {
    return absl::InternalError(absl::StrCat("shard sent an unexpected or malformed ", what));
  }

  HeldModel* const held_;
  PublishedLosses* const losses_;
  const PullStreams::Destinations* const dst_;
  const PullStreams::SliceArrived* const on_slice_;
  const std::shared_ptr<PullResult> result_;
  const std::vector<uint32_t> asked_;
  const uint64_t min_version_;
};

// A pull running on its own thread, counting per tensor the slices still to come.
class PullTicketImpl final : public PullTicket {
 public:
  using PullFn = std::function<absl::StatusOr<uint64_t>(const PullStreams::SliceArrived&)>;

  PullTicketImpl(const core::ModelLayout& layout, PullStreams::Destinations dst)
      : layout_(layout), dst_(std::move(dst)), arrived_(layout.slices().size(), 0) {
    for (size_t t = 0; t < layout.tensors().size(); ++t) {
      remaining_.push_back(layout.SlicesOfTensor(t).size());
    }
    on_slice_ = [this](uint32_t id) {
      absl::MutexLock lock(&mu_);
      if (arrived_[id]) return;
      arrived_[id] = 1;
      --remaining_[layout_.slices()[id].tensor];
    };
  }

  ~PullTicketImpl() override { Join(); }

  const PullStreams::Destinations& dst() const { return dst_; }

  void Run(PullFn pull) {
    absl::MutexLock lock(&join_mu_);
    thread_ = std::thread([this, pull = std::move(pull)] {
      absl::StatusOr<uint64_t> r = pull(on_slice_);
      absl::MutexLock lock(&mu_);
      result_ = std::move(r);
      done_ = true;
    });
  }

  absl::Status WaitTensor(size_t tensor) override {
    if (tensor >= layout_.tensors().size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("no tensor ", tensor, "; the layout has ", layout_.tensors().size()));
    }
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return remaining_[tensor] == 0 || done_; };
    mu_.Await(absl::Condition(&ready));
    if (remaining_[tensor] == 0) return absl::OkStatus();
    if (!result_.ok()) return result_.status();
    return absl::InternalError(
        absl::StrCat("pull ended without tensor '", layout_.tensors()[tensor].name, "'"));
  }

  bool TensorReady(size_t tensor) const override {
    absl::MutexLock lock(&mu_);
    return tensor < remaining_.size() && remaining_[tensor] == 0;
  }

  absl::StatusOr<uint64_t> Wait() override {
    Join();
    absl::MutexLock lock(&mu_);
    return result_;
  }

 private:
  void Join() {
    absl::MutexLock lock(&join_mu_);
    if (thread_.joinable()) thread_.join();
  }

  const core::ModelLayout& layout_;
  const PullStreams::Destinations dst_;
  PullStreams::SliceArrived on_slice_;
  absl::Mutex join_mu_;
  std::thread thread_ ABSL_GUARDED_BY(join_mu_);
  mutable absl::Mutex mu_;
  std::vector<uint8_t> arrived_ ABSL_GUARDED_BY(mu_);
  std::vector<size_t> remaining_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::StatusOr<uint64_t> result_ ABSL_GUARDED_BY(mu_) = absl::UnknownError("pull still running");
};

}  // namespace

void PublishedLosses::Record(const net::PullHeader& h) {
  if (!h.loss.has_value() || !h.first_loss.has_value()) return;
  absl::MutexLock lock(&mu_);
  Entry& e = by_slice_[h.slice_id];
  if (h.version < e.version) return;  // an older version arriving late
  e = Entry{h.version, *h.loss, *h.first_loss};
}

std::optional<PublishedLoss> PublishedLosses::Latest() const {
  std::vector<float> losses, firsts;
  uint64_t version = 0;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, e] : by_slice_) version = std::max(version, e.version);
    for (const auto& [id, e] : by_slice_) {
      if (e.version != version) continue;
      losses.push_back(e.loss);
      firsts.push_back(e.first_loss);
    }
  }
  if (losses.empty()) return std::nullopt;
  auto median = [](std::vector<float>& v) {
    const size_t mid = v.size() / 2;
    std::nth_element(v.begin(), v.begin() + mid, v.end());
    if (v.size() % 2 == 1) return double{v[mid]};
    const double lower = *std::max_element(v.begin(), v.begin() + mid);
    return (lower + v[mid]) / 2;
  };
  return PublishedLoss{version, median(losses), median(firsts)};
}

absl::StatusOr<uint64_t> PullStreams::Pull(size_t tensor, uint64_t min_version,
                                           std::span<float> out,
                                           std::chrono::milliseconds timeout) {
  if (tensor >= layout_.tensors().size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no tensor ", tensor, "; the layout has ", layout_.tensors().size()));
  }
  Destinations dst;
  PS_RETURN_IF_ERROR(AddDestinations(tensor, out, dst));
  return PullSlices(dst, min_version, timeout);
}

absl::StatusOr<uint64_t> PullStreams::PullAll(uint64_t min_version,
                                              std::span<const std::span<float>> outs,
                                              std::chrono::milliseconds timeout) {
  Destinations dst;
  PS_RETURN_IF_ERROR(AllDestinations(outs, dst));
  return PullSlices(dst, min_version, timeout);
}

absl::StatusOr<std::unique_ptr<PullTicket>> PullStreams::StartPullAll(
    uint64_t min_version, std::span<const std::span<float>> outs,
    std::chrono::milliseconds timeout) {
  Destinations dst;
  PS_RETURN_IF_ERROR(AllDestinations(outs, dst));
  auto ticket = std::make_unique<PullTicketImpl>(layout_, std::move(dst));
  PullTicketImpl* raw = ticket.get();
  raw->Run([this, raw, min_version, timeout](const SliceArrived& on_slice) {
    return PullSlices(raw->dst(), min_version, timeout, on_slice);
  });
  return ticket;
}

PullStreams::PullStreams(core::RetryPolicy policy, const core::ModelLayout& layout,
                         ShardClient& client)
    : policy_(std::move(policy)), layout_(layout), client_(client), held_(layout) {
  for (uint32_t s = 0; s < layout.num_shards(); ++s) {
    downlinks_.push_back(std::make_unique<SharedLinkEstimate>());
  }
}

void PullStreams::FillStats(WorkerStats& stats) const {
  stats.pull_links.clear();
  for (const auto& link : downlinks_) stats.pull_links.push_back(link->Estimate().stats());
  stats.slices_pulled = slices_pulled_.load();
  stats.pull_bytes = pull_bytes_.load();
  stats.slices_pulled_as_change = slices_pulled_as_change_.load();
}

absl::Status PullStreams::AllDestinations(std::span<const std::span<float>> outs,
                                          Destinations& dst) const {
  if (outs.size() != layout_.tensors().size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pulling every tensor needs ", layout_.tensors().size(), " buffers, got ", outs.size()));
  }
  for (size_t t = 0; t < outs.size(); ++t) PS_RETURN_IF_ERROR(AddDestinations(t, outs[t], dst));
  return absl::OkStatus();
}

absl::Status PullStreams::AddDestinations(size_t tensor, std::span<float> out,
                                          Destinations& dst) const {
  const core::TensorSpec& spec = layout_.tensors()[tensor];
  if (out.size() != spec.numel) {
    return absl::InvalidArgumentError(absl::StrCat("buffer for '", spec.name, "' has ", out.size(),
                                                   " elements; expected ", spec.numel));
  }
  for (uint32_t id : layout_.SlicesOfTensor(tensor)) {
    dst[id] = out.data() + layout_.slices()[id].offset;
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> PullStreams::PullSlices(const Destinations& dst, uint64_t min_version,
                                                 std::chrono::milliseconds timeout,
                                                 const SliceArrived& on_slice) {
  const auto deadline = RpcClock::now() + timeout;
  std::set<uint32_t> missing;
  for (const auto& [id, ptr] : dst) missing.insert(id);
  uint64_t version = UINT64_MAX;
  for (int attempt = 0;; ++attempt) {
    std::map<uint32_t, PullAsk> asks;
    for (uint32_t id : missing) asks[layout_.slices()[id].shard].slice_ids.push_back(id);
    std::vector<std::pair<uint32_t, std::shared_ptr<PullResult>>> streams;
    std::map<uint32_t, uint64_t> epochs;
    for (auto& [shard, ask] : asks) {
      ask.layout_hash = layout_.hash();
      ask.min_version = min_version;
      held_.Describe(ask);
      auto result = std::make_shared<PullResult>(downlinks_[shard].get());
      auto sink = std::make_shared<StreamSink>(&held_, &losses_, &dst, &on_slice, result,
                                               ask.slice_ids, min_version);
      epochs[shard] = client_.channel(shard, PushPath::kDataPlane)
                          ->Pull(std::move(ask), deadline, std::move(sink));
      streams.emplace_back(shard, std::move(result));
    }
    // The first failure, unless a later one is final (not retriable): that one.
    absl::Status worst;
    uint32_t worst_shard = 0;
    for (auto& [shard, result] : streams) {
      absl::Status s = result->Await();
      absl::MutexLock lock(&result->mu);
      for (uint32_t id : result->received) missing.erase(id);
      if (!result->received.empty()) version = std::min(version, result->min_version);
      slices_pulled_.fetch_add(result->received.size());
      pull_bytes_.fetch_add(result->bytes);
      slices_pulled_as_change_.fetch_add(result->changes);
      if (!s.ok() && (worst.ok() || !policy_.IsRetriable(s))) {
        worst = s;
        worst_shard = shard;
      }
    }
    if (missing.empty()) return version;
    const std::string context =
        absl::StrCat("pull of ", dst.size(), " slices at version >= ", min_version, " from ",
                     client_.name(worst_shard), " (", missing.size(), " missing)");
    if (worst.ok()) return absl::InternalError(absl::StrCat(context, ": stream ended early"));
    const auto backoff = policy_.Backoff(attempt);
    if (!policy_.ShouldRetry(worst, attempt) || RpcClock::now() + backoff >= deadline) {
      return WithContext(worst, context);
    }
    retries_.fetch_add(1);
    if (CallsForRejoin(worst)) client_.Rejoin(worst_shard, epochs[worst_shard]);
    std::this_thread::sleep_for(backoff);
  }
}

}  // namespace ps::internal
