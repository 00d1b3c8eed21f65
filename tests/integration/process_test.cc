// The real ps-server binary: start-up refusals, serving a worker, SIGTERM drain.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "crypto/cluster_secret.h"
#include "tests/integration/cluster_util.h"
#include "tests/integration/process_util.h"
#include "worker_lib/worker.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using std::chrono::milliseconds;
using testing::Process;
using testing::ReadPortFile;

TEST(ProcessTest, RefusesAnImpossibleRuleAtStartUp) {
  Process p({PS_SERVER_BINARY, "--aggregator", "krum", "--workers", "6", "--byzantine", "2",
             "--port", "0"});
  EXPECT_NE(p.Wait(milliseconds(10000)), 0);
  EXPECT_THAT(p.Log(), HasSubstr("2f + 3"));
}

TEST(ProcessTest, RefusesUnknownFlagWithExitCode2) {
  Process p({PS_SERVER_BINARY, "--no-such-flag"});
  EXPECT_EQ(p.Wait(milliseconds(10000)), 2);
  EXPECT_THAT(p.Log(), HasSubstr("no-such-flag"));
}

// Serving and draining on each data plane: on the TCP plane the worker's pushes and its
// waiting pull go over the data port, and the drain ends that pull there too.
class ProcessPlaneTest : public ::testing::TestWithParam<core::DataPlane> {};
INSTANTIATE_TEST_SUITE_P(Planes, ProcessPlaneTest, testing::DataPlanes(),
                         [](const auto& info) { return testing::PlaneName(info.param); });

TEST_P(ProcessPlaneTest, ServesAWorkerAndDrainsOnSigterm) {
  const std::string port_file = (std::filesystem::temp_directory_path() /
                                 ("ps_port_" + std::to_string(::getpid()))).string();
  std::filesystem::remove(port_file);
  const std::string run_dir = port_file + ".run";
  std::filesystem::remove_all(run_dir);
  std::vector<std::string> args = {PS_SERVER_BINARY, "--port", "0", "--port-file", port_file,
                                   "--workers", "1", "--lr", "1", "--momentum", "0",
                                   "--drain-timeout-ms", "20000", "--run-dir", run_dir};
  const std::vector<std::string> plane_flags = testing::PlaneFlags(GetParam());
  args.insert(args.end(), plane_flags.begin(), plane_flags.end());
  Process server(args);
  const std::string port = ReadPortFile(port_file, milliseconds(15000));
  ASSERT_FALSE(port.empty()) << server.Log();
  std::filesystem::remove(port_file);
  absl::StatusOr<std::string> token = core::ReadTokenFile(
      crypto::TokenFilePath(run_dir, core::Identity{core::Identity::Kind::kWorker, 0}));
  ASSERT_TRUE(token.ok()) << token.status();

  auto layout = *core::ModelLayout::Create({{"w", 3, 0}}, 128, 1);
  WorkerOptions wo;
  wo.shard_addresses = {"127.0.0.1:" + port};
  wo.credentials.token = *token;
  wo.max_attempts = 1;
  std::vector<float> init = {1, 2, 3};
  std::vector<std::span<const float>> spans = {init};
  auto worker = Worker::Start(wo, layout, spans);
  ASSERT_TRUE(worker.ok()) << worker.status();
  ASSERT_EQ((*worker)->shards()[0].data_plane, GetParam());
  std::vector<float> w(3);
  ASSERT_TRUE((*worker)->Pull(0, 0, w, milliseconds(5000)).ok());
  ASSERT_TRUE((*worker)->Push(0, 0, std::vector<float>{1, 1, 1}).ok());
  ASSERT_TRUE((*worker)->WaitPushes().ok());
  ASSERT_TRUE((*worker)->Pull(0, 1, w, milliseconds(5000)).ok());
  EXPECT_EQ(w, (std::vector<float>{0, 1, 2}));

  // The operator's per-worker view: the shard's line, then one line per worker.
  Process admin({PS_ADMIN_BINARY, "--address", "127.0.0.1:" + port, "--run-dir", run_dir,
                 "status", "--workers"},
                {}, /*with_stdout=*/true);
  ASSERT_EQ(admin.Wait(milliseconds(30000)), 0) << admin.Log();
  EXPECT_THAT(admin.Log(), HasSubstr("\"pushes_accepted\":1,\"refusals\":0"));
  EXPECT_THAT(admin.Log(),
              HasSubstr("}\n{\"worker\":0,\"joined\":true,\"state\":\"present\",\"pushes_accepted\":1,"
                        "\"udp_chunks_accepted\":0,\"late\":0,\"refused\":0,\"malformed\":0,"
                        "\"slice_rounds_missed\":0,\"quarantines\":0,\"suspected\":false,"
                        "\"windows_suspected\":0,\"mean_push_latency_seconds\":"));
  // No window of rounds closed yet: no score (JSON has no NaN).
  EXPECT_THAT(admin.Log(), HasSubstr(",\"suspicion\":null}\n"));

  // A pull waiting for a version that never comes is ended by the drain.
  std::thread waiter([&] {
    std::vector<float> out(3);
    auto v = (*worker)->Pull(0, 5, out, milliseconds(20000));
    EXPECT_FALSE(v.ok());
  });
  std::this_thread::sleep_for(milliseconds(200));
  // The drain ends that pull and the shard exits long before --drain-timeout-ms, on
  // either plane. (On the TCP plane the worker's gRPC control channel has no call open and
  // would read the shard's GOAWAY only when gRPC next polls it; gRPC's shutdown waited for
  // that connection until the deadline, until the shard closed the port's idle
  // connections itself.)
  const auto signalled = std::chrono::steady_clock::now();
  server.Signal(SIGTERM);
  EXPECT_EQ(server.Wait(milliseconds(30000)), 0) << server.Log();
  EXPECT_LT(std::chrono::steady_clock::now() - signalled, std::chrono::seconds(10)) << server.Log();
  waiter.join();
  EXPECT_THAT(server.Log(), HasSubstr("SIGTERM"));
}

}  // namespace
}  // namespace ps
