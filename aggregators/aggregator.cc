// Aggregator and RoundPlan: composes the stages' mixings into one plan per round and
// applies a plan to a range of coordinates (the chain is built from its spec in
// make_aggregator.cc).
#include "aggregators/aggregator.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "aggregators/coordinate_internal.h"
#include "aggregators/device_internal.h"
#include "aggregators/influence_internal.h"
#include "aggregators/mask_internal.h"
#include "aggregators/mixing_internal.h"
#include "aggregators/stage_internal.h"
#include "core/status.h"

namespace ps::aggregators {
namespace {

using core::AsAbsl;
using internal::Congruence;
using internal::IsUnitRow;
using internal::Mixing;
using internal::MixRow;
using internal::Multiply;
using internal::PlanData;
using internal::SquareMatrix;
using internal::TopLeftBlock;
using internal::WithState;

// Rows of the inputs with every missing coordinate filled by the median of the values
// present there (docs/aggregators.md, "Masks"). Holds the filled copies.
class FilledInputs {
 public:
  FilledInputs(std::span<const float* const> inputs, std::span<const uint8_t* const> masks,
               size_t d, EvenMedian even, core::ThreadPool* pool)
      : rows_(inputs.begin(), inputs.end()) {
    if (masks.empty()) return;
    std::vector<float> median(d);
    internal::CoordinateRule rule;
    rule.kind = internal::CoordinateRule::Kind::kMedian;
    rule.even_median = even;
    internal::ApplyCoordinateRule(rule, inputs, masks, median, pool);
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (masks[i] == nullptr) continue;
      std::vector<float>& copy = copies_.emplace_back(inputs[i], inputs[i] + d);
      for (size_t c = 0; c < d; ++c) {
        if (!internal::Present(masks[i], c)) copy[c] = median[c];
      }
      rows_[i] = copy.data();
    }
  }
  std::span<const float* const> rows() const { return rows_; }

 private:
  std::vector<const float*> rows_;
  std::vector<std::vector<float>> copies_;
};

absl::Status CheckCall(const internal::Pipeline& p, std::span<const float* const> inputs,
                       size_t d, const AggregationContext& ctx) {
  const size_t k = inputs.size();
  if (k < p.min_inputs) {
    return absl::InvalidArgumentError(absl::StrCat(p.spec, " needs ", p.bound, " = ",
                                                   p.min_inputs, " inputs, got ", k));
  }
  if (d == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(p.spec, ": empty output (0 coordinates) for ", k, " inputs"));
  }
  for (size_t i = 0; i < k; ++i) {
    if (inputs[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(p.spec, ": input ", i, " of ", k, " is null"));
    }
  }
  if (!ctx.masks.empty() && ctx.masks.size() != k) {
    return absl::InvalidArgumentError(absl::StrCat(p.spec, ": ", ctx.masks.size(),
                                                   " masks for ", k, " inputs"));
  }
  if (!ctx.influence.empty() && ctx.influence.size() != k) {
    return absl::InvalidArgumentError(absl::StrCat(p.spec, ": influence holds ",
                                                   ctx.influence.size(), " entries for ", k,
                                                   " inputs"));
  }
  const size_t s = p.rule->StateRows();
  if (!ctx.state.empty() && ctx.state.size() != s * d) {
    return absl::InvalidArgumentError(absl::StrCat(p.spec, ": state holds ", ctx.state.size(),
                                                   " floats, expected ", s, " x ", d));
  }
  if (ctx.device_memory) {
    if (p.device == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          p.spec, ": inputs in device memory, but the rule runs on the CPU",
          p.device_note.empty() ? "" : absl::StrCat(" (", p.device_note, ")")));
    }
    if (!ctx.masks.empty() || !ctx.support.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(p.spec, ": masks and supports need inputs in host memory"));
    }
    if (s > 0 && ctx.state.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(p.spec, ": a stateful rule on device memory needs ctx.state"));
    }
  }
  return absl::OkStatus();
}

// Whether this call runs on the pipeline's device. Asked after UseSupport: a support
// in use is gathered on the CPU first, and the gathered rows come back here without one.
bool OnDevice(const internal::Pipeline& p) { return p.device != nullptr; }

