// Byzantine attacks: each one's output on a fixed input, the optimized variants against
// their fixed versions under a real rule, and the factory's refusals.
#include "worker_lib/attacks/attack.h"

#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "aggregators/aggregator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::attacks {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatNear;
using ::testing::HasSubstr;

std::unique_ptr<Attack> Make(std::string_view spec) {
  auto attack = MakeAttack(spec);
  EXPECT_TRUE(attack.ok()) << attack.status();
  return attack.ok() ? *std::move(attack) : nullptr;
}

// Applies `attack` with the given own and honest vectors.
std::vector<float> Apply(const Attack& attack, std::vector<float> own,
                         const std::vector<std::vector<float>>& honest = {}, int n = 5, int f = 1,
                         const aggregators::Aggregator* rule = nullptr, uint64_t round = 0,
                         SharedSearch* shared = nullptr) {
  std::vector<std::span<const float>> views(honest.begin(), honest.end());
  AttackContext ctx;
  ctx.own = own;
  ctx.honest = views;
  ctx.num_workers = n;
  ctx.num_byzantine = f;
  ctx.rule = rule;
  ctx.seed = 7;
  ctx.round = round;
  ctx.shared_search = shared;
  std::vector<float> out(own.size());
  const absl::Status s = attack.Apply(ctx, out);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// `rows` honest gradients of `d` values drawn from N(0.5, 1).
std::vector<std::vector<float>> NormalRows(int rows, size_t d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.5f, 1.0f);
  std::vector<std::vector<float>> out(static_cast<size_t>(rows), std::vector<float>(d));
  for (auto& row : out) {
    for (float& v : row) v = normal(rng);
  }
  return out;
}

TEST(AttackTest, SignFlipScalesTheOwnGradient) {
  auto a = Make("signflip(2)");
  EXPECT_EQ(a->spec(), "signflip(scale=2)");
  EXPECT_FALSE(a->omniscient());
  EXPECT_THAT(Apply(*a, {1, -2, 3}, {{100, 100, 100}}), ElementsAre(-2, 4, -6));
}

TEST(AttackTest, IpmIsMinusEpsTimesTheHonestMean) {
  auto a = Make("ipm(eps=0.5)");
  EXPECT_TRUE(a->omniscient());
  EXPECT_THAT(Apply(*a, {9, 9}, {{1, 2}, {3, 4}}), ElementsAre(-1.0f, -1.5f));
  // Without the honest gradients, the own gradient is the only sample.
  EXPECT_THAT(Apply(*a, {2, -4}), ElementsAre(-1.0f, 2.0f));
}

TEST(AttackTest, AlieIsMeanMinusZTimesTheSampleStd) {
  auto a = Make("alie(z=1)");
  // mean {2, 4}, sample std {sqrt 2, sqrt 8}.
  EXPECT_THAT(
      Apply(*a, {0, 0}, {{1, 2}, {3, 6}}),
      ElementsAre(FloatNear(2 - std::sqrt(2.0f), 1e-6f), FloatNear(4 - std::sqrt(8.0f), 1e-6f)));
  // z from n and f: n = 12, f = 2 gives s = 5 and z = Phi^-1(7 / 12).
  auto automatic = Make("alie");
  EXPECT_EQ(automatic->spec(), "alie(z=auto)");
  const double z = *AlieZ(12, 2);
  EXPECT_NEAR(z, 0.210428, 1e-5);
  EXPECT_THAT(Apply(*automatic, {0, 0}, {{1, 2}, {3, 6}}, 12, 2),
              ElementsAre(FloatNear(static_cast<float>(2 - z * std::sqrt(2.0)), 1e-6f),
                          FloatNear(static_cast<float>(4 - z * std::sqrt(8.0)), 1e-6f)));
}

TEST(AttackTest, AlieZFollowsThePaper) {
  EXPECT_NEAR(*AlieZ(50, 24), 1.750686, 1e-5);  // s = 2, Phi^-1(0.96)
  EXPECT_NEAR(*AlieZ(10, 1), 0.0, 1e-9);        // s = 5, Phi^-1(0.5)
  EXPECT_THAT(std::string(AlieZ(10, 0).status().message()), HasSubstr("1 <= f < n"));
  EXPECT_THAT(std::string(AlieZ(10, 10).status().message()), HasSubstr("1 <= f < n"));
  EXPECT_THAT(std::string(AlieZ(10, 6).status().message()), HasSubstr("z is unbounded"));
}

