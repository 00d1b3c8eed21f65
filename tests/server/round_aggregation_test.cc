// A closed round's aggregation and step (round_aggregation.h) on its own: the rule's
// result, the model's step, the thread's aggregate buffer and the pool's share.
#include "server/round_aggregation.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "aggregators/aggregator.h"
#include "codecs/codec.h"
#include "core/fp32_bytes.h"
#include "core/thread_pool.h"
#include "server/slice_round.h"

namespace ps::server {
namespace {

using ::testing::HasSubstr;

std::string Fp32(const std::vector<float>& v) {
  std::string s;
  core::AppendFp32(v, &s);
  return s;
}

ClosedRound RoundOf(const std::vector<std::vector<float>>& rows) {
  ClosedRound r;
  r.info.numel = static_cast<uint32_t>(rows[0].size());
  const size_t n = rows.size();
  r.inputs.pushed.assign(n, 1);
  r.inputs.supports.assign(n, std::nullopt);
  r.inputs.chunked.assign(n, ChunkedPush{});
  for (const auto& row : rows) {
    r.inputs.rows.push_back(std::make_unique<float[]>(row.size()));
    std::copy(row.begin(), row.end(), r.inputs.rows.back().get());
  }
  r.model.params.assign(r.info.numel, 1.0f);
  r.model.velocity.assign(r.info.numel, 0.0f);
  return r;
}

TEST(RoundAggregationTest, AggregatesTheRoundAndStepsTheModel) {
  core::ThreadPool pool(1);
  aggregators::AggregatorOptions opts;
  opts.num_workers = 3;
  std::unique_ptr<aggregators::Aggregator> mean = aggregators::MakeAggregator("mean", opts).value();
  RoundAggregation a(mean.get(), &pool, SgdOptions{0.5f, 0.0f, 0.0f}, /*aggregate_only=*/false,
                     /*quorum=*/2);
  ClosedRound r = RoundOf({{1, 2}, {3, 4}, {5, 9}});
  r.inputs.pushed[1] = 0;  // worker 1 did not push: its row is not read
  std::vector<float> out(2);
  AggregationCounts counts;
  ASSERT_TRUE(a.Aggregate(r, out, &counts).ok());
  EXPECT_EQ(out, (std::vector<float>{3, 5.5f}));
  EXPECT_EQ(counts.on_support + counts.sign_votes + counts.masked, 0u);
  absl::Status st;
  std::shared_ptr<const std::string> values = a.Step(r, out, st).values;
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(r.model.params, (std::vector<float>{1 - 1.5f, 1 - 2.75f}));
  EXPECT_EQ(*values, Fp32(r.model.params));

  // Finite inputs whose mean overflows: the aggregate is refused, and after the error
  // the parameters stay.
  const float big = std::numeric_limits<float>::max();
  ClosedRound overflowing = RoundOf({{big, 1}, {big, 2}, {big, 3}});
  overflowing.model.params = r.model.params;
  absl::StatusOr<std::span<const float>> bad = a.Aggregate(overflowing, out, &counts);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInternal) << bad.status();
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("not finite"));
  absl::Status failed = bad.status();
  values = a.Step(overflowing, out, failed).values;
  EXPECT_EQ(*values, Fp32({1 - 1.5f, 1 - 2.75f}));

  // Below the quorum the rule does not run: the round is refused as BelowQuorum, which
  // the shard publishes unchanged and counts as dropped, not as an aggregation error.
  ClosedRound alone = RoundOf({{1, 2}, {3, 4}, {5, 9}});
  alone.inputs.pushed[1] = alone.inputs.pushed[2] = 0;
  std::vector<float> untouched = {7, 7};
  absl::Status below = a.Aggregate(alone, untouched, &counts).status();
  EXPECT_TRUE(IsBelowQuorum(below)) << below;
  EXPECT_THAT(std::string(below.message()), ::testing::HasSubstr("1 of the 2 inputs"));
  EXPECT_EQ(untouched, (std::vector<float>{7, 7}));
  EXPECT_FALSE(IsBelowQuorum(absl::FailedPreconditionError("x")));
  EXPECT_TRUE(a.CheckQuorum(2, "model round 3").ok());

