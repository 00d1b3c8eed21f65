// Fuzz target for the spec grammars read from flags and from workers: the input is tried
// as an --aggregator spec (any string either is refused with an error or makes an
// Aggregator that then aggregates a few small inputs into a finite result, or refuses
// them cleanly) and as a tensor's optimizer spec (a layout entry, server/optimizer.h:
// refused with a message, or an optimizer whose canonical spec parses to itself, whose
// steps then run over a few values (under ASan and UBSan); a step may overflow with
// hyperparameters such as weight_decay=1e300, which the workers see as divergence).
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "aggregators/aggregator.h"
#include "server/optimizer.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

void TryOptimizer(const std::string& spec) {
  auto opt = ps::server::Optimizer::Parse(spec);
  if (!opt.ok()) {
    PS_FUZZ_CHECK(!opt.status().message().empty(), "optimizer refused without a message");
    return;
  }
  auto again = ps::server::Optimizer::Parse(opt->spec());
  PS_FUZZ_CHECK(again.ok() && again->spec() == opt->spec(), "canonical optimizer spec not stable");
  std::vector<float> g = {0.5f, -1.0f, 0.0f}, w = {1.0f, 2.0f, -3.0f}, m(3, 0.0f);
  std::vector<float> v(opt->has_second_moment() ? 3 : 0, 0.0f);
  for (uint64_t step = 1; step <= 3; ++step) opt->Step(1e-3f, step, g, m, v, w);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 256) return 0;  // specs are short; longer inputs only slow the fuzzer
  const std::string spec(reinterpret_cast<const char*>(data), size);
  TryOptimizer(spec);
  ps::aggregators::AggregatorOptions options;
  options.num_workers = 11;
  options.num_byzantine = 2;
  auto rule = ps::aggregators::MakeAggregator(spec, options);
  if (!rule.ok()) {
    PS_FUZZ_CHECK(!rule.status().message().empty(), "refused without a message");
    return 0;
  }
  PS_FUZZ_CHECK((*rule)->MinInputs() >= 1, "a rule accepting no inputs");
  // The canonical name must itself be a valid spec for the same chain.
  auto again = ps::aggregators::MakeAggregator((*rule)->name(), options);
  PS_FUZZ_CHECK(again.ok() && (*again)->name() == (*rule)->name(), "canonical name not stable");
  const size_t d = 37;
  std::vector<std::vector<float>> x(11, std::vector<float>(d));
  for (size_t i = 0; i < x.size(); ++i) {
    for (size_t c = 0; c < d; ++c) x[i][c] = std::sin(0.3f * static_cast<float>(i * d + c));
  }
  std::vector<const float*> ptrs;
  for (const auto& v : x) ptrs.push_back(v.data());
  std::vector<float> out(d);
  std::vector<float> state((*rule)->StateRows() * d, 0.0f);
  ps::aggregators::AggregationContext ctx;
  ctx.state = state;
  if ((*rule)->Aggregate(ptrs, out, ctx).ok()) {
    for (float v : out) PS_FUZZ_CHECK(std::isfinite(v), "non-finite aggregate of finite inputs");
  }
  return 0;
}
