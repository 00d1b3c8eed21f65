// ModelCoordinator: a shard's model-scope rounds from end to end (docs/aggregators.md,
// "Model scope: exact on a sharded model"), between its slices and its peers.
//
//   SliceClosed (last owned slice) -> Start: take every owned slice's ClosedRound, compute
//   this shard's RoundShare (participants, Gram share), hold the closed rounds, send the
//   share to the peers and store it -> once a share from every shard is stored: Finish,
//   CombineShares, the rule's plan -> Publish: apply the plan to each held round (or,
//   when it failed or a peer's share is overdue, publish them unchanged) in publish
//   order -> ModelRounds::Advance to the next round.
//
// The bookkeeping of the share protocol (which round, whose shares, what is held, when
// the peers are due) is ModelRounds'; the arithmetic RoundAggregation's; this part joins
// them to the slices, the job queue and the counters. Each step runs as an
// AggregationJobs job, never under a lock of the shard's.
//
// Thread-safe: no state but ModelRounds (its own lock). Borrows the parts in `Parts`,
// which must outlive it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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
      std::function<void(ClosedRound round, std::vector<float>& out, absl::Status st)>;
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

  // An owned slice closed `round`; the last of them starts the round (on a job).
  void SliceClosed(uint64_t round);

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
  // Stores a share; a share that completes its round schedules Finish.
  absl::Status Store(std::shared_ptr<const RoundShare> share);
  // Combines the shares of a complete round, plans and publishes.
  void Finish(ModelRounds::Complete complete);
  // Applies `plan` to every held slice with the agreed workers' pushes (or, when it is
  // an error, publishes them unchanged), then advances the round.
  void Publish(uint64_t round, const absl::StatusOr<aggregators::RoundPlan>& plan,
               const std::vector<uint32_t>& agreed);
  // Schedules Finish of `complete`, if there is one.
  void FinishLater(std::optional<ModelRounds::Complete> complete);

  const ModelRounds::Config config_;
  const Parts parts_;
  const bool enabled_;
  ModelRounds rounds_;
};

}  // namespace ps::server