internal::Memory MemoryOf(const AggregationContext& ctx) {
  return ctx.device_memory ? internal::Memory::kDevice : internal::Memory::kHost;
}

// The input rows followed by the state rows (zeros when the caller keeps none).
std::vector<const float*> WithStateRows(std::span<const float* const> inputs, size_t s, size_t d,
                                        const AggregationContext& ctx,
                                        std::vector<float>* zeros) {
  std::vector<const float*> rows(inputs.begin(), inputs.end());
  if (s == 0) return rows;
  if (ctx.state.empty()) zeros->assign(s * d, 0.0f);
  const float* base = ctx.state.empty() ? zeros->data() : ctx.state.data();
  for (size_t i = 0; i < s; ++i) rows.push_back(base + i * d);
  return rows;
}

}  // namespace

namespace internal {

std::unique_ptr<Aggregator> Pipeline::Wrap(std::unique_ptr<Pipeline> p) {
  return std::unique_ptr<Aggregator>(new Aggregator(std::move(p)));
}

RoundPlan Pipeline::MakePlan(std::shared_ptr<const PlanData> data) {
  RoundPlan plan;
  plan.data_ = std::move(data);
  return plan;
}

}  // namespace internal

RoundPlan::RoundPlan() : data_(std::make_shared<PlanData>()) {}
size_t RoundPlan::num_inputs() const { return data_->k; }
const std::vector<double>& RoundPlan::mixing() const { return data_->mixing.values; }
size_t RoundPlan::rows() const { return data_->mixing.rows; }
std::string RoundPlan::Describe() const { return data_->description; }

Aggregator::Aggregator(std::unique_ptr<internal::Pipeline> pipeline)
    : pipeline_(std::move(pipeline)) {}
Aggregator::~Aggregator() = default;

std::string_view Aggregator::name() const { return pipeline_->spec; }
int Aggregator::MinInputs() const { return static_cast<int>(pipeline_->min_inputs); }
std::string_view Aggregator::Bound() const { return pipeline_->bound; }
bool Aggregator::NeedsGram() const { return pipeline_->needs_gram; }
bool Aggregator::VotesOnSigns() const { return pipeline_->votes_on_signs; }
bool Aggregator::AveragesInputs() const {
  return pipeline_->averages_inputs && pipeline_->device == nullptr;
}
void Aggregator::AddMeanInfluence(size_t d, std::span<double> influence) {
  internal::AddMeanInfluence(d, influence);
}
std::string_view Aggregator::device() const {
  return pipeline_->device != nullptr ? std::string_view(pipeline_->device->description()) : "cpu";
}
std::string_view Aggregator::device_note() const { return pipeline_->device_note; }
size_t Aggregator::StateRows() const { return pipeline_->rule->StateRows(); }

namespace {

// The inputs' values on a shared support (AggregationContext::support), gathered.
class OnSupport {
 public:
  // Checks the support against d: strictly increasing, every coordinate < d.
  static absl::StatusOr<OnSupport> Gather(std::string_view spec,
                                          std::span<const float* const> inputs, size_t d,
                                          const AggregationContext& ctx) {
    const std::span<const uint32_t> support = ctx.support;
    for (size_t j = 0; j < support.size(); ++j) {
      if (support[j] >= d || (j > 0 && support[j] <= support[j - 1])) {
        return absl::InvalidArgumentError(absl::StrCat(
            AsAbsl(spec), ": support coordinate ", j, " (", support[j],
            ") is not strictly increasing below ", d));
      }
    }
    OnSupport g;
    const size_t k = support.size();
    g.values_.resize(inputs.size() * k);
    for (size_t i = 0; i < inputs.size(); ++i) {
      float* dst = g.values_.data() + i * k;
      for (size_t j = 0; j < k; ++j) dst[j] = inputs[i][support[j]];
      g.rows_.push_back(dst);
    }
    g.inner_ = ctx;
    g.inner_.support = {};
    return g;
  }
  std::span<const float* const> rows() const { return rows_; }
  const AggregationContext& inner() const { return inner_; }
  // out = 0 except out[support[j]] = kept[j].
  static void Scatter(std::span<const uint32_t> support, std::span<const float> kept,
                      std::span<float> out) {
    std::fill(out.begin(), out.end(), 0.0f);
    for (size_t j = 0; j < support.size(); ++j) out[support[j]] = kept[j];
  }

