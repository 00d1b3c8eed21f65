// The shard's table of slices (SliceTable) on its own: the layout it takes, the memory
// it estimates and the lookups it refuses.
#include "server/slice_table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/fp32_bytes.h"
#include "core/refusal.h"
#include "server/deadline_queue.h"
#include "server/memory_estimate.h"

namespace ps::server {
namespace {

using ::testing::HasSubstr;

struct TableRig {
  TableRig() {
    rules.num_workers = 2;
    rules.clock = &clock;
    rules.deadlines = &deadlines;
  }
  static SliceTable::Config Config(uint32_t shard_id, uint32_t num_shards, uint64_t max_shard_bytes,
                                   bool aggregate_only = false, bool priority_order = false) {
    return {shard_id, num_shards, /*num_workers=*/2, /*max_message_bytes=*/1 << 20,
            max_shard_bytes, /*state_rows=*/0, /*keep_published_model=*/false, aggregate_only,
            priority_order};
  }
  core::ManualClock clock;
  DeadlineQueue deadlines;
  RoundRules rules;
};

// The memory estimate counts the published versions a layout's slices keep: the snapshot
// pool's spare buffers with dense pulls; with --pull-codec one more copy of the
// parameters (what the workers hold) and each version's encoded change instead.
TEST(SliceTableTest, PublishedVersionsCountInTheMemoryEstimate) {
  // The summary core::ModelLayout makes of one tensor of 4096 in slices of 1024, one shard
  // (its bound on what a shard owns adds a slice).
  core::LayoutSummary sum;
  sum.num_slices = sum.max_owned_slices = 4;
  sum.total_elems = 4096;
  sum.max_owned_elems = 4096 + 1024;
  EXPECT_EQ(EstimateShardBytes(sum, 2, 0, false, 2),
            EstimateShardBytes(sum, 2, 0, false) + 2 * 5120 * sizeof(float));
  // Published versions beyond one: with dense pulls the snapshot pool's spare buffers;
  // with fp16 pulls what the workers hold and a version's change (2 bytes a value, in
  // fp32 copies rounded up: one). Each layout fits a bound of its estimate, not one less.
  for (const std::string codec : {"", "fp16"}) {
    const uint64_t need =
        EstimateShardBytes(sum, 2, 0, false, codec.empty() ? SnapshotPool::kMaxFree : 2);
    for (const uint64_t bound : {need - 1, need}) {
      TableRig rig;
      rig.rules.pull_codec = codec;
      SliceTable t(TableRig::Config(0, 1, /*max_shard_bytes=*/bound), &rig.rules);
      absl::StatusOr<std::vector<uint32_t>> owned = t.Register(0, {{"w", 4096, 0}}, 1024, 1);
      if (bound == need) {
        EXPECT_TRUE(owned.ok()) << "'" << codec << "': " << owned.status();
      } else {
        EXPECT_EQ(core::RefusalOf(owned.status()), core::Refusal::kOverLimit)
            << "'" << codec << "': " << owned.status();
      }
    }
  }
  const uint64_t dense = EstimateShardBytes(sum, 2, 0, false, SnapshotPool::kMaxFree);
  // So does Adam's second moment (SGD's buffer is the velocity every slice has).
  for (const std::string optimizer : {"sgd(lr=0.1, momentum=0.9)", "adam(lr=0.1)"}) {
    TableRig rig;
    SliceTable t(TableRig::Config(0, 1, /*max_shard_bytes=*/dense), &rig.rules);
    absl::StatusOr<std::vector<uint32_t>> owned =
        t.Register(0, {{"w", 4096, 0, 0, optimizer}}, 1024, 1);
    if (optimizer[0] == 's') {
      EXPECT_TRUE(owned.ok()) << owned.status();
    } else {
      EXPECT_EQ(core::RefusalOf(owned.status()), core::Refusal::kOverLimit) << owned.status();
    }
  }
}

// An --aggregate-only shard applies no optimizer: a layout naming one is refused (the
// workers step their own optimizers then), one without is taken.
TEST(SliceTableTest, AnAggregateOnlyShardRefusesATensorsOptimizer) {
  TableRig rig;
  SliceTable t(TableRig::Config(0, 1, 1 << 30, /*aggregate_only=*/true), &rig.rules);
  const absl::Status refused =
      t.Register(0, {{"w", 10, 0, 0, "adam(lr=0.001)"}}, 4, 1).status();
  EXPECT_EQ(core::RefusalOf(refused), core::Refusal::kBadLayout);
  EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("--aggregate-only"));
  EXPECT_TRUE(t.Register(0, {{"w", 10, 0}}, 4, 1).ok());
}

TEST(SliceTableTest, TheFirstLayoutWinsAndLookupsNameWhatIsWrong) {
  TableRig rig;
  SliceTable t(TableRig::Config(1, 2, 1 << 30, /*aggregate_only=*/false, /*priority_order=*/true),
               &rig.rules);
  EXPECT_FALSE(t.registered());
  EXPECT_EQ(t.layout(), nullptr);
  EXPECT_EQ(core::RefusalOf(t.Lookup(1, 0).status()), core::Refusal::kNoLayout);
  EXPECT_TRUE(t.CheckJoin(0, 1234).ok()) << "any layout may join before registration";

  EXPECT_EQ(core::RefusalOf(t.Register(0, {{"w", 10, 0}}, 4, /*num_shards=*/3).status()),
            core::Refusal::kBadLayout);
  EXPECT_EQ(core::RefusalOf(t.Register(0, {{"w", 10, 0}}, 1 << 20, 2).status()),
            core::Refusal::kBadLayout)
      << "slices larger than a message";
  EXPECT_EQ(core::RefusalOf(t.Register(0, {{"w", 1ull << 28, 0}}, 1 << 16, 2).status()),
            core::Refusal::kOverLimit);
  // An optimizer the shard cannot make is refused naming the tensor and the reason.
  const absl::Status bad_optimizer =
      t.Register(0, {{"w", 10, 0, 0, "rmsprop(lr=0.1)"}}, 4, 2).status();
  EXPECT_EQ(core::RefusalOf(bad_optimizer), core::Refusal::kBadLayout);
  EXPECT_THAT(std::string(bad_optimizer.message()),
              ::testing::HasSubstr("tensor 'w': optimizer 'rmsprop(lr=0.1)': unknown optimizer"));
  EXPECT_FALSE(t.registered()) << "nothing refused was installed";

  // Tensor b (priority 0) is more urgent than a (priority 5).
  const std::vector<core::TensorSpec> tensors = {{"a", 8, 5}, {"b", 8, 0}};
  absl::StatusOr<std::vector<uint32_t>> owned = t.Register(0, tensors, 4, 2);
  ASSERT_TRUE(owned.ok()) << owned.status();
  ASSERT_TRUE(t.registered());
  const uint64_t hash = t.hash();
  EXPECT_EQ(hash, core::ModelLayout::Hash(tensors, 4, 2));
  EXPECT_EQ(t.owned_count(), owned->size());
  std::vector<uint32_t> sorted = *owned;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(t.owned_ids(), sorted);
  EXPECT_EQ(t.publish_order(), *owned) << "priority order";
  EXPECT_EQ(t.layout()->slices()[owned->front()].tensor, 1u);

  EXPECT_EQ(t.Register(1, tensors, 4, 2).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(core::RefusalOf(t.Register(1, {{"c", 8, 0}}, 4, 2).status()),
            core::Refusal::kLayoutMismatch);
  EXPECT_EQ(core::RefusalOf(t.CheckJoin(1, hash + 1)), core::Refusal::kLayoutMismatch);
  EXPECT_TRUE(t.CheckJoin(1, hash).ok());

  EXPECT_EQ(core::RefusalOf(t.Lookup(hash + 1, owned->front()).status()),
            core::Refusal::kLayoutMismatch);
  EXPECT_EQ(core::RefusalOf(t.Lookup(hash, 99).status()), core::Refusal::kUnknownSlice);
  uint32_t other = 0;
  while (std::find(owned->begin(), owned->end(), other) != owned->end()) ++other;
  EXPECT_EQ(core::RefusalOf(t.Lookup(hash, other).status()), core::Refusal::kWrongShard);
  absl::StatusOr<SliceRound*> s = t.Lookup(hash, owned->front());
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, t.slice(owned->front()));

  EXPECT_FALSE(t.ready());
  for (size_t i = 0; i + 1 < owned->size(); ++i) EXPECT_FALSE(t.SliceInitialized());
  EXPECT_TRUE(t.SliceInitialized()) << "the last one makes the shard ready";
  EXPECT_TRUE(t.ready());
  EXPECT_EQ(t.Restore(*t.layout(), {}).status().code(), absl::StatusCode::kFailedPrecondition);

  // Queries over every owned slice.
  size_t visited = 0;
  t.ForEach([&](SliceRound&) { ++visited; });
  EXPECT_EQ(visited, owned->size());
  Wakeups wake;
  SliceRound& first = *t.slice(owned->front());
  const std::vector<float> values = {1, 2, 3, 4};
  ASSERT_TRUE(first.Initialize(*core::SharedFp32(values), &wake).ok());
  ASSERT_TRUE(first.FastForward(3, &wake));
  EXPECT_EQ(t.MaxVersion(), 3u);
  EXPECT_EQ(t.MinVersion(), 0u) << "the other slices are at version 0";
  EXPECT_EQ(t.WatcherCount(), 0u);
  EXPECT_NE(first.Watch(4, [](bool) {}, /*id=*/1, /*draining=*/false), 0u);
  EXPECT_EQ(t.WatcherCount(), 1u);
}

}  // namespace
}  // namespace ps::server
