// Aggregator: a robust aggregation rule, optionally behind a chain of pre-aggregators,
// combining k gradient vectors into one (docs/aggregators.md).
//
// A rule is made from a spec string: pre-aggregators joined by '+' in front of one rule,
// each with optional arguments in parentheses, for example "clip(2)+nnm+trimmed_mean" or
// "bucketing(s=2)+centered_clipping(tau=10, iterations=3)". MakeAggregator() checks the
// spec, n and f, and names the bound that failed.
//
// Two ways to run a rule:
//  - Slice scope: Aggregate() on the coordinates at hand. Exact for coordinate-wise
//    rules; for rules that use distances or norms (NeedsGram()), these are then the
//    distances between the parts of the inputs the call sees.
//  - Model scope, exact on a sharded model: every holder of part of the coordinates
//    adds its part's Gram matrix with AccumulateGram(); the holders sum their partial
//    matrices (they add up over disjoint coordinates) and each calls Plan() on the sum,
//    getting the same RoundPlan; each then calls Apply() on its part.
//
// Ownership: calls borrow inputs, outputs and state for the call only.
// Thread safety: every method is const and may run concurrently (different slices).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/thread_pool.h"

namespace ps::aggregators {

namespace internal {
struct Pipeline;
struct PlanData;
}  // namespace internal

// How many neighbours Krum scores over.
enum class KrumNeighbours {
  kPaper,  // n - f - 2, as in Blanchard et al. (the default)
  kByzFL,  // n - f - 1, as ByzFL computes it
};

// Coordinate-wise median for an even number of inputs.
enum class EvenMedian {
  kMidpoint,  // mean of the two middle values (the default)
  kLower,     // the lower middle value
  kUpper,     // the upper middle value
};

// "paper", "byzfl"; "midpoint", "lower", "upper": the spelling of ps-server's flags.
std::string_view KrumNeighboursName(KrumNeighbours k);
std::string_view EvenMedianName(EvenMedian m);
absl::StatusOr<KrumNeighbours> ParseKrumNeighbours(std::string_view text);
absl::StatusOr<EvenMedian> ParseEvenMedian(std::string_view text);

// Defaults for every stage; arguments in the spec string override them per stage.
struct AggregatorOptions {
  // n: the number of workers, i.e. inputs when everyone pushes.
  int num_workers = 1;
  // f: the number of Byzantine workers tolerated.
  int num_byzantine = 0;
  // Multi-Krum: how many lowest-score inputs to average; 0 means k - f for k inputs.
  int multi_krum_m = 0;
  KrumNeighbours krum_neighbours = KrumNeighbours::kPaper;
  EvenMedian even_median = EvenMedian::kMidpoint;
  // geometric_median (smoothed Weiszfeld): smoothing nu, iteration cap, relative
  // tolerance on the objective.
  double weiszfeld_nu = 0.1;
  int weiszfeld_iterations = 100;
  double weiszfeld_tolerance = 1e-6;
  // centered_clipping: radius tau and iterations L per round.
  double clipping_tau = 100.0;
  int clipping_iterations = 1;
  // mda and smea: the most (n - f)-subsets their exact searches may enumerate.
  uint64_t mda_max_subsets = 1'000'000;
  // bucketing: the seed mixed with the round number for each round's shuffle.
  uint64_t seed = 0;
  // Where the rule computes (docs/gpu.md). kCuda runs the Gram matrix and the pass over
  // the coordinates on the CUDA device when there is one, and on the CPU otherwise
  // (device_note() then says why). Masked inputs run there too; a support in use is
  // gathered on the CPU and the gathered rows aggregated on the device.
  core::Device device = core::Device::kCpu;
};

// What a call aggregates beyond the vectors themselves.
struct AggregationContext {
  uint32_t slice_id = 0;
  uint64_t round = 0;
  // Threads to split coordinates over; nullptr runs on the calling thread. Results do
  // not depend on the pool's size.
  core::ThreadPool* pool = nullptr;
  // Missing coordinates: empty (all present) or one entry per input, nullptr for a
  // complete input, else a bitmap over the coordinates (bit c = byte c / 8, bit c % 8,
  // least significant first) set where the coordinate is present. Coordinate-wise rules
  // use the values present; rules that use distances fill a missing coordinate with the
  // median of the values present there first (docs/aggregators.md, "Masks").
  std::span<const uint8_t* const> masks;
  // The rule's memory for these coordinates, StateRows() x d floats, all zero before the
  // first round, kept by the caller between rounds (centered clipping keeps its centre
  // here). Empty when StateRows() is 0; may be empty for a stateful rule, which then
  // starts from zero every call.
  std::span<float> state;
  // A shared support (compressed-domain aggregation, docs/codecs.md): strictly
  // increasing coordinates outside which every input is zero, as when every worker
  // pushed random-k with the same global seed. Aggregate, AccumulateGram and Apply then
  // read and compute on these coordinates only and write zeros elsewhere. Ignored
  // (the full coordinates are used) with masks, for stateful rules and for
  // sign_majority, whose results depend on the zeros. Empty: no support.
  std::span<const uint32_t> support;
  // The inputs, out and state are CUDA device pointers (an aggregator made with
  // device = kCuda that got its device; docs/gpu.md). Refused with masks or a support
  // (pass those in host memory), and on the CPU; a stateful rule then needs ctx.state.
  // The memory must be written by the time of the call: by work on the legacy default
  // stream (plain cudaMemcpy included; the aggregator's stream waits for it) or on a
  // stream the caller has synchronized. The call returns once out and state are
  // written, and on an error once nothing queued still touches them.
  bool device_memory = false;
  // Influence (docs/aggregators.md, "Influence"): empty, or one entry per input, to which
  // Aggregate and Apply add the input's weight in the output summed over these
  // coordinates: for a linear plan (Krum, CAF, centered clipping, the mean after
  // pre-aggregators) its coefficient times d, exactly; for coordinate-wise rules the
  // weight of the ranks each coordinate keeps, traced back through the pre-aggregators'
  // mixing and estimated on at most 128 coordinates. An input the rule set aside weighs
  // 0; the entries of inputs used equally are equal. Not computed with device_memory
  // (left unchanged), and `out` must then not be one of the inputs.
  std::span<double> influence;
};

// The weights a round's aggregate is made from, derived from the Gram matrix: the same
// on every shard that derived it from the same matrix. Cheap to copy.
class RoundPlan {
 public:
  RoundPlan();
  // k: the number of inputs the plan is for.
  size_t num_inputs() const;
  // The plan's linear step as a rows() x (k + StateRows()) matrix, row-major: row r is
  // sum_j mixing()[r * cols + j] * x_j over the inputs and then the state rows. Rules
  // that select (Krum, Bulyan, MDA) have 0/1 or 1/m entries; an empty matrix means the
  // inputs are used as they are.
  const std::vector<double>& mixing() const;
  size_t rows() const;
  // One line for logs: "krum: input 3" / "bulyan: inputs {0, 2, 5, 7}".
  std::string Describe() const;