 private:
  std::vector<float> values_;
  std::vector<const float*> rows_;
  AggregationContext inner_;
};

// The influence of `inputs` (host memory, masks as in ctx) under `plan`, for the device
// paths, which compute the output elsewhere.
void AddInfluenceOf(const internal::Pipeline& p, const RoundPlan& plan,
                    std::span<const float* const> inputs, size_t d, const AggregationContext& ctx) {
  if (ctx.influence.empty() || ctx.device_memory) return;
  const PlanData& data = internal::Pipeline::Data(plan);
  const bool native_masks = data.mixing.rows == 0 && data.coordinate.has_value();
  std::span<const uint8_t* const> no_masks;
  const FilledInputs filled(inputs, native_masks ? no_masks : ctx.masks, d, EvenMedian::kMidpoint,
                            ctx.pool);
  std::vector<float> zeros;
  const std::vector<const float*> raw =
      WithStateRows(filled.rows(), p.rule->StateRows(), d, ctx, &zeros);
  internal::AddInfluence(data, native_masks ? filled.rows() : std::span<const float* const>(raw),
                         native_masks ? ctx.masks : no_masks, d, ctx.round, ctx.slice_id,
                         ctx.influence);
}

// The input a plan's output is as it stands: the plan's one row (mixed, or the inputs
// as they are when k = 1) is a single input with weight 1, and no rule follows it or the
// rule's value of one value is that value (every coordinate rule but the sign vote, -0
// aside: the rank rules' sums start at +0.0).
std::optional<size_t> PickedInput(const PlanData& data) {
  if (data.coordinate.has_value() &&
      data.coordinate->kind == internal::CoordinateRule::Kind::kSignVote) {
    return std::nullopt;
  }
  if (data.mixing.rows == 0) {
    if (data.k == 1 && data.coordinate.has_value()) return 0;
    return std::nullopt;
  }
  size_t unit = 0;
  if (data.mixing.rows == 1 && IsUnitRow(data.mixing, 0, &unit) && unit < data.k) return unit;
  return std::nullopt;
}

bool UseSupport(const internal::Pipeline& p, const AggregationContext& ctx) {
  return !ctx.support.empty() && ctx.masks.empty() && p.rule->ZeroPreserving();
}

}  // namespace

absl::Status Aggregator::Aggregate(std::span<const float* const> inputs, std::span<float> out,
                                   const AggregationContext& ctx) const {
  return AggregateTo(inputs, out, ctx, /*pick=*/false).status();
}

absl::StatusOr<std::span<const float>> Aggregator::AggregateOrPick(
    std::span<const float* const> inputs, std::span<float> out,
    const AggregationContext& ctx) const {
  return AggregateTo(inputs, out, ctx, /*pick=*/true);
}

