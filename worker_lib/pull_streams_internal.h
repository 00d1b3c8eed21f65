// PullStreams: Worker::Pull, PullAll and StartPullAll. A pull maps every wanted slice
// to its place in the caller's buffers (the destinations), opens one pull per shard on
// its data-plane DataChannel and has each slice the stream delivers placed straight at
// its destination, after checking id, version and size (a compressed slice, from a
// shard with --pull-codec, is applied to what HeldModel holds first). Slices still missing after a
// retriable failure are asked for again (the policy), re-joining first when the
// session was lost, until the pull's timeout. StartPullAll runs the same on a thread
// of its own and hands out a PullTicket that counts per tensor the slices to come.
//
// Owns nothing across calls but its counters (atomics) and its downlink estimates (one
// per shard, from the arrival times of the messages each stream's shard wrote back to
// back: BurstTimer, link_estimator_internal.h): each pull owns its streams'
// shared results (PullResult: lock `mu`, shared with the channel's callbacks so
// neither outlives what it touches), each ticket its thread and its per-tensor counts
// (lock `mu_`, and `join_mu_` around joining the thread).
//
// Thread safety: every method may be called from any thread, pulls run concurrently.
// Lifetimes: the layout and ShardClient outlive this object; the caller's buffers
// outlive the pull (for a ticket: until Wait() returned or the ticket is destroyed).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/layout.h"
#include "core/retry.h"
#include "net/wire.h"
#include "worker_lib/held_model_internal.h"
#include "worker_lib/link_estimator_internal.h"
#include "worker_lib/shard_client_internal.h"
#include "worker_lib/worker.h"

namespace ps::internal {

// The losses shards publish with each slice (net::PullHeader::loss, first_loss), kept
// per slice with its version. Thread-safe.
class PublishedLosses {
 public:
  void Record(const net::PullHeader& h);
  // The medians over the slices recorded at the highest version (PublishedLoss).
  std::optional<PublishedLoss> Latest() const;

 private:
  struct Entry {
    uint64_t version = 0;
    float loss = 0;
    float first_loss = 0;
  };
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint32_t, Entry> by_slice_ ABSL_GUARDED_BY(mu_);
};

class PullStreams {
 public:
  PullStreams(core::RetryPolicy policy, const core::ModelLayout& layout, ShardClient& client);

  // As the Worker methods of the same names.
  absl::StatusOr<uint64_t> Pull(size_t tensor, uint64_t min_version, std::span<float> out,
                                std::chrono::milliseconds timeout);
  absl::StatusOr<uint64_t> PullAll(uint64_t min_version, std::span<const std::span<float>> outs,
                                   std::chrono::milliseconds timeout);
  absl::StatusOr<std::unique_ptr<PullTicket>> StartPullAll(uint64_t min_version,
                                                           std::span<const std::span<float>> outs,
                                                           std::chrono::milliseconds timeout);

  // Fills the pull counters of `stats` (retries: see retries()).
  void FillStats(WorkerStats& stats) const;
  uint64_t retries() const { return retries_.load(); }
  uint64_t pull_bytes() const { return pull_bytes_.load(); }
  // The downlink from `shard` (< the layout's shards), timed over the streams'
  // back-to-back runs (BurstTimer); not valid before a run was seen.
  LinkCost LinkOf(uint32_t shard) const { return downlinks_[shard]->Estimate(); }
  std::optional<PublishedLoss> published_loss() const { return losses_.Latest(); }

  // Called with each slice id once its values are in place (on a channel's thread).
  using SliceArrived = std::function<void(uint32_t)>;
  // Slice id -> where its first value goes.
  using Destinations = absl::flat_hash_map<uint32_t, float*>;

 private:
  absl::Status AllDestinations(std::span<const std::span<float>> outs, Destinations& dst) const;
  // Maps every slice of `tensor` to its place in `out`, after checking out's size.
  absl::Status AddDestinations(size_t tensor, std::span<float> out, Destinations& dst) const;
  absl::StatusOr<uint64_t> PullSlices(const Destinations& dst, uint64_t min_version,
                                      std::chrono::milliseconds timeout,
                                      const SliceArrived& on_slice = {});

  const core::RetryPolicy policy_;
  const core::ModelLayout& layout_;
  ShardClient& client_;
  HeldModel held_;  // compressed pulls: what this worker holds of each slice
  PublishedLosses losses_;
  std::vector<std::unique_ptr<SharedLinkEstimate>> downlinks_;  // per shard
  std::atomic<uint64_t> slices_pulled_{0}, pull_bytes_{0}, slices_pulled_as_change_{0}, retries_{0};
};

}  // namespace ps::internal
