// server::LocalCluster and PickFreePorts: shards started in-process on loopback, their
// addresses, the run directory with the workers' tokens (gone with the cluster), and
// errors (a shard that does not start, no port to pick) reported as errors.
#include "server/local_cluster.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/layout.h"
#include "server/server.h"
#include "tests/support/test_certs.h"
#include "worker_lib/worker.h"

namespace ps::server {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

ServerOptions Base() {
  ServerOptions o;
  o.num_workers = 1;
  o.threads = 1;
  o.round_deadline = milliseconds(20000);
  o.drain_timeout = milliseconds(2000);
  o.log_level = "warn";
  return o;
}

// A fresh directory below the system's temporary one (removed by the caller).
std::string MakeTempDir(const std::string& stem) {
  std::string dir = (std::filesystem::temp_directory_path() / (stem + "-XXXXXX")).string();
  EXPECT_NE(::mkdtemp(dir.data()), nullptr);
  return dir;
}

TEST(LocalCluster, TwoShardsAnswerAWorkerWithItsTokenAndTheRunDirectoryGoesWithThem) {
  absl::StatusOr<LocalCluster> started = LocalCluster::Start(2, Base());
  ASSERT_TRUE(started.ok()) << started.status();
  LocalCluster c = *std::move(started);
  ASSERT_EQ(c.num_shards(), 2u);
  ASSERT_EQ(c.addresses().size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(c.shard(i).shard().shard_id(), i);
    EXPECT_NE(c.shard(i).port(), 0);
    EXPECT_EQ(c.addresses()[i], absl::StrCat("127.0.0.1:", c.shard(i).port()));
  }
  EXPECT_NE(c.addresses()[0], c.addresses()[1]);

  // The default authentication: a private run directory with the secret and the tokens.
  const std::string run_dir = c.run_dir();
  ASSERT_FALSE(run_dir.empty());
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(run_dir) / "secret"));
  EXPECT_EQ(std::filesystem::status(run_dir).permissions() &
                (std::filesystem::perms::group_all | std::filesystem::perms::others_all),
            std::filesystem::perms::none);
  absl::StatusOr<std::string> token = c.WorkerToken(0);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_THAT(*token, HasSubstr("worker-0"));

  // One slice on each shard: a round completes only if both answer.
  const core::ModelLayout layout = *core::ModelLayout::Create({{"a", 4, 0}, {"b", 4, 1}}, 4, 2);
  WorkerOptions wo;
  wo.shard_addresses = c.addresses();
  wo.credentials.token = *token;
  wo.connect_timeout = milliseconds(20000);
  const std::vector<float> init(4, 1.0f);
  const std::vector<std::span<const float>> initial = {init, init};
  absl::StatusOr<std::unique_ptr<Worker>> worker = Worker::Start(wo, layout, initial);
  ASSERT_TRUE(worker.ok()) << worker.status();
  for (size_t t = 0; t < 2; ++t)
    ASSERT_TRUE((*worker)->Push(t, 0, std::vector<float>(4, 1.0f)).ok());
  ASSERT_TRUE((*worker)->WaitPushes().ok());
  std::vector<std::vector<float>> params(2, std::vector<float>(4));
  const std::vector<std::span<float>> outs(params.begin(), params.end());
  absl::StatusOr<uint64_t> version = (*worker)->PullAll(1, outs, milliseconds(20000));
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, 1u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(c.shard(i).shard().MaxVersion(), 1u);
  worker->reset();

  // A move hands the shards and the directory over; the destructor removes it.
  {
    LocalCluster moved = std::move(c);
    EXPECT_EQ(c.num_shards(), 0u);  // NOLINT(bugprone-use-after-move): documented empty
    EXPECT_EQ(moved.num_shards(), 2u);
    EXPECT_EQ(moved.run_dir(), run_dir);
    EXPECT_TRUE(std::filesystem::exists(run_dir));
  }
  EXPECT_FALSE(std::filesystem::exists(run_dir));
}