absl::StatusOr<std::span<const float>> Aggregator::AggregateTo(
    std::span<const float* const> inputs, std::span<float> out, const AggregationContext& ctx,
    bool pick) const {
  PS_RETURN_IF_ERROR(CheckCall(*pipeline_, inputs, out.size(), ctx));
  if (UseSupport(*pipeline_, ctx)) {
    PS_ASSIGN_OR_RETURN(OnSupport g, OnSupport::Gather(name(), inputs, out.size(), ctx));
    std::vector<float> kept(ctx.support.size());
    PS_RETURN_IF_ERROR(Aggregate(g.rows(), kept, g.inner()));
    OnSupport::Scatter(ctx.support, kept, out);
    return out;
  }
  if (OnDevice(*pipeline_)) {
    // One upload for the Gram matrix and the pass over the coordinates.
    std::vector<float> zeros;
    const std::vector<const float*> rows =
        WithStateRows(inputs, StateRows(), out.size(), ctx, &zeros);
    std::optional<RoundPlan> used;
    PS_RETURN_IF_ERROR(pipeline_->device->Aggregate(
        rows, out, MemoryOf(ctx), ctx.masks, ctx.state.empty() ? nullptr : ctx.state.data(),
        NeedsGram(), [&](std::span<const double> gram) -> absl::StatusOr<RoundPlan> {
          PS_ASSIGN_OR_RETURN(RoundPlan plan, Plan(inputs.size(), gram, ctx.round));
          used = plan;
          return plan;
        }));
    if (used.has_value()) AddInfluenceOf(*pipeline_, *used, inputs, out.size(), ctx);
    return out;
  }
  if (!NeedsGram()) {
    PS_ASSIGN_OR_RETURN(RoundPlan plan, Plan(inputs.size(), {}, ctx.round));
    return ApplyTo(plan, inputs, out, ctx, pick);
  }
  // Missing coordinates are filled once here, not again in each step.
  const FilledInputs filled(inputs, ctx.masks, out.size(), EvenMedian::kMidpoint, ctx.pool);
  AggregationContext complete = ctx;
  complete.masks = {};
  const size_t k = inputs.size();
  const size_t rows = k + StateRows();
  std::vector<double> gram(rows * rows, 0.0);
  PS_RETURN_IF_ERROR(AccumulateGram(filled.rows(), out.size(), complete, gram));
  PS_ASSIGN_OR_RETURN(RoundPlan plan, Plan(k, gram, ctx.round));
  // A pick would point into `filled`'s rows where inputs had missing coordinates.
  return ApplyTo(plan, filled.rows(), out, complete, pick && ctx.masks.empty());
}

absl::Status Aggregator::AccumulateGram(std::span<const float* const> inputs, size_t d,
                                        const AggregationContext& ctx,
                                        std::span<double> gram) const {
  PS_RETURN_IF_ERROR(CheckCall(*pipeline_, inputs, d, ctx));
  if (UseSupport(*pipeline_, ctx)) {
    PS_ASSIGN_OR_RETURN(OnSupport g, OnSupport::Gather(name(), inputs, d, ctx));
    return AccumulateGram(g.rows(), ctx.support.size(), g.inner(), gram);
  }
  const size_t s = StateRows();
  const size_t n = inputs.size() + s;
  if (gram.size() != n * n) {
    return absl::InvalidArgumentError(absl::StrCat(pipeline_->spec, ": Gram buffer holds ",
                                                   gram.size(), " values, expected ", n, " x ", n));
  }
  if (OnDevice(*pipeline_)) {
    std::vector<float> zeros;
    const std::vector<const float*> rows = WithStateRows(inputs, s, d, ctx, &zeros);
    return pipeline_->device->AccumulateGram(rows, d, MemoryOf(ctx), ctx.masks, gram);
  }
  FilledInputs filled(inputs, ctx.masks, d, EvenMedian::kMidpoint, ctx.pool);
  std::vector<float> zeros;
  const std::vector<const float*> rows = WithStateRows(filled.rows(), s, d, ctx, &zeros);
  const SquareMatrix g = internal::GramMatrix(rows, d, ctx.pool);
  for (size_t i = 0; i < n * n; ++i) gram[i] += g.values[i];
  return absl::OkStatus();
}

