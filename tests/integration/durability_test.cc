// Durability (docs/operations.md, "Backing up and restoring") with real ps-server processes on loopback: kill -9 of a shard
// mid-training and its restart from its checkpoint; a corrupted checkpoint; a dead
// worker. Bounded: every wait has a deadline.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cluster_util.h"
#include "core/cluster_secret.h"
#include "process_util.h"
#include "server/optimizer.h"
#include "worker_lib/worker.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using std::chrono::milliseconds;

std::filesystem::path TempDir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() /
           (name + "_" + std::to_string(::getpid()) + "_" +
            std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::filesystem::create_directories(d);
  return d;
}

// The parameters after `steps` SGD steps with a constant gradient, as a shard computes
// them (the run without faults).
std::vector<float> Simulate(std::vector<float> params, float grad, uint64_t steps,
                            const server::SgdOptions& sgd) {
  std::vector<float> velocity(params.size(), 0.0f), g(params.size(), grad);
  for (uint64_t i = 0; i < steps; ++i) server::SgdStep(sgd, g, velocity, params);
  return params;
}

TEST(DurabilityTest, KillNineOfAShardMidTrainingRestoresAndTrainingFinishes) {
  const auto dir = TempDir("ps_durability");
  const std::vector<uint16_t> ports = testing::PickFreePorts(2);
  ASSERT_EQ(ports.size(), 2u);
  const uint16_t p0 = ports[0], p1 = ports[1];
  const std::string peers = absl::StrCat("127.0.0.1:", p0, ",127.0.0.1:", p1);
  auto shard_args = [&](int id) {
    return std::vector<std::string>{
        PS_SERVER_BINARY, "--shard-id", std::to_string(id), "--num-shards", "2", "--peers", peers,
        "--port", std::to_string(id == 0 ? p0 : p1), "--workers", "2", "--aggregator", "mean",
        "--lr", "0.05", "--momentum", "0.9", "--round-deadline-ms", "60000",
        "--checkpoint-dir", dir.string(), "--checkpoint-every-rounds", "1",
        "--checkpoint-interval-s", "0", "--peer-timeout-ms", "5000",
        // Both shards share one run directory: the first makes the secret.
        "--run-dir", (dir / "run").string()};
  };
  auto shard0 = std::make_unique<testing::Process>(shard_args(0));
  auto shard1 = std::make_unique<testing::Process>(shard_args(1));

  // Two tensors, one slice each: one on each shard.
  const core::ModelLayout layout = *core::ModelLayout::Create({{"a", 8, 0}, {"b", 8, 1}}, 8, 2);
  const std::vector<float> init(8, 1.0f);
  constexpr uint64_t kRounds = 24, kKillAfter = 10;
  std::atomic<uint64_t> progress[2] = {0, 0};
  std::atomic<int> late_refusals{0};
  std::atomic<uint64_t> replayed{0};  // pushes resent to the restarted shard
  std::vector<std::vector<float>> final_values(2, std::vector<float>(16));
  std::vector<absl::Status> results(2);
  auto run = [&](uint32_t w) {
    WorkerOptions wo;
    wo.shard_addresses = {absl::StrCat("127.0.0.1:", p0), absl::StrCat("127.0.0.1:", p1)};
    wo.worker_id = w;
    // The token file appears once a shard started: wait for it (bounded).
    const std::string token_file = core::TokenFilePath(
        (dir / "run").string(), core::Identity{core::Identity::Kind::kWorker, w});
    for (int i = 0; i < 1500 && !std::filesystem::exists(token_file); ++i) {
      std::this_thread::sleep_for(milliseconds(10));
    }
    absl::StatusOr<std::string> token = core::ReadTokenFile(token_file);
    if (!token.ok()) {
      results[w] = token.status();
      return;
    }
    wo.credentials.token = *token;
    wo.max_attempts = 40;
    wo.max_backoff = milliseconds(250);
    const std::span<const float> inits[2] = {init, init};
    auto worker = Worker::Start(wo, layout, inits);
    if (!worker.ok()) {
      results[w] = worker.status();
      return;
    }
    std::vector<float> a(8), b(8);
    const std::span<float> outs[2] = {a, b};
    const std::vector<float> grad(8, static_cast<float>(w + 1));  // mean 1.5
    for (uint64_t t = (*worker)->start_version(); t < kRounds; ++t) {
      absl::StatusOr<uint64_t> v = (*worker)->PullAll(t, outs, milliseconds(60000));
      if (!v.ok()) {
        results[w] = v.status();
        return;
      }
      t = std::max(t, *v);  // a restored shard may stand further on
      for (size_t i = 0; i < 2; ++i) (void)(*worker)->Push(i, t, grad);
      absl::Status pushed = (*worker)->WaitPushes();
      // A push of a round the restarted shard moved past is refused as late.
      if (!pushed.ok()) {
        if (pushed.code() != absl::StatusCode::kOutOfRange) {
          results[w] = pushed;
          return;
        }
        late_refusals.fetch_add(1);
      }
      progress[w].store(t + 1);
    }
    absl::StatusOr<uint64_t> v = (*worker)->PullAll(kRounds, outs, milliseconds(60000));
    if (!v.ok()) {
      results[w] = v.status();
      return;
    }
    replayed.fetch_add((*worker)->stats().pushes_replayed);
    std::copy(a.begin(), a.end(), final_values[w].begin());
    std::copy(b.begin(), b.end(), final_values[w].begin() + 8);
  };
  std::thread w0(run, 0), w1(run, 1);

  // Mid-training: kill -9 shard 1 and start it again on the same port and directory.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while ((progress[0].load() < kKillAfter || progress[1].load() < kKillAfter) &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(2));
  }
  ASSERT_GE(progress[0].load(), kKillAfter) << shard1->Log();
  // Checkpoints trail the rounds: on a loaded machine ten rounds can pass before shard 1
  // wrote its first. Kill it only once one is on disk (bounded), or it would restart
  // empty and the test would measure nothing.
  const auto has_checkpoint = [&] {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir / "shard-1", ec)) {
      const std::string name = e.path().filename().string();
      if (name.starts_with("checkpoint-") && name.ends_with(".pscp")) return true;
    }
    return false;
  };
  for (int i = 0; i < 1000 && !has_checkpoint(); ++i) std::this_thread::sleep_for(milliseconds(10));
  ASSERT_TRUE(has_checkpoint()) << shard1->Log();
  shard1->Signal(SIGKILL);
  EXPECT_EQ(shard1->Wait(milliseconds(10000)), 128 + SIGKILL);
  shard1 = std::make_unique<testing::Process>(shard_args(1));

  w0.join();
  w1.join();
  const std::string log1 = shard1->Log();
  ASSERT_TRUE(results[0].ok()) << results[0] << "\n" << log1;
  ASSERT_TRUE(results[1].ok()) << results[1] << "\n" << log1;
  EXPECT_THAT(log1, HasSubstr("restored layout"));
  EXPECT_EQ(final_values[0], final_values[1]);

  // Shard 0 never failed: exactly the fault-free run. Shard 1 lost the rounds between
  // its last checkpoint and the kill (checkpoints are written behind the rounds, so a
  // few with --checkpoint-every-rounds 1); otherwise it matches the fault-free run.
  const server::SgdOptions sgd{0.05f, 0.9f, 0.0f};
  const std::vector<float> a(final_values[0].begin(), final_values[0].begin() + 8);
  const std::vector<float> b(final_values[0].begin() + 8, final_values[0].end());
  const uint32_t slice_of_shard1 = layout.SlicesOfShard(1)[0];
  const std::vector<float>& on_shard0 = slice_of_shard1 == 0 ? b : a;
  const std::vector<float>& on_shard1 = slice_of_shard1 == 0 ? a : b;
  EXPECT_EQ(on_shard0, Simulate(init, 1.5f, kRounds, sgd));
  int lost = -1;
  for (int l = 0; l <= static_cast<int>(kKillAfter) + 2 && lost < 0; ++l) {
    if (on_shard1 == Simulate(init, 1.5f, kRounds - l, sgd)) lost = l;
  }
  EXPECT_GE(lost, 0) << "shard 1's parameters match no fault-free run that lost rounds\n"
                     << log1;
  // The rounds lost are those the restarted shard skipped to catch up with shard 0.
  if (lost > 0) {
    EXPECT_THAT(log1, HasSubstr("are lost on this shard")) << log1;
  }
  RecordProperty("rounds_lost", lost);
  RecordProperty("late_refusals", late_refusals.load());
  RecordProperty("pushes_replayed", static_cast<int>(replayed.load()));
  shard0.reset();
  shard1.reset();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

