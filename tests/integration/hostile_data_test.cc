// The TCP data port under attack while honest workers train (docs/data-plane.md,
// "Per-connection bounds"): other local processes flood it with silent connections,
// stall inside a frame header, and say HELLO under sessions that do not exist. The
// honest workers' rounds go on and give the reference's parameters, the port holds its
// bounds, and once the attackers stop, what they opened is closed and counted (the
// metrics, scraped as an operator would).
//
// The attackers bind their own loopback source addresses (127.0.0.2-4), as other hosts
// would be: the per-source bounds are what stop them, and the honest workers (127.0.0.1)
// keep their own.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "cluster_util.h"
#include "net/data_frame.h"
#include "tests/net/metrics_text.h"
#include "worker_lib/worker.h"

namespace ps {
namespace {

using net::testing::MetricValue;
using net::testing::ParseMetrics;
using std::chrono::milliseconds;

// A TCP connection to 127.0.0.1:`port` from `source` (another loopback address); -1 when
// the connect fails (the port refused it at once, or the kernel's backlog was full).
int ConnectFrom(const char* source, uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in from{};
  from.sin_family = AF_INET;
  ::inet_pton(AF_INET, source, &from.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&from), sizeof(from)) != 0 ||
      ::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof(to)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void SendAll(int fd, const std::string& bytes) {
  size_t at = 0;
  while (at < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return;
    at += static_cast<size_t>(n);
  }
}

// Deterministic gradient of worker w in round r.
std::vector<float> Grad(uint32_t w, uint64_t r, size_t n) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) {
    g[i] = std::sin(0.3f * static_cast<float>(i) + 1.1f * static_cast<float>(w) +
                    0.7f * static_cast<float>(r));
  }
  return g;
}