 private:
  friend struct internal::Pipeline;
  std::shared_ptr<const internal::PlanData> data_;
};

class Aggregator {
 public:
  ~Aggregator();
  Aggregator(const Aggregator&) = delete;
  Aggregator& operator=(const Aggregator&) = delete;

  // The canonical spec, as given but normalised: "clip(2)+nnm+trimmed_mean".
  std::string_view name() const;
  // Fewest inputs the chain accepts with the configured f (for example 2f + 3 for
  // Krum; with bucketing(s) in front, enough for ceil(k / s) buckets). A server checks
  // its quorum against this at start-up.
  int MinInputs() const;
  // The bound as text, for messages: "n >= 2f + 3".
  std::string_view Bound() const;
  // True when some stage uses distances or norms between whole inputs: on a sharded
  // model only model scope gives the rule as defined.
  bool NeedsGram() const;
  // True when the rule is a majority vote on the signs of the pushes themselves
  // (sign_majority, alone): pushes compressed to signs may then be kept packed and
  // voted on bit by bit (codecs::SignMajorityVote), with the rule's result.
  bool VotesOnSigns() const;
  // True when the chain is the plain mean alone on the CPU (no pre-aggregator, no state):
  // its aggregate of k inputs is ((x_0 + x_1) + ... + x_{k-1}) / k, which a caller holding
  // the inputs in another form may compute itself (codecs::Mean3lc on 3lc pushes), with
  // the rule's bits; AddMeanInfluence then adds the influence Aggregate would.
  bool AveragesInputs() const;
  // What Aggregate of k unmasked inputs over d coordinates adds to ctx.influence for the
  // plain mean: d / k to each of the k entries.
  static void AddMeanInfluence(size_t d, std::span<double> influence);
  // Rows of state kept per coordinate range between rounds (centered clipping: 1).
  size_t StateRows() const;
  // Where the rule computes: "cpu", or the CUDA device ("cuda:0 NVIDIA H100 80GB HBM3
  // (sm_90, 79.1 GiB)").
  std::string_view device() const;
  // Empty, or why device = kCuda was asked for and the CPU computes instead: "device=cuda
  // requested but unavailable (no CUDA device: ...); aggregating on the CPU". Callers log it.
  std::string_view device_note() const;

