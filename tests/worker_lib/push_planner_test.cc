#include "worker_lib/push_planner_internal.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/device.h"
#include "gpu/cuda_device.h"

namespace ps::internal {
namespace {

using ::testing::ElementsAre;

// Two shards; "w" is a large weight (4 slices of 64 Ki values, two per shard), "b" a
// small bias nearer the output.
core::ModelLayout PlannerLayout() {
  return *core::ModelLayout::Create({{"w", 1u << 18, 0}, {"b", 64, 1}}, /*slice_elems=*/1u << 16,
                                    2);
}

// Costs of the kind ProfileCodec measures, fixed so that the plans are exact.
std::vector<PlanOption> Candidates() {
  return {PlanOption{.name = "fp32"},
          PlanOption{.name = "fp16",
                     .bytes_per_value = 2,
                     .encode_seconds_per_value = 1e-9,
                     .decode_seconds_per_value = 1e-9},
          PlanOption{.name = "topk(0.01)+varint+fp16",
                     .bytes_per_value = 0.04,
                     .encode_seconds_per_value = 5e-9,
                     .decode_seconds_per_value = 1e-9}};
}

struct Clock {
  double now = 0;
  std::function<double()> fn() {
    return [this] { return now; };
  }
};

// Runs `rounds` rounds of 1 s: pull at the start, "w" ready at 0.4 s, "b" at 0.5 s.
void Rounds(PushPlanner& p, Clock& clock, uint64_t first, uint64_t rounds,
            std::vector<bool>* first_pushes = nullptr) {
  for (uint64_t r = first; r < first + rounds; ++r) {
    clock.now = static_cast<double>(r);
    p.RoundStarted(r);
    clock.now = static_cast<double>(r) + 0.4;
    const bool first_push = p.PushQueued(1, r);  // backward: the output side first
    clock.now = static_cast<double>(r) + 0.5;
    EXPECT_FALSE(p.PushQueued(0, r)) << "round " << r << " had its first push";
    if (first_pushes != nullptr) first_pushes->push_back(first_push);
  }
}

// Both tensors' own encode device.
std::vector<core::Device> OnCpu() { return {core::Device::kCpu, core::Device::kCpu}; }

// The codec names of a plan (none: no plan made).
std::optional<std::vector<std::string>> Names(const std::optional<std::vector<PlanOption>>& plan) {
  if (!plan.has_value()) return std::nullopt;
  std::vector<std::string> names;
  for (const PlanOption& o : *plan) names.push_back(o.name);
  return names;
}

PlanOptions Options() {
  PlanOptions o;
  o.enabled = true;
  o.warmup_rounds = 2;
  o.drift = 0.2;
  o.drift_rounds = 2;
  o.replan_rounds = 50;
  return o;
}

TEST(PushPlannerTest, PlansOnceWarmedUpAndMeasured) {
  const core::ModelLayout layout = PlannerLayout();
  Clock clock;
  PushPlanner p(Options(), Objective::kTime, layout, Candidates(), {"fp32", "fp32"}, OnCpu(),
                clock.fn());
  const std::vector<PlanLink> slow(2, PlanLink{.alpha_seconds = 1e-3, .seconds_per_byte = 4e-7});
  std::vector<bool> firsts;
  Rounds(p, clock, 0, 1, &firsts);
  EXPECT_EQ(p.Replan(0, slow, 12), std::nullopt) << "one round seen, two wanted";
  Rounds(p, clock, 1, 1, &firsts);
  EXPECT_THAT(firsts, ElementsAre(true, true));
  const std::vector<PlanLink> unmeasured = {slow[0], PlanLink{}};
  EXPECT_EQ(p.Replan(1, unmeasured, 12), std::nullopt) << "shard 1's link is not measured";
  EXPECT_EQ(p.stats().plans, 0u);
  EXPECT_THAT(p.stats().codecs, ElementsAre("fp32", "fp32"));
  EXPECT_DOUBLE_EQ(p.stats().measured_seconds, 1.0);

  // 2.5 MB/s: the weight's 1 MB in fp32 takes 0.4 s a shard; top-k is far cheaper.
  std::optional<std::vector<std::string>> codecs = Names(p.Replan(1, slow, 12));
  ASSERT_TRUE(codecs.has_value());
  EXPECT_EQ((*codecs)[0], "topk(0.01)+varint+fp16");
  const PlanStats stats = p.stats();
  EXPECT_EQ(stats.plans, 1u);
  EXPECT_EQ(stats.planned_at, 1u);
  EXPECT_EQ(stats.codecs, *codecs);
  EXPECT_LT(stats.predicted_seconds, stats.baseline_seconds);
  EXPECT_GT(stats.predicted_seconds, 0.5) << "the round cannot end before its last gradient";
  EXPECT_EQ(p.Replan(1, slow, 12), std::nullopt) << "nothing changed: no new plan";
}

TEST(PushPlannerTest, AFastLinkKeepsFp32AndDriftReplans) {
  const core::ModelLayout layout = PlannerLayout();
  Clock clock;
  PushPlanner p(Options(), Objective::kTime, layout, Candidates(), {"fp32", "fp32"}, OnCpu(),
                clock.fn());
  Rounds(p, clock, 0, 3);
  const std::vector<PlanLink> fast(2, PlanLink{.alpha_seconds = 1e-5, .seconds_per_byte = 1e-10});
  std::optional<std::vector<std::string>> codecs = Names(p.Replan(2, fast, 12));
  ASSERT_TRUE(codecs.has_value());
  EXPECT_THAT(*codecs, ElementsAre("fp32", "fp32")) << "10 GB/s: encoding costs more than it saves";
  // A 10 % change is noise; 3x slower links are a new network: plan again once the
  // drift held for drift_rounds (2) checks in a row.
  std::vector<PlanLink> links = fast;
  links[1].seconds_per_byte *= 1.1;
  EXPECT_EQ(p.Replan(3, links, 12), std::nullopt);
  EXPECT_EQ(p.Replan(3, links, 12), std::nullopt);
  links[1].seconds_per_byte = 4e-7;
  links[0].seconds_per_byte = 4e-7;
  EXPECT_EQ(p.Replan(3, links, 12), std::nullopt) << "one drifted check";
  EXPECT_EQ(p.Replan(3, fast, 12), std::nullopt) << "back: the streak ends";
  EXPECT_EQ(p.Replan(3, links, 12), std::nullopt) << "a new streak";
  codecs = Names(p.Replan(3, links, 12));
  ASSERT_TRUE(codecs.has_value());
  EXPECT_EQ((*codecs)[0], "topk(0.01)+varint+fp16");
  EXPECT_EQ(p.stats().plans, 2u);
  // And after replan_rounds rounds whatever happened.
  EXPECT_EQ(p.Replan(52, links, 12), std::nullopt);
  EXPECT_TRUE(p.Replan(53, links, 12).has_value());
}

// The pulls' own downlink estimate replaces the uplink's for the pulls of the plan; a
// shard whose downlink is not measured yet keeps its uplink; the downlink's drift
// alone replans.
TEST(PushPlannerTest, AMeasuredDownlinkTimesThePulls) {
  const core::ModelLayout layout = PlannerLayout();
  Clock clock;
  const std::vector<PlanLink> up(2, PlanLink{.alpha_seconds = 1e-3, .seconds_per_byte = 1e-8});
  PushPlanner same(Options(), Objective::kTime, layout, Candidates(), {"fp32", "fp32"}, OnCpu(),
                   clock.fn());
  Rounds(same, clock, 0, 3);
  ASSERT_TRUE(same.Replan(2, up, 12).has_value());
  const double symmetric = same.stats().predicted_seconds;

  PushPlanner p(Options(), Objective::kTime, layout, Candidates(), {"fp32", "fp32"}, OnCpu(),
                clock.fn());
  Rounds(p, clock, 0, 3);
  const std::vector<PlanLink> unmeasured(2);
  ASSERT_TRUE(p.Replan(2, up, 12, unmeasured).has_value());
  EXPECT_DOUBLE_EQ(p.stats().predicted_seconds, symmetric) << "no downlink: the uplink";
  // A downlink 40x slower (2.5 MB/s): each shard's dense pull of half the weight
  // (512 KiB) takes 0.2 s instead of 5 ms; compressing pushes cannot hide that.
  std::vector<PlanLink> slow_down(2, PlanLink{.alpha_seconds = 0, .seconds_per_byte = 4e-7});
  EXPECT_EQ(p.Replan(3, up, 12, slow_down), std::nullopt) << "one drifted check";
  ASSERT_TRUE(p.Replan(3, up, 12, slow_down).has_value()) << "two in a row: a new plan";
  EXPECT_EQ(p.stats().plans, 2u);
  EXPECT_GT(p.stats().predicted_seconds, symmetric + 0.19);
}

TEST(PushPlannerTest, CompressedPullsEnterThePlan) {
  const core::ModelLayout layout = PlannerLayout();
  Clock clock;
  PushPlanner p(Options(), Objective::kTime, layout, Candidates(), {"fp32", "fp32"}, OnCpu(),
                clock.fn());
  Rounds(p, clock, 0, 3);
  const std::vector<PlanLink> slow(2, PlanLink{.alpha_seconds = 1e-3, .seconds_per_byte = 4e-7});
  auto dense = p.Replan(2, slow, 12);
  ASSERT_TRUE(dense.has_value());
  const double dense_round = p.stats().predicted_seconds;
  // Pulls that bring 0.1 bytes per value instead of 4 make the round shorter.
  PushPlanner q(Options(), Objective::kTime, layout, Candidates(), {"fp32", "fp32"}, OnCpu(),
                clock.fn());
  q.PullTotals(1000, 10000);
  Rounds(q, clock, 0, 3);
  ASSERT_TRUE(q.Replan(2, slow, 12).has_value());
  // Each shard sends half the weight: 512 KB dense is 0.2 s at 2.5 MB/s, 13 KB is 5 ms.
  EXPECT_LT(q.stats().predicted_seconds, dense_round - 0.15);
}

TEST(PushPlannerTest, CandidatesComeProfiledWithTheBaselineFirst) {
  PlanOptions o = Options();
  o.candidates = {"fp16", "topk(0.01)+varint+fp16"};
  o.profile_budget = std::chrono::milliseconds(1);
  o.device_encode = false;
  auto made = PushPlanner::MakeCandidates(o, PlannerLayout());
  ASSERT_TRUE(made.ok()) << made.status();
  ASSERT_EQ(made->size(), 3u);
  EXPECT_EQ((*made)[0].name, "fp32");
  EXPECT_EQ((*made)[0].bytes_per_value, 4);
  EXPECT_EQ((*made)[1].name, "fp16");
  EXPECT_NEAR((*made)[1].bytes_per_value, 2, 0.01);
  EXPECT_GT((*made)[1].encode_seconds_per_value, 0);
  EXPECT_LT((*made)[2].bytes_per_value, 0.1);
  o.candidates = {"fp16", "nonsense"};
  EXPECT_FALSE(PushPlanner::MakeCandidates(o, PlannerLayout()).ok());
}

// With device_encode, a spec is offered again on the CUDA device only where it encodes
// there: never in a build or on a machine without a device (as in CI), and for fp16
// (which has a device encoder) where there is one; PowerSGD has none anywhere.
TEST(PushPlannerTest, DeviceOptionsOnlyWhereTheCodecEncodesThere) {
  PlanOptions o = Options();
  o.candidates = {"fp16", "powersgd(rank=2)"};
  o.profile_budget = std::chrono::milliseconds(1);
  auto made = PushPlanner::MakeCandidates(o, PlannerLayout());
  ASSERT_TRUE(made.ok()) << made.status();
  std::vector<std::string> on_device;
  for (size_t i = 0; i < made->size(); ++i) {
    if ((*made)[i].device != core::Device::kCuda) continue;
    on_device.push_back((*made)[i].name);
    ASSERT_GT(i, 0u);
    EXPECT_EQ((*made)[i - 1].name, (*made)[i].name) << "the CPU's profile comes first";
    EXPECT_EQ((*made)[i - 1].device, core::Device::kCpu);
  }
  if (gpu::CudaDevice().ok()) {
    EXPECT_THAT(on_device, ElementsAre("fp16"));
  } else {
    EXPECT_THAT(on_device, ::testing::IsEmpty()) << gpu::CudaDevice().status();
    EXPECT_EQ(made->size(), 3u);
  }
}

// The plan's choice carries the encode device: a GPU option that encodes faster is taken
// with its device; without device_encode a tensor keeps the device of its own options.
TEST(PushPlannerTest, ThePlanSaysWhereEachTensorEncodes) {
  const core::ModelLayout layout = PlannerLayout();
  const std::vector<PlanLink> slow(2, PlanLink{.alpha_seconds = 1e-3, .seconds_per_byte = 4e-7});
  std::vector<PlanOption> candidates = Candidates();
  candidates[2].encode_seconds_per_value = 1e-6;  // top-k on the CPU: 0.26 s for "w"
  PlanOption gpu = candidates[2];
  gpu.device = core::Device::kCuda;
  gpu.encode_seconds_per_value = 1e-8;
  candidates.push_back(gpu);
  Clock clock;
  PushPlanner p(Options(), Objective::kTime, layout, candidates, {"fp32", "fp32"}, OnCpu(),
                clock.fn());
  Rounds(p, clock, 0, 3);
  auto plan = p.Replan(2, slow, 12);
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ((*plan)[0].name, "topk(0.01)+varint+fp16");
  EXPECT_EQ((*plan)[0].device, core::Device::kCuda);
  EXPECT_THAT(p.stats().devices, ElementsAre(core::Device::kCuda, (*plan)[1].device));

  PlanOptions own = Options();
  own.device_encode = false;
  PushPlanner q(own, Objective::kTime, layout, Candidates(), {"fp32", "fp32"},
                {core::Device::kCuda, core::Device::kCpu}, clock.fn());
  EXPECT_THAT(q.stats().devices, ElementsAre(core::Device::kCuda, core::Device::kCpu));
  Rounds(q, clock, 0, 3);
  auto kept = q.Replan(2, slow, 12);
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ((*kept)[0].name, "topk(0.01)+varint+fp16");
  EXPECT_EQ((*kept)[0].device, core::Device::kCuda) << "its own device";
  EXPECT_EQ((*kept)[1].device, core::Device::kCpu);
  EXPECT_THAT(q.stats().devices, ElementsAre(core::Device::kCuda, core::Device::kCpu));
}

// Objective::kBytes, wired through: over a slow link both objectives compress the
// weight; the bias, pushed 0.1 s before the weight's gradient is ready, is hidden, so
// the time objective leaves it on fp32 and the bytes objective compresses it too (the
// round ends no later for it).
TEST(PushPlannerTest, TheBytesObjectiveAlsoCompressesWhatTheRoundHides) {
  const core::ModelLayout layout = PlannerLayout();
  Clock clock;
  PushPlanner time(Options(), Objective::kTime, layout, Candidates(), {"fp32", "fp32"}, OnCpu(),
                   clock.fn());
  PushPlanner bytes(Options(), Objective::kBytes, layout, Candidates(), {"fp32", "fp32"}, OnCpu(),
                    clock.fn());
  Rounds(time, clock, 0, 3);
  Rounds(bytes, clock, 0, 3);
  const std::vector<PlanLink> slow(2, PlanLink{.alpha_seconds = 1e-3, .seconds_per_byte = 4e-7});
  auto by_time = Names(time.Replan(2, slow, 12));
  auto by_bytes = Names(bytes.Replan(2, slow, 12));
  ASSERT_TRUE(by_time.has_value() && by_bytes.has_value());
  EXPECT_THAT(*by_time, ElementsAre("topk(0.01)+varint+fp16", "fp32"));
  EXPECT_THAT(*by_bytes, ElementsAre("topk(0.01)+varint+fp16", "topk(0.01)+varint+fp16"));
  EXPECT_LE(bytes.stats().predicted_seconds, bytes.stats().baseline_seconds);
}

}  // namespace
}  // namespace ps::internal
