// The gradient boards omniscient attackers read: the in-process one (honest workers
// publish) and the side channel across processes (a directory the Byzantine workers
// share), each with threads standing in for workers.
#include "examples/fashion_mnist/training.h"

#include <atomic>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "examples/fashion_mnist/model.h"
#include "examples/fashion_mnist/torch_cpu.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::fashion_mnist {
namespace {

using std::chrono::milliseconds;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(SharedGradientBoardTest, CollectWaitsForEveryHonestWorkerOfTheRound) {
  SharedGradientBoard board(3);
  EXPECT_TRUE(board.Publishes(false));
  EXPECT_FALSE(board.Publishes(true));
  std::vector<std::thread> honest;
  for (uint32_t w = 0; w < 3; ++w) {
    honest.emplace_back([&, w] {
      std::this_thread::sleep_for(milliseconds(20 * w));
      ASSERT_TRUE(board.Publish(7, w, std::vector<float>{float(w), float(10 * w)}).ok());
    });
  }
  auto seen = board.Collect(7, milliseconds(10000));
  for (auto& t : honest) t.join();
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_THAT(*seen, ElementsAre(ElementsAre(0, 0), ElementsAre(1, 10), ElementsAre(2, 20)));
  // A round nobody completes times out with a message.
  ASSERT_TRUE(board.Publish(8, 0, {1.0f}).ok());
  auto late = board.Collect(8, milliseconds(50));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(late.status().message()), HasSubstr("round 8"));
}

