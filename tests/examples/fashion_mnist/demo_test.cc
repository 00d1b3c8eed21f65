// RunScenario against stand-in shell scripts for ps-server and ps-fashion-mnist: the
// launcher's process handling (startup, progress, shutdown, failures, timeouts,
// interruption) without torch or a real server. Every test checks that no process the
// scenario started is left running.
#include "examples/fashion_mnist/demo.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "harness/process_stats.h"

namespace ps::fashion_mnist {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

// Shared argument parsing: sets $port, $pf, $id, $steps, $byz (the --attack); records $$ in pids/.
constexpr char kPrologue[] = R"(#!/bin/sh
port=; pf=; id=; steps=; byz=none
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port=$2; shift;;
    --port-file) pf=$2; shift;;
    --worker-id) id=$2; shift;;
    --steps) steps=$2; shift;;
    --attack) byz=$2; shift;;
  esac
  shift
done
)";

// A shard that writes its port file and exits 0 on SIGTERM.
constexpr char kGoodServer[] = R"(
echo $$ > "$DEMO_TEST_DIR/pids/server-$$"
echo "$port" > "$pf.tmp" && mv "$pf.tmp" "$pf"
trap 'exit 0' TERM
while :; do sleep 0.05; done
)";

// A trainer that reports `steps` steps and a final accuracy.
constexpr char kGoodTrainer[] = R"(
echo $$ > "$DEMO_TEST_DIR/pids/trainer-$id"
echo "$byz" > "$DEMO_TEST_DIR/byzantine-$id"
echo '{"event":"start"}'
i=1
while [ $i -le $steps ]; do
  echo "{\"event\":\"step\",\"step\":$i,\"loss\":0.5}"
  i=$((i+1))
done
echo "{\"event\":\"eval\",\"step\":$steps,\"test_accuracy\":0.875}"
echo "{\"event\":\"done\",\"steps\":$steps,\"final_test_accuracy\":0.875,\"wall_seconds\":1}"
)";

class DemoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "demo_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    std::filesystem::create_directories(dir_ / "pids");
    setenv("DEMO_TEST_DIR", dir_.c_str(), 1);
    config_.out_dir = (dir_ / "out").string();
    config_.workers = 4;
    config_.byzantine = 1;
    config_.steps = 5;
    config_.timeout = 60s;
    config_.shutdown_grace = 10s;
    config_.startup_timeout = 10s;
    SetServer(kGoodServer);
    SetTrainer(kGoodTrainer);
  }

  void TearDown() override {
    ExpectNothingLeftRunning();
    std::filesystem::remove_all(dir_);
  }

  std::string Script(const std::string& name, const std::string& body) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << kPrologue << body;
    chmod(path.c_str(), 0755);
    return path;
  }
  void SetServer(const std::string& body) { config_.server_bin = Script("server.sh", body); }
  void SetTrainer(const std::string& body) { config_.trainer_bin = Script("trainer.sh", body); }

  ScenarioResult Run(std::function<bool()> interrupted = nullptr) {
    return RunScenario(config_, "trimmed_mean", interrupted,
                       [this](const ScenarioProgress& p) { last_progress_ = p; });
  }

  void ExpectNothingLeftRunning() {
    for (const auto& entry : std::filesystem::directory_iterator(dir_ / "pids")) {
      std::ifstream in(entry.path());
      pid_t pid = 0;
      in >> pid;
      ASSERT_GT(pid, 0);
      EXPECT_FALSE(harness::Running(pid))
          << entry.path().filename() << " (pid " << pid << ") still runs";
    }
  }

  std::string ReadFile(const std::filesystem::path& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  std::filesystem::path dir_;
  DemoConfig config_;
  ScenarioProgress last_progress_;
};

