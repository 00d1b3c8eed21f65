// The pieces an Aggregator is built from: pre-aggregator stages and one rule stage,
// the spec-string parser, and the plan a round is computed with. Not part of the
// public interface.
//
// Every stage is linear in its input rows once the Gram matrix of those rows is known
// (gram_rules_internal.h), so a whole chain reduces to one mixing matrix over the raw
// inputs (and the rule's state rows) followed, for coordinate-wise rules, by one
// coordinate rule. Plan() composes the stages on the k x k Gram matrix only; Apply()
// touches the coordinates once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "aggregators/aggregator.h"
#include "aggregators/coordinate_rules_internal.h"
#include "aggregators/gram_internal.h"
#include "aggregators/gram_rules_internal.h"
#include "core/spec.h"

namespace ps::aggregators::internal {

using core::StageArgs;
using core::StageSpec;

// A pre-aggregator: maps m rows to OutputRows(m) rows by a mixing matrix it derives
// from the Gram matrix of those m rows.
class PreStage {
 public:
  virtual ~PreStage() = default;
  virtual const std::string& spec() const = 0;
  virtual bool NeedsGram() const = 0;
  virtual size_t OutputRows(size_t m) const { return m; }
  // Fewest input rows giving at least `rows` output rows.
  virtual size_t InputsFor(size_t rows) const { return rows; }
  // Its output row count as text, for bounds: "ceil(n / 2)".
  virtual std::string RowsExpression() const { return "n"; }
  // Its own least input count and that bound as text ("n >= f + 1"), if any.
  virtual size_t MinInputs() const { return 1; }
  virtual std::string Bound() const { return ""; }
  // An OutputRows(m) x m mixing. gram is the m x m Gram matrix when NeedsGram().
  virtual absl::StatusOr<Mixing> Mix(size_t m, const SquareMatrix* gram, uint64_t round) const = 0;
};

// What a rule makes of one round's m rows (and its state rows).
struct Tail {
  // r x (m + s): the rows the coordinate rule reads, or (without one) the single output
  // row. r == 0: the m rows as they are.
  Mixing mixing;
  std::optional<CoordinateRule> coordinate;
  std::string description;  // "input 3", "inputs {0, 2}"; in terms of the m rows
};

class RuleStage {
 public:
  virtual ~RuleStage() = default;
  virtual const std::string& spec() const = 0;
  virtual bool NeedsGram() const = 0;
  virtual size_t StateRows() const { return 0; }
  // Whether coordinates that are zero in every input come out zero and the rest do not
  // depend on them, so the rule may run on a shared support only
  // (AggregationContext::support). Stateful rules are not.
  virtual bool ZeroPreserving() const { return StateRows() == 0; }
  virtual size_t MinInputs() const = 0;
  virtual std::string Bound() const = 0;  // "n >= 2f + 3"
  // gram is the (m + s) x (m + s) Gram matrix of the rows and the state rows (last)
  // when NeedsGram().
  virtual absl::StatusOr<Tail> Finish(size_t m, const SquareMatrix* gram, uint64_t round) const = 0;
};

absl::StatusOr<std::unique_ptr<PreStage>> MakePreStage(const StageSpec& spec,
                                                       const AggregatorOptions& options);
absl::StatusOr<std::unique_ptr<RuleStage>> MakeRuleStage(const StageSpec& spec,
                                                         const AggregatorOptions& options);
std::vector<std::string> RuleStageNames();
std::vector<std::string> PreStageNames();

// A round's plan in terms of the raw inputs.
struct PlanData {
  size_t k = 0;
  size_t state_rows = 0;
  Mixing mixing;  // rows x (k + state_rows); rows == 0: the inputs as they are
  std::optional<CoordinateRule> coordinate;
  std::string description;
};

// The Aggregator's implementation.
class DeviceBackend;

struct Pipeline {
  std::string spec;
  std::vector<std::unique_ptr<PreStage>> pre;
  std::unique_ptr<RuleStage> rule;
  size_t min_inputs = 1;
  std::string bound;
  bool needs_gram = false;
  bool votes_on_signs = false;  // Aggregator::VotesOnSigns()
  bool averages_inputs = false;  // Aggregator::AveragesInputs(), but for the device
  // The device the rule runs on (aggregators/device_internal.h); null: the CPU.
  std::shared_ptr<const DeviceBackend> device;
  std::string device_note;  // Aggregator::device_note()

  static std::unique_ptr<Aggregator> Wrap(std::unique_ptr<Pipeline> p);
  static RoundPlan MakePlan(std::shared_ptr<const PlanData> data);
  static const PlanData& Data(const RoundPlan& plan) { return *plan.data_; }
  static const Pipeline& Of(const Aggregator& a) { return *a.pipeline_; }
};

// a * f + b as size_t, saturating (f is capped by MakeAggregator anyway).
inline size_t LinearBound(size_t a, size_t f, size_t b) { return a * f + b; }

}  // namespace ps::aggregators::internal