TEST(DurabilityTest, CorruptedCheckpointIsDetectedAndThePreviousOneUsed) {
  const auto dir = TempDir("ps_corrupt");
  server::ServerOptions o;
  o.insecure = true;  // durability, not authentication
  o.num_workers = 1;
  o.learning_rate = 0.5f;
  o.momentum = 0.0f;
  o.checkpoint_dir = dir.string();
  o.checkpoint_every_rounds = 1;
  o.checkpoint_interval = std::chrono::seconds(0);
  o.checkpoint_keep = 3;
  const core::ModelLayout layout = *core::ModelLayout::Create({{"w", 4, 0}}, 128, 1);
  const std::vector<float> init(4, 0.0f), grad(4, 1.0f);
  {
    testing::Cluster c = testing::StartCluster(1, o);
    ASSERT_EQ(c.num_shards(), 1u);
    WorkerOptions wo;
    wo.shard_addresses = c.addresses();
    const std::span<const float> inits[1] = {init};
    auto w = Worker::Start(wo, layout, inits);
    ASSERT_TRUE(w.ok()) << w.status();
    std::vector<float> out(4);
    for (uint64_t t = 0; t < 5; ++t) {
      ASSERT_TRUE((*w)->Push(0, t, grad).ok());
      ASSERT_TRUE((*w)->Pull(0, t + 1, out, milliseconds(20000)).ok());
      // Checkpoints are written behind the rounds: wait (bounded) for this one.
      const auto name = dir / "shard-0" / absl::StrFormat("checkpoint-%020d.pscp", t + 1);
      for (int i = 0; i < 500 && !std::filesystem::exists(name); ++i) {
        std::this_thread::sleep_for(milliseconds(10));
      }
    }
    c.shard(0).Shutdown();  // the final checkpoint: version 5
  }
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir / "shard-0")) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  ASSERT_EQ(files.size(), 3u);  // --checkpoint-keep 3
  EXPECT_THAT(files.back().filename().string(), HasSubstr("00000000000000000005"));
  {
    // Flip one byte in the middle of the newest.
    std::fstream f(files.back(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(40);
    char ch = 0;
    f.get(ch);
    f.seekp(40);
    f.put(static_cast<char>(ch ^ 0x20));
  }
  testing::Cluster c = testing::StartCluster(1, o);
  ASSERT_EQ(c.num_shards(), 1u);
  EXPECT_EQ(c.shard(0).shard().MaxVersion(), 4u);
  EXPECT_TRUE(c.shard(0).shard().ready());
  WorkerOptions wo;
  wo.shard_addresses = c.addresses();
  auto w = Worker::Start(wo, layout);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->start_version(), 4u);
  std::vector<float> out(4);
  ASSERT_TRUE((*w)->Pull(0, 4, out, milliseconds(20000)).ok());
  EXPECT_EQ(out, std::vector<float>(4, -2.0f));  // 4 steps of lr 0.5 x 1.0
  c.shard(0).Shutdown();
  std::filesystem::remove_all(dir);
}