absl::StatusOr<RoundPlan> Aggregator::Plan(size_t k, std::span<const double> gram,
                                           uint64_t round) const {
  const internal::Pipeline& p = *pipeline_;
  if (k < p.min_inputs) {
    return absl::InvalidArgumentError(
        absl::StrCat(p.spec, " needs ", p.bound, " = ", p.min_inputs, " inputs, got ", k));
  }
  const size_t s = StateRows();
  auto data = std::make_shared<PlanData>();
  data->k = k;
  data->state_rows = s;
  SquareMatrix g;
  if (p.needs_gram) {
    if (gram.size() != (k + s) * (k + s)) {
      return absl::InvalidArgumentError(absl::StrCat(p.spec, ": Gram matrix of ", gram.size(),
                                                     " values for ", k, " inputs and ", s,
                                                     " state rows"));
    }
    for (double v : gram) {
      if (!std::isfinite(v)) {
        return absl::InvalidArgumentError(
            absl::StrCat(p.spec, ": the Gram matrix is not finite (inputs overflowed)"));
      }
    }
    g = SquareMatrix(k + s);
    g.values.assign(gram.begin(), gram.end());
  }
  // Compose the pre-aggregators: `total` maps the raw rows to the current rows (with the
  // state rows carried along unchanged); unset means the identity.
  std::optional<Mixing> total;
  std::vector<std::string> notes;
  size_t m = k;
  for (size_t i = 0; i < p.pre.size(); ++i) {
    const internal::PreStage& stage = *p.pre[i];
    SquareMatrix block;
    if (stage.NeedsGram()) block = TopLeftBlock(g, m);
    PS_ASSIGN_OR_RETURN(Mixing mix, stage.Mix(m, stage.NeedsGram() ? &block : nullptr, round));
    const Mixing ext = WithState(mix, s);
    bool later_needs_gram = p.rule->NeedsGram();
    for (size_t j = i + 1; j < p.pre.size(); ++j) later_needs_gram |= p.pre[j]->NeedsGram();
    if (later_needs_gram) g = Congruence(ext, g);
    total = total.has_value() ? Multiply(ext, *total) : ext;
    m = mix.rows;
  }
  PS_ASSIGN_OR_RETURN(internal::Tail tail,
                      p.rule->Finish(m, p.rule->NeedsGram() ? &g : nullptr, round));
  data->coordinate = tail.coordinate;
  if (tail.mixing.rows == 0) {
    if (total.has_value()) {
      // The m current rows (not the state rows) feed the coordinate rule.
      data->mixing = Mixing(m, k + s);
      std::copy_n(total->values.begin(), m * (k + s), data->mixing.values.begin());
    }
  } else {
    data->mixing = total.has_value() ? Multiply(tail.mixing, *total) : tail.mixing;
  }
  data->description = p.pre.empty()
                          ? absl::StrCat(p.rule->spec(), ": ", tail.description)
                          : absl::StrCat(p.spec, ": ", tail.description, " (of ", m,
                                         " pre-aggregated rows)");
  return internal::Pipeline::MakePlan(std::move(data));
}

absl::Status Aggregator::Apply(const RoundPlan& plan, std::span<const float* const> inputs,
                               std::span<float> out, const AggregationContext& ctx) const {
  return ApplyTo(plan, inputs, out, ctx, /*pick=*/false).status();
}

absl::StatusOr<std::span<const float>> Aggregator::ApplyOrPick(
    const RoundPlan& plan, std::span<const float* const> inputs, std::span<float> out,
    const AggregationContext& ctx) const {
  return ApplyTo(plan, inputs, out, ctx, /*pick=*/true);
}