  // Model scope: participants are the workers in every slice's round.
  ClosedRound other = RoundOf({{1, 1}, {1, 1}, {1, 1}});
  std::vector<ClosedRound> rounds;
  rounds.push_back(std::move(r));
  rounds.push_back(std::move(other));
  EXPECT_EQ(a.Participants(rounds, 3), (std::vector<uint32_t>{0, 2}));
}

// The aggregate's buffer: the thread's own, reused and grown as slices need; a buffer made
// while the thread's is in use, and one on another thread, are others.
TEST(AggregateBufferTest, TheThreadsBufferIsReusedAndANestedOneIsItsOwn) {
  const float* first = nullptr;
  {
    const AggregateBuffer a(1000);
    first = a.values().data();
    ASSERT_EQ(a.values().size(), 1000u);
    a.values()[999] = 1.0f;
    const AggregateBuffer nested(1000);
    EXPECT_NE(nested.values().data(), first);
    EXPECT_EQ(nested.values().size(), 1000u);
    nested.values()[999] = 2.0f;
    EXPECT_EQ(a.values()[999], 1.0f);
    std::thread([&] {
      const AggregateBuffer other(1000);
      EXPECT_NE(other.values().data(), first);
      other.values()[0] = 3.0f;
    }).join();
  }
  {
    const AggregateBuffer again(500);
    EXPECT_EQ(again.values().data(), first);
    EXPECT_EQ(again.values().size(), 500u);
  }
  const AggregateBuffer larger(1 << 20);
  ASSERT_EQ(larger.values().size(), size_t{1} << 20);
  larger.values()[(1 << 20) - 1] = 4.0f;  // writable to the end (ASan would see past it)
}

// A slice below 2^20 coordinates is aggregated on the job that closed it alone; a larger
// one spreads its coordinates over the pool.
TEST(RoundAggregationTest, OnlyASliceOfAMillionCoordinatesIsSpreadOverThePool) {
  core::ThreadPool pool(2);
  aggregators::AggregatorOptions opts;
  opts.num_workers = 1;
  std::unique_ptr<aggregators::Aggregator> mean = aggregators::MakeAggregator("mean", opts).value();
  RoundAggregation a(mean.get(), &pool, SgdOptions{0.5f, 0.0f, 0.0f}, /*aggregate_only=*/false,
                     /*quorum=*/1);
  ClosedRound r;
  for (uint32_t numel : {uint32_t{1}, uint32_t{65536}, (uint32_t{1} << 20) - 1}) {
    r.info.numel = numel;
    EXPECT_EQ(a.OneSlicePool(r), nullptr) << numel;
  }
  for (uint32_t numel : {uint32_t{1} << 20, uint32_t{1} << 22}) {
    r.info.numel = numel;
    EXPECT_EQ(a.OneSlicePool(r), &pool) << numel;
  }
}

