#include "core/layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>
#include <set>

namespace ps::core {
namespace {

using ::testing::HasSubstr;

std::vector<TensorSpec> Mlp() {
  return {{"fc1.weight", 784 * 128, 0}, {"fc1.bias", 128, 1}, {"fc2.weight", 1280, 2},
          {"fc2.bias", 10, 3}};
}

TEST(ModelLayoutTest, CutsTensorsIntoSlicesInOffsetOrder) {
  auto l = ModelLayout::Create(Mlp(), 65536, 2);
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_EQ(l->slices().size(), 5u);  // 100352 -> 2 slices, then 1 each
  auto fc1 = l->SlicesOfTensor(0);
  ASSERT_EQ(fc1.size(), 2u);
  EXPECT_EQ(l->slices()[fc1[0]].offset, 0u);
  EXPECT_EQ(l->slices()[fc1[0]].numel, 65536u);
  EXPECT_EQ(l->slices()[fc1[1]].offset, 65536u);
  EXPECT_EQ(l->slices()[fc1[1]].numel, 784u * 128 - 65536);
  EXPECT_EQ(l->total_elems(), 784u * 128 + 128 + 1280 + 10);
  for (size_t t = 0; t < l->tensors().size(); ++t) {
    uint64_t covered = 0;
    for (uint32_t id : l->SlicesOfTensor(t)) {
      EXPECT_EQ(l->slices()[id].tensor, t);
      EXPECT_EQ(l->slices()[id].offset, covered);
      covered += l->slices()[id].numel;
    }
    EXPECT_EQ(covered, l->tensors()[t].numel);
  }
}

TEST(ModelLayoutTest, EveryShardGetsSlicesAndLoadsAreBalanced) {
  std::vector<TensorSpec> t;
  for (int i = 0; i < 20; ++i) t.push_back({"t" + std::to_string(i), uint64_t(1000 + 37 * i), i});
  auto l = ModelLayout::Create(t, 256, 3);
  ASSERT_TRUE(l.ok());
  auto loads = l->ShardLoads();
  auto [lo, hi] = std::minmax_element(loads.begin(), loads.end());
  EXPECT_LE(*hi - *lo, 256u);  // within one slice
  std::set<uint32_t> seen;
  for (uint32_t s = 0; s < 3; ++s) {
    int32_t last_priority = INT32_MIN;
    for (uint32_t id : l->SlicesOfShard(s)) {
      EXPECT_EQ(l->slices()[id].shard, s);
      EXPECT_GE(l->slices()[id].priority, last_priority) << "shard slices not in priority order";
      last_priority = l->slices()[id].priority;
      EXPECT_TRUE(seen.insert(id).second);
    }
  }
  EXPECT_EQ(seen.size(), l->slices().size());
}

TEST(ModelLayoutTest, HashDependsOnEveryField) {
  const uint64_t base = ModelLayout::Create(Mlp(), 65536, 2)->hash();
  EXPECT_EQ(ModelLayout::Create(Mlp(), 65536, 2)->hash(), base);
  EXPECT_NE(ModelLayout::Create(Mlp(), 65536, 3)->hash(), base);
  EXPECT_NE(ModelLayout::Create(Mlp(), 4096, 2)->hash(), base);
  auto renamed = Mlp();
  renamed[1].name = "fc1.b";
  EXPECT_NE(ModelLayout::Create(renamed, 65536, 2)->hash(), base);
  auto resized = Mlp();
  resized[3].numel = 11;
  EXPECT_NE(ModelLayout::Create(resized, 65536, 2)->hash(), base);
  auto reprio = Mlp();
  reprio[0].priority = 9;
  EXPECT_NE(ModelLayout::Create(reprio, 65536, 2)->hash(), base);
  EXPECT_NE(base, 0u);
}

// A tensor with rows (a weight matrix) is cut at whole rows: slices of the longest
// multiple of its row length that fits slice_elems; rows longer than a slice are cut
// as any tensor; the summary counts and bounds the same slices Create makes.
TEST(ModelLayoutTest, TensorsWithRowsAreCutAtWholeRows) {
  const std::vector<TensorSpec> t = {
      {"w", 10 * 300, 0, 300}, {"long_rows", 2 * 1500, 1, 1500}, {"b", 10, 2, 0}};
  EXPECT_EQ(SliceElemsOf(t[0], 1000), 900u);
  EXPECT_EQ(SliceElemsOf(t[1], 1000), 1000u);
  EXPECT_EQ(SliceElemsOf(t[2], 1000), 1000u);
  for (uint32_t shards : {1u, 2u, 3u}) {
    absl::StatusOr<ModelLayout> l = ModelLayout::Create(t, 1000, shards);
    ASSERT_TRUE(l.ok()) << l.status();
    std::vector<uint32_t> sizes;
    for (uint32_t id : l->SlicesOfTensor(0)) {
      const SliceInfo& s = l->slices()[id];
      EXPECT_EQ(s.offset % 300, 0u) << id;
      EXPECT_EQ(s.numel % 300, 0u) << id;
      sizes.push_back(s.numel);
    }
    EXPECT_EQ(sizes, (std::vector<uint32_t>{900, 900, 900, 300}));
    EXPECT_EQ(l->SlicesOfTensor(1).size(), 3u) << "1000, 1000, 1000: rows split";
    absl::StatusOr<LayoutSummary> sum = ModelLayout::Check(t, 1000, shards);
    ASSERT_TRUE(sum.ok());
    EXPECT_EQ(sum->num_slices, l->slices().size());
    EXPECT_EQ(sum->partial_slices, 4u + 1u) << "w's four and b";
    for (uint32_t s = 0; s < shards; ++s) {
      EXPECT_LE(l->SlicesOfShard(s).size(), sum->max_owned_slices) << shards;
      EXPECT_LE(l->ShardLoads()[s], sum->max_owned_elems) << shards;
    }
  }
  // The row length is part of the layout, and must divide the tensor.
  std::vector<TensorSpec> plain = t;
  for (TensorSpec& spec : plain) spec.row_elems = 0;
  EXPECT_NE(ModelLayout::Hash(t, 1000, 2), ModelLayout::Hash(plain, 1000, 2));
  std::vector<TensorSpec> other_rows = t;
  other_rows[0].row_elems = 600;
  EXPECT_NE(ModelLayout::Hash(t, 1000, 2), ModelLayout::Hash(other_rows, 1000, 2));
  std::vector<TensorSpec> ragged = t;
  ragged[0].row_elems = 7;
  EXPECT_EQ(ModelLayout::Create(ragged, 1000, 1).status().message(),
            "tensor 'w' has 3000 elements, not whole rows of 7");
}

TEST(ModelLayoutTest, AssignmentIsDeterministic) {
  auto a = ModelLayout::Create(Mlp(), 1000, 4);
  auto b = ModelLayout::Create(Mlp(), 1000, 4);
  ASSERT_EQ(a->slices().size(), b->slices().size());
  for (size_t i = 0; i < a->slices().size(); ++i) EXPECT_EQ(a->slices()[i].shard, b->slices()[i].shard);
}

TEST(ModelLayoutTest, RefusesBadLayoutsWithMessages) {
  EXPECT_THAT(ModelLayout::Create({}, 10, 1).status().message(), HasSubstr("no tensors"));
  EXPECT_THAT(ModelLayout::Create({{"a", 0, 0}}, 10, 1).status().message(), HasSubstr("no elements"));
  EXPECT_THAT(ModelLayout::Create({{"a", 1, 0}, {"a", 2, 0}}, 10, 1).status().message(),
              HasSubstr("duplicate tensor name 'a'"));
  EXPECT_THAT(ModelLayout::Create({{"", 1, 0}}, 10, 1).status().message(), HasSubstr("names"));
  EXPECT_THAT(ModelLayout::Create({{"a", 1, 0}}, 0, 1).status().message(), HasSubstr("slice_elems"));
  EXPECT_THAT(ModelLayout::Create({{"a", 1, 0}}, kMaxSliceElems + 1, 1).status().message(),
              HasSubstr("slice_elems"));
  EXPECT_THAT(ModelLayout::Create({{"a", 1, 0}}, 10, 0).status().message(), HasSubstr("num_shards"));
  EXPECT_THAT(ModelLayout::Create({{"a", uint64_t{1} << 40, 0}}, 1, 1).status().message(),
              HasSubstr("slices"));
  EXPECT_EQ(ModelLayout::Create({}, 10, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelLayoutTest, FindsTensorsByName) {
  auto l = ModelLayout::Create(Mlp(), 65536, 1);
  EXPECT_EQ(l->FindTensor("fc2.weight"), 2);
  EXPECT_EQ(l->FindTensor("nope"), -1);
}

}  // namespace
}  // namespace ps::core

namespace ps::core {
namespace {

// numel 2^64 - 1 with slice_elems 2^22 made the slice count wrap below the limit, and
// the layout was then cut slice by slice until memory ran out.
TEST(ModelLayoutCheckTest, SizesNearTwoToTheSixtyFourAreRefusedWithoutWrapping) {
  for (uint32_t slice_elems : {1u << 22, 1u, 65536u}) {
    absl::StatusOr<LayoutSummary> sum = ModelLayout::Check({{"w", ~0ull, 0}}, slice_elems, 1);
    ASSERT_FALSE(sum.ok());
    EXPECT_EQ(sum.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(sum.status().message(), HasSubstr("elements"));
  }
  // Two tensors whose sum wraps.
  EXPECT_FALSE(ModelLayout::Check({{"a", kMaxModelElems, 0}, {"b", ~0ull - 5, 0}}, 1u << 22, 1).ok());
  EXPECT_FALSE(ModelLayout::Create({{"w", ~0ull, 0}}, 1u << 22, 1).ok());
}

TEST(ModelLayoutCheckTest, SummaryBoundsWhatEachShardOwns) {
  std::vector<TensorSpec> t;
  for (int i = 0; i < 30; ++i) t.push_back({"t" + std::to_string(i), uint64_t(700 + 131 * i), i});
  for (uint32_t shards : {1u, 2u, 3u, 7u}) {
    absl::StatusOr<LayoutSummary> sum = ModelLayout::Check(t, 256, shards);
    ASSERT_TRUE(sum.ok()) << sum.status();
    absl::StatusOr<ModelLayout> l = ModelLayout::Create(t, 256, shards);
    ASSERT_TRUE(l.ok());
    EXPECT_EQ(sum->num_slices, l->slices().size());
    EXPECT_EQ(sum->total_elems, l->total_elems());
    for (uint32_t s = 0; s < shards; ++s) {
      EXPECT_LE(l->SlicesOfShard(s).size(), sum->max_owned_slices) << shards;
      EXPECT_LE(l->ShardLoads()[s], sum->max_owned_elems) << shards;
    }
  }
}

// The hashes are on the wire and in checkpoints: these are the values the layout hash
// had when it was computed with OpenSSL's SHA-256 (core/sha256.h computes it since).
TEST(ModelLayoutTest, HashKeepsItsValues) {
  EXPECT_EQ(ModelLayout::Hash({{"w", 1000, 0}, {"b", 10, 1}}, 256, 1), 0x41be698ebe91b6ecu);
  std::vector<TensorSpec> t = {
      {"fc1.weight", 784 * 128, 0}, {"fc1.bias", 128, 1}, {"emb", 1 << 20, -2}};
  EXPECT_EQ(ModelLayout::Hash(t, 65536, 3), 0xbf2f513609a0d31cu);
  t[2].row_elems = 64;
  EXPECT_EQ(ModelLayout::Hash(t, 65536, 3), 0xda6d629893e6c29au);
  std::vector<TensorSpec> many;
  for (int i = 0; i < 40; ++i) {
    many.push_back({"tensor_with_a_long_name_" + std::to_string(i), uint64_t(1000 + i), i % 3});
  }
  EXPECT_EQ(ModelLayout::Hash(many, 4096, 7), 0xa46cc034aca8c7d5u);
}

TEST(ModelLayoutCheckTest, HashEqualsTheBuiltLayoutsAndMessagesQuoteBoundedNames) {
  const std::vector<TensorSpec> t = {{"a", 100, 0}, {"b", 7, 1}};
  EXPECT_EQ(ModelLayout::Hash(t, 16, 2), ModelLayout::Create(t, 16, 2)->hash());
  EXPECT_NE(ModelLayout::Hash(t, 16, 2), ModelLayout::Hash(t, 16, 1));
  const std::string huge(1 << 20, '\n');
  absl::StatusOr<LayoutSummary> sum = ModelLayout::Check({{huge, 1, 0}}, 16, 1);
  ASSERT_FALSE(sum.ok());
  EXPECT_LT(sum.status().message().size(), 256u);
  EXPECT_EQ(sum.status().message().find('\n'), absl::string_view::npos);
}

}  // namespace
}  // namespace ps::core
