// Checkpoint files and the store (server/checkpoint.h): round trip, corruption and
// truncation detected as DATA_LOSS, content checks, atomic writes keeping the newest K,
// and LoadLatest falling back past a broken file. Also: the checked-in fuzz seeds
// (tests/fuzz/corpus/checkpoint) still decode, so the corpus follows format changes.
#include "server/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

namespace ps::server {
namespace {

using ::testing::HasSubstr;

std::string Fp32(const std::vector<float>& v) {
  std::string out(v.size() * sizeof(float), '\0');
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// Shard `shard` of a two-tensor layout cut for `shards` shards, every owned slice at
// `version`.
ShardCheckpoint Make(uint32_t shard = 0, uint32_t shards = 1, uint64_t version = 5) {
  auto layout = core::ModelLayout::Create({{"w", 10, 0}, {"b", 3, 1}}, 4, shards);
  EXPECT_TRUE(layout.ok());
  ShardCheckpoint c;
  c.shard_id = shard;
  c.num_shards = shards;
  c.layout = *layout;
  c.config_summary = "rule=median";
  c.written_unix_s = 1795000000;
  for (uint32_t id : layout->SlicesOfShard(shard)) {
    const uint32_t n = layout->slices()[id].numel;
    SliceCheckpoint s;
    s.slice_id = id;
    s.version = version;
    std::vector<float> v(n);
    for (uint32_t i = 0; i < n; ++i) v[i] = 0.5f * static_cast<float>(id) - 0.125f * static_cast<float>(i);
    s.values = Fp32(v);
    s.velocity.assign(n, 0.01f * static_cast<float>(id));
    s.rule_state.assign(2 * n, 1.5f);
    s.params.assign(n, 0.25f * static_cast<float>(id));
    s.second_moment.assign(n, 0.001f * static_cast<float>(id + 1));
    s.optimizer_steps = 7 + id;
    c.slices.push_back(std::move(s));
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  c.workers = {WorkerCheckpoint{0, Membership::State::kPresent,
                                WorkerSuspicion{0.1, 0.1, 0.6, false, 40, 38.5, 2, 0}},
               WorkerCheckpoint{2, Membership::State::kLeft,
                                WorkerSuspicion{0.7, 0.7, nan, true, 12, 3.0, 2, 1}},
               WorkerCheckpoint{5, Membership::State::kExpired, WorkerSuspicion{}}};
  c.suspicion_history = {Suspicion::Window{0, {0.2, nan, 0.8}, {0.2, nan, 0.8}, {0.5, nan, -0.3}},
                         Suspicion::Window{50, {0.1, nan, 0.7}, {0.1, nan, 0.7}, {0.6, nan, nan}}};
  return c;
}

TEST(CheckpointCodecTest, RoundTripKeepsEverything) {
  const ShardCheckpoint c = Make(1, 2, 9);
  auto back = DecodeCheckpoint(EncodeCheckpoint(c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->shard_id, 1u);
  EXPECT_EQ(back->num_shards, 2u);
  EXPECT_EQ(back->config_summary, "rule=median");
  EXPECT_EQ(back->written_unix_s, 1795000000);
  ASSERT_TRUE(back->layout.has_value());
  EXPECT_EQ(back->layout->hash(), c.layout->hash());
  ASSERT_EQ(back->slices.size(), c.slices.size());
  for (size_t i = 0; i < c.slices.size(); ++i) {
    EXPECT_EQ(back->slices[i].slice_id, c.slices[i].slice_id);
    EXPECT_EQ(back->slices[i].version, 9u);
    EXPECT_EQ(back->slices[i].values, c.slices[i].values);
    EXPECT_EQ(back->slices[i].velocity, c.slices[i].velocity);
    EXPECT_EQ(back->slices[i].rule_state, c.slices[i].rule_state);
    EXPECT_EQ(back->slices[i].params, c.slices[i].params);
    EXPECT_EQ(back->slices[i].second_moment, c.slices[i].second_moment);
    EXPECT_EQ(back->slices[i].optimizer_steps, c.slices[i].optimizer_steps);
  }
  EXPECT_EQ(back->MaxVersion(), 9u);
  ASSERT_EQ(back->workers.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const WorkerCheckpoint& w = back->workers[i];
    const WorkerCheckpoint& want = c.workers[i];
    EXPECT_EQ(w.worker, want.worker);
    EXPECT_EQ(w.state, want.state);
    EXPECT_THAT(w.suspicion.score, ::testing::NanSensitiveDoubleEq(want.suspicion.score));
    EXPECT_THAT(w.suspicion.alignment, ::testing::NanSensitiveDoubleEq(want.suspicion.alignment));
    EXPECT_EQ(w.suspicion.suspected, want.suspicion.suspected);
    EXPECT_EQ(w.suspicion.slice_rounds_weighed, want.suspicion.slice_rounds_weighed);
    EXPECT_EQ(w.suspicion.share_sum, want.suspicion.share_sum);
    EXPECT_EQ(w.suspicion.windows, want.suspicion.windows);
    EXPECT_EQ(w.suspicion.windows_suspected, want.suspicion.windows_suspected);
  }
  ASSERT_EQ(back->suspicion_history.size(), 2u);
  EXPECT_EQ(back->suspicion_history[1].first_round, 50u);
  EXPECT_THAT(back->suspicion_history[1].scores,
              ::testing::Pointwise(::testing::NanSensitiveDoubleEq(),
                                   c.suspicion_history[1].scores));
  EXPECT_THAT(back->suspicion_history[0].alignment,
              ::testing::Pointwise(::testing::NanSensitiveDoubleEq(),
                                   c.suspicion_history[0].alignment));
}

TEST(CheckpointCodecTest, EveryFlippedBitIsDataLoss) {
  const std::string file = EncodeCheckpoint(Make());
  for (size_t byte = 0; byte < file.size(); byte += 7) {
    std::string bad = file;
    bad[byte] = static_cast<char>(bad[byte] ^ 0x10);
    auto r = DecodeCheckpoint(bad);
    ASSERT_FALSE(r.ok()) << "flip at byte " << byte << " went unnoticed";
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << byte;
  }
}

TEST(CheckpointCodecTest, TruncationAndGarbageAreDataLoss) {
  const std::string file = EncodeCheckpoint(Make());
  for (size_t keep : {size_t{0}, size_t{8}, size_t{20}, file.size() / 2, file.size() - 1}) {
    auto r = DecodeCheckpoint(file.substr(0, keep));
    ASSERT_FALSE(r.ok()) << keep;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << keep;
  }
  auto r = DecodeCheckpoint(file + "x");
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("torn write"));
  EXPECT_THAT(std::string(DecodeCheckpoint("hello, world, this is not it").status().message()),
              HasSubstr("not a ps-server checkpoint"));
}

TEST(CheckpointCodecTest, ContentChecksRefuseWithReasons) {
  struct Case {
    const char* name;
    void (*mutate)(ShardCheckpoint&);
    const char* expected;
  };
  const Case cases[] = {
      {"missing slice", [](ShardCheckpoint& c) { c.slices.pop_back(); }, "slices shard 0 owns"},
      {"repeated slice", [](ShardCheckpoint& c) { c.slices.push_back(c.slices.front()); },
       "or repeated"},
      {"short values", [](ShardCheckpoint& c) { c.slices[0].values.resize(4); }, "values have"},
      {"nan value",
       [](ShardCheckpoint& c) {
         const float nan = std::numeric_limits<float>::quiet_NaN();
         std::memcpy(c.slices[0].values.data(), &nan, sizeof(nan));
       },
       "values is not finite"},
      {"inf velocity",
       [](ShardCheckpoint& c) { c.slices[1].velocity[0] = std::numeric_limits<float>::infinity(); },
       "velocity is not finite"},
      {"velocity size", [](ShardCheckpoint& c) { c.slices[0].velocity.resize(7); }, "velocity"},
      {"second moment size", [](ShardCheckpoint& c) { c.slices[0].second_moment.resize(7); },
       "second moment"},
      {"rule state not rows", [](ShardCheckpoint& c) { c.slices[0].rule_state.resize(5); },
       "rule state"},
      {"parameters twice the slice", [](ShardCheckpoint& c) { c.slices[0].params.resize(8); },
       "parameters size"},
      {"nan parameter",
       [](ShardCheckpoint& c) { c.slices[1].params[0] = std::numeric_limits<float>::quiet_NaN(); },
       "parameters is not finite"},
      {"shard out of range", [](ShardCheckpoint& c) { c.shard_id = 3; }, "names shard 3 of 1"},
      {"no layout with slices", [](ShardCheckpoint& c) { c.layout.reset(); },
       "slices but no layout"},
      {"workers out of order", [](ShardCheckpoint& c) { std::swap(c.workers[0], c.workers[1]); },
       "ids must increase"},
      {"repeated worker", [](ShardCheckpoint& c) { c.workers[1].worker = 0; }, "ids must increase"},
      {"worker id too large", [](ShardCheckpoint& c) { c.workers[2].worker = 70000; },
       "below 65536"},
      {"unknown state",
       [](ShardCheckpoint& c) { c.workers[0].state = Membership::State::kSpare; },
       "is not present, left or expired"},
      {"score above 1", [](ShardCheckpoint& c) { c.workers[0].suspicion.score = 1.5; },
       "suspicion out of range"},
      {"more suspected windows than windows",
       [](ShardCheckpoint& c) { c.workers[1].suspicion.windows_suspected = 3; },
       "suspicion out of range"},
      {"window sizes differ",
       [](ShardCheckpoint& c) { c.suspicion_history[0].alignment.pop_back(); }, "sizes differ"},
      {"window score out of range",
       [](ShardCheckpoint& c) { c.suspicion_history[1].set_aside[0] = -0.5; },
       "worker 0's score out of range"},
      {"too many windows",
       [](ShardCheckpoint& c) {
         c.suspicion_history.resize(Suspicion::kHistoryWindows + 1, c.suspicion_history[0]);
       },
       "at most 64"},
  };
  for (const Case& k : cases) {
    ShardCheckpoint c = Make();
    k.mutate(c);
    auto r = DecodeCheckpoint(EncodeCheckpoint(c));
    ASSERT_FALSE(r.ok()) << k.name;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << k.name;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(k.expected)) << k.name;
  }
}

TEST(CheckpointCodecTest, AShardsCheckpointDoesNotHoldAnotherShardsSlice) {
  ShardCheckpoint c = Make(0, 2);
  const ShardCheckpoint other = Make(1, 2);
  c.slices.push_back(other.slices.front());
  auto r = DecodeCheckpoint(EncodeCheckpoint(c));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("is not owned by shard 0"));
}

class CheckpointStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ps-checkpoint-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(CheckpointStoreTest, WritesKeepTheNewestKAndNoTemporaries) {
  CheckpointStore store(dir_.string(), 0, 3);
  for (uint64_t v = 1; v <= 5; ++v) ASSERT_TRUE(store.Write(Make(0, 1, v)).ok());
  auto files = store.List();
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->size(), 3u);
  EXPECT_THAT(files->front(), HasSubstr("checkpoint-00000000000000000003.pscp"));
  EXPECT_THAT(files->back(), HasSubstr("checkpoint-00000000000000000005.pscp"));
  size_t entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(store.directory())) {
    ++entries;
    EXPECT_EQ(e.path().extension(), ".pscp") << e.path();
  }
  EXPECT_EQ(entries, 3u);
  auto loaded = store.LoadLatest();
  ASSERT_TRUE(loaded.ok() && loaded->has_value());
  EXPECT_EQ((*loaded)->checkpoint.MaxVersion(), 5u);
  EXPECT_TRUE((*loaded)->skipped.empty());
}