TEST(DurabilityTest, ACheckpointOfAnotherShardCountIsRefusedAtStart) {
  const auto dir = TempDir("ps_other_count");
  server::ServerOptions o;
  o.insecure = true;  // durability, not authentication
  o.num_workers = 1;
  o.checkpoint_dir = dir.string();
  o.checkpoint_interval = std::chrono::seconds(0);
  {
    testing::Cluster c = testing::StartCluster(1, o);
    ASSERT_EQ(c.num_shards(), 1u);
    WorkerOptions wo;
    wo.shard_addresses = c.addresses();
    const std::vector<float> init(4, 0.0f);
    const std::span<const float> inits[1] = {init};
    ASSERT_TRUE(Worker::Start(wo, *core::ModelLayout::Create({{"w", 4, 0}}, 128, 1), inits).ok());
    c.shard(0).Shutdown();
  }
  // The same directory, now as shard 0 of 2: its shard-0 checkpoint says "of 1".
  server::ServerOptions two = o;
  two.num_shards = 2;
  two.peers = {"127.0.0.1:1", "127.0.0.1:2"};
  two.port = 0;
  auto s = server::Server::Start(two);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("belongs to shard 0 of 1"));
  std::filesystem::remove_all(dir);
}

TEST(DurabilityTest, ADeadWorkersRoundsCloseAtTheDeadlineWithTheQuorum) {
  server::ServerOptions o;
  o.insecure = true;  // durability, not authentication
  o.num_workers = 3;
  o.num_byzantine = 1;  // quorum 2
  o.aggregator = "mean";
  o.aggregate_only = true;
  o.round_deadline = milliseconds(150);
  testing::Cluster c = testing::StartCluster(1, o);
  ASSERT_EQ(c.num_shards(), 1u);
  const core::ModelLayout layout = *core::ModelLayout::Create({{"w", 2, 0}}, 128, 1);
  std::vector<std::unique_ptr<Worker>> workers;
  for (uint32_t w = 0; w < 3; ++w) {
    WorkerOptions wo;
    wo.shard_addresses = c.addresses();
    wo.worker_id = w;
    auto worker = Worker::Start(wo, layout);
    ASSERT_TRUE(worker.ok()) << worker.status();
    workers.push_back(*std::move(worker));
  }
  std::vector<float> out(2);
  for (uint64_t t = 0; t < 2; ++t) {
    for (uint32_t w = 0; w < 3; ++w) ASSERT_TRUE(workers[w]->Push(0, t, std::vector<float>(2, w)).ok());
    ASSERT_TRUE(workers[0]->Pull(0, t + 1, out, milliseconds(20000)).ok());
  }
  workers[2].reset();  // worker 2 dies
  for (uint64_t t = 2; t < 5; ++t) {
    for (uint32_t w = 0; w < 2; ++w) ASSERT_TRUE(workers[w]->Push(0, t, std::vector<float>(2, w)).ok());
    ASSERT_TRUE(workers[0]->Pull(0, t + 1, out, milliseconds(20000)).ok());
    EXPECT_EQ(out, std::vector<float>(2, 0.5f));  // mean of workers 0 and 1
  }
  EXPECT_GE(c.shard(0).shard().stats().rounds_closed_at_deadline, 3u);
}

}  // namespace
}  // namespace ps