TEST(HostileDataPortTest, HonestRoundsGoOnWhileTheDataPortIsFloodedStalledAndProbed) {
  server::ServerOptions o;
  o.num_workers = 2;
  o.aggregator = "mean";
  o.learning_rate = 0.5f;
  o.momentum = 0.0f;
  o.threads = 2;
  o.round_deadline = milliseconds(30000);
  o.data_plane = core::DataPlane::kTcp;
  o.metrics_port = 0;
  o.max_connections_per_source = 32;                 // the flood's bound
  o.connection_proof_timeout = milliseconds(1500);  // the stalled headers' end
  testing::Cluster c = testing::StartCluster(1, o);
  ASSERT_EQ(c.num_shards(), 1u);
  server::Server& shard = c.shard(0);
  const uint16_t data_port = shard.data_port();
  ASSERT_NE(data_port, 0);
  const auto metrics = [&] {
    absl::StatusOr<net::testing::HttpResponse> r =
        net::testing::HttpGet(shard.metrics_port(), "/metrics");
    EXPECT_TRUE(r.ok()) << r.status();
    return ParseMetrics(r.ok() ? r->body : "");
  };

  constexpr size_t kNumel = 4096;
  constexpr uint64_t kRounds = 12;
  const core::ModelLayout layout = *core::ModelLayout::Create({{"w", kNumel, 0}}, 1024, 1);
  const std::vector<float> init(kNumel, 0.25f);
  std::vector<std::vector<float>> got(2, std::vector<float>(kNumel));
  std::atomic<int> rounds_done{0};
  std::vector<std::thread> honest;
  for (uint32_t w = 0; w < 2; ++w) {
    honest.emplace_back([&, w] {
      WorkerOptions wo = testing::ClientOptions(c, w);
      wo.data_plane = core::DataPlane::kTcp;
      const std::vector<std::span<const float>> initial = {init};
      auto worker = Worker::Start(wo, layout, initial);
      ASSERT_TRUE(worker.ok()) << worker.status();
      const std::vector<std::span<float>> outs = {got[w]};
      for (uint64_t r = 0; r < kRounds; ++r) {
        ASSERT_TRUE((*worker)->PullAll(r, outs, milliseconds(30000)).ok());
        ASSERT_TRUE((*worker)->Push(0, r, Grad(w, r, kNumel)).ok());
        ASSERT_TRUE((*worker)->WaitPushes().ok());
        // Paced, so that the rounds run while the attacks do.
        std::this_thread::sleep_for(milliseconds(100));
        if (w == 0) rounds_done.fetch_add(1);
      }
      ASSERT_TRUE((*worker)->PullAll(kRounds, outs, milliseconds(30000)).ok());
    });
  }

  // Once the honest workers are in: the attacks, all at once.
  for (int i = 0; i < 200 && rounds_done.load() < 1; ++i) std::this_thread::sleep_for(milliseconds(10));
  std::vector<int> fds;
  // 1. A flood of silent connections from one source: over its bound they are refused.
  for (int i = 0; i < 64; ++i) {
    if (const int fd = ConnectFrom("127.0.0.2", data_port); fd >= 0) fds.push_back(fd);
  }
  // 2. Half a frame header, then nothing: the proof timeout ends them.
  for (int i = 0; i < 8; ++i) {
    if (const int fd = ConnectFrom("127.0.0.3", data_port); fd >= 0) {
      SendAll(fd, std::string(8, '\x01'));
      fds.push_back(fd);
    }
  }
  // 3. HELLO under sessions that do not exist: refused before any HMAC.
  for (int i = 0; i < 16; ++i) {
    if (const int fd = ConnectFrom("127.0.0.4", data_port); fd >= 0) {
      net::HelloMeta hello{.data_session = 0xdead0000u + static_cast<uint64_t>(i), .worker_id = 0};
      hello.client_nonce.fill('x');
      std::string frame;
      ASSERT_TRUE(net::AppendHello(hello, &frame).ok());
      SendAll(fd, frame);
      fds.push_back(fd);
    }
  }
  // The source's bound holds: each flood connection over it evicted that source's oldest
  // unproven one (the table's rule; docs/connections.md), so at most 32 of the 64 are
  // open, beside the honest 2, the 8 stalled and what is left of the 16 refused HELLOs.
  // Read once the port has taken every attack connection (bounded wait).
  auto taken = metrics();
  for (int i = 0; i < 500 && MetricValue(taken, "ps_data_connections_accepted_total") < 2 + 64 + 8 + 16; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
    taken = metrics();
  }
  EXPECT_EQ(MetricValue(taken, "ps_data_connections_accepted_total"), 2 + 64 + 8 + 16);
  EXPECT_LE(MetricValue(taken, "ps_data_connections_open"), 2 + 32 + 8 + 16);
  for (std::thread& t : honest) t.join();
  EXPECT_EQ(rounds_done.load(), static_cast<int>(kRounds));
  // The stalled headers end at the proof timeout (bounded wait), each counted.
  const std::string proof_timeout = "ps_data_connections_closed_total{reason=\"proof_timeout\"}";
  auto during = metrics();
  for (int i = 0; i < 500 && MetricValue(during, proof_timeout) < 8; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
    during = metrics();
  }
  EXPECT_GE(MetricValue(during, proof_timeout), 8);
  EXPECT_GE(MetricValue(during, "ps_data_connections_closed_total{reason=\"source_unproven\"}"),
            64 - 32);

  // The reference: SGD on the mean of the two gradients, without any attack.
  std::vector<float> want = init;
  for (uint64_t r = 0; r < kRounds; ++r) {
    const std::vector<float> a = Grad(0, r, kNumel), b = Grad(1, r, kNumel);
    for (size_t i = 0; i < kNumel; ++i) want[i] -= 0.5f * ((a[i] + b[i]) / 2.0f);
  }
  for (uint32_t w = 0; w < 2; ++w) {
    for (size_t i = 0; i < kNumel; ++i) {
      ASSERT_NEAR(got[w][i], want[i], 1e-4) << "worker " << w << " element " << i;
    }
  }

  // Every attack connection was taken (the table evicts rather than refuses below its
  // global bounds) and none proved itself; once the attackers close, none is left open
  // (bounded wait), and the unknown sessions were refused as such.
  for (int fd : fds) ::close(fd);
  auto m = metrics();
  for (int i = 0; i < 500 && MetricValue(m, "ps_data_connections_open") != 0; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
    m = metrics();
  }
  EXPECT_EQ(MetricValue(m, "ps_data_connections_open"), 0) << "the honest workers are gone too";
  EXPECT_EQ(MetricValue(m, "ps_data_connections_accepted_total"), 2 + 64 + 8 + 16);
  EXPECT_EQ(MetricValue(m, "ps_data_connections_refused_total"), 0);
  EXPECT_EQ(MetricValue(m, "ps_data_connections_admitted_total"), 2);
  EXPECT_GE(MetricValue(m, "ps_refusals_total{reason=\"unknown_session\"}"), 16);
}

}  // namespace
}  // namespace ps
