// ShardCounters: what a shard counts (ShardStats) and the log lines that go with the
// counts, so that nothing a client can trigger floods the log: refusals by reason (the
// 1st, 2nd, 4th, ... of each at warning, the rest at debug), malformed pushes per
// worker, dropped rounds, rounds closed at their deadline; and the aggregation observer
// (metrics' timing histograms).
//
// Thread-safe: one mutex for the counters, one for the observer; neither is held while
// logging or calling the observer's caller back, and both are taken under no other lock
// of the shard's (they may be taken under a slice's).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "core/clock.h"
#include "core/refusal.h"
#include "server/membership.h"
#include "server/round_aggregation.h"
#include "server/suspicion.h"

namespace ps::server {

// What one worker did on this shard (docs/metrics.md, "Per worker"): one entry per
// worker id, so bounded by --workers.
struct WorkerCounts {
  // Pushes (gRPC or TCP) and UDP chunks taken into a round.
  uint64_t pushes_accepted = 0;
  uint64_t chunks_accepted = 0;
  // Sum over its accepted pushes of the time from their round's opening (its version's
  // publication) to their arrival: the worker's pull, compute and push (ps_worker_push_latency).
  double push_latency_seconds = 0;
  // Its pushes and chunks refused, by reason (late ones among them).
  std::array<uint64_t, static_cast<size_t>(core::Refusal::kCount)> refusals{};
  uint64_t refused(core::Refusal r) const { return refusals[static_cast<size_t>(r)]; }
  // Slice rounds published without any push or chunk of it (missed, or too late).
  uint64_t slice_rounds_missed = 0;
  uint64_t quarantines = 0;
  // How little the rule used its pushes (server/suspicion.h); filled in by Shard::stats().
  WorkerSuspicion suspicion;
};

struct ShardStats {
  uint64_t pushes_accepted = 0;
  // Payload bytes of accepted pushes and UDP chunks as they came on the wire, and the
  // fp32 bytes they decoded to (their ratio is the compression ratio).
  uint64_t push_bytes = 0;
  uint64_t push_decoded_bytes = 0;
  uint64_t rounds_closed = 0;  // slice rounds
  uint64_t rounds_closed_at_deadline = 0;
  // Slice rounds whose deadline passed below the quorum (they wait for it, or in an
  // armed UDP round for one more deadline), and slice rounds published unchanged because
  // fewer than the quorum pushed (the rule never ran; not aggregation errors).
  uint64_t deadlines_below_quorum = 0;
  uint64_t rounds_dropped_below_quorum = 0;
  uint64_t aggregation_errors = 0;
  // Model scope (docs/aggregators.md): rounds aggregated from every shard's share, rounds
  // dropped because a peer's share did not come in time, and peer shares refused.
  uint64_t model_rounds = 0;
  uint64_t model_rounds_dropped = 0;
  uint64_t shares_refused = 0;
  // Compressed-domain aggregation (docs/codecs.md): slice aggregations (or Gram and
  // apply steps) run on a shared random-k support, sign votes on packed bits, and means
  // of 3lc pushes made from their digits.
  uint64_t aggregations_on_support = 0;
  uint64_t sign_votes = 0;
  uint64_t means_of_digits = 0;
  // UDP path (docs/transport.md): chunks accepted, and chunks missing when their round
  // closed (from workers that sent at least one chunk of that slice), which went into
  // the aggregation as masked coordinates.
  uint64_t udp_chunks_accepted = 0;
  uint64_t udp_chunks_lost = 0;
  // Chunks a restarted worker resent under its new session that the round already held
  // from its predecessor (SliceRound::Progress::held_from_before): that copy counts.
  uint64_t udp_chunks_held_from_before = 0;
  uint64_t masked_aggregations = 0;
  // Workers quarantined after a malformed push (server/quarantine.h), each time.
  uint64_t quarantines = 0;
  std::array<uint64_t, static_cast<size_t>(core::Refusal::kCount)> refusals{};
  // Per worker id.
  std::vector<WorkerCounts> workers;
};

// What an aggregation observer (Shard::SetAggregationObserver) is timing.
enum class AggregationStage : int {
  kSlice = 0,   // one slice's round aggregated on its own (slice scope)
  kModelGram,   // model scope: this shard's Gram share of a round, over its owned slices
  kModelApply,  // model scope: the agreed plan applied to one slice
  kModelSliceGram,  // model scope: one slice's part of the Gram matrix, as it closed
  kCount,
};
std::string_view AggregationStageName(AggregationStage stage);

// The totals a stopping shard logs: slice rounds (at the deadline), pushes accepted and
// refused, and in model scope its model rounds and the peer shares it refused.
std::string TotalsLine(const ShardStats& st, bool model_scope);

class ShardCounters {
 public:
  ShardCounters(uint32_t shard_id, uint32_t num_workers);
  ShardCounters(const ShardCounters&) = delete;
  ShardCounters& operator=(const ShardCounters&) = delete;