  // Slice scope: combines inputs (each pointing at out.size() floats) into out. Refuses
  // fewer than MinInputs() inputs. Inputs must be finite where present.
  absl::Status Aggregate(std::span<const float* const> inputs, std::span<float> out,
                         const AggregationContext& ctx) const;

  // Model scope, step 1: adds to `gram` ((k + StateRows())^2 doubles, row-major, the
  // state rows last) the Gram matrix of these coordinates of the inputs and of
  // ctx.state. `d` is the number of coordinates. Masks are honoured as in Aggregate().
  absl::Status AccumulateGram(std::span<const float* const> inputs, size_t d,
                              const AggregationContext& ctx, std::span<double> gram) const;
  // Step 2: the plan for k inputs from the Gram matrix summed over all coordinates
  // (ignored, and may be empty, when !NeedsGram()).
  absl::StatusOr<RoundPlan> Plan(size_t k, std::span<const double> gram, uint64_t round) const;
  // Step 3: applies `plan` to these coordinates; updates ctx.state when StateRows() > 0.
  absl::Status Apply(const RoundPlan& plan, std::span<const float* const> inputs,
                     std::span<float> out, const AggregationContext& ctx) const;

  // Aggregate and Apply without the copy where the aggregate is one of the inputs (the
  // one input a plan's single row weighs 1 with no rule after it: Krum's pick; or the
  // only input of a coordinate rule other than sign_majority, such as the mean of one):
  // `out` is then left unwritten and the result is that input's d floats. Otherwise the
  // result is `out`, written as Aggregate and Apply write it. The values are theirs
  // bit for bit but for one case: a single input's -0 stays -0 here, where the median's
  // and the trimmed mean's sums start at +0.0 and write +0 (docs/aggregators.md,
  // "Picked inputs"). Influence is added as Apply adds it. Never with masks, a shared
  // support in use, state rows, device memory or a device rule: `out` is written then.
  absl::StatusOr<std::span<const float>> AggregateOrPick(std::span<const float* const> inputs,
                                                         std::span<float> out,
                                                         const AggregationContext& ctx) const;
  absl::StatusOr<std::span<const float>> ApplyOrPick(const RoundPlan& plan,
                                                     std::span<const float* const> inputs,
                                                     std::span<float> out,
                                                     const AggregationContext& ctx) const;

 private:
  friend struct internal::Pipeline;
  explicit Aggregator(std::unique_ptr<internal::Pipeline> pipeline);
  // Aggregate and Apply; with `pick` AggregateOrPick and ApplyOrPick.
  absl::StatusOr<std::span<const float>> AggregateTo(std::span<const float* const> inputs,
                                                     std::span<float> out,
                                                     const AggregationContext& ctx,
                                                     bool pick) const;
  absl::StatusOr<std::span<const float>> ApplyTo(const RoundPlan& plan,
                                                 std::span<const float* const> inputs,
                                                 std::span<float> out,
                                                 const AggregationContext& ctx, bool pick) const;
  std::unique_ptr<internal::Pipeline> pipeline_;
};

// The cosine between each input and `out` (an aggregate of them), over at most
// kAlignmentSamples evenly spaced coordinates where the input is present (masks as in
// AggregationContext); NaN where it has none or either side is zero there. How far an
// input pointed with or against what a rule made of it (the server's suspicion scores).
inline constexpr size_t kAlignmentSamples = 1024;
std::vector<double> Alignment(std::span<const float* const> inputs,
                              std::span<const uint8_t* const> masks, std::span<const float> out);
// The coordinates Alignment reads for d: t * stride for t < count. Alignment of the
// inputs' and out's values at just those coordinates, each a row of `count`, gives the
// same bits.
struct AlignmentSampling {
  size_t count = 0;
  size_t stride = 0;
};
AlignmentSampling AlignmentSamplingOf(size_t d);

// Makes the chain described by `spec`. Refuses an unknown stage (listing the known
// ones), a malformed spec or argument, a pre-aggregator in last place, f < 0, and n
// below the chain's bound, with a message naming the bound ("krum needs n >= 2f + 3 = 9,
// got n = 8 (f = 3)").
absl::StatusOr<std::unique_ptr<Aggregator>> MakeAggregator(std::string_view spec,
                                                           const AggregatorOptions& options);

// Rule names accepted as the last stage, in a stable order.
std::vector<std::string> AggregatorNames();
// Pre-aggregator names: clip, arc, nnm, bucketing.
std::vector<std::string> PreAggregatorNames();

}  // namespace ps::aggregators
