// The harness's server side against the real ps-server binary: a ServerProcess that
// serves, writes its port file and tokens, trains with HonestTraining and stops on
// SIGTERM; one that fails to start is reported with its log; the port file's format
// (server/port_file.h) as both sides read it; /proc figures of a live process.
#include "harness/server_process.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "harness/honest_training.h"
#include "harness/process_stats.h"
#include "server/port_file.h"

namespace ps::harness {
namespace {

using ::testing::HasSubstr;
using std::chrono::milliseconds;

class ServerProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::string> dir = MakeTempDir("ps-harness-test");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
};

TEST_F(ServerProcessTest, ServesTrainsAndStopsOnSigterm) {
  const std::string run_dir = dir_ + "/run", port_file = dir_ + "/port";
  auto server = ServerProcess::Start(
      PS_SERVER_BINARY,
      {"--host", "127.0.0.1", "--port", "0", "--port-file", port_file, "--run-dir", run_dir,
       "--workers", "2", "--threads", "2"},
      dir_ + "/server.log");
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<uint16_t> port = (*server)->WaitForPort(port_file, milliseconds(20000));
  ASSERT_TRUE(port.ok()) << port.status();
  EXPECT_EQ(server::ReadPortFile(port_file), *port);
  absl::StatusOr<std::vector<std::string>> tokens = ReadWorkerTokens(run_dir, 2);
  ASSERT_TRUE(tokens.ok()) << tokens.status();

  HonestTrainingOptions o;
  o.address = "127.0.0.1:" + std::to_string(*port);
  o.tokens = *tokens;
  o.workers = 2;
  const core::ModelLayout layout = *core::ModelLayout::Create({{"a", 4096, 0}, {"b", 100, 1}}, 1024, 1);
  auto training = HonestTraining::Start(layout, o);
  ASSERT_TRUE(training.ok()) << training.status();
  EXPECT_TRUE((*training)->AdvancesBy(5)) << (*training)->last_error();
  EXPECT_TRUE((*training)->WaitOpen(5, milliseconds(20000)));
  (*training)->Stop();
  EXPECT_GE((*training)->rounds(), 2 * 5u - 2);  // both workers, all but the last round
  EXPECT_EQ((*training)->errors(), 0u) << (*training)->last_error();

  {
    PeakSampler peaks((*server)->pid());
    EXPECT_GT(peaks.peak_rss_bytes(), 1u << 20);
    EXPECT_GT(peaks.peak_fds(), 3u);
  }
  EXPECT_GT(ResidentBytes((*server)->pid()), 1u << 20);
  EXPECT_GT(CpuSeconds((*server)->pid()), 0.0);
  EXPECT_FALSE((*server)->Exited());
  EXPECT_EQ((*server)->Describe(), "running");
  EXPECT_EQ((*server)->Stop(milliseconds(20000)), "exit 0");
  EXPECT_GT((*server)->LogBytes(), 0u);
  EXPECT_THAT((*server)->Log(), HasSubstr("serving on 127.0.0.1:" + std::to_string(*port)));
}

TEST_F(ServerProcessTest, AServerThatExitsBeforeServingIsReportedWithItsLog) {
  auto server = ServerProcess::Start(PS_SERVER_BINARY, {"--no-such-flag"}, dir_ + "/server.log");
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<uint16_t> port = (*server)->WaitForPort(dir_ + "/port", milliseconds(20000));
  ASSERT_EQ(port.status().code(), absl::StatusCode::kUnavailable) << port.status();
  EXPECT_THAT(std::string(port.status().message()), HasSubstr("before serving"));
  EXPECT_THAT(std::string(port.status().message()), HasSubstr("no-such-flag"));
  EXPECT_NE((*server)->Describe(), "running");
}

TEST_F(ServerProcessTest, AMissingBinaryIsNotFound) {
  auto server = ServerProcess::Start(dir_ + "/ps-server", {}, dir_ + "/server.log");
  ASSERT_EQ(server.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(server.status().message()), HasSubstr("pass --server-bin"));
}

TEST_F(ServerProcessTest, TokensThatNeverAppearAreAnError) {
  EXPECT_FALSE(ReadWorkerTokens(dir_ + "/no-run-dir", 1).ok());
}

TEST_F(ServerProcessTest, PortFilesAreReadOnlyWhenWholeAndValid) {
  const std::string path = dir_ + "/port";
  EXPECT_EQ(server::ReadPortFile(path), std::nullopt);  // not there yet
  ASSERT_TRUE(server::WritePortFile(path, 40123).ok());
  EXPECT_EQ(server::ReadPortFile(path), 40123);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  for (const char* bad : {"", "0\n", "65536\n", "12a\n", "-5\n", "80 81\n"}) {
    std::ofstream(path, std::ios::trunc) << bad;
    EXPECT_EQ(server::ReadPortFile(path), std::nullopt) << "'" << bad << "'";
  }
  EXPECT_FALSE(server::WritePortFile(dir_ + "/no-such-dir/port", 1).ok());
}

TEST(ProcessStatsTest, FiguresOfThisProcessAndNoneOfAGoneOne) {
  EXPECT_GT(ResidentBytes(::getpid()), 1u << 20);
  EXPECT_GE(StatusBytes(::getpid(), "VmHWM:"), ResidentBytes(::getpid()) / 2);
  EXPECT_GT(OpenFds(::getpid()), 2u);
  EXPECT_GE(CpuSeconds(::getpid()), 0.0);
  // Pid numbers wrap far below this.
  EXPECT_EQ(ResidentBytes(0x3fffffff), 0u);
  EXPECT_EQ(OpenFds(0x3fffffff), 0u);
  EXPECT_EQ(CpuSeconds(0x3fffffff), 0.0);
}

TEST(ProcessStatsTest, PeakSamplerKeepsThePeakAfterMemoryIsFreed) {
  PeakSampler peaks(::getpid());
  peaks.Reset();
  const uint64_t before = peaks.peak_rss_bytes();
  {
    std::vector<char> block(64u << 20, 1);  // touched: resident
    ASSERT_EQ(block[block.size() - 1], 1);
    EXPECT_GE(peaks.peak_rss_bytes(), before + (48u << 20));
  }
  EXPECT_GE(peaks.peak_rss_bytes(), before + (48u << 20));
}

}  // namespace
}  // namespace ps::harness