  // Counts and logs `status` when it carries a refusal (core::RefusalOf); returns it.
  absl::Status Counted(absl::Status status);
  // A push or chunk of `worker_id` refused: counted as above and against the worker, and
  // a malformed one named in a warning (at the worker's 1st, 2nd, 4th, ...).
  absl::Status RefusedPush(uint32_t worker_id, absl::Status status);
  // A peer's share refused (logged at warning: peers are few and authenticated).
  absl::Status RefusedShare(uint32_t from_shard, uint64_t round, absl::Status status);

  // An accepted push (or UDP chunk) of `worker`: its wire bytes, the fp32 bytes it
  // decoded to, and (pushes) the time since its round opened.
  void PushAccepted(uint32_t worker, uint64_t wire_bytes, uint64_t decoded_bytes,
                    core::Duration latency);
  void ChunkAccepted(uint32_t worker, uint64_t wire_bytes, uint64_t decoded_bytes);
  void ChunkHeldFromBefore();
  // `worker` was quarantined for `duration` (logged: once per quarantine and worker).
  void Quarantined(uint32_t worker, core::Duration duration);
  // A round closed once its deadline had passed, by the push that reached the quorum.
  void ClosedAtDeadline();
  // Slice `slice_id`'s round passed its deadline (out.due): counted when it closed then,
  // with its quorum (logged at info the 1st, 2nd, 4th, ... time: on a lossy UDP path most
  // rounds close so), else a warning (the 1st, 2nd, 4th, ...) that it waits for the
  // quorum or, closed below it, will be dropped.
  void DeadlinePassed(uint32_t slice_id, const SliceRound::DeadlineOutcome& out,
                      uint32_t num_workers);
  void Aggregated(const AggregationCounts& counts, uint64_t chunks_lost);
  // A slice's round published; `error` when its aggregation failed or it was below the
  // quorum (IsBelowQuorum; it was published unchanged either way), which is logged at the
  // 1st, 2nd, 4th, ... of each kind. `pushed[w]`: worker w sent something to it (the
  // others missed it, except spares that never joined).
  void Published(uint64_t round, uint32_t slice_id, const absl::Status& error,
                 std::span<const uint8_t> pushed, const Membership& membership);
  // A model round aggregated from every shard's share (its plan may still fail).
  void ModelRoundAggregated();
  // A model round published unchanged (its plan failed, or a peer's share did not come
  // in time), logged with `why`.
  void ModelRoundDropped(uint64_t round, std::string_view why);

  ShardStats Get() const;

  // Hands the time since `start` to the observer, if any (on the aggregating thread).
  void SetObserver(std::function<void(AggregationStage, core::Duration)> observer);
  void Observe(AggregationStage stage, std::chrono::steady_clock::time_point start);

 private:
  // Adds one to the count `count` of stats_; returns the new value.
  uint64_t Bump(uint64_t ShardStats::*count);

  const uint32_t shard_id_;

  mutable absl::Mutex mu_;
  ShardStats stats_ ABSL_GUARDED_BY(mu_);

  absl::Mutex observer_mu_;
  std::function<void(AggregationStage, core::Duration)> observer_ ABSL_GUARDED_BY(observer_mu_);
};

}  // namespace ps::server