TEST_F(DemoTest, RunsToTheEndAndStopsTheShardsCleanly) {
  const ScenarioResult r = Run();
  EXPECT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.aggregator, "trimmed_mean");
  EXPECT_EQ(r.attack, "signflip");
  EXPECT_EQ(r.byzantine, 1u);
  EXPECT_EQ(r.steps, 5u);
  ASSERT_TRUE(r.final_test_accuracy.has_value());
  EXPECT_DOUBLE_EQ(*r.final_test_accuracy, 0.875);
  EXPECT_EQ(last_progress_.steps_done, 5u);
  EXPECT_EQ(last_progress_.test_accuracy, 0.875);
  // Logs per process, and worker 0's events kept.
  const auto out = dir_ / "out" / "trimmed_mean";
  EXPECT_TRUE(std::filesystem::exists(out / "shard-0.log"));
  EXPECT_TRUE(std::filesystem::exists(out / "shard-1.log"));
  EXPECT_THAT(ReadFile(out / "worker-3.log"), HasSubstr("\"event\":\"done\""));
  EXPECT_THAT(ReadFile(out / "worker-0.jsonl"), HasSubstr("\"final_test_accuracy\":0.875"));
}

TEST_F(DemoTest, OnlyTheLastFWorkersAttack) {
  config_.byzantine = 2;
  ASSERT_TRUE(Run().ok);
  for (int w = 0; w < 4; ++w) {
    EXPECT_EQ(ReadFile(dir_ / ("byzantine-" + std::to_string(w))), w >= 2 ? "signflip(scale=10)\n" : "none\n")
        << "worker " << w;
  }
}

TEST_F(DemoTest, FailingTrainerFailsTheScenarioAndNothingIsLeft) {
  SetTrainer(std::string(R"(
echo $$ > "$DEMO_TEST_DIR/pids/trainer-$id"
if [ "$id" = 2 ]; then echo boom >&2; exit 3; fi
while :; do sleep 0.05; done
)"));
  const ScenarioResult r = Run();
  EXPECT_FALSE(r.ok);
  EXPECT_THAT(r.error, HasSubstr("worker-2 failed: exit 3"));
  EXPECT_THAT(ReadFile(dir_ / "out" / "trimmed_mean" / "worker-2.log"), HasSubstr("boom"));
}

TEST_F(DemoTest, TimeoutKillsEverything) {
  SetTrainer(R"(
echo $$ > "$DEMO_TEST_DIR/pids/trainer-$id"
echo '{"event":"step","step":1,"loss":1}'
while :; do sleep 0.05; done
)");
  config_.timeout = 2s;
  const ScenarioResult r = Run();
  EXPECT_FALSE(r.ok);
  EXPECT_THAT(r.error, HasSubstr("timed out after 2 s"));
  EXPECT_LT(r.wall_seconds, 30);
}

TEST_F(DemoTest, InterruptKillsEverything) {
  SetTrainer(R"(
echo $$ > "$DEMO_TEST_DIR/pids/trainer-$id"
while :; do sleep 0.05; done
)");
  const auto start = std::chrono::steady_clock::now();
  const ScenarioResult r = Run([start] { return std::chrono::steady_clock::now() - start > 1s; });
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.error, "interrupted");
}

TEST_F(DemoTest, ShardIgnoringSigtermIsKilledAndReported) {
  SetServer(R"(
echo $$ > "$DEMO_TEST_DIR/pids/server-$$"
echo "$port" > "$pf"
trap '' TERM
while :; do sleep 0.05; done
)");
  config_.shutdown_grace = 1s;
  const ScenarioResult r = Run();
  EXPECT_FALSE(r.ok);
  EXPECT_THAT(r.error, HasSubstr("after SIGTERM"));
}

TEST_F(DemoTest, ShardExitingNonZeroOnSigtermIsReported) {
  SetServer(R"(
echo $$ > "$DEMO_TEST_DIR/pids/server-$$"
echo "$port" > "$pf"
trap 'exit 4' TERM
while :; do sleep 0.05; done
)");
  const ScenarioResult r = Run();
  EXPECT_FALSE(r.ok);
  EXPECT_THAT(r.error, HasSubstr("exit 4"));
}