TEST(LocalCluster, EachShardServesItsOwnCertificateUnderMutualTlsOnTheTcpPlane) {
  // "{shard}" in the certificate's paths: shard N presents shard-N (the peers check each
  // other's names against their shard ids), over both of its ports.
  const std::string certs = ps::testing::MakeTestCerts("ps-local-cluster-tls", 2, 1);
  ServerOptions o = Base();
  o.tls_ca = certs + "/ca.pem";
  o.tls_cert = certs + "/shard-{shard}.pem";
  o.tls_key = certs + "/shard-{shard}.key";
  o.data_plane = core::DataPlane::kTcp;
  absl::StatusOr<LocalCluster> started = LocalCluster::Start(2, o);
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_TRUE(started->run_dir().empty()) << "mTLS needs no run directory";
  const core::ModelLayout layout = *core::ModelLayout::Create({{"a", 4, 0}, {"b", 4, 1}}, 4, 2);
  WorkerOptions wo;
  wo.shard_addresses = started->addresses();
  wo.credentials = {.tls_ca = o.tls_ca,
                    .tls_cert = certs + "/worker-0.pem",
                    .tls_key = certs + "/worker-0.key"};
  wo.connect_timeout = milliseconds(20000);
  const std::vector<float> init(4, 1.0f);
  const std::vector<std::span<const float>> initial = {init, init};
  absl::StatusOr<std::unique_ptr<Worker>> worker = Worker::Start(wo, layout, initial);
  ASSERT_TRUE(worker.ok()) << worker.status();
  for (const ShardInfo& shard : (*worker)->shards()) EXPECT_EQ(shard.data_plane, core::DataPlane::kTcp);
  for (size_t t = 0; t < 2; ++t) ASSERT_TRUE((*worker)->Push(t, 0, std::vector<float>(4, 1.0f)).ok());
  ASSERT_TRUE((*worker)->WaitPushes().ok());
}

TEST(LocalCluster, OneInsecureShardBindsAPortTheKernelPicksAndHasNoTokens) {
  ServerOptions o = Base();
  o.insecure = true;
  absl::StatusOr<LocalCluster> c = LocalCluster::Start(1, o);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->num_shards(), 1u);
  EXPECT_NE(c->shard(0).port(), 0);
  EXPECT_EQ(c->addresses(),
            std::vector<std::string>{absl::StrCat("127.0.0.1:", c->shard(0).port())});
  EXPECT_TRUE(c->run_dir().empty());
  absl::StatusOr<std::string> token = c->WorkerToken(0);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "");
}

TEST(LocalCluster, ShutdownStopsServingAndStopEmptiesTheCluster) {
  absl::StatusOr<LocalCluster> c = LocalCluster::Start(1, Base());
  ASSERT_TRUE(c.ok()) << c.status();
  const std::string run_dir = c->run_dir();
  c->Shutdown();
  ASSERT_EQ(c->num_shards(), 1u);
  EXPECT_FALSE(c->shard(0).serving());
  c->Stop();
  EXPECT_EQ(c->num_shards(), 0u);
  EXPECT_TRUE(c->addresses().empty());
  EXPECT_FALSE(std::filesystem::exists(run_dir));
}

TEST(LocalCluster, AGivenRunDirectoryIsUsedAndKept) {
  const std::string dir = MakeTempDir("ps-local-cluster-test");
  ServerOptions o = Base();
  o.run_dir = dir;
  {
    absl::StatusOr<LocalCluster> c = LocalCluster::Start(1, o);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->run_dir(), dir);
    absl::StatusOr<std::string> token = c->WorkerToken(0);
    ASSERT_TRUE(token.ok()) << token.status();
    EXPECT_THAT(*token, HasSubstr("worker-0"));
  }
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(dir) / "secret"));
  std::filesystem::remove_all(dir);
}

TEST(LocalCluster, AShardThatDoesNotStartIsAnErrorAndLeavesNoRunDirectory) {
  // Start makes its run directory below TMPDIR: an empty one of our own, to look into.
  const std::string tmp = MakeTempDir("ps-local-cluster-tmp");
  const char* old_tmpdir = std::getenv("TMPDIR");
  const std::string saved = old_tmpdir ? old_tmpdir : "";
  ASSERT_EQ(::setenv("TMPDIR", tmp.c_str(), 1), 0);
  ServerOptions o = Base();
  o.aggregator = "no_such_rule";
  absl::StatusOr<LocalCluster> c = LocalCluster::Start(2, o);
  if (old_tmpdir) {
    ::setenv("TMPDIR", saved.c_str(), 1);
  } else {
    ::unsetenv("TMPDIR");
  }
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("shard 0"));
  EXPECT_TRUE(std::filesystem::is_empty(tmp));
  std::filesystem::remove_all(tmp);
}