// The learning rate the round's pushes carried: their median, which one liar of three
// does not move; the tensor's optimizer (Adam here) steps with it and counts its steps.
TEST(RoundAggregationTest, TheTensorsOptimizerStepsWithTheMedianOfTheRatesPushed) {
  core::ThreadPool pool(1);
  aggregators::AggregatorOptions opts;
  opts.num_workers = 3;
  std::unique_ptr<aggregators::Aggregator> mean = aggregators::MakeAggregator("mean", opts).value();
  // The shard's own SGD would take lr 100: the tensor's optimizer must be used instead.
  RoundAggregation a(mean.get(), &pool, SgdOptions{100.0f, 0.0f, 0.0f}, /*aggregate_only=*/false,
                     /*quorum=*/2);
  ClosedRound r = RoundOf({{1, -2}, {1, -2}, {1, -2}});
  r.model.optimizer = std::make_shared<const Optimizer>(*Optimizer::Parse("adam(lr=0.5)"));
  r.model.second_moment.assign(2, 0.0f);
  r.inputs.lrs = {0.01f, 1e30f, 0.02f};  // worker 1 lies
  std::vector<float> out(2);
  AggregationCounts counts;
  ASSERT_TRUE(a.Aggregate(r, out, &counts).ok());
  absl::Status st;
  a.Step(r, out, st);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(r.model.steps, 1u);
  // Adam's first step moves each value by lr (times sign), here the median 0.02.
  EXPECT_NEAR(r.model.params[0], 1 - 0.02f, 1e-6);
  EXPECT_NEAR(r.model.params[1], 1 + 0.02f, 1e-6);
  // Without rates pushed: the spec's lr, 0.5 (Adam's later steps are near lr too).
  r.inputs.lrs.assign(3, std::numeric_limits<float>::quiet_NaN());
  a.Step(r, out, st);
  EXPECT_EQ(r.model.steps, 2u);
  EXPECT_NEAR(r.model.params[0], 1 - 0.02f - 0.5f, 1e-5);
  // The shard's SGD (no optimizer of the tensor's) takes the median too.
  ClosedRound plain = RoundOf({{1, 1}, {1, 1}, {1, 1}});
  plain.inputs.lrs = {0.25f, 0.25f, 7.0f};
  a.Step(plain, out = {1, 1}, st);
  EXPECT_EQ(plain.model.params, (std::vector<float>{0.75f, 0.75f}));
}

TEST(RoundAggregationTest, AggregateOnlyPublishesTheAggregateOrZeros) {
  core::ThreadPool pool(1);
  aggregators::AggregatorOptions opts;
  opts.num_workers = 2;
  std::unique_ptr<aggregators::Aggregator> mean = aggregators::MakeAggregator("mean", opts).value();
  RoundAggregation a(mean.get(), &pool, SgdOptions{}, /*aggregate_only=*/true, /*quorum=*/1);
  ClosedRound r = RoundOf({{1, 2}, {3, 4}});
  std::vector<float> out = {2, 3};
  absl::Status st;
  EXPECT_EQ(*a.Step(r, out, st).values, Fp32({2, 3}));
  absl::Status failed = absl::InvalidArgumentError("too few inputs");
  EXPECT_EQ(*a.Step(r, out, failed).values, Fp32({0, 0}));
}

// The mean of one push is that push's row: the round's step reads it in place, `out`
// stays unwritten, and the parameters step as from a written mean.
TEST(RoundAggregationTest, TheMeanOfOnePushIsItsRowReadInPlace) {
  core::ThreadPool pool(1);
  aggregators::AggregatorOptions opts;
  opts.num_workers = 2;
  std::unique_ptr<aggregators::Aggregator> mean = aggregators::MakeAggregator("mean", opts).value();
  RoundAggregation a(mean.get(), &pool, SgdOptions{0.5f, 0.0f, 0.0f}, /*aggregate_only=*/false,
                     /*quorum=*/1);
  ClosedRound r = RoundOf({{1, 2}, {4, 6}});
  r.inputs.pushed[0] = 0;
  std::vector<float> out(2, std::numeric_limits<float>::quiet_NaN());
  AggregationCounts counts;
  InputWeights weights;
  absl::StatusOr<std::span<const float>> aggregate = a.Aggregate(r, out, &counts, &weights);
  ASSERT_TRUE(aggregate.ok()) << aggregate.status();
  EXPECT_EQ(aggregate->data(), r.inputs.rows[1].get());
  EXPECT_TRUE(std::isnan(out[0]) && std::isnan(out[1]));
  EXPECT_EQ(weights.workers, (std::vector<uint32_t>{1}));
  EXPECT_EQ(weights.influence, (std::vector<double>{2.0}));
  EXPECT_EQ(weights.alignment, (std::vector<double>{1.0}));
  absl::Status st;
  std::shared_ptr<const std::string> values = a.Step(r, *aggregate, st).values;
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(*values, Fp32({1 - 2.0f, 1 - 3.0f}));
}

// What a SliceTable of two workers needs around it.