TEST(AttackTest, GaussianIsSeededPerWorkerAndRound) {
  auto a = Make("gaussian(sigma=2, mu=1)");
  EXPECT_EQ(a->spec(), "gaussian(mu=1, sigma=2)");
  const std::vector<float> own(100001, 0.0f);
  const std::vector<float> x = Apply(*a, own);
  EXPECT_EQ(x, Apply(*a, own));
  EXPECT_NE(x, Apply(*a, own, {}, 5, 1, nullptr, /*round=*/1));
  double sum = 0, sq = 0;
  for (float v : x) {
    sum += v;
    sq += double{v} * v;
  }
  const double mean = sum / x.size();
  EXPECT_NEAR(mean, 1.0, 0.03);  // sd of the mean 0.006
  EXPECT_NEAR(std::sqrt(sq / x.size() - mean * mean), 2.0, 0.03);
}

TEST(AttackTest, LabelFlipPushesTheOwnGradientOfFlippedData) {
  auto a = Make("labelflip");
  EXPECT_TRUE(a->flips_labels());
  EXPECT_THAT(Apply(*a, {1, 2}), ElementsAre(1, 2));
}

TEST(AttackTest, MimicCopiesOneHonestWorker) {
  auto a = Make("mimic(1)");
  EXPECT_THAT(Apply(*a, {0, 0}, {{1, 2}, {3, 4}}), ElementsAre(3, 4));
  std::vector<float> own = {0, 0}, out(2);
  std::vector<float> h = {1, 2};
  std::vector<std::span<const float>> one = {h};
  AttackContext ctx{.own = own, .honest = one};
  EXPECT_THAT(std::string(a->Apply(ctx, out).message()), HasSubstr("worker 1 is not among the 1"));
}

TEST(AttackTest, NanAndInfFillEveryValue) {
  for (const char* spec : {"nan", "inf"}) {
    for (float v : Apply(*Make(spec), {1, 2, 3})) EXPECT_FALSE(std::isfinite(v)) << spec;
  }
}

// The optimized variants never do worse, under the rule they target, than the fixed
// attack with its default factor: the search includes factors on both sides of it.
TEST(AttackTest, OptimizedVariantsMoveTheRuleFartherThanTheFixedOnes) {
  const int n = 12, f = 2;
  const std::vector<std::vector<float>> honest = NormalRows(n - f, 200, 3);
  for (const char* rule_spec :
       {"mean", "trimmed_mean", "krum", "clip(2)+nnm+trimmed_mean", "median"}) {
    aggregators::AggregatorOptions options;
    options.num_workers = n;
    options.num_byzantine = f;
    auto rule = aggregators::MakeAggregator(rule_spec, options);
    ASSERT_TRUE(rule.ok()) << rule.status();
    auto distance = [&](const std::vector<float>& attack) {
      std::vector<const float*> inputs;
      std::vector<double> mean(200);
      for (const auto& h : honest) {
        inputs.push_back(h.data());
        for (size_t j = 0; j < 200; ++j) mean[j] += h[j] / double(n - f);
      }
      for (int i = 0; i < f; ++i) inputs.push_back(attack.data());
      std::vector<float> out(200);
      EXPECT_TRUE((*rule)->Aggregate(inputs, out, {}).ok());
      double d = 0;
      for (size_t j = 0; j < 200; ++j) d += (out[j] - mean[j]) * (out[j] - mean[j]);
      return d;
    };
    const std::vector<float> own(200);
    for (const auto& [fixed, optimized] :
         {std::pair{"ipm", "ipm_opt"}, std::pair{"alie", "alie_opt"}}) {
      auto opt = Make(optimized);
      EXPECT_TRUE(opt->needs_rule());
      const double d_fixed = distance(Apply(*Make(fixed), own, honest, n, f, rule->get()));
      const double d_opt = distance(Apply(*opt, own, honest, n, f, rule->get()));
      EXPECT_GE(d_opt, d_fixed * 0.999) << rule_spec << " " << optimized;
    }
  }
}

