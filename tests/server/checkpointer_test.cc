// Checkpointer: the restore at start, writes on demand, and the writer thread, over a
// real Shard (manual clock, no network) and real files.
#include "server/checkpointer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "aggregators/aggregator.h"
#include "codecs/codec.h"
#include "core/fp32_bytes.h"
#include "core/thread_pool.h"

namespace ps::server {
namespace {

class CheckpointerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ps-checkpointer-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    options_.num_workers = 1;
    options_.learning_rate = 1.0f;
    options_.momentum = 0.0f;
    options_.checkpoint_dir = dir_.string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A one-worker shard; `registered`: with the layout registered and slice 0 at
  // {1, 1, 1, 1} (otherwise bare, as a process before its restore).
  std::unique_ptr<Shard> MakeShard(bool registered = true) {
    aggregators::AggregatorOptions a;
    a.num_workers = 1;
    auto rule = aggregators::MakeAggregator("mean", a);
    EXPECT_TRUE(rule.ok()) << rule.status();
    auto shard = std::make_unique<Shard>(options_, 0, *std::move(rule), &clock_, &pool_);
    if (!registered) return shard;
    auto layout = core::ModelLayout::Create({{"w", 4, 0}}, 4, 1);
    EXPECT_TRUE(layout.ok());
    hash_ = layout->hash();
    EXPECT_TRUE(shard->Join(0, hash_).ok());
    EXPECT_TRUE(shard->RegisterLayout(0, *layout).ok());
    std::string ones;
    core::AppendFp32(std::vector<float>(4, 1.0f), &ones);
    EXPECT_TRUE(shard->InitSlice(0, hash_, 0, ones).ok());
    return shard;
  }

  // Pushes round `round` of the only worker and waits (bounded) for its version.
  void Step(Shard& shard, uint64_t round) {
    std::string g;
    ASSERT_TRUE((*codecs::MakeCodec("fp32"))->Encode(std::vector<float>(4, 0.5f), &g).ok());
    ASSERT_TRUE(shard.Push(0, hash_, round, 0, "fp32", g).ok());
    absl::Notification done;
    shard.Watch(0, round + 1, [&done](bool) { done.Notify(); });
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  }

  std::filesystem::path dir_;
  ServerOptions options_;
  core::ManualClock clock_;
  core::ThreadPool pool_{1};
  uint64_t hash_ = 0;
};

TEST_F(CheckpointerTest, AWriteOnDemandIsRestoredByTheNextProcess) {
  std::unique_ptr<Shard> shard = MakeShard();
  std::vector<int64_t> written;
  Checkpointer first(options_, shard.get(), &clock_,
                     [&written](int64_t unix_s) { written.push_back(unix_s); });
  absl::StatusOr<bool> restored = first.Restore();
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_FALSE(*restored);  // nothing there yet
  Step(*shard, 0);
  Step(*shard, 1);
  auto path = first.Write("test");
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(path->second, 2u);
  EXPECT_TRUE(std::filesystem::exists(path->first));
  const Checkpointer::Info info = first.info();
  EXPECT_EQ(info.last_path, path->first);
  EXPECT_GT(info.last_unix_s, 0);
  EXPECT_EQ(written, std::vector<int64_t>{info.last_unix_s});
  EXPECT_EQ(info.restored_from, "");

  // A new shard (a restarted process) finds it.
  std::unique_ptr<Shard> again = MakeShard(/*registered=*/false);
  Checkpointer second(options_, again.get(), &clock_, nullptr);
  restored = second.Restore();
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(*restored);
  EXPECT_EQ(again->MaxVersion(), 2u);
  EXPECT_EQ(second.info().restored_from, path->first);
  EXPECT_EQ(second.info().restored_unix_s, info.last_unix_s);
  EXPECT_EQ(second.info().last_path, "");
}

TEST_F(CheckpointerTest, TheWriterFollowsTheRoundsUntilStopped) {
  options_.checkpoint_every_rounds = 2;
  options_.checkpoint_interval = std::chrono::seconds(0);  // rounds only
  std::unique_ptr<Shard> shard = MakeShard();
  Checkpointer checkpointer(options_, shard.get(), &clock_, nullptr);
  checkpointer.Start();
  Step(*shard, 0);
  // One version: not due yet (the writer looks every 10 ms).
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(checkpointer.info().last_path, "");
  Step(*shard, 1);
  for (int i = 0; i < 500 && checkpointer.info().last_path.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::string first = checkpointer.info().last_path;
  ASSERT_NE(first, "");
  EXPECT_TRUE(std::filesystem::exists(first));
  checkpointer.Stop();
  Step(*shard, 2);
  Step(*shard, 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(checkpointer.info().last_path, first);  // stopped: no more writes
}

TEST_F(CheckpointerTest, TheIntervalWritesOnlyWhatChanged) {
  options_.checkpoint_interval = std::chrono::seconds(30);
  std::unique_ptr<Shard> shard = MakeShard();
  Checkpointer checkpointer(options_, shard.get(), &clock_, nullptr);
  checkpointer.Start();
  Step(*shard, 0);
  clock_.Advance(std::chrono::seconds(31));
  for (int i = 0; i < 500 && checkpointer.info().last_path.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::string first = checkpointer.info().last_path;
  ASSERT_NE(first, "");
  // Another interval without a new version: nothing new is written.
  clock_.Advance(std::chrono::seconds(31));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(checkpointer.info().last_path, first);
  checkpointer.Stop();
}

}  // namespace
}  // namespace ps::server
