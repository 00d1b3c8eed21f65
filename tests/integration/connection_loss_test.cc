// Connection loss mid-push and mid-pull (issue 46): a worker's data connection to a real
// shard is cut while a large push's body flows, while a pulled slice's bytes flow, or
// (TCP plane) just as the shard answers a push it has counted. The worker reconnects
// (on the TCP plane: a new handshake), sends again what was unanswered, and every round
// ends with parameters equal, bit for bit, to those of an uncut run with the same
// gradients. Each run asserts that its cut happened and the worker reconnected.
//
// Worker 0's connections go through net::ShapingRelay relays (unshaped) on 127.0.0.7 at
// the shard's own ports: it dials the control address 127.0.0.7:<port>, so its data
// connection goes to 127.0.0.7:<data port>, the other relay. On the gRPC plane the data
// rides the control connection's HTTP/2 (a cut is a transport failure there too); on
// the TCP plane the control relay is never cut. Worker 1 dials the shard directly.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cluster_util.h"
#include "net/shaper.h"
#include "tests/net/metrics_text.h"
#include "worker_lib/worker.h"

namespace ps {
namespace {

using net::RelayDirection;
using net::ShapingRelay;
using std::chrono::milliseconds;

constexpr size_t kNumel = size_t{1} << 18;         // 1 MiB of fp32 ...
constexpr uint32_t kSliceElems = uint32_t{1} << 16;  // ... in four slices of 256 KiB
constexpr uint64_t kSliceBytes = uint64_t{kSliceElems} * sizeof(float);
constexpr uint64_t kRounds = 4;
constexpr uint64_t kCutRound = 2;
// Half way through the third slice's bytes, counted from the first byte after arming:
// the frames' (and HTTP/2's) headers around the slices move it by a few KiB at most.
constexpr uint64_t kMidThirdSlice = 2 * kSliceBytes + kSliceBytes / 2;
constexpr char kRelayHost[] = "127.0.0.7";

enum class Cut {
  kPushBody,    // the cut round's pushes: in the third slice's body (up)
  kPullBody,    // the cut round's pull: in the third slice's values (down)
  kPushAnswer,  // the first answer to the cut round's pushes: its first byte (down)
};

struct LossCase {
  core::DataPlane plane;
  Cut cut;
};

std::string CaseName(const LossCase& c) {
  const char* cut = c.cut == Cut::kPushBody   ? "PushBody"
                    : c.cut == Cut::kPullBody ? "PullBody"
                                              : "PushAnswer";
  return absl::StrCat(cut, "_", testing::PlaneName(c.plane));
}

// A relay on kRelayHost at `port` to the same port on 127.0.0.1.
std::unique_ptr<ShapingRelay> RelayTo(uint16_t port) {
  auto relay = ShapingRelay::Start(absl::StrCat("127.0.0.1:", port), net::LinkShaping{},
                                   net::RelayOptions{.listen_host = kRelayHost, .listen_port = port});
  EXPECT_TRUE(relay.ok()) << relay.status();
  return relay.ok() ? *std::move(relay) : nullptr;
}

struct RunResult {
  std::array<std::vector<float>, 2> params;  // each worker's after the last round
  WorkerStats stats0;                        // worker 0's
  uint64_t cuts = 0;                         // by the relay carrying worker 0's data
  uint64_t data_connections = 0;             // ... and the connections it accepted
  uint64_t connections_at_cut = 0;           // ... of which before the cut was armed
  double admitted = 0;  // the shard's ps_data_connections_admitted_total (TCP plane)
};

// Trains kRounds synchronous rounds (SGD with momentum on the mean) with two workers;
// with `cut`, worker 0's data connection is cut once in round kCutRound, where worker 0
// pushes only after worker 1's pushes were answered (so its slices' rounds close with
// its pushes, and an answer lost then meets a closed round when the push comes again).
RunResult Train(core::DataPlane plane, std::optional<Cut> cut) {
  RunResult out;
  server::ServerOptions o;
  o.num_workers = 2;
  o.aggregator = "mean";
  o.learning_rate = 0.1f;
  o.momentum = 0.9f;
  o.weight_decay = 0.01f;
  o.threads = 2;
  o.round_deadline = milliseconds(30000);
  o.data_plane = plane;
  o.metrics_port = 0;
  // Decoding 256 KiB pushes takes far longer under the sanitizers on a loaded machine;
  // the decode budget is not what this test is about.
  o.max_decode_ms = 60000;
  testing::Cluster c = testing::StartCluster(1, o);
  if (c.num_shards() != 1) return out;
  server::Server& shard = c.shard(0);
  const uint16_t control_port = shard.port();
  std::unique_ptr<ShapingRelay> control = RelayTo(control_port);
  std::unique_ptr<ShapingRelay> data;
  if (plane == core::DataPlane::kTcp) data = RelayTo(shard.data_port());
  if (control == nullptr || (plane == core::DataPlane::kTcp && data == nullptr)) return out;
  ShapingRelay& carrier = data != nullptr ? *data : *control;

  const core::ModelLayout layout = *core::ModelLayout::Create({{"w", kNumel, 0}}, kSliceElems, 1);
  std::vector<float> init(kNumel);
  for (size_t i = 0; i < kNumel; ++i) init[i] = 0.001f * static_cast<float>(i % 101);
  std::atomic<bool> w1_pushed_cut_round{false};
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      WorkerOptions wo = testing::ClientOptions(c, w);
      if (w == 0) wo.shard_addresses = {absl::StrCat(kRelayHost, ":", control_port)};
      const std::vector<std::span<const float>> initial = {init};
      auto worker = Worker::Start(wo, layout, initial);
      ASSERT_TRUE(worker.ok()) << worker.status();
      std::vector<float>& mine = out.params[w];
      mine.resize(kNumel);
      const std::vector<std::span<float>> outs = {mine};
      for (uint64_t r = 0; r < kRounds; ++r) {
        const bool cutting = w == 0 && cut.has_value() && r == kCutRound;
        if (cutting && *cut == Cut::kPullBody) out.connections_at_cut = carrier.connections();
        if (cutting && *cut == Cut::kPullBody) carrier.CutAfter(RelayDirection::kDown, kMidThirdSlice);
        absl::StatusOr<uint64_t> v = (*worker)->PullAll(r, outs, milliseconds(30000));
        ASSERT_TRUE(v.ok()) << "worker " << w << " round " << r << ": " << v.status();
        const std::vector<float> g = testing::SineGradient(w, r, kNumel);
        if (w == 0 && r == kCutRound) {
          for (int i = 0; i < 3000 && !w1_pushed_cut_round.load(); ++i) {
            std::this_thread::sleep_for(milliseconds(10));
          }
          ASSERT_TRUE(w1_pushed_cut_round.load()) << "worker 1 never pushed round " << r;
        }
        if (cutting && *cut != Cut::kPullBody) out.connections_at_cut = carrier.connections();
        if (cutting && *cut == Cut::kPushBody) carrier.CutAfter(RelayDirection::kUp, kMidThirdSlice);
        if (cutting && *cut == Cut::kPushAnswer) carrier.CutAfter(RelayDirection::kDown, 1);
        ASSERT_TRUE((*worker)->Push(0, r, g).ok());
        absl::Status pushed = (*worker)->WaitPushes();
        ASSERT_TRUE(pushed.ok()) << "worker " << w << " round " << r << ": " << pushed;
        if (w == 1 && r == kCutRound) w1_pushed_cut_round.store(true);
      }
      absl::StatusOr<uint64_t> v = (*worker)->PullAll(kRounds, outs, milliseconds(30000));
      ASSERT_TRUE(v.ok()) << "worker " << w << " final pull: " << v.status();
      if (w == 0) out.stats0 = (*worker)->stats();
    });
  }
  for (std::thread& t : threads) t.join();
  out.cuts = carrier.cuts();
  out.data_connections = carrier.connections();
  if (plane == core::DataPlane::kTcp) {
    absl::StatusOr<net::testing::HttpResponse> m = net::testing::HttpGet(shard.metrics_port(), "/metrics");
    EXPECT_TRUE(m.ok()) << m.status();
    out.admitted = net::testing::MetricValue(net::testing::ParseMetrics(m.ok() ? m->body : ""),
                                             "ps_data_connections_admitted_total");
  }
  return out;
}

