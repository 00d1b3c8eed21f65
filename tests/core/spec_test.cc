// The spec grammar shared by aggregators and codecs. The aggregator-specific cases
// (chains, bounds) are in tests/aggregators/pipeline_test.cc.
#include "core/spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ps::core {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

TEST(SpecTest, SplitsStagesAndArguments) {
  auto stages = ParseSpec(" topk(0.01) + bloom(p0, fpr=0.01)+fp16 ", "codec spec");
  ASSERT_TRUE(stages.ok()) << stages.status();
  ASSERT_EQ(stages->size(), 3u);
  EXPECT_EQ((*stages)[0].name, "topk");
  EXPECT_THAT((*stages)[0].args, ElementsAre(Pair("", "0.01")));
  EXPECT_EQ((*stages)[1].name, "bloom");
  EXPECT_THAT((*stages)[1].args, ElementsAre(Pair("", "p0"), Pair("fpr", "0.01")));
  EXPECT_EQ((*stages)[2].name, "fp16");
  EXPECT_TRUE((*stages)[2].args.empty());
  // '+' inside parentheses is part of a value (an exponent), not a separator.
  stages = ParseSpec("clip(1e+3)+mean", "aggregator spec");
  ASSERT_TRUE(stages.ok()) << stages.status();
  EXPECT_THAT((*stages)[0].args, ElementsAre(Pair("", "1e+3")));
}

TEST(SpecTest, ErrorsNameTheKindAndQuoteTheSpec) {
  auto stages = ParseSpec("topk(0.01", "codec spec");
  ASSERT_FALSE(stages.ok());
  EXPECT_EQ(stages.status().message(), "codec spec 'topk(0.01': '(' without ')'");
  EXPECT_THAT(ParseSpec("a+", "codec spec").status().message(), HasSubstr("empty stage"));
  EXPECT_THAT(ParseSpec("a(x=)", "codec spec").status().message(), HasSubstr("bad or empty argument"));
  EXPECT_THAT(ParseSpec("a(=1)", "codec spec").status().message(), HasSubstr("bad argument name"));
  // Stage names may start with a digit ("3lc"); argument names may not.
  EXPECT_TRUE(ParseSpec("3lc(s=1.5)", "codec spec").ok());
  EXPECT_THAT(ParseSpec("3lc(1s=1.5)", "codec spec").status().message(),
              HasSubstr("bad argument name"));
  EXPECT_THAT(ParseSpec("_x", "codec spec").status().message(), HasSubstr("bad stage name"));
}

TEST(SpecTest, ArgumentsBindByPositionAndName) {
  auto stages = ParseSpec("q(4, seed=7)", "codec spec");
  ASSERT_TRUE(stages.ok());
  auto args = StageArgs::Bind((*stages)[0], {"levels", "seed", "norm"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(*args->Int("levels", 1, 1, 255), 4);
  EXPECT_EQ(*args->Int("seed", 0, 0, 100), 7);
  EXPECT_EQ(*args->Choice("norm", {"l2", "max"}, 1), 1u);
  EXPECT_FALSE(args->Has("norm"));
  EXPECT_EQ(args->Canonical(), "q(levels=4, seed=7)");
  EXPECT_THAT(std::string(args->Int("levels", 1, 5, 255).status().message()),
              HasSubstr("levels must lie in [5, 255], got 4"));
  auto bad = StageArgs::Bind((*stages)[0], {"levels"});
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("unknown argument 'seed'"));
}

}  // namespace
}  // namespace ps::core