// gRPC would set SO_REUSEPORT: a second server on a port in use would then start and
// take a share of its connections. Here it is refused at startup.
TEST(LocalCluster, AShardCannotListenOnAPortAnotherServerHolds) {
  absl::StatusOr<LocalCluster> first = LocalCluster::Start(1, Base());
  ASSERT_TRUE(first.ok()) << first.status();
  ServerOptions o = Base();
  o.insecure = true;
  o.host = "127.0.0.1";
  o.port = first->shard(0).port();
  absl::StatusOr<std::unique_ptr<Server>> second = Server::Start(o);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("cannot listen on 127.0.0.1:"));
}

// Ports picked for several shards may be taken before they bind: the cluster starts
// again on fresh ones.
TEST(LocalCluster, PortsTakenInBetweenArePickedAgain) {
  absl::StatusOr<LocalCluster> holder = LocalCluster::Start(1, Base());
  ASSERT_TRUE(holder.ok()) << holder.status();
  const uint16_t taken = holder->shard(0).port();
  int picks = 0;
  PortPicker picker = [&](size_t count) -> absl::StatusOr<std::vector<uint16_t>> {
    ++picks;
    absl::StatusOr<std::vector<uint16_t>> fresh = PickFreePorts(count);
    if (fresh.ok() && picks == 1) (*fresh)[1] = taken;  // shard 1's port is in use
    return fresh;
  };
  absl::StatusOr<LocalCluster> c = LocalCluster::Start(2, Base(), picker);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(picks, 2);
  ASSERT_EQ(c->num_shards(), 2u);
  EXPECT_NE(c->shard(1).port(), taken);
  EXPECT_EQ(c->addresses()[1], absl::StrCat("127.0.0.1:", c->shard(1).port()));

  // Always taken: four attempts, then the error names the shard and the port.
  picks = 0;
  PortPicker always = [&](size_t count) -> absl::StatusOr<std::vector<uint16_t>> {
    ++picks;
    absl::StatusOr<std::vector<uint16_t>> fresh = PickFreePorts(count);
    if (fresh.ok()) (*fresh)[0] = taken;
    return fresh;
  };
  absl::StatusOr<LocalCluster> never = LocalCluster::Start(2, Base(), always);
  ASSERT_FALSE(never.ok());
  EXPECT_EQ(picks, 4);
  EXPECT_THAT(never.status().message(),
              HasSubstr(absl::StrCat("shard 0: cannot listen on 127.0.0.1:", taken)));
}

TEST(LocalCluster, NoShardsIsAnError) {
  absl::StatusOr<LocalCluster> c = LocalCluster::Start(0, Base());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PickFreePorts, GivesDistinctNonZeroPorts) {
  absl::StatusOr<std::vector<uint16_t>> ports = PickFreePorts(4);
  ASSERT_TRUE(ports.ok()) << ports.status();
  ASSERT_EQ(ports->size(), 4u);
  EXPECT_EQ(std::set<uint16_t>(ports->begin(), ports->end()).size(), 4u);
  for (uint16_t p : *ports) EXPECT_NE(p, 0);
  absl::StatusOr<std::vector<uint16_t>> none = PickFreePorts(0);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
}

// With the descriptor limit just above the highest open descriptor, there are fewer free
// descriptors than ports asked for: socket() fails, and so do PickFreePorts and a
// cluster of that many shards.
TEST(PickFreePorts, ASocketFailureIsAnError) {
  int highest = 2;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    highest = std::max(highest, std::stoi(entry.path().filename().string()));
  }
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  const rlimit low{static_cast<rlim_t>(highest + 1), saved.rlim_max};
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  absl::StatusOr<std::vector<uint16_t>> ports = PickFreePorts(static_cast<size_t>(highest + 1));
  ServerOptions o = Base();
  o.insecure = true;
  absl::StatusOr<LocalCluster> c = LocalCluster::Start(static_cast<uint32_t>(highest + 1), o);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  ASSERT_FALSE(ports.ok());
  EXPECT_THAT(ports.status().message(), HasSubstr("socket"));
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("socket"));
}

}  // namespace
}  // namespace ps::server