TEST(DirectoryGradientBoardTest, ByzantineProcessesShareTheirGradientsThroughFiles) {
  const std::string dir = ::testing::TempDir() + "ps_collude_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // Two attackers, each with its own board object as in separate processes.
  DirectoryGradientBoard a(dir, 2), b(dir, 2);
  EXPECT_TRUE(a.Publishes(true));
  EXPECT_FALSE(a.Publishes(false));
  for (uint64_t round = 0; round < 5; ++round) {
    std::thread other([&] { ASSERT_TRUE(b.Publish(round, 11, {float(round), 2.0f}).ok()); });
    ASSERT_TRUE(a.Publish(round, 10, {float(round), 1.0f}).ok());
    other.join();
    auto seen = a.Collect(round, milliseconds(10000));
    ASSERT_TRUE(seen.ok()) << seen.status();
    EXPECT_THAT(*seen,
                ElementsAre(ElementsAre(float(round), 1.0f), ElementsAre(float(round), 2.0f)));
  }
  // Old rounds are removed by their writers: rounds 0 and 1 are gone, 2..4 are there.
  EXPECT_FALSE(std::filesystem::exists(dir + "/round-1-worker-10.f32"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/round-4-worker-11.f32"));
  auto missing = a.Collect(9, milliseconds(30));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("round 9 has 0 of 2 gradients"));
}

// Both models train locally past chance in a few steps and report through the events.
class Recorder final : public TrainerEvents {
 public:
  void Eval(uint64_t step, double accuracy) override { last = accuracy; }
  void Done(uint64_t steps, std::optional<double> accuracy, double, bool diverged,
            uint64_t) override {
    done_steps = steps;
    this->diverged = diverged;
  }
  double last = 0;
  uint64_t done_steps = 0;
  bool diverged = false;
};

TEST(TrainLocalTest, MlpAndCnnLearn) {
  auto data = LoadTrainingData("/usr/share/datasets/fashion-mnist", /*with_test=*/true);
  ASSERT_TRUE(data.ok()) << data.status();
  for (const char* model : {"mlp", "cnn"}) {
    TrainerConfig c;
    c.model = model;
    c.steps = 60;
    c.eval_every = 0;
    c.log_every = 0;
    c.lr = 0.02;
    Recorder events;
    ASSERT_TRUE(TrainLocal(c, *data, events).ok()) << model;
    EXPECT_EQ(events.done_steps, 60u) << model;
    EXPECT_FALSE(events.diverged) << model;
    EXPECT_GT(events.last, 0.5) << model;  // 10 classes: chance is 0.1
  }
}

// The trainer's communication settings are checked before anything starts.
TEST(BlasTest, FindsTheLibraryThatTorchsMatrixProductsCall) {
  // libtorch calls sgemm_ of the system BLAS; the path is the library update-alternatives
  // chose (OpenBLAS once run.sh has installed it).
  const std::string blas = BlasLibraryPath();
  EXPECT_FALSE(blas.empty());
  EXPECT_TRUE(std::filesystem::exists(blas)) << blas;
  EXPECT_TRUE(IsReferenceBlas("/usr/lib/x86_64-linux-gnu/blas/libblas.so.3"));
  EXPECT_FALSE(IsReferenceBlas("/usr/lib/x86_64-linux-gnu/openblas-serial/libblas.so.3"));
  EXPECT_FALSE(IsReferenceBlas("/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"));
  EXPECT_FALSE(IsReferenceBlas(""));
  EXPECT_TRUE(IsThreadUnsafeBlas("/usr/lib/x86_64-linux-gnu/openblas-serial/libblas.so.3"));
  EXPECT_FALSE(IsThreadUnsafeBlas("/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"));
  EXPECT_FALSE(IsThreadUnsafeBlas("/usr/lib/x86_64-linux-gnu/blas/libblas.so.3"));
}

// Workers train as threads of one process (RunCluster, ps-experiment), so the BLAS must
// give every thread the product one thread alone gets. Debian's libopenblas0-serial
// does not (4-36 of these 10000 products differed, 5 threads on 2 cores); ConfigureTorchForWorkers refuses it for
// more than one thread.
TEST(BlasTest, ProductsOfConcurrentThreadsEqualThoseOfOneThread) {
  ASSERT_TRUE(ConfigureTorchForWorkers(/*threads=*/1).ok());
  torch::manual_seed(3);
  // The MLP's shapes at batch 32, hidden 32: forward, and both backward products.
  const std::vector<std::pair<torch::Tensor, torch::Tensor>> pairs = {
      {torch::randn({32, 784}), torch::randn({784, 32})},
      {torch::randn({784, 32}), torch::randn({32, 32})},
      {torch::randn({32, 32}).t(), torch::randn({32, 784})},
      {torch::randn({32, 32}), torch::randn({10, 32}).t()},
  };
  std::vector<torch::Tensor> alone;
  for (const auto& [a, b] : pairs) alone.push_back(torch::mm(a, b));
  std::atomic<int> differed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 5; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        const size_t k = static_cast<size_t>(t + i) % pairs.size();
        if (!torch::equal(torch::mm(pairs[k].first, pairs[k].second), alone[k])) ++differed;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(differed.load(), 0) << "of 10000 products on " << BlasLibraryPath();
  if (IsThreadUnsafeBlas(BlasLibraryPath())) {
    EXPECT_EQ(ConfigureTorchForWorkers(/*threads=*/2).code(),
              absl::StatusCode::kFailedPrecondition);
  } else {
    EXPECT_TRUE(ConfigureTorchForWorkers(/*threads=*/2).ok());
  }
}

TEST(ValidateConfigTest, RefusesUnknownCommunicationSettings) {
  TrainerConfig c;
  c.shards = {"127.0.0.1:1"};
  EXPECT_TRUE(ValidateConfig(c, /*local=*/false).ok());
  c.objective = "bytes";
  EXPECT_TRUE(ValidateConfig(c, false).ok());
  c.objective = "speed";
  EXPECT_EQ(ValidateConfig(c, false).message(), "objective 'speed' is not one of: time, bytes");
  c.objective = "time";
  c.comm = "gossip";
  EXPECT_EQ(ValidateConfig(c, false).message(),
            "communication 'gossip' is not one of: sync, adacomm, auto");
}

// --comm auto resolves on what the shards said at join.
TEST(ResolveCommTest, LocalUpdatesOnlyWhenEveryShardAddsChangesAsTheyAre) {
  TrainerConfig c;
  c.comm = "auto";
  ShardInfo as_is{.shard_id = 0, .learning_rate = 1, .momentum = 0, .weight_decay = 0};
  ShardInfo sgd{.shard_id = 1, .learning_rate = 0.05f, .momentum = 0.9f};
  ASSERT_TRUE(as_is.AddsChangesAsTheyAre());
  ASSERT_FALSE(sgd.AddsChangesAsTheyAre());

  const TrainerConfig unknown = ResolveComm(c, {});
  EXPECT_EQ(unknown.comm, "sync");
  EXPECT_EQ(unknown.codec, "auto");
  EXPECT_TRUE(unknown.error_feedback);
  EXPECT_EQ(unknown.codec_candidates.size(), 5u);

  const std::vector<ShardInfo> both = {as_is, as_is};
  const TrainerConfig local = ResolveComm(c, both);
  EXPECT_EQ(local.comm, "adacomm");
  EXPECT_EQ(local.codec, "fp16");
  EXPECT_TRUE(CheckShards(local, both).ok());

  const std::vector<ShardInfo> mixed = {as_is, sgd};
  EXPECT_EQ(ResolveComm(c, mixed).comm, "sync");
  ShardInfo aggregating = as_is;
  aggregating.aggregate_only = true;
  const std::vector<ShardInfo> only_aggregate = {aggregating};
  EXPECT_EQ(ResolveComm(c, only_aggregate).comm, "sync");

  c.comm = "sync";
  EXPECT_EQ(ResolveComm(c, both).comm, "sync") << "only auto is resolved";
  EXPECT_TRUE(CheckShards(c, mixed).ok()) << "synchronous rounds work with any shard";
  c.comm = "adacomm";
  EXPECT_EQ(CheckShards(c, only_aggregate).message(),
            "--comm adacomm pushes the change of each worker's local steps, which the shards "
            "must add as it is; shard 0 only aggregates (--aggregate-only) (start ps-server "
            "with --lr 1 --momentum 0 --weight-decay 0)");
  EXPECT_EQ(CheckShards(c, mixed).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace ps::fashion_mnist
