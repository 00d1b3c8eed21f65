// RoundAggregation: what a shard computes from closed rounds, and nothing else: the rule
// over the pushes (or a vote on packed sign bits), the compressed-domain glue the rule is
// given (a shared random-k support, masks of lost UDP chunks), the model-scope steps
// (Gram share, Apply of an agreed plan) and the optimizer's step that turns an aggregate
// into the next published values.
//
// The codecs and the rule say what they can do (codecs::SharedStructure,
// Aggregator::VotesOnSigns, StateRows): nothing here knows a rule or a codec by name.
//
// No lock and no state of its own: a ClosedRound is owned by its aggregation, and the
// rule's per-slice memory travels in it (ClosedRound::model.rule_state). Calls for
// different closed rounds may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "aggregators/aggregator.h"
#include "core/scratch.h"
#include "core/thread_pool.h"
#include "server/optimizer.h"
#include "server/slice_round.h"

namespace ps::server {

// How the aggregations went (ShardStats adds them up).
struct AggregationCounts {
  uint64_t on_support = 0;  // on a shared random-k support
  uint64_t sign_votes = 0;  // a vote on packed sign bits
  uint64_t masked = 0;      // slice scope, with lost UDP chunks masked
  uint64_t means_of_digits = 0;  // the mean of 3lc pushes made from their digits
};

// Each input's weight in a slice round's aggregate (aggregators::AggregationContext::
// influence) by the worker that pushed it; empty when the round reports none (a vote on
// packed sign bits).
// With each input's alignment with the aggregate (aggregators::Alignment).
struct InputWeights {
  std::vector<uint32_t> workers;
  std::vector<double> influence;
  std::vector<double> alignment;
};

// The refusal of a round with fewer inputs than the quorum (RoundAggregation::CheckQuorum):
// the round is published unchanged and counted as dropped below the quorum, not as an
// aggregation error.
absl::Status BelowQuorum(std::string_view message);
bool IsBelowQuorum(const absl::Status& status);

// The floats a slice's aggregate is written into: the calling thread's own buffer,
// reused from slice to slice and not zeroed (every rule writes each coordinate of its
// output: AggregatorTest.EveryCoordinateOfTheOutputIsWritten), or one of its own when
// the thread's is in use further up its stack. A zeroed vector made and freed per slice
// was 1% of a 1 x 1 fp32 round's CPU (docs/bench.md, "The aggregate's buffer kept").
// Lives on the stack of the thread that made it.
class AggregateBuffer {
 public:
  explicit AggregateBuffer(size_t numel);

  // numel floats, their values unspecified until written.
  std::span<float> values() const { return values_; }

 private:
  struct Tag;
  core::ThreadRows<Tag> rows_;  // kept whatever their size, as before
  std::span<float> values_;
};

class RoundAggregation {
 public:
  // Borrows `rule` and `pool`, which must outlive this. `quorum`: the fewest inputs any
  // round is aggregated with (Shard::quorum(); at least the rule's MinInputs()).
  RoundAggregation(aggregators::Aggregator* rule, core::ThreadPool* pool, SgdOptions sgd,
                   bool aggregate_only, uint32_t quorum);

  uint32_t quorum() const { return quorum_; }
  // OK when `inputs` reach the quorum, else BelowQuorum naming `what` and the counts. The
  // one gate both scopes pass before the rule runs: no rule ever sees fewer inputs.
  absl::Status CheckQuorum(size_t inputs, std::string_view what) const;

  // Slice scope: the rule over every push of `round` (a sign vote when each push is
  // packed signs and the rule votes on signs; the plain mean of pushes all kept as 3lc
  // from their digits, MeanOfDigits). The aggregate: `out` (numel values),
  // written, or one of the round's rows where the aggregate is that row (the mean of one
  // push, Aggregator::AggregateOrPick), valid while `round` and `scratch` live. Kept
  // pushes are decoded into `scratch`'s rows, or without one into the workers' own.
  // BelowQuorum, the rule not run, when fewer than the quorum pushed; INTERNAL when the
  // aggregate written into `out` is not finite (inputs overflowed).
  // `weights`, if given, receives each input's weight in the aggregate.
  absl::StatusOr<std::span<const float>> Aggregate(ClosedRound& round, std::span<float> out,
                                                   AggregationCounts* counts,
                                                   InputWeights* weights = nullptr,
                                                   RowScratch* scratch = nullptr);

