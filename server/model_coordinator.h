// ModelCoordinator: a shard's model-scope rounds from end to end (docs/aggregators.md,
// "Model scope: exact on a sharded model"), between its slices and its peers.
//
//   SliceClosed -> (rules that measure distances, on the CPU, without state rows: take
//   the slice's ClosedRound and compute its part of the Gram matrix, RoundAggregation::
//   SliceGram, on a job) -> the last owned slice starts the round: Start takes every
//   owned slice's ClosedRound, computes this shard's RoundShare (participants, Gram share
//   from the slices' parts or from their rows), holds the closed rounds, sends the
//   share to the peers and store it -> once a share from every shard is stored: Finish,
//   CombineShares, the rule's plan -> Publish: apply the plan to each held round (or,
//   when it failed or a peer's share is overdue, publish them unchanged), the slices
//   claimed in publish order by the planning job and the pool's idle threads ->
//   ModelRounds::Advance to the next round.
//
// The bookkeeping of the share protocol (which round, whose shares, what is held, when
// the peers are due) is ModelRounds'; the arithmetic RoundAggregation's; this part joins
// them to the slices, the job queue and the counters. Each step runs as an
// AggregationJobs job, never under a lock of the shard's.
//
// Thread-safe: its state is ModelRounds (its own lock) and the closed rounds taken early
// (taken_, under taken_mu_). Borrows the parts in `Parts`, which must outlive it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "aggregators/aggregator.h"
#include "core/clock.h"
#include "server/aggregation_jobs.h"
#include "server/deadline_queue.h"
#include "server/model_rounds.h"
#include "server/round_aggregation.h"
#include "server/shard_counters.h"
#include "server/slice_round.h"
#include "server/slice_table.h"
#include "server/suspicion.h"

namespace ps::server {

class ModelCoordinator {
 public:
  // Publishes a closed round from its aggregate `out` (or, when !st.ok(), the unchanged
  // parameters) and wakes its watchers: the shard's one publishing path.
  using PublishFn =
      std::function<void(ClosedRound round, std::span<const float> aggregate, absl::Status st)>;
  struct Parts {
    SliceTable* table = nullptr;
    RoundAggregation* aggregation = nullptr;
    aggregators::Aggregator* rule = nullptr;
    AggregationJobs* jobs = nullptr;
    ShardCounters* counters = nullptr;
    Suspicion* suspicion = nullptr;
    PublishFn publish;
  };
  // `enabled`: the shard runs in model scope; otherwise every share is refused.
  ModelCoordinator(const ModelRounds::Config& config, core::Clock* clock, DeadlineQueue* deadlines,
                   Parts parts, bool enabled);
  ModelCoordinator(const ModelCoordinator&) = delete;
  ModelCoordinator& operator=(const ModelCoordinator&) = delete;

  // Who sends this shard's share to every peer (on a job thread, without locks held).
  void SetSender(std::function<void(std::shared_ptr<const RoundShare>)> sender);

  // Owned slice `slice_id` closed `round`; the last of them starts the round (on a job).
  // Where RoundAggregation::GramPerSlice(), a job first takes the slice's closed round
  // and computes its part of the Gram matrix, so the round's start sums parts instead of
  // reading every row at the round's tail.
  void SliceClosed(uint32_t slice_id, uint64_t round);

  // A peer's share. Refused (and counted) outside model scope, for another layout, when
  // none is registered, or when ModelRounds refuses it (CheckShare, Store).
  absl::Status AcceptShare(const RoundShare& share);

  // Drops the current round (on a job) when the peers' shares are overdue at `now`.
  void Tick(core::SteadyTime now);
  // When the peers' shares of the current round are due, if they are awaited.
  std::optional<core::SteadyTime> due() const { return rounds_.due(); }
  // Jumps to `round` when behind it (restore, fast-forward).
  void FastForward(uint64_t round) { rounds_.FastForward(round); }

 private:
  // Takes the owned slices' closed rounds, computes, sends and stores this shard's share.
  void Start(uint64_t round);
  // Slice `id`'s closed `round`: the one taken early, else the slice's own.
  std::optional<ClosedRound> TakeClosed(uint32_t id, uint64_t round);
  // Stores a share; a share that completes its round schedules Finish.
  absl::Status Store(std::shared_ptr<const RoundShare> share);
  // Combines the shares of a complete round, plans and publishes.
  void Finish(ModelRounds::Complete complete);
  // Applies `plan` to every held slice with the agreed workers' pushes (or, when it is
  // an error, publishes them unchanged), the slices spread over the pool in publish
  // order, then advances the round.
  void Publish(uint64_t round, const absl::StatusOr<aggregators::RoundPlan>& plan,
               const std::vector<uint32_t>& agreed);
  // One held slice of Publish: applies the plan and publishes it.
  void PublishSlice(ClosedRound& r, const absl::StatusOr<aggregators::RoundPlan>& plan,
                    const std::vector<uint32_t>& agreed);
  // Schedules Finish of `complete`, if there is one.
  void FinishLater(std::optional<ModelRounds::Complete> complete);

  const ModelRounds::Config config_;
  const Parts parts_;
  const bool enabled_;
  ModelRounds rounds_;
  absl::Mutex taken_mu_;
  // Closed rounds taken with their Gram part (SliceClosed), by slice, until Start.
  absl::flat_hash_map<uint32_t, ClosedRound> taken_ ABSL_GUARDED_BY(taken_mu_);
};

}  // namespace ps::server