// Pushes kept as 3lc under the plain mean: the aggregate is made from their digits
// (counted), with the bits, influence and alignment the rule gives on their decoded rows;
// under any other chain, or with one push decoded already, the rows are decoded as before.
TEST(RoundAggregationTest, TheMeanOfThreeLcPushesIsMadeFromTheirDigitsWithTheRulesResult) {
  core::ThreadPool pool(1);
  constexpr size_t kWorkers = 3;
  constexpr size_t kNumel = 5000;  // past the fast decode's minimum, a partial last block
  aggregators::AggregatorOptions opts;
  opts.num_workers = kWorkers;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::shared_ptr<const codecs::Codec> codec = codecs::MakeCodec("3lc").value();
  std::vector<std::string> payloads(kWorkers);
  std::vector<std::vector<float>> decoded(kWorkers, std::vector<float>(kNumel));
  for (size_t w = 0; w < kWorkers; ++w) {
    std::vector<float> g(kNumel);
    for (float& v : g) v = normal(rng) * static_cast<float>(w + 1) + (w == 2 ? 0.3f : 0.0f);
    std::string bytes;
    ASSERT_TRUE(const_cast<codecs::Codec&>(*codec).Encode(g, &bytes).ok());
    ASSERT_TRUE(codec->Decode(bytes, decoded[w]).ok());
    payloads[w] = bytes;
  }
  auto kept_round = [&] {
    ClosedRound r = RoundOf(std::vector<std::vector<float>>(kWorkers, std::vector<float>(kNumel)));
    r.inputs.kept.resize(kWorkers);
    for (size_t w = 0; w < kWorkers; ++w) r.inputs.kept[w] = KeptPush{payloads[w], codec};
    return r;
  };
  for (const char* spec : {"mean", "nnm+mean"}) {
    SCOPED_TRACE(spec);
    std::unique_ptr<aggregators::Aggregator> rule =
        aggregators::MakeAggregator(spec, opts).value();
    RoundAggregation a(rule.get(), &pool, SgdOptions{}, /*aggregate_only=*/true, /*quorum=*/1);
    ClosedRound dense = RoundOf(decoded);
    ClosedRound kept = kept_round();
    std::vector<float> want(kNumel), got(kNumel);
    AggregationCounts dense_counts, kept_counts;
    InputWeights dense_weights, kept_weights;
    absl::StatusOr<std::span<const float>> w = a.Aggregate(dense, want, &dense_counts, &dense_weights);
    ASSERT_TRUE(w.ok()) << w.status();
    RowScratch scratch;
    absl::StatusOr<std::span<const float>> g =
        a.Aggregate(kept, got, &kept_counts, &kept_weights, &scratch);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_EQ(std::memcmp(w->data(), g->data(), kNumel * sizeof(float)), 0);
    EXPECT_EQ(kept_counts.means_of_digits, std::string(spec) == "mean" ? 1u : 0u);
    EXPECT_EQ(dense_counts.means_of_digits, 0u);
    EXPECT_EQ(kept_weights.workers, dense_weights.workers);
    ASSERT_EQ(kept_weights.influence.size(), kWorkers);
    ASSERT_EQ(kept_weights.alignment.size(), kWorkers);
    for (size_t j = 0; j < kWorkers; ++j) {
      EXPECT_EQ(kept_weights.influence[j], dense_weights.influence[j]) << j;
      EXPECT_EQ(std::bit_cast<uint64_t>(kept_weights.alignment[j]),
                std::bit_cast<uint64_t>(dense_weights.alignment[j]))
          << j;
    }
  }
  // One push already decoded into its row (an earlier Rows() without scratch): the rows.
  std::unique_ptr<aggregators::Aggregator> mean = aggregators::MakeAggregator("mean", opts).value();
  RoundAggregation a(mean.get(), &pool, SgdOptions{}, /*aggregate_only=*/true, /*quorum=*/1);
  ClosedRound kept = kept_round();
  const uint32_t first[] = {0};
  ASSERT_TRUE(kept.Rows(first).ok());
  std::vector<float> out(kNumel);
  AggregationCounts counts;
  ASSERT_TRUE(a.Aggregate(kept, out, &counts).ok());
  EXPECT_EQ(counts.means_of_digits, 0u);
}

}  // namespace
}  // namespace ps::server