class ConnectionLossTest : public ::testing::TestWithParam<LossCase> {};

TEST_P(ConnectionLossTest, WorkerReconnectsResendsAndEndsWithTheUncutParameters) {
  const LossCase param = GetParam();
  const RunResult want = Train(param.plane, std::nullopt);
  if (::testing::Test::HasFatalFailure() || HasFailure()) return;
  ASSERT_EQ(want.cuts, 0u);
  const RunResult got = Train(param.plane, param.cut);
  if (HasFailure()) return;

  // The cut happened, and the worker came back on a new connection.
  EXPECT_EQ(got.cuts, 1u) << "the relay never reached its cut: nothing was lost";
  EXPECT_GE(got.stats0.retries, 1u) << "worker 0 repeated nothing";
  if (param.plane == core::DataPlane::kTcp) {
    EXPECT_EQ(want.data_connections, 1u);
    EXPECT_EQ(got.data_connections, 2u);
    EXPECT_EQ(want.admitted, 2);
    EXPECT_EQ(got.admitted, 3) << "worker 0's second handshake";
  } else {
    // gRPC may open a connection of its own accord (the uncut run has had two under the
    // sanitizers), so the count to beat is the one when the cut was armed.
    EXPECT_GT(got.data_connections, got.connections_at_cut) << "no new HTTP/2 connection after the cut";
  }
  EXPECT_EQ(got.stats0.slices_refused, 0u);

  for (uint32_t w = 0; w < 2; ++w) {
    ASSERT_EQ(got.params[w].size(), kNumel);
    ASSERT_EQ(want.params[w].size(), kNumel);
    size_t differ = 0, first = kNumel;
    for (size_t i = 0; i < kNumel; ++i) {
      if (std::memcmp(&got.params[w][i], &want.params[w][i], sizeof(float)) != 0) {
        if (differ++ == 0) first = i;
      }
    }
    EXPECT_EQ(differ, 0u) << "worker " << w << ": " << differ << " parameters differ from the "
                          << "uncut run's, the first at " << first;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cuts, ConnectionLossTest,
    ::testing::Values(LossCase{core::DataPlane::kGrpc, Cut::kPushBody},
                      LossCase{core::DataPlane::kGrpc, Cut::kPullBody},
                      LossCase{core::DataPlane::kTcp, Cut::kPushBody},
                      LossCase{core::DataPlane::kTcp, Cut::kPullBody},
                      // Only the TCP plane can place this cut: its answers are the first
                      // bytes back, where HTTP/2 sends window updates while the body flows.
                      LossCase{core::DataPlane::kTcp, Cut::kPushAnswer}),
    [](const auto& info) { return CaseName(info.param); });

}  // namespace
}  // namespace ps