// Colluding attackers of one process search once per round and push what each would
// have found alone; another round, rule or input set searches again.
TEST(AttackTest, AttackersShareTheirSearchAndPushWhatEachWouldFind) {
  const int n = 12, f = 2;
  const std::vector<std::vector<float>> honest = NormalRows(n - f, 300, 5);
  aggregators::AggregatorOptions options;
  options.num_workers = n;
  options.num_byzantine = f;
  auto trimmed = aggregators::MakeAggregator("trimmed_mean", options);
  auto krum = aggregators::MakeAggregator("krum", options);
  ASSERT_TRUE(trimmed.ok() && krum.ok());
  const std::vector<float> own(300);
  for (const char* spec : {"alie_opt", "ipm_opt"}) {
    auto alone = Make(spec);
    const std::vector<float> expected = Apply(*alone, own, honest, n, f, trimmed->get(), 4);
    SharedSearch shared;
    // Two attackers (their own instances, as in a cluster), concurrently.
    auto first = Make(spec), second = Make(spec);
    std::vector<float> a, b;
    std::thread t([&] { a = Apply(*first, own, honest, n, f, trimmed->get(), 4, &shared); });
    b = Apply(*second, own, honest, n, f, trimmed->get(), 4, &shared);
    t.join();
    EXPECT_EQ(a, expected) << spec;
    EXPECT_EQ(b, expected) << spec;
    EXPECT_EQ(shared.searches(), 1u) << spec;
    EXPECT_EQ(shared.reused(), 1u) << spec;
    // Another round, another rule, other inputs: each a search of its own.
    Apply(*first, own, honest, n, f, trimmed->get(), 5, &shared);
    Apply(*first, own, honest, n, f, krum->get(), 4, &shared);
    std::vector<std::vector<float>> changed = honest;
    changed[3][7] += 1.0f;
    EXPECT_EQ(Apply(*first, own, changed, n, f, trimmed->get(), 4, &shared),
              Apply(*alone, own, changed, n, f, trimmed->get(), 4))
        << spec;
    EXPECT_EQ(shared.searches(), 4u) << spec;
    EXPECT_EQ(shared.reused(), 1u) << spec;
  }
}

TEST(SharedSearchTest, KeepsTheNewestKeysAndSharesErrors) {
  SharedSearch shared(2);
  int calls = 0;
  auto value = [&](double v) {
    return [&calls, v]() -> absl::StatusOr<double> {
      ++calls;
      return v;
    };
  };
  EXPECT_EQ(*shared.Get("a", value(1)), 1);
  EXPECT_EQ(*shared.Get("b", value(2)), 2);
  EXPECT_EQ(*shared.Get("a", value(9)), 1);  // kept: the first answer
  EXPECT_EQ(*shared.Get("c", value(3)), 3);  // drops "a", the oldest
  EXPECT_EQ(*shared.Get("a", value(4)), 4);
  EXPECT_EQ(calls, 4);
  auto refused = [&]() -> absl::StatusOr<double> {
    ++calls;
    return absl::InvalidArgumentError("no");
  };
  EXPECT_EQ(shared.Get("e", refused).status().message(), "no");
  EXPECT_EQ(shared.Get("e", value(5)).status().message(), "no");
  EXPECT_EQ(calls, 5);
  EXPECT_EQ(shared.searches(), 5u);
  EXPECT_EQ(shared.reused(), 2u);
}

TEST(AttackTest, OptimizedVariantsNeedARuleAndTheHonestGradients) {
  auto a = Make("alie_opt");
  std::vector<float> own = {1, 2}, out(2);
  AttackContext ctx{.own = own, .num_workers = 5, .num_byzantine = 1};
  EXPECT_THAT(std::string(a->Apply(ctx, out).message()), HasSubstr("needs the configured rule"));
  aggregators::AggregatorOptions options;
  options.num_workers = 5;
  options.num_byzantine = 1;
  auto rule = *aggregators::MakeAggregator("median", options);
  ctx.rule = rule.get();
  EXPECT_THAT(std::string(a->Apply(ctx, out).message()), HasSubstr("needs the honest gradients"));
}

TEST(AttackTest, RefusesMismatchedSizes) {
  std::vector<float> own = {1, 2}, out(2);
  std::vector<float> h = {1, 2, 3};
  std::vector<std::span<const float>> honest = {h};
  AttackContext ctx{.own = own, .honest = honest};
  EXPECT_EQ(std::string(Make("ipm")->Apply(ctx, out).message()),
            "ipm: honest gradient 0 has 3 values, expected 2");
}

TEST(MakeAttackTest, NamesAndRefusals) {
  EXPECT_THAT(AttackNames(), ElementsAre("signflip", "ipm", "alie", "ipm_opt", "alie_opt",
                                         "gaussian", "labelflip", "mimic", "nan", "inf"));
  EXPECT_THAT(std::string(MakeAttack("x").status().message()),
              HasSubstr("unknown attack 'x'; known: signflip, ipm"));
  EXPECT_THAT(std::string(MakeAttack("ipm(eps=-1)").status().message()), HasSubstr("eps"));
  EXPECT_THAT(std::string(MakeAttack("alie(z=fast)").status().message()), HasSubstr("z"));
  EXPECT_THAT(std::string(MakeAttack("signflip+ipm").status().message()), HasSubstr("one attack"));
  EXPECT_THAT(std::string(MakeAttack("nan(1)").status().message()), HasSubstr("nan"));
  EXPECT_EQ(Make("ipm")->spec(), "ipm(eps=0.1)");
  EXPECT_EQ(Make("mimic")->spec(), "mimic(worker=0)");
}

}  // namespace
}  // namespace ps::attacks