TEST_F(DemoTest, ShardFailingAtStartupIsRetriedOnce) {
  // The first shard-0 start fails as if its port had been taken; the retry works.
  SetServer(std::string(R"(
if [ ! -e "$DEMO_TEST_DIR/failed-once" ]; then
  touch "$DEMO_TEST_DIR/failed-once"; echo "bind: address in use" >&2; exit 1
fi
)") + kGoodServer);
  const ScenarioResult r = Run();
  EXPECT_TRUE(r.ok) << r.error;
}

TEST_F(DemoTest, ShardAlwaysFailingAtStartupGivesUpAfterTheRetry) {
  SetServer(R"(
echo "bind: address in use" >&2; exit 1
)");
  const ScenarioResult r = Run();
  EXPECT_FALSE(r.ok);
  EXPECT_THAT(r.error, HasSubstr("exited during startup"));
  EXPECT_THAT(r.error, HasSubstr("after a retry"));
}

TEST_F(DemoTest, DivergedTrainingIsAResultNotAFailure) {
  SetTrainer(R"(
echo $$ > "$DEMO_TEST_DIR/pids/trainer-$id"
echo '{"event":"diverged","step":3}'
echo '{"event":"done","steps":3,"final_test_accuracy":0.1,"diverged":true}'
)");
  const ScenarioResult r = Run();
  EXPECT_TRUE(r.ok) << r.error;
  EXPECT_TRUE(r.diverged);
  EXPECT_EQ(r.steps, 3u);
  EXPECT_EQ(r.final_test_accuracy, 0.1);
}

TEST_F(DemoTest, TrainerWithoutFinalAccuracyFails) {
  SetTrainer(R"(
echo $$ > "$DEMO_TEST_DIR/pids/trainer-$id"
echo '{"event":"done","steps":5,"final_test_accuracy":null}'
)");
  const ScenarioResult r = Run();
  EXPECT_FALSE(r.ok);
  EXPECT_THAT(r.error, HasSubstr("without a final accuracy"));
}

TEST(Summary, JsonHasOneObjectPerScenario) {
  ScenarioResult ok{"trimmed_mean", "signflip", 6, 1, 600, 0.8312, 61.234, false, true, ""};
  ScenarioResult failed{"mean", "signflip", 6, 1, 12, std::nullopt, 3.5, false, false, "timed out"};
  const std::string json = SummaryJson({ok, failed});
  EXPECT_EQ(json,
            "[\n"
            "  {\"aggregator\":\"trimmed_mean\",\"attack\":\"signflip\",\"byzantine\":1,"
            "\"workers\":6,\"steps\":600,\"final_test_accuracy\":0.8312,\"wall_seconds\":61.23,"
            "\"diverged\":false,\"ok\":true},\n"
            "  {\"aggregator\":\"mean\",\"attack\":\"signflip\",\"byzantine\":1,\"workers\":6,"
            "\"steps\":12,\"final_test_accuracy\":null,\"wall_seconds\":3.5,\"diverged\":false,"
            "\"ok\":false,\"error\":\"timed out\"}\n"
            "]\n");
  EXPECT_EQ(SummaryJson({}), "[]\n");
}

TEST(Summary, TableHasAHeaderAndARowPerScenario) {
  ScenarioResult ok{"trimmed_mean", "signflip", 6, 1, 600, 0.8312, 61.2, false, true, ""};
  ScenarioResult diverged{"mean", "signflip", 6, 1, 18, 0.1, 4.2, true, true, ""};
  const std::string table = SummaryTable({ok, diverged});
  EXPECT_THAT(table, HasSubstr("ok (diverged, stopped early)"));
  EXPECT_THAT(table, HasSubstr("aggregator"));
  EXPECT_THAT(table, HasSubstr("final test acc"));
  EXPECT_THAT(table, HasSubstr("trimmed_mean"));
  EXPECT_THAT(table, HasSubstr("0.8312"));
  EXPECT_THAT(table, HasSubstr("1 of 6"));
}

}  // namespace
}  // namespace ps::fashion_mnist
