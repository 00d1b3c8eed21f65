#include "server/pull_scheduler.h"

#include <algorithm>
#include <set>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "server/metrics.h"

namespace ps::server {

// The scheduler's mutable state, behind a mutex in a block that watch callbacks hold
// weakly: it outlives the scheduler while a callback runs.
struct PullScheduler::State {
  absl::Mutex mu;
  const Shard* shard = nullptr;
  PullSink* sink ABSL_GUARDED_BY(mu) = nullptr;  // null before Start and once detached
  // (priority, arrival, slice); the priority is 0 for everything under --schedule=fifo.
  std::set<std::tuple<int32_t, uint64_t, uint32_t>> ready ABSL_GUARDED_BY(mu);
  uint64_t arrivals ABSL_GUARDED_BY(mu) = 0;
  size_t remaining ABSL_GUARDED_BY(mu) = 0;  // slices not yet written
  size_t in_flight ABSL_GUARDED_BY(mu) = 0;  // Writes not yet done
  size_t window ABSL_GUARDED_BY(mu) = 1;     // the sink's writes_in_flight()
  bool registering ABSL_GUARDED_BY(mu) = true;  // Start() is adding watches
  bool finished ABSL_GUARDED_BY(mu) = false;
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  bool shutting_down ABSL_GUARDED_BY(mu) = false;
  absl::flat_hash_map<uint32_t, uint64_t> held;  // slice -> version the worker holds
  Metrics* metrics = nullptr;                    // may be null
  const std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();

  void OnReady(uint32_t id, int32_t priority, bool ok) {
    absl::MutexLock lock(&mu);
    if (sink == nullptr || finished) return;
    if (!ok) {
      shutting_down = true;
    } else {
      ready.emplace(priority, arrivals++, id);
    }
    if (!registering) NextLocked(/*after_write=*/false);
  }

  // Starts writes while the sink takes more, or finishes when nothing is left to do.
  // `after_write`: a write just completed, so a slice written now was waiting for the
  // link (as is one handed to the sink behind a write still in flight).
  void NextLocked(bool after_write) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (finished || sink == nullptr) return;
    if (cancelled) {
      if (in_flight == 0) FinishLocked(absl::CancelledError("pull cancelled"));
      return;
    }
    while (!ready.empty() && in_flight < window) {
      const uint32_t id = std::get<2>(*ready.begin());
      ready.erase(ready.begin());
      SliceSnapshot snap = shard->Snapshot(id);
      PullItem item{.header = {{.slice_id = id,
                                .version = snap.version,
                                .epoch = shard->pull_epoch(),
                                .loss = snap.loss,
                                .first_loss = snap.first_loss,
                                .queued = after_write || in_flight > 0}},
                    .body = std::move(snap.values)};
      if (snap.delta != nullptr && snap.delta->version == snap.version) {
        auto it = held.find(id);
        if (it != held.end() && it->second == snap.delta->base_version) {
          item.header.codec = shard->pull_codec();
          item.header.base_version = snap.delta->base_version;
          item.body = snap.delta->payload;
        }
      }
      --remaining;
      if (metrics != nullptr) metrics->ObservePullBytes(item.body->size());
      ++in_flight;
      sink->Write(std::move(item));
    }
    if (in_flight > 0 || !ready.empty()) return;
    if (remaining == 0) {
      FinishLocked(absl::OkStatus());
    } else if (shutting_down) {
      FinishLocked(absl::UnavailableError("shard is shutting down"));
    }
  }

  void FinishLocked(const absl::Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (finished || sink == nullptr) return;
    finished = true;
    if (metrics != nullptr) metrics->ObservePull(std::chrono::steady_clock::now() - start);
    sink->Finish(s);
  }
};

PullScheduler::PullScheduler(Shard* shard, std::vector<uint32_t> slice_ids, uint64_t min_version,
                             uint64_t held_epoch, const std::vector<uint64_t>& held_versions,
                             Metrics* metrics)
    : shard_(shard), slice_ids_(std::move(slice_ids)), min_version_(min_version) {
  state_ = std::make_shared<State>();
  state_->shard = shard;
  state_->metrics = metrics;
  absl::MutexLock lock(&state_->mu);
  state_->remaining = slice_ids_.size();
  // What the worker holds (compressed pulls): a slice whose change applies to it goes out
  // as that change.
  if (shard->pull_epoch() != 0 && held_epoch == shard->pull_epoch()) {
    for (size_t k = 0; k < held_versions.size() && k < slice_ids_.size(); ++k) {
      state_->held.emplace(slice_ids_[k], held_versions[k]);
    }
  }
}

PullScheduler::~PullScheduler() {
  {
    absl::MutexLock lock(&state_->mu);
    state_->sink = nullptr;
  }
  for (const auto& [slice, watch] : watches_) shard_->Unwatch(slice, watch);
}

void PullScheduler::Start(PullSink* sink) {
  {
    absl::MutexLock lock(&state_->mu);
    state_->sink = sink;
    state_->window = std::max<size_t>(1, sink->writes_in_flight());
  }
  watches_.reserve(slice_ids_.size());
  for (uint32_t id : slice_ids_) {
    std::weak_ptr<State> weak = state_;
    const int32_t priority = shard_->priority_schedule() ? shard_->SlicePriority(id) : 0;
    const uint64_t watch = shard_->Watch(id, min_version_, [weak, id, priority](bool ok) {
      if (auto st = weak.lock()) st->OnReady(id, priority, ok);
    });
    if (watch != 0) watches_.emplace_back(id, watch);
  }
  // Writing starts once every watch is registered: the slices ready at the start then go
  // out most urgent first, and all but the first as queued behind it.
  absl::MutexLock lock(&state_->mu);
  state_->registering = false;
  state_->NextLocked(/*after_write=*/false);
}

void PullScheduler::WriteDone(bool ok) {
  absl::MutexLock lock(&state_->mu);
  --state_->in_flight;
  if (!ok) {
    state_->FinishLocked(absl::CancelledError("pull stream broken"));
    return;
  }
  state_->NextLocked(/*after_write=*/true);
}

void PullScheduler::Cancel() {
  absl::MutexLock lock(&state_->mu);
  state_->cancelled = true;
  if (state_->in_flight == 0) state_->FinishLocked(absl::CancelledError("pull cancelled"));
}

}  // namespace ps::server