TEST_F(CheckpointStoreTest, ACorruptedNewestFileFallsBackToThePreviousOne) {
  CheckpointStore store(dir_.string(), 1, 3);
  ASSERT_TRUE(store.Write(Make(1, 2, 4)).ok());
  auto newest = store.Write(Make(1, 2, 6));
  ASSERT_TRUE(newest.ok());
  {
    std::fstream f(*newest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(30);
    f.put('\x7f');
  }
  auto loaded = store.LoadLatest();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(loaded->has_value());
  EXPECT_EQ((*loaded)->checkpoint.MaxVersion(), 4u);
  ASSERT_EQ((*loaded)->skipped.size(), 1u);
  EXPECT_THAT((*loaded)->skipped[0], HasSubstr("checkpoint-00000000000000000006.pscp"));
}

TEST_F(CheckpointStoreTest, AnEmptyOrBrokenDirectoryLoadsNothing) {
  CheckpointStore store(dir_.string(), 0, 2);
  auto none = store.LoadLatest();
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  auto path = store.Write(Make());
  ASSERT_TRUE(path.ok());
  std::filesystem::resize_file(*path, 10);
  auto broken = store.LoadLatest();
  ASSERT_TRUE(broken.ok());
  EXPECT_FALSE(broken->has_value());
}

TEST(CheckpointSeedsTest, TheFuzzCorpusStillDecodes) {
  // The seeds named framed_one_tensor and file_valid are valid checkpoints
  // (tests/fuzz/make_corpus.py); if the format changes, rerun that script.
  const std::filesystem::path dir = std::filesystem::path(PS_SOURCE_DIR) / "tests/fuzz/corpus/checkpoint";
  std::ifstream in(dir / "file_valid", std::ios::binary);
  ASSERT_TRUE(in) << "missing seed " << (dir / "file_valid");
  const std::string input((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(input.empty());
  auto c = DecodeCheckpoint(std::string_view(input).substr(1));
  ASSERT_TRUE(c.ok()) << c.status() << " (rerun tests/fuzz/make_corpus.py)";
  EXPECT_EQ(c->slices.size(), 3u);
  EXPECT_EQ(c->MaxVersion(), 7u);
}

}  // namespace
}  // namespace ps::server