absl::StatusOr<std::span<const float>> Aggregator::ApplyTo(const RoundPlan& plan,
                                                           std::span<const float* const> inputs,
                                                           std::span<float> out,
                                                           const AggregationContext& ctx,
                                                           bool pick) const {
  const internal::Pipeline& p = *pipeline_;
  const PlanData& data = internal::Pipeline::Data(plan);
  PS_RETURN_IF_ERROR(CheckCall(p, inputs, out.size(), ctx));
  if (UseSupport(p, ctx)) {
    PS_ASSIGN_OR_RETURN(OnSupport g, OnSupport::Gather(name(), inputs, out.size(), ctx));
    std::vector<float> kept(ctx.support.size());
    PS_RETURN_IF_ERROR(Apply(plan, g.rows(), kept, g.inner()));
    OnSupport::Scatter(ctx.support, kept, out);
    return out;
  }
  if (data.k != inputs.size() || data.state_rows != StateRows()) {
    return absl::InvalidArgumentError(absl::StrCat(p.spec, ": plan made for ", data.k,
                                                   " inputs, applied to ", inputs.size()));
  }
  const size_t d = out.size();
  const size_t s = data.state_rows;
  if (OnDevice(p)) {
    AddInfluenceOf(p, plan, inputs, d, ctx);
    std::vector<float> zeros;
    const std::vector<const float*> rows = WithStateRows(inputs, s, d, ctx, &zeros);
    PS_RETURN_IF_ERROR(p.device->Apply(data, rows, out, MemoryOf(ctx), ctx.masks,
                                       s > 0 && !ctx.state.empty() ? ctx.state.data() : nullptr));
    return out;
  }
  // Native masks only where the coordinate rule reads the inputs as they are.
  const bool native_masks = data.mixing.rows == 0 && data.coordinate.has_value();
  std::span<const uint8_t* const> no_masks;
  FilledInputs filled(inputs, native_masks ? no_masks : ctx.masks, d, EvenMedian::kMidpoint, ctx.pool);
  std::vector<float> zeros;
  const std::vector<const float*> raw = WithStateRows(filled.rows(), s, d, ctx, &zeros);
  if (!ctx.influence.empty()) {
    // Before `out` is written: it may be one of the inputs.
    internal::AddInfluence(data, native_masks ? filled.rows() : std::span<const float* const>(raw),
                           native_masks ? ctx.masks : no_masks, d, ctx.round, ctx.slice_id,
                           ctx.influence);
  }
  // `raw` is `inputs` itself here: no masks, no state rows.
  if (pick && ctx.masks.empty() && s == 0) {
    if (const std::optional<size_t> picked = PickedInput(data)) {
      return std::span<const float>(inputs[*picked], d);
    }
  }

  if (data.mixing.rows == 0) {
    if (!data.coordinate.has_value()) {
      return absl::InternalError(absl::StrCat(p.spec, ": plan has neither rows nor a rule"));
    }
    internal::ApplyCoordinateRule(*data.coordinate, filled.rows(),
                                  native_masks ? ctx.masks : no_masks, out, ctx.pool);
  } else if (!data.coordinate.has_value()) {
    std::vector<double> weights(data.mixing.values.begin(),
                                data.mixing.values.begin() + static_cast<ptrdiff_t>(data.mixing.cols));
    size_t unit = 0;
    if (IsUnitRow(data.mixing, 0, &unit)) {
      if (raw[unit] != out.data()) std::memmove(out.data(), raw[unit], d * sizeof(float));
    } else {
      MixRow(weights, raw, out, ctx.pool);
    }
  } else {
    // A coordinate rule over mixed rows (nnm+trimmed_mean, Bulyan): rows with a single
    // weight of 1 are read in place; the others are formed one coordinate block at a
    // time, so the extra memory is O(rows x block) per thread whatever d is. Every
    // output coordinate depends only on its own column, so blocking changes no bit.
    const size_t r_count = data.mixing.rows;
    std::vector<size_t> unit(r_count, SIZE_MAX);
    std::vector<std::vector<double>> weights(r_count);
    size_t to_mix = 0;
    for (size_t r = 0; r < r_count; ++r) {
      if (IsUnitRow(data.mixing, r, &unit[r])) continue;
      unit[r] = SIZE_MAX;
      weights[r].assign(
          data.mixing.values.begin() + static_cast<ptrdiff_t>(r * data.mixing.cols),
          data.mixing.values.begin() + static_cast<ptrdiff_t>((r + 1) * data.mixing.cols));
      ++to_mix;
    }
    internal::ForEachCoordinateBlock(d, ctx.pool, [&](size_t begin, size_t end) {
      const size_t len = end - begin;
      std::vector<float> buf(to_mix * len);
      std::vector<const float*> shifted(raw.size());
      for (size_t j = 0; j < raw.size(); ++j) shifted[j] = raw[j] + begin;
      std::vector<const float*> rows(r_count);
      size_t next = 0;
      for (size_t r = 0; r < r_count; ++r) {
        if (unit[r] != SIZE_MAX) {
          rows[r] = shifted[unit[r]];
          continue;
        }
        float* dst = buf.data() + next++ * len;
        MixRow(weights[r], shifted, std::span<float>(dst, len), nullptr);
        rows[r] = dst;
      }
      internal::ApplyCoordinateRule(*data.coordinate, rows, no_masks, out.subspan(begin, len),
                                    nullptr);
    });
  }
  if (s > 0 && !ctx.state.empty()) std::memcpy(ctx.state.data(), out.data(), d * sizeof(float));
  return out;
}

}  // namespace ps::aggregators
