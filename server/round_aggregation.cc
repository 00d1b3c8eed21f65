#include "server/round_aggregation.h"

#include <algorithm>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "codecs/compressed.h"
#include "core/fp32_bytes.h"
#include "core/status.h"
#include "server/snapshot_pool.h"
#include "spdlog/spdlog.h"

namespace ps::server {

AggregateBuffer::AggregateBuffer(size_t numel) : values_(rows_.Take(0, numel)) {}

namespace {

// The payload that marks a BelowQuorum status.
constexpr std::string_view kBelowQuorumUrl = "ps.server/below_quorum";

}  // namespace

absl::Status BelowQuorum(std::string_view message) {
  absl::Status st = absl::FailedPreconditionError(core::AsAbsl(message));
  st.SetPayload(core::AsAbsl(kBelowQuorumUrl), absl::Cord());
  return st;
}

bool IsBelowQuorum(const absl::Status& status) {
  return status.GetPayload(core::AsAbsl(kBelowQuorumUrl)).has_value();
}

namespace {

// An aggregate a rule computed into `out`, refused where it is not finite; a picked
// input (not `out`) is one of the pushes, each checked finite as it arrived, and is not
// read again.
absl::StatusOr<std::span<const float>> Finite(std::span<const float> aggregate,
                                              std::span<const float> out) {
  if (aggregate.data() == out.data() && core::FindNonFinite(aggregate) >= 0) {
    return absl::InternalError("aggregate is not finite (inputs overflowed)");
  }
  return aggregate;
}

}  // namespace

RoundAggregation::RoundAggregation(aggregators::Aggregator* rule, core::ThreadPool* pool,
                                   SgdOptions sgd, bool aggregate_only, uint32_t quorum)
    : rule_(rule), pool_(pool), sgd_(sgd), aggregate_only_(aggregate_only), quorum_(quorum) {}

absl::Status RoundAggregation::CheckQuorum(size_t inputs, std::string_view what) const {
  if (inputs >= quorum_) return absl::OkStatus();
  return BelowQuorum(absl::StrCat(core::AsAbsl(what), ": ", inputs, " of the ", quorum_,
                                  " inputs the quorum needs (dropped; parameters unchanged)"));
}

core::ThreadPool* RoundAggregation::OneSlicePool(const ClosedRound& round) const {
  return round.info.numel >= kPooledSliceElems ? pool_ : nullptr;
}

aggregators::AggregationContext RoundAggregation::ContextOf(ClosedRound& round,
                                                            std::span<const uint32_t> workers,
                                                            const InputMasks& masks,
                                                            const std::vector<uint32_t>& support,
                                                            AggregationCounts* counts,
                                                            InputWeights* weights) const {
  if (!support.empty()) ++counts->on_support;
  aggregators::AggregationContext ctx;
  ctx.slice_id = round.info.id;
  ctx.round = round.round;
  ctx.pool = OneSlicePool(round);
  ctx.masks = masks.ptrs;
  ctx.state = round.model.rule_state;
  ctx.support = support;
  if (weights != nullptr) {
    weights->workers.assign(workers.begin(), workers.end());
    weights->influence.assign(workers.size(), 0.0);
    ctx.influence = weights->influence;
  }
  return ctx;
}

absl::StatusOr<std::span<const float>> RoundAggregation::Aggregate(ClosedRound& round,
                                                                   std::span<float> out,
                                                                   AggregationCounts* counts,
                                                                   InputWeights* weights,
                                                                   RowScratch* scratch) {
  const std::vector<uint32_t> workers = round.Workers();
  PS_RETURN_IF_ERROR(CheckQuorum(workers.size(), absl::StrCat("round ", round.round, " of slice ",
                                                              round.info.id)));
  if (rule_->VotesOnSigns()) {
    const std::vector<std::string_view> signs = round.Signs(workers);
    if (!signs.empty()) {
      // Every push is sign-compressed: vote on the packed bits (same result as the rule).
      ++counts->sign_votes;
      PS_RETURN_IF_ERROR(codecs::SignMajorityVote(signs, out));
      return Finite(out, out);
    }
  }
  const InputMasks masks = round.MasksOf(workers);
  if (!masks.ptrs.empty()) ++counts->masked;
  const std::vector<uint32_t> support = round.SharedSupport(workers);
  if (masks.ptrs.empty() && support.empty() && rule_->AveragesInputs()) {
    if (const std::vector<std::string_view> payloads = round.Kept3lc(workers);
        !payloads.empty()) {
      ++counts->means_of_digits;
      return MeanOfDigits(round, workers, payloads, out, weights);
    }
  }
  // Kept pushes decoded into the caller's thread's rows, which the rule then reads in cache.
  PS_ASSIGN_OR_RETURN(const std::vector<const float*> rows, round.Rows(workers, scratch));
  const aggregators::AggregationContext ctx =
      ContextOf(round, workers, masks, support, counts, weights);
  PS_ASSIGN_OR_RETURN(const std::span<const float> aggregate,
                      rule_->AggregateOrPick(rows, out, ctx));
  if (weights != nullptr) weights->alignment = aggregators::Alignment(rows, masks.ptrs, aggregate);
  return Finite(aggregate, out);
}

absl::StatusOr<std::span<const float>> RoundAggregation::MeanOfDigits(
    const ClosedRound& round, std::span<const uint32_t> workers,
    std::span<const std::string_view> payloads, std::span<float> out,
    InputWeights* weights) const {
  // The samples Alignment reads, taken as the digits are read: the rows are never made.
  const aggregators::AlignmentSampling at = aggregators::AlignmentSamplingOf(out.size());
  std::vector<float> sampled(weights != nullptr ? (workers.size() + 1) * at.count : 0);
  std::vector<float*> rows;
  for (size_t j = 0; weights != nullptr && j < workers.size(); ++j) {
    rows.push_back(sampled.data() + j * at.count);
  }
  const codecs::ValueSamples samples{
      .count = weights != nullptr ? at.count : 0, .stride = at.stride, .rows = rows};
  if (absl::Status st = codecs::Mean3lc(payloads, out, samples); !st.ok()) {
    return absl::InternalError(absl::StrCat("slice ", round.info.id,
                                            ": a push passed its check and then failed to "
                                            "decode: ",
                                            st.message()));
  }
  if (weights != nullptr) {
    weights->workers.assign(workers.begin(), workers.end());
    weights->influence.assign(workers.size(), 0.0);
    aggregators::Aggregator::AddMeanInfluence(out.size(), weights->influence);
    const std::span<float> mean(sampled.data() + workers.size() * at.count, at.count);
    for (size_t t = 0; t < at.count; ++t) mean[t] = out[t * at.stride];
    const std::vector<const float*> inputs(rows.begin(), rows.end());
    weights->alignment = aggregators::Alignment(inputs, {}, mean);
  }
  return Finite(out, out);
}

std::vector<uint32_t> RoundAggregation::Participants(std::span<const ClosedRound> rounds,
                                                     uint32_t num_workers) const {
  // A worker missing from any slice is left out of the whole round (docs/aggregators.md,
  // "Model scope").
  std::vector<uint8_t> everywhere(num_workers, 1);
  for (const ClosedRound& r : rounds) {
    for (uint32_t w = 0; w < num_workers; ++w) everywhere[w] &= r.inputs.pushed[w];
  }
  std::vector<uint32_t> participants;
  for (uint32_t w = 0; w < num_workers; ++w) {
    if (everywhere[w]) participants.push_back(w);
  }
  return participants;
}

bool RoundAggregation::GramPerSlice() const {
  return rule_->NeedsGram() && rule_->StateRows() == 0 && rule_->device() == "cpu";
}

void RoundAggregation::SliceGram(ClosedRound& round) const {
  if (!GramPerSlice()) return;
  std::vector<uint32_t> workers = round.Workers();
  if (workers.empty() || !round.MasksOf(workers).ptrs.empty() ||
      !round.SharedSupport(workers).empty()) {
    return;
  }
  aggregators::AggregationContext ctx;
  ctx.slice_id = round.info.id;
  ctx.round = round.round;
  ctx.pool = OneSlicePool(round);
  // Model scope reads the rows again in Apply: kept pushes are decoded into their own.
  absl::StatusOr<std::vector<const float*>> rows = round.Rows(workers);
  if (!rows.ok()) return;
  ClosedRound::GramPart part;
  part.gram.assign(workers.size() * workers.size(), 0.0);
  if (!rule_->AccumulateGram(*rows, round.info.numel, ctx, part.gram).ok()) return;
  part.workers = std::move(workers);
  round.gram_part = std::move(part);
}

namespace {

// Adds the entries of `participants` (increasing) to `gram` (participants^2) when they
// are all among part.workers; false, `gram` untouched, otherwise.
bool AddPart(const ClosedRound::GramPart& part, std::span<const uint32_t> participants,
             std::vector<double>& gram) {
  const size_t n = participants.size();
  const size_t width = part.workers.size();
  if (gram.size() != n * n || part.gram.size() != width * width) return false;
  std::vector<size_t> at;
  at.reserve(n);
  size_t j = 0;
  for (uint32_t w : participants) {
    while (j < width && part.workers[j] < w) ++j;
    if (j == width || part.workers[j] != w) return false;
    at.push_back(j);
  }
  for (size_t a = 0; a < n; ++a) {
    for (size_t b = 0; b < n; ++b) gram[a * n + b] += part.gram[at[a] * width + at[b]];
  }
  return true;
}

}  // namespace

absl::Status RoundAggregation::AccumulateGram(std::span<ClosedRound> rounds,
                                              std::span<const uint32_t> participants,
                                              std::vector<double>& gram,
                                              AggregationCounts* counts) {
  absl::Status st;
  for (ClosedRound& r : rounds) {
    // Participants pushed every slice, so they are among the part's workers; a subset
    // sharing a random-k support (the part's did not) is measured on it, below.
    if (r.gram_part.has_value() && r.SharedSupport(participants).empty() &&
        AddPart(*r.gram_part, participants, gram)) {
      continue;
    }
    const InputMasks masks = r.MasksOf(participants);
    const std::vector<uint32_t> support = r.SharedSupport(participants);
    // One job walks every slice here: each slice's rows go over the pool whatever its size.
    aggregators::AggregationContext ctx = ContextOf(r, participants, masks, support, counts);
    ctx.pool = pool_;
    absl::StatusOr<std::vector<const float*>> rows = r.Rows(participants);
    if (!rows.ok()) {
      st.Update(rows.status());
      continue;
    }
    st.Update(rule_->AccumulateGram(*rows, r.info.numel, ctx, gram));
  }
  return st;
}

absl::StatusOr<std::span<const float>> RoundAggregation::Apply(
    const aggregators::RoundPlan& plan, ClosedRound& round, std::span<const uint32_t> agreed,
    std::span<float> out, AggregationCounts* counts, InputWeights* weights) {
  const InputMasks masks = round.MasksOf(agreed);
  const std::vector<uint32_t> support = round.SharedSupport(agreed);
  PS_ASSIGN_OR_RETURN(const std::vector<const float*> rows, round.Rows(agreed));
  const aggregators::AggregationContext ctx =
      ContextOf(round, agreed, masks, support, counts, weights);
  PS_ASSIGN_OR_RETURN(const std::span<const float> aggregate,
                      rule_->ApplyOrPick(plan, rows, out, ctx));
  if (weights != nullptr) weights->alignment = aggregators::Alignment(rows, masks.ptrs, aggregate);
  return Finite(aggregate, out);
}

void RoundAggregation::StepModel(ClosedRound& round, std::span<const float> out,
                                 std::span<float> copy_to) const {
  SliceModel& m = round.model;
  // The learning rate the round's pushes asked for (their median), else the configured one.
  const std::optional<float> lr = MedianLr(round.inputs);
  ++m.steps;
  if (m.optimizer == nullptr) {
    SgdStep(sgd_, round.round, out, m.velocity, m.params, copy_to, lr);
    return;
  }
  const float step_lr =
      lr.has_value() ? *lr
                     : static_cast<float>(m.optimizer->lr() * sgd_.schedule.Factor(round.round));
  m.optimizer->Step(step_lr, m.steps, out, m.velocity, m.second_moment, m.params, copy_to);
}

RoundAggregation::Publication RoundAggregation::Step(ClosedRound& round,
                                                     std::span<const float> out,
                                                     absl::Status& st) const {
  if (aggregate_only_) {
    if (!st.ok()) return {core::SharedFp32(std::vector<float>(round.info.numel, 0.0f)), nullptr};
    return {core::SharedFp32(out), nullptr};
  }
  HeldValues& held = round.model.held;
  if (st.ok() && held.codec == nullptr) {
    // Dense pulls: the step writes the published values as it goes, into a buffer an
    // older version gave back.
    std::shared_ptr<std::string> next =
        SnapshotPool::Take(round.model.snapshots, round.model.params.size() * sizeof(float));
    StepModel(round, out,
              std::span<float>(reinterpret_cast<float*>(next->data()), round.model.params.size()));
    return {std::move(next), nullptr};
  }
  if (st.ok()) StepModel(round, out, {});
  if (held.codec == nullptr) return {core::SharedFp32(round.model.params), nullptr};
  // The published values are what the workers will hold: the encoding writes them as it
  // goes, into a buffer an older version gave back.
  std::shared_ptr<std::string> next =
      SnapshotPool::Take(round.model.snapshots, held.values.size() * sizeof(float));
  absl::StatusOr<std::shared_ptr<const std::string>> delta =
      EncodeChange(round.model.params, round.info.id, round.round + 1, held,
                   std::span<float>(reinterpret_cast<float*>(next->data()), held.values.size()));
  if (!delta.ok()) {
    // The workers get this version densely; the round itself stands.
    spdlog::warn("slice {}: the pull codec refused version {}'s change ({}); sending it dense",
                 round.info.id, round.round + 1, std::string(delta.status().message()));
    return {core::SharedFp32(held.values), nullptr};
  }
  return {std::move(next), *std::move(delta)};
}

}  // namespace ps::server
