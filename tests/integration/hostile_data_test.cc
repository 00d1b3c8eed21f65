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
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cluster_util.h"
#include "tests/net/metrics_text.h"
#include "tests/support/data_port_client.h"
#include "worker_lib/worker.h"

namespace ps {
namespace {

using net::testing::MetricValue;
using net::testing::ParseMetrics;
using std::chrono::milliseconds;

// A connection to the data port from `source` (another loopback address); null when the
// connect failed (the port refused it at once, or the kernel's backlog was full).
std::unique_ptr<testing::DataPortClient> ConnectFrom(const char* source, uint16_t port) {
  auto c = std::make_unique<testing::DataPortClient>(
      port, testing::DataPortClient::Options{.source = source});
  return c->connected() ? std::move(c) : nullptr;
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
        ASSERT_TRUE((*worker)->Push(0, r, testing::SineGradient(w, r, kNumel)).ok());
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
  std::vector<std::unique_ptr<testing::DataPortClient>> attackers;
  // 1. A flood of silent connections from one source: over its bound they are refused.
  for (int i = 0; i < 64; ++i) {
    if (auto c = ConnectFrom("127.0.0.2", data_port)) attackers.push_back(std::move(c));
  }
  // 2. Half a frame header, then nothing: the proof timeout ends them.
  for (int i = 0; i < 8; ++i) {
    if (auto c = ConnectFrom("127.0.0.3", data_port)) {
      c->Send(std::string(8, '\x01'));
      attackers.push_back(std::move(c));
    }
  }
  // 3. HELLO under sessions that do not exist: refused before any HMAC.
  for (int i = 0; i < 16; ++i) {
    if (auto c = ConnectFrom("127.0.0.4", data_port)) {
      c->Send(testing::HelloFrame(0xdead0000u + static_cast<uint64_t>(i), 0));
      attackers.push_back(std::move(c));
    }
  }
  // The source's bound holds: each flood connection over it evicted that source's oldest
  // unproven one (the table's rule; docs/connections.md), so at most 32 of the 64 are
  // open, beside the honest 2, the 8 stalled and what is left of the 16 refused HELLOs.
  // Read once the port has taken every attack connection and the evicted ones have ended
  // (an eviction closes the connection on its own thread, which then leaves the count;
  // under load that lags the accept by a little): a bounded wait.
  auto taken = metrics();
  for (int i = 0; i < 500 && (MetricValue(taken, "ps_data_connections_accepted_total") < 2 + 64 + 8 + 16 ||
                              MetricValue(taken, "ps_data_connections_open") > 2 + 32 + 8 + 16);
       ++i) {
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
    const std::vector<float> a = testing::SineGradient(0, r, kNumel),
                             b = testing::SineGradient(1, r, kNumel);
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
  attackers.clear();
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