  // Model scope: the workers whose push every one of `rounds` took (increasing).
  std::vector<uint32_t> Participants(std::span<const ClosedRound> rounds,
                                     uint32_t num_workers) const;
  // Whether a slice's part of the Gram matrix may be computed as the slice closes,
  // before the round's participants are known (SliceGram): the rule measures distances,
  // on the CPU, and keeps no state rows. The part is then of every worker that pushed;
  // an entry of the Gram matrix depends on its two rows alone (the same bits in a Gram
  // of fewer rows), so the participants' entries are those the round's start computes.
  bool GramPerSlice() const;
  // Sets round.gram_part when GramPerSlice() and the slice's pushes are whole and dense
  // (no masked chunks, no shared random-k support); else leaves it, and AccumulateGram
  // computes the slice's part as before. A part the rule refuses (too few pushes) is
  // left to AccumulateGram too, which reports it.
  void SliceGram(ClosedRound& round) const;
  // Adds the Gram matrix of `participants`' pushes (then the rule's state rows) over
  // `rounds` to `gram` ((participants + state rows)^2, row-major), slice by slice: a
  // slice's gram_part where it has one (its participants' entries, when they share no
  // random-k support), else computed here.
  absl::Status AccumulateGram(std::span<ClosedRound> rounds, std::span<const uint32_t> participants,
                              std::vector<double>& gram, AggregationCounts* counts);
  // Applies an agreed plan to one slice's pushes of `agreed` workers; the aggregate
  // (`out`, or the row of Krum's pick, valid while `round` lives) and `weights` as in
  // Aggregate.
  absl::StatusOr<std::span<const float>> Apply(const aggregators::RoundPlan& plan,
                                               ClosedRound& round,
                                               std::span<const uint32_t> agreed,
                                               std::span<float> out, AggregationCounts* counts,
                                               InputWeights* weights = nullptr);

  // The pool a rule may spread one slice's coordinates over: none below
  // kPooledSliceElems. The shard already aggregates its slices side by side (each on the
  // job its last push or the plan started), and a default slice of 2^16 coordinates is
  // four of the rules' 16384-coordinate blocks: waking another pool thread for one cost
  // about what the block's work does (1 x 1 fp32 moved 1.05x as much without, docs/bench.md,
  // "One slice, one thread"). Model scope's Gram at the round's start still spreads each
  // slice's rows over the pool, the one place a single job walks every slice.
  core::ThreadPool* OneSlicePool(const ClosedRound& round) const;

  // What a round publishes: the values, and with --pull-codec the change from the last
  // version, encoded (null: none).
  struct Publication {
    std::shared_ptr<const std::string> values;
    std::shared_ptr<const std::string> delta_payload;
  };
  // The values to publish for `round` from its aggregate (finite: Aggregate and Apply
  // refuse one that is not): the parameters after an SGD step, or the aggregate itself
  // with --aggregate-only. After an error (`st`) the parameters stay as they were (zeros
  // with --aggregate-only), and `aggregate` is not read. With --pull-codec the values
  // are what the workers hold once they applied the encoded change (server/pull_delta.h).
  Publication Step(ClosedRound& round, std::span<const float> aggregate, absl::Status& st) const;

 private:
  // The plain mean of `workers`' pushes, each kept as a 3lc payload (`payloads`, in the
  // same order), into `out` from their digits (codecs::Mean3lc): the rule's bits without
  // decoding a row, and `weights` as the rule would give them (the mean's influence, and
  // the alignment from the values it samples, read from the digits).
  absl::StatusOr<std::span<const float>> MeanOfDigits(const ClosedRound& round,
                                                      std::span<const uint32_t> workers,
                                                      std::span<const std::string_view> payloads,
                                                      std::span<float> out,
                                                      InputWeights* weights) const;
  // The optimizer's step of `round`'s model with the aggregate `out` (the slice's
  // tensor's optimizer, else the shard's SGD), at the learning rate the round's pushes
  // carried (their median) or the configured one; the new parameters also into `copy_to`.
  void StepModel(ClosedRound& round, std::span<const float> out, std::span<float> copy_to) const;
  // The rule's context for `workers` of `round` (its pool OneSlicePool's); `masks` and
  // `support` must outlive it.
  // `weights`, if given, is sized for `workers` and receives their influence.
  aggregators::AggregationContext ContextOf(ClosedRound& round, std::span<const uint32_t> workers,
                                            const InputMasks& masks,
                                            const std::vector<uint32_t>& support,
                                            AggregationCounts* counts,
                                            InputWeights* weights = nullptr) const;

  // Slices of at least this many coordinates (64 of the rules' blocks) are spread over
  // the pool (OneSlicePool).
  static constexpr uint32_t kPooledSliceElems = uint32_t{1} << 20;

  aggregators::Aggregator* const rule_;
  core::ThreadPool* const pool_;
  const SgdOptions sgd_;
  const bool aggregate_only_;
  const uint32_t quorum_;
};

}  // namespace ps::server
