// Durability (docs/operations.md, "Backing up and restoring") with real ps-server processes on loopback: kill -9 of a shard
// mid-training and its restart from its checkpoint; a corrupted checkpoint; a dead
// worker. Bounded: every wait has a deadline. Each runs on both data planes
// (testing::DataPlanes()): the shards are started on the plane, and the workers follow
// the plane their Join answers name.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cluster_util.h"
#include "crypto/cluster_secret.h"
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
  for (uint64_t i = 0; i < steps; ++i) server::SgdStep(sgd, i, g, velocity, params);
  return params;
}

// What a kill -9 run (RunKillNine) left: both workers' final values (tensor a, then b),
// how the shard that was killed and restarted logged, and the workers' counts.
struct KillNineRun {
  uint32_t slice_of_shard1 = 0;  // the slice shard 1 holds (0: tensor a, 1: b)
  std::vector<std::vector<float>> final_values;
  std::string log1;
  int late_refusals = 0;
  uint64_t pushes_replayed = 0;
  uint64_t slices_borrowed = 0;
  uint64_t slices_pulled = 0;
  uint64_t slices_pulled_as_change = 0;
};

constexpr uint64_t kRounds = 24, kKillAfter = 10;

// Two ps-server shards on data plane `plane` (with `extra_args`) and two workers pushing
// a constant gradient (1 and 2, mean 1.5) for kRounds rounds; after kKillAfter rounds and
// a checkpoint of shard 1 on disk, kill -9 of shard 1 and its restart on the same port
// and directory. On the TCP plane the data ports are either picked here and kept across
// the restart, as deployments keep theirs (deploy/, ps-launch): the workers' HELLO to the
// restarted shard is refused unknown_session and they join again; or left to the kernel
// (--data-port 0, as LocalCluster does): the restarted shard listens elsewhere, the old
// data port refuses the connection, and the workers join again for the new one. With
// `pushes` kBorrowed the workers push from their buffer (PushOptions::borrow) and fill it
// with NaN between WaitPushes and the next round: what the restarted shard is sent again
// must be the copy taken of each accepted push, not the buffer.
enum class DataPorts { kKept, kKernelPicked };
enum class Pushes { kCopied, kBorrowed };
void RunKillNine(core::DataPlane plane, DataPorts data_ports, Pushes pushes,
                 const std::vector<std::string>& extra_args, KillNineRun* out) {
  const auto dir = TempDir("ps_durability");
  const std::vector<uint16_t> ports = testing::PickFreePorts(4);  // control 0, 1; data 0, 1
  ASSERT_EQ(ports.size(), 4u);
  const uint16_t p0 = ports[0], p1 = ports[1];
  const std::string peers = absl::StrCat("127.0.0.1:", p0, ",127.0.0.1:", p1);
  auto shard_args = [&](int id) {
    std::vector<std::string> args{
        PS_SERVER_BINARY, "--shard-id", std::to_string(id), "--num-shards", "2", "--peers", peers,
        "--port", std::to_string(id == 0 ? p0 : p1), "--workers", "2", "--aggregator", "mean",
        "--lr", "0.05", "--momentum", "0.9", "--round-deadline-ms", "60000",
        "--checkpoint-dir", dir.string(), "--checkpoint-every-rounds", "1",
        "--checkpoint-interval-s", "0", "--peer-timeout-ms", "5000",
        // Both shards share one run directory: the first makes the secret.
        "--run-dir", (dir / "run").string()};
    const std::vector<std::string> plane_flags =
        testing::PlaneFlags(plane, data_ports == DataPorts::kKept ? ports[2 + id] : 0);
    args.insert(args.end(), plane_flags.begin(), plane_flags.end());
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    return args;
  };
  auto shard0 = std::make_unique<testing::Process>(shard_args(0));
  auto shard1 = std::make_unique<testing::Process>(shard_args(1));

  // Two tensors, one slice each: one on each shard.
  const core::ModelLayout layout = *core::ModelLayout::Create({{"a", 8, 0}, {"b", 8, 1}}, 8, 2);
  const std::vector<float> init(8, 1.0f);
  std::atomic<uint64_t> progress[2] = {0, 0};
  // Set once shard 1 was killed and started again: the workers wait for it before round
  // kKillAfter + 2, so the kill always falls mid-training (a fast machine could
  // otherwise finish all rounds while the test waits for shard 1's checkpoint).
  std::atomic<bool> restarted{false};
  std::atomic<int> late_refusals{0};
  std::atomic<uint64_t> replayed{0};  // pushes resent to the restarted shard
  std::atomic<uint64_t> borrowed{0};  // slices pushed from the workers' buffers
  std::atomic<uint64_t> pulled{0}, pulled_as_change{0};
  std::vector<std::vector<float>> final_values(2, std::vector<float>(16));
  std::vector<absl::Status> results(2);
  auto run = [&](uint32_t w) {
    WorkerOptions wo;
    wo.shard_addresses = {absl::StrCat("127.0.0.1:", p0), absl::StrCat("127.0.0.1:", p1)};
    wo.worker_id = w;
    // The token file appears once a shard started: wait for it (bounded).
    const std::string token_file = crypto::TokenFilePath(
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
    wo.push.borrow = pushes == Pushes::kBorrowed;
    const std::span<const float> inits[2] = {init, init};
    auto worker = Worker::Start(wo, layout, inits);
    if (!worker.ok()) {
      results[w] = worker.status();
      return;
    }
    std::vector<float> a(8), b(8);
    const std::span<float> outs[2] = {a, b};
    const float g = static_cast<float>(w + 1);  // mean 1.5
    std::vector<float> grad(8, g);
    for (uint64_t t = (*worker)->start_version(); t < kRounds; ++t) {
      for (int i = 0; t >= kKillAfter + 2 && !restarted.load() && i < 6000; ++i) {
        std::this_thread::sleep_for(milliseconds(10));
      }
      absl::StatusOr<uint64_t> v = (*worker)->PullAll(t, outs, milliseconds(60000));
      if (!v.ok()) {
        results[w] = v.status();
        return;
      }
      t = std::max(t, *v);  // a restored shard may stand further on
      std::fill(grad.begin(), grad.end(), g);
      for (size_t i = 0; i < 2; ++i) (void)(*worker)->Push(i, t, grad);
      absl::Status pushed = (*worker)->WaitPushes();
      if (pushes == Pushes::kBorrowed) {
        std::fill(grad.begin(), grad.end(), std::numeric_limits<float>::quiet_NaN());
      }
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
    const WorkerStats stats = (*worker)->stats();
    replayed.fetch_add(stats.pushes_replayed);
    borrowed.fetch_add(stats.slices_borrowed);
    pulled.fetch_add(stats.slices_pulled);
    pulled_as_change.fetch_add(stats.slices_pulled_as_change);
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
  restarted.store(true);

  w0.join();
  w1.join();
  const std::string log1 = shard1->Log();
  ASSERT_TRUE(results[0].ok()) << results[0] << "\n" << log1;
  ASSERT_TRUE(results[1].ok()) << results[1] << "\n" << log1;
  EXPECT_THAT(log1, HasSubstr("restored layout"));
  EXPECT_EQ(final_values[0], final_values[1]) << "the workers hold different parameters";
  out->slice_of_shard1 = layout.SlicesOfShard(1)[0];
  out->final_values = final_values;
  out->log1 = log1;
  out->late_refusals = late_refusals.load();
  out->pushes_replayed = replayed.load();
  out->slices_borrowed = borrowed.load();
  out->slices_pulled = pulled.load();
  out->slices_pulled_as_change = pulled_as_change.load();
  shard0.reset();
  shard1.reset();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// The rounds shard 1 lost (0 or more) if `values` (a then b) match the fault-free run
// within `tolerance` (relative), with shard 0 losing none; -1 if they match none.
int RoundsLost(const KillNineRun& run, const std::vector<float>& values, float tolerance) {
  const server::SgdOptions sgd{0.05f, 0.9f, 0.0f};
  const std::vector<float> init(8, 1.0f);
  const std::vector<float> a(values.begin(), values.begin() + 8);
  const std::vector<float> b(values.begin() + 8, values.end());
  const std::vector<float>& on_shard0 = run.slice_of_shard1 == 0 ? b : a;
  const std::vector<float>& on_shard1 = run.slice_of_shard1 == 0 ? a : b;
  auto near = [tolerance](const std::vector<float>& x, const std::vector<float>& y) {
    for (size_t i = 0; i < x.size(); ++i) {
      if (std::abs(x[i] - y[i]) > tolerance * std::max(1.0f, std::abs(y[i]))) return false;
    }
    return true;
  };
  if (!near(on_shard0, Simulate(init, 1.5f, kRounds, sgd))) return -1;
  for (int l = 0; l <= static_cast<int>(kKillAfter) + 2; ++l) {
    if (near(on_shard1, Simulate(init, 1.5f, kRounds - l, sgd))) return l;
  }
  return -1;
}

class DurabilityTest : public ::testing::TestWithParam<core::DataPlane> {};
INSTANTIATE_TEST_SUITE_P(Planes, DurabilityTest, testing::DataPlanes(),
                         [](const auto& info) { return testing::PlaneName(info.param); });

// (On TCP with data ports the kernel picks: the restarted shard's is new.)
TEST_P(DurabilityTest, KillNineOfAShardMidTrainingRestoresAndTrainingFinishes) {
  KillNineRun run;
  RunKillNine(GetParam(), DataPorts::kKernelPicked, Pushes::kCopied, {}, &run);
  if (HasFatalFailure()) return;
  const std::string& log1 = run.log1;

  // Shard 0 never failed: exactly the fault-free run. Shard 1 lost the rounds between
  // its last checkpoint and the kill (checkpoints are written behind the rounds, so a
  // few with --checkpoint-every-rounds 1); otherwise it matches the fault-free run.
  const int lost = RoundsLost(run, run.final_values[0], 0.0f);
  EXPECT_GE(lost, 0) << "the parameters match no fault-free run that lost rounds of shard 1\n"
                     << log1;
  // The rounds lost are those the restarted shard skipped to catch up with shard 0.
  if (lost > 0) {
    EXPECT_THAT(log1, HasSubstr("are lost on this shard")) << log1;
  }
  EXPECT_EQ(run.slices_pulled_as_change, 0u);
  RecordProperty("rounds_lost", lost);
  RecordProperty("late_refusals", run.late_refusals);
  RecordProperty("pushes_replayed", static_cast<int>(run.pushes_replayed));
}

// The same with compressed pulls: the restarted shard has a new epoch, so each worker gets
// its slice densely once and changes again after; both workers end with the same bits, on
// the fault-free trajectory up to what fp16 loses of the last change (the rest of what it
// lost stays on the shard and goes out with the next changes). (On TCP with data ports
// kept across the restart; the pushes borrowed, their buffers NaN between rounds: the
// replays to the restored shard send the copies.)
TEST_P(DurabilityTest, KillNineWithCompressedPullsKeepsEveryWorkerOnTheSameBits) {
  KillNineRun run;
  RunKillNine(GetParam(), DataPorts::kKept, Pushes::kBorrowed, {"--pull-codec", "fp16"}, &run);
  if (HasFatalFailure()) return;
  EXPECT_GE(RoundsLost(run, run.final_values[0], 1e-3f), 0)
      << "the parameters match no fault-free run that lost rounds of shard 1\n" << run.log1;
  // Most slices came as changes; at least the first of each worker and the first after
  // the restart came dense.
  EXPECT_GT(run.slices_pulled_as_change, run.slices_pulled / 2);
  EXPECT_LE(run.slices_pulled_as_change + 2 * 2 + 2, run.slices_pulled);
  EXPECT_GE(run.slices_borrowed, 2 * 2 * (kRounds - kKillAfter));  // borrowing was taken
  RecordProperty("pushes_replayed", static_cast<int>(run.pushes_replayed));
}

TEST_P(DurabilityTest, CorruptedCheckpointIsDetectedAndThePreviousOneUsed) {
  const auto dir = TempDir("ps_corrupt");
  server::ServerOptions o;
  o.insecure = true;  // durability, not authentication
  o.data_plane = GetParam();
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

// Once, on the default plane: the refusal is decided at start-up from the checkpoint's
// header, before any data plane is opened, so a second plane would test nothing more.
TEST(DurabilityStartTest, ACheckpointOfAnotherShardCountIsRefusedAtStart) {
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

TEST_P(DurabilityTest, ADeadWorkersRoundsCloseAtTheDeadlineWithTheQuorum) {
  server::ServerOptions o;
  o.insecure = true;  // durability, not authentication
  o.data_plane = GetParam();
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

TEST_P(DurabilityTest, AWorkerRestartedMidRoundResumesItAndItsEarlierCopiesCount) {
  // Worker 1 pushes two of round 0's three slices and dies (no Leave); worker 0 closes
  // slice "a". Worker 1's new process joins at version 0 and pushes the whole round: "a"
  // closed with its first copy, "c" is still open with it, "b" takes the new push. Each
  // duplicate is that first copy, not an error; the round closes; a second push of the
  // next round is refused as before.
  server::ServerOptions o;
  o.insecure = true;
  o.data_plane = GetParam();
  o.num_workers = 2;
  o.aggregator = "mean";
  o.aggregate_only = true;
  testing::Cluster c = testing::StartCluster(1, o);
  const core::ModelLayout layout =
      *core::ModelLayout::Create({{"a", 2, 0}, {"b", 2, 0}, {"c", 2, 0}}, 128, 1);
  auto start = [&](uint32_t id) {
    WorkerOptions wo;
    wo.shard_addresses = c.addresses();
    wo.worker_id = id;
    return Worker::Start(wo, layout);
  };
  auto w0 = start(0);
  ASSERT_TRUE(w0.ok()) << w0.status();
  {
    auto dying = start(1);
    ASSERT_TRUE(dying.ok()) << dying.status();
    ASSERT_TRUE((*dying)->Push(0, 0, std::vector<float>(2, 1.0f)).ok());
    ASSERT_TRUE((*dying)->Push(2, 0, std::vector<float>(2, 1.0f)).ok());
    ASSERT_TRUE((*dying)->WaitPushes().ok());
  }
  ASSERT_TRUE((*w0)->Push(0, 0, std::vector<float>(2, 0.0f)).ok());
  ASSERT_TRUE((*w0)->WaitPushes().ok());
  std::vector<float> out(2);
  ASSERT_TRUE((*w0)->Pull(0, 1, out, milliseconds(20000)).ok());
  EXPECT_EQ(out, std::vector<float>(2, 0.5f));
  auto back = start(1);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ((*back)->start_version(), 0u);
  for (size_t t = 0; t < 3; ++t) {
    ASSERT_TRUE((*back)->Push(t, 0, std::vector<float>(2, 7.0f)).ok());
  }
  ASSERT_TRUE((*back)->WaitPushes().ok());
  EXPECT_EQ((*back)->stats().slices_held_from_before, 2u);  // "a" and "c"
  EXPECT_EQ((*back)->stats().slices_pushed, 3u);
  for (size_t t = 1; t < 3; ++t) ASSERT_TRUE((*w0)->Push(t, 0, std::vector<float>(2, 0.0f)).ok());
  ASSERT_TRUE((*w0)->WaitPushes().ok());
  const std::vector<float> expected[] = {std::vector<float>(2, 0.5f),
                                         std::vector<float>(2, 3.5f),
                                         std::vector<float>(2, 0.5f)};
  for (size_t t = 0; t < 3; ++t) {
    ASSERT_TRUE((*back)->Pull(t, 1, out, milliseconds(20000)).ok());
    EXPECT_EQ(out, expected[t]) << "tensor " << t;
  }
  ASSERT_TRUE((*back)->Push(1, 1, std::vector<float>(2, 7.0f)).ok());
  ASSERT_TRUE((*back)->Push(1, 1, std::vector<float>(2, 7.0f)).ok());
  EXPECT_EQ((*back)->WaitPushes().code(), absl::StatusCode::kAlreadyExists);
}

}  // namespace
}  // namespace ps
