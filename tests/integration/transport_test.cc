// The transport features end to end on loopback (docs/transport.md): P3 send order over
// a shaped link, per-tensor readiness of a pull, and the UDP path with injected loss,
// whose round closes at its deadline with the lost ranges masked.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cluster_util.h"
#include "net/tcp_options.h"
#include "net/udp_frame.h"
#include "tests/support/sanitized.h"
#include "worker_lib/transport/udp/sender.h"
#include "worker_lib/worker.h"

namespace ps {
namespace {

// ASan or TSan: several times slower and, under CI's load, irregularly so. The tests
// that assert decisions made from measured timings (CAT's level, the plan's codec) then
// run their traffic (for the sanitizers) but assert only what does not depend on timing.
constexpr bool kInstrumented = PS_SANITIZED;

using std::chrono::milliseconds;

server::ServerOptions Options(uint32_t n) {
  server::ServerOptions o;
  o.num_workers = n;
  o.learning_rate = 1.0f;
  o.momentum = 0.0f;
  o.threads = 1;
  o.round_deadline = milliseconds(20000);
  // Under TSan beside other tests, decoding one round's CAT pushes once took 3 s of the
  // shard's CPU, which the decode budget refused (and the round never closed): these tests
  // are about the link, not that budget.
  if (kInstrumented) o.max_decode_ms = 0;
  return o;
}

using testing::ClientOptions;

using testing::Spans;

// Where the urgent tensor's slice lands in the shard's publish order when one worker
// pushes 8 slices of a late layer and then the first layer's slice, over a link of
// 20 Mbit/s (26 ms per slice) with one push in flight.
size_t UrgentPosition(server::Schedule schedule, bool priority_order, core::DataPlane plane) {
  server::ServerOptions so = Options(1);
  so.schedule = schedule;
  so.data_plane = plane;
  testing::Cluster c = testing::StartCluster(1, so);
  if (c.num_shards() == 0) return 0;
  auto layout = core::ModelLayout::Create({{"conv1", 16384, 0}, {"fc", 8 * 16384, 1}}, 16384, 1);
  EXPECT_TRUE(layout.ok());
  const std::vector<std::vector<float>> init = {std::vector<float>(16384, 0.0f),
                                                std::vector<float>(8 * 16384, 0.0f)};
  WorkerOptions o = ClientOptions(c, 0);
  o.priority_order = priority_order;
  o.max_inflight_bytes = 1;
  auto shaping = net::ParseLinkShaping("rate=20mbps");
  EXPECT_TRUE(shaping.ok());
  o.shaping = *shaping;
  auto worker = Worker::Start(o, *layout, Spans(init));
  EXPECT_TRUE(worker.ok()) << worker.status();
  if (!worker.ok()) return 0;
  absl::Mutex mu;
  std::vector<uint32_t> published;
  for (uint32_t id = 0; id < layout->slices().size(); ++id) {
    c.shard(0).shard().Watch(id, 1, [&mu, &published, id](bool) {
      absl::MutexLock lock(&mu);
      published.push_back(id);
    });
  }
  // Backward order: the last layer's gradient first.
  EXPECT_TRUE((*worker)->Push(1, 0, init[1]).ok());
  EXPECT_TRUE((*worker)->Push(0, 0, init[0]).ok());
  EXPECT_TRUE((*worker)->WaitPushes().ok());
  std::vector<float> out0(16384), out1(8 * 16384);
  const std::vector<std::span<float>> outs = {out0, out1};
  EXPECT_TRUE((*worker)->PullAll(1, outs, milliseconds(20000)).ok());
  absl::MutexLock lock(&mu);
  EXPECT_EQ(published.size(), 9u);
  const uint32_t urgent = layout->SlicesOfTensor(0)[0];
  return static_cast<size_t>(std::find(published.begin(), published.end(), urgent) -
                             published.begin());
}

// On either data plane (the TCP one shaped through a relay of its own).
class P3Test : public ::testing::TestWithParam<core::DataPlane> {};

INSTANTIATE_TEST_SUITE_P(Planes, P3Test, testing::DataPlanes(),
                         [](const auto& info) { return testing::PlaneName(info.param); });

TEST_P(P3Test, AnUrgentSliceOvertakesQueuedOnesAndFifoDoesNot) {
  // With priorities it goes right after the slice already on the wire (1), at worst
  // one later if the queue got a second slice out before it was pushed.
  EXPECT_LE(UrgentPosition(server::Schedule::kPriority, true, GetParam()), 2u);
  EXPECT_EQ(UrgentPosition(server::Schedule::kFifo, false, GetParam()), 8u);
}

// The link's cost as the worker measures it, on either data plane.
class LinkCostTest : public ::testing::TestWithParam<core::DataPlane> {};

INSTANTIATE_TEST_SUITE_P(Planes, LinkCostTest, testing::DataPlanes(),
                         [](const auto& info) { return testing::PlaneName(info.param); });

// The worker's measured push cost (WorkerStats::push_links) over a link shaped to
// 40 Mbit/s (5 MB/s, 2e-7 s per byte): pushes of 256 KiB and of 1 MiB in separate busy
// periods give the slope.
TEST_P(LinkCostTest, PushesOverAShapedLinkMeasureItsRate) {
  server::ServerOptions so = Options(1);
  so.data_plane = GetParam();
  testing::Cluster c = testing::StartCluster(1, so);
  ASSERT_EQ(c.num_shards(), 1u);
  auto layout = core::ModelLayout::Create({{"small", 65536, 0}, {"large", 262144, 1}}, 262144, 1);
  ASSERT_TRUE(layout.ok());
  const std::vector<std::vector<float>> init = {std::vector<float>(65536, 0.0f),
                                                std::vector<float>(262144, 0.0f)};
  WorkerOptions o = ClientOptions(c, 0);
  auto shaping = net::ParseLinkShaping("rate=40mbps");
  ASSERT_TRUE(shaping.ok());
  o.shaping = *shaping;
  auto worker = Worker::Start(o, *layout, Spans(init));
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ((*worker)->stats().push_links.at(0).transfers, 0u);
  std::vector<float> out0(65536), out1(262144);
  const std::vector<std::span<float>> outs = {out0, out1};
  for (uint64_t round = 0; round < 3; ++round) {
    ASSERT_TRUE((*worker)->PullAll(round, outs, milliseconds(20000)).ok());
    // Each tensor in its own busy period: wait for one before pushing the other.
    for (size_t t : {0, 1}) {
      ASSERT_TRUE((*worker)->Push(t, round, init[t]).ok());
      ASSERT_TRUE((*worker)->WaitPushes().ok());
    }
  }
  const std::vector<LinkStats> links = (*worker)->stats().push_links;
  ASSERT_EQ(links.size(), 1u);
  EXPECT_EQ(links[0].transfers, 6u);
  // The shaper bounds the rate; the shard's work and a loaded (or sanitized) machine
  // only slow it. Unshaped loopback would be about 1e-9.
  EXPECT_GT(links[0].seconds_per_byte, 0.7 * 2e-7);
  EXPECT_LT(links[0].seconds_per_byte, 3.0 * 2e-7);
  EXPECT_LT(links[0].alpha_seconds, 0.1);
}

// The worker's measured pull cost (WorkerStats::pull_links) over a link whose downlink
// is shaped to 40 Mbit/s (2e-7 s per byte) and its uplink ten times faster: each pull's
// 16 slices of 64 KiB were all ready, so the shard wrote all but the first back to
// back and the run of the other 15 is one transfer.
TEST_P(LinkCostTest, PullsOverAShapedDownlinkMeasureItsRate) {
  server::ServerOptions so = Options(1);
  so.data_plane = GetParam();
  testing::Cluster c = testing::StartCluster(1, so);
  ASSERT_EQ(c.num_shards(), 1u);
  auto layout = core::ModelLayout::Create({{"w", 16 * 16384, 0}}, 16384, 1);
  ASSERT_TRUE(layout.ok());
  const std::vector<std::vector<float>> init = {std::vector<float>(16 * 16384, 0.0f)};
  WorkerOptions o = ClientOptions(c, 0);
  auto shaping = net::ParseLinkShaping("up=400mbps,down=40mbps");
  ASSERT_TRUE(shaping.ok());
  o.shaping = *shaping;
  auto worker = Worker::Start(o, *layout, Spans(init));
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ((*worker)->stats().pull_links.at(0).transfers, 0u);
  std::vector<float> out(16 * 16384);
  const std::vector<std::span<float>> outs = {out};
  for (uint64_t round = 0; round < 3; ++round) {
    ASSERT_TRUE((*worker)->Push(0, round, init[0]).ok());
    ASSERT_TRUE((*worker)->WaitPushes().ok());
    ASSERT_TRUE((*worker)->PullAll(round + 1, outs, milliseconds(20000)).ok());
  }
  const std::vector<LinkStats> links = (*worker)->stats().pull_links;
  ASSERT_EQ(links.size(), 1u);
  // One run per pull, or more where the shard's first write completed before the next
  // slice's watch fired (the stream was idle for an instant: seen under TSan).
  EXPECT_GE(links[0].transfers, 3u);
  // The shaper bounds the rate; a loaded (or sanitized) machine only slows it.
  EXPECT_GT(links[0].seconds_per_byte, 0.7 * 2e-7);
  EXPECT_LT(links[0].seconds_per_byte, 3.0 * 2e-7);
  EXPECT_LT(links[0].alpha_seconds, 0.05);
}

// The payload bytes of one topk(level=cat) push of a Gaussian gradient of 64 Ki values,
// after three rounds in which fp32 probes of 4 Ki and 64 Ki values (separate busy
// periods) measured the link and the pulls between rounds the idle time: `shaping`
// empty for unshaped loopback. (Messages of at most 256 KiB: under TSan a 1 MiB
// request once stalled for over 30 s on loopback; docs/adaptive.md.)
uint64_t CatPushBytes(const std::string& shaping) {
  server::ServerOptions so = Options(1);
  // Compressed pulls: a dense pull of the model each round would be idle time
  // that dwarfs the push on the slow link, and CAT would rightly keep the most there too.
  so.pull_codec = "topk(0.01)+varint+fp16";
  testing::Cluster c = testing::StartCluster(1, so);
  if (c.num_shards() != 1) return 0;
  auto layout = core::ModelLayout::Create(
      {{"probe_small", 4096, 0}, {"probe_large", 65536, 1}, {"grad", 65536, 2}}, 65536, 1);
  EXPECT_TRUE(layout.ok());
  const std::vector<std::vector<float>> init = {std::vector<float>(4096, 0.0f),
                                                std::vector<float>(65536, 0.0f),
                                                std::vector<float>(65536, 0.0f)};
  WorkerOptions o = ClientOptions(c, 0);
  PushOptions cat;
  cat.codec = "topk(0.5, level=cat, min=0.0001)+raw+raw";
  cat.error_feedback = true;
  o.tensor_push["grad"] = cat;
  if (!shaping.empty()) {
    auto parsed = net::ParseLinkShaping(shaping);
    EXPECT_TRUE(parsed.ok());
    o.shaping = *parsed;
  }
  auto worker = Worker::Start(o, *layout, Spans(init));
  EXPECT_TRUE(worker.ok()) << worker.status();
  if (!worker.ok()) return 0;
  std::vector<float> grad(65536);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (float& g : grad) g = normal(rng);
  std::vector<float> out0(4096), out1(65536), out2(65536);
  const std::vector<std::span<float>> outs = {out0, out1, out2};
  uint64_t bytes = 0;
  for (uint64_t round = 0; round < 4; ++round) {
    EXPECT_TRUE((*worker)->PullAll(round, outs, milliseconds(20000)).ok());
    for (size_t t : {0, 1}) {
      EXPECT_TRUE((*worker)->Push(t, round, init[t]).ok());
      EXPECT_TRUE((*worker)->WaitPushes().ok());
    }
    const uint64_t before = (*worker)->stats().push_bytes;
    EXPECT_TRUE((*worker)->Push(2, round, grad).ok());
    EXPECT_TRUE((*worker)->WaitPushes().ok());
    bytes = (*worker)->stats().push_bytes - before;
  }
  return bytes;
}

// CAT closes the loop: the same gradient keeps fewer coordinates over a 5 Mbit/s link
// than over loopback, because the fixed cost of a push (alpha and the round's idle
// time) buys fewer bytes where each byte costs more. (The link was 20 Mbit/s until
// 2026-12-05: beside two busy loops the slow link kept 0.14-0.85 of loopback's bytes, 1
// run of 6 over the bound below; at 5 Mbit/s 0.06-0.47 in 8 runs, and 0.04-0.13 on a
// quiet machine at 20.)
TEST(CatTest, CatKeepsFewerCoordinatesOnASlowerLink) {
  const uint64_t slow = CatPushBytes("rate=5mbps");
  const uint64_t fast = CatPushBytes("");
  RecordProperty("slow_link_bytes", std::to_string(slow));
  RecordProperty("loopback_bytes", std::to_string(fast));
  EXPECT_GT(slow, 0u);
  EXPECT_GT(fast, 0u);
  // Instrumented, the fixed cost CAT weighs (alpha and the round's idle time, measured)
  // moves with the load on both links: under TSan with a compile beside it the slow link
  // once kept 2.5x loopback's bytes, and 0.53-0.58 of them without one.
  if (kInstrumented) GTEST_SKIP() << "timing-dependent comparison; asserted in normal builds";
  EXPECT_LT(2 * slow, fast) << "5 Mbit/s: " << slow << " bytes, loopback: " << fast << " bytes";
}

// Espresso in the worker: after two rounds that measure the 20 Mbit/s link, the plan
// moves the large tensor off fp32 (its 256 KiB push is most of the round there), and the
// shard takes the pushes in the planned codec.
TEST(EspressoTest, APlanOverASlowLinkCompressesTheLargeTensor) {
  testing::Cluster c = testing::StartCluster(1, Options(1));
  ASSERT_EQ(c.num_shards(), 1u);
  auto layout = core::ModelLayout::Create({{"w", 65536, 0}, {"b", 64, 1}}, 65536, 1);
  ASSERT_TRUE(layout.ok());
  const std::vector<std::vector<float>> init = {std::vector<float>(65536, 0.0f),
                                                std::vector<float>(64, 0.0f)};
  WorkerOptions o = ClientOptions(c, 0);
  o.push.error_feedback = true;
  o.plan.enabled = true;
  o.plan.candidates = {"fp32", "fp16", "topk(0.01)+varint+fp16"};
  o.plan.warmup_rounds = 2;
  o.plan.profile_budget = milliseconds(5);
  auto parsed = net::ParseLinkShaping("rate=20mbps");
  ASSERT_TRUE(parsed.ok());
  o.shaping = *parsed;
  auto worker = Worker::Start(o, *layout, Spans(init));
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ((*worker)->stats().plan.plans, 0u);
  EXPECT_THAT((*worker)->stats().plan.codecs, ::testing::ElementsAre("fp32", "fp32"));
  std::vector<float> grad(65536);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (float& g : grad) g = normal(rng);
  std::vector<float> w(65536), b(64);
  const std::vector<std::span<float>> outs = {w, b};
  uint64_t last_round_bytes = 0;
  for (uint64_t round = 0; round < 5; ++round) {
    ASSERT_TRUE((*worker)->PullAll(round, outs, milliseconds(20000)).ok());
    const uint64_t before = (*worker)->stats().push_bytes;
    ASSERT_TRUE((*worker)->Push(1, round, std::vector<float>(64, 0.01f)).ok());
    ASSERT_TRUE((*worker)->Push(0, round, grad).ok());
    ASSERT_TRUE((*worker)->WaitPushes().ok()) << "round " << round;
    last_round_bytes = (*worker)->stats().push_bytes - before;
  }
  const PlanStats plan = (*worker)->stats().plan;
  ASSERT_GE(plan.plans, 1u);
  ASSERT_EQ(plan.codecs.size(), 2u);
  RecordProperty("codec", plan.codecs[0]);
  RecordProperty("last_round_bytes", std::to_string(last_round_bytes));
  // Instrumented under load, a starved relay can make the 256-byte push's busy period
  // as long as the 256 KiB one's, so the fitted seconds per byte (and the plan) vary.
  if (kInstrumented) GTEST_SKIP() << "timing-dependent choice; asserted in normal builds";
  EXPECT_NE(plan.codecs[0], "fp32");
  EXPECT_LT(plan.predicted_seconds, plan.baseline_seconds);
  EXPECT_GT(plan.measured_seconds, 0);
  EXPECT_LT(last_round_bytes, 65536u * 4 / 2 + 64 * 4) << "the plan's codec pushed the last round";
}

TEST_P(P3Test, StartPullAllTellsPerTensorWhenItArrived) {
  server::ServerOptions so = Options(1);
  so.data_plane = GetParam();
  testing::Cluster c = testing::StartCluster(1, so);
  ASSERT_EQ(c.num_shards(), 1u);
  auto layout = core::ModelLayout::Create({{"a", 300, 0}, {"b", 500, 1}}, 128, 1);
  ASSERT_TRUE(layout.ok());
  const std::vector<std::vector<float>> init = {std::vector<float>(300, 1.0f),
                                                std::vector<float>(500, 2.0f)};
  auto worker = Worker::Start(ClientOptions(c, 0), *layout, Spans(init));
  ASSERT_TRUE(worker.ok()) << worker.status();
  std::vector<float> a(300), b(500);
  const std::vector<std::span<float>> outs = {a, b};
  {
    // Version 1 does not exist yet: nothing is ready, and the pull times out.
    auto ticket = (*worker)->StartPullAll(1, outs, milliseconds(300));
    ASSERT_TRUE(ticket.ok());
    EXPECT_FALSE((*ticket)->TensorReady(0));
    EXPECT_EQ((*ticket)->WaitTensor(0).code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_EQ((*ticket)->Wait().status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_EQ((*ticket)->WaitTensor(7).code(), absl::StatusCode::kInvalidArgument);
  }
  auto ticket = (*worker)->StartPullAll(1, outs, milliseconds(20000));
  ASSERT_TRUE(ticket.ok());
  ASSERT_TRUE((*worker)->Push(0, 0, std::vector<float>(300, 0.5f)).ok());
  ASSERT_TRUE((*ticket)->WaitTensor(0).ok());
  EXPECT_TRUE((*ticket)->TensorReady(0));
  EXPECT_THAT(a, ::testing::Each(0.5f));
  ASSERT_TRUE((*worker)->Push(1, 0, std::vector<float>(500, 1.0f)).ok());
  ASSERT_TRUE((*ticket)->WaitTensor(1).ok());
  EXPECT_THAT(b, ::testing::Each(1.0f));
  auto version = (*ticket)->Wait();
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, 1u);
  EXPECT_EQ((*ticket)->WaitTensor(1), absl::OkStatus());
  const std::vector<std::span<float>> too_few = {a};
  EXPECT_EQ((*worker)->StartPullAll(1, too_few, milliseconds(100)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Two workers push over UDP with 10% of their datagrams lost (seeded, so which ones is
// known) and `end_copies` ends per push; the rounds close with the lost chunks masked:
// at the workers' ends where one copy of each lossy push's end came, else at the deadline.
// `borrow`: the chunks go from the pushed buffers (PushOptions::borrow), which the
// workers fill with NaN once WaitPushes returned; the outcome is the same to the bit.
void RunLossyUdpRound(uint32_t end_copies, bool borrow = false) {
  server::ServerOptions so = Options(2);
  so.udp_port = 0;
  // Long enough for both workers to send on a loaded machine; the lossy round waits for it.
  so.round_deadline = milliseconds(1000);
  // Two shards, four slices of 1024 values, four chunks each.
  testing::Cluster c = testing::StartCluster(2, so);
  ASSERT_EQ(c.num_shards(), 2u);
  ASSERT_NE(c.shard(0).udp_port(), 0);
  constexpr uint32_t kNumel = 4096, kSlice = 1024, kChunk = 256;
  auto layout = core::ModelLayout::Create({{"w", kNumel, 0}}, kSlice, 2);
  ASSERT_TRUE(layout.ok());
  const std::vector<std::vector<float>> init = {std::vector<float>(kNumel, 0.0f)};
  std::vector<std::unique_ptr<Worker>> workers;
  for (uint32_t w = 0; w < 2; ++w) {
    WorkerOptions o = ClientOptions(c, w);
    o.push.path = PushPath::kUdp;
    o.udp.chunk_elems = kChunk;
    o.udp.loss = 0.1;
    o.udp.loss_seed = 2;
    o.udp.end_copies = end_copies;
    o.push.borrow = borrow;
    auto worker = Worker::Start(o, *layout, Spans(init));
    ASSERT_TRUE(worker.ok()) << worker.status();
    workers.push_back(*std::move(worker));
  }
  // Worker 0 pushes 1 everywhere, worker 1 pushes 3.
  for (uint32_t w = 0; w < 2; ++w) {
    std::vector<float> grad(kNumel, 1.0f + 2.0f * w);
    ASSERT_TRUE(workers[w]->Push(0, 0, grad).ok());
    ASSERT_TRUE(workers[w]->WaitPushes().ok());
    std::fill(grad.begin(), grad.end(), std::numeric_limits<float>::quiet_NaN());
  }
  std::vector<float> out(kNumel);
  const std::vector<std::span<float>> outs = {out};
  auto version = workers[0]->PullAll(1, outs, milliseconds(20000));
  ASSERT_TRUE(version.ok()) << version.status();
  // What each worker lost is known from the seed.
  UdpOptions u;
  u.loss = 0.1;
  u.loss_seed = 2;
  uint64_t expected_lost = 0;
  for (uint32_t k = 0; k < kNumel / kChunk; ++k) {
    const uint32_t slice = k * kChunk / kSlice, chunk = k % (kSlice / kChunk);
    const bool lost0 = internal::udp_path::InjectedLoss(u, 0, 0, slice, chunk);
    const bool lost1 = internal::udp_path::InjectedLoss(u, 1, 0, slice, chunk);
    expected_lost += lost0 + lost1;
    // lr 1, from 0: minus the mean of the values present, 0 where none came.
    const float want = lost0 && lost1 ? 0.0f : lost0 ? -3.0f : lost1 ? -1.0f : -2.0f;
    for (uint32_t i = k * kChunk; i < (k + 1) * kChunk; ++i) {
      ASSERT_EQ(out[i], want) << "coordinate " << i << " of slice " << slice << ", chunk " << chunk;
    }
  }
  ASSERT_GT(expected_lost, 0u) << "pick a seed that loses something";
  // Each worker sends one end per shard, after the chunks of all its slices there, named
  // by the first of them for the loss injection. A slice closes at the workers' ends when
  // each push lost nothing or kept a copy of its shard's end.
  const uint32_t num_slices = kNumel / kSlice;
  uint64_t ends_lost = 0, at_deadline = 0;
  std::map<std::pair<uint32_t, uint32_t>, bool> ended;  // (worker, shard) -> a copy came
  for (uint32_t w = 0; w < 2; ++w) {
    for (uint32_t slice = 0; slice < num_slices; ++slice) {
      const uint32_t shard = layout->slices()[slice].shard;
      if (ended.count({w, shard}) != 0) continue;  // not the first of its shard
      bool kept = false;
      for (uint32_t copy = 0; copy < end_copies; ++copy) {
        const bool lost = internal::udp_path::InjectedLoss(
            u, w, 0, slice, internal::udp_path::kInjectedEndIndex + copy);
        ends_lost += lost;
        kept |= !lost;
      }
      ended[{w, shard}] = kept;
    }
  }
  for (uint32_t slice = 0; slice < num_slices; ++slice) {
    bool waits = false;
    for (uint32_t w = 0; w < 2; ++w) {
      bool lossy = false;
      for (uint32_t chunk = 0; chunk < kSlice / kChunk; ++chunk) {
        lossy |= internal::udp_path::InjectedLoss(u, w, 0, slice, chunk);
      }
      waits |= lossy && !ended[{w, layout->slices()[slice].shard}];
    }
    at_deadline += waits;
  }
  if (end_copies == 0) {
    EXPECT_GT(at_deadline, 0u);
  } else {
    ASSERT_LT(at_deadline, num_slices) << "pick a seed that keeps some ends";
  }
  // Chunks are counted by the receiving thread after the shard took them, possibly
  // after the round was published: wait (bounded) for the counts to settle.
  uint64_t lost = 0, received = 0;
  for (int i = 0; i < 1000; ++i) {
    lost = received = 0;
    for (size_t s = 0; s < c.num_shards(); ++s) {
      lost += c.shard(s).shard().stats().udp_chunks_lost;
      received += c.shard(s).udp_stats()->received;
    }
    if (received >= 2 * kNumel / kChunk - expected_lost) break;
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_EQ(lost, expected_lost);
  EXPECT_EQ(received, 2 * kNumel / kChunk - expected_lost);
  EXPECT_EQ(workers[0]->stats().udp_datagrams_dropped + workers[1]->stats().udp_datagrams_dropped,
            expected_lost + ends_lost);
  uint64_t closed_at_deadline = 0;
  for (size_t s = 0; s < c.num_shards(); ++s) {
    closed_at_deadline += c.shard(s).shard().stats().rounds_closed_at_deadline;
  }
  EXPECT_EQ(closed_at_deadline, at_deadline);
}

TEST(UdpTest, WithTenPercentLossTheRoundClosesAtTheWorkersEndsAndTheMaskIsUsed) {
  RunLossyUdpRound(/*end_copies=*/2);
}

TEST(UdpTest, WithoutEndsALossyRoundClosesAtItsDeadline) { RunLossyUdpRound(/*end_copies=*/0); }

TEST(UdpTest, BorrowedPushesLoseAndCloseAsCopiedOnes) {
  RunLossyUdpRound(/*end_copies=*/2, /*borrow=*/true);
}



// The retransmission timeout (`rto:`, ms) that `ss -tin` reports of each established TCP
// connection with `port` at either end, both ends listed.
std::vector<double> RtoOfConnections(uint16_t port) {
  const std::string command =
      absl::StrCat("ss -tinH state established '( sport = :", port, " or dport = :", port, " )'");
  std::vector<double> rtos;
  FILE* out = ::popen(command.c_str(), "r");
  if (out == nullptr) return rtos;
  char line[4096];
  while (std::fgets(line, sizeof(line), out) != nullptr) {
    const char* at = std::strstr(line, " rto:");
    if (at != nullptr) rtos.push_back(std::atof(at + 5));
  }
  ::pclose(out);
  return rtos;
}

// --tcp-rto-min-ms: the shard sets it on the data connections it accepts, and its Join
// answer has the worker set it on its end, so a segment lost either way (a pull's, a
// push's) is sent again after about 10 ms instead of the kernel's 200. Read from the
// live sockets with `ss` (iproute2): 10 given, -1 (auto, the default) and 0 (the
// kernel's). Skipped where the kernel predates the option (Linux 6.15).
TEST(TcpPlaneTest, TheShardsLeastRetransmissionTimeoutHoldsAtBothEndsOfADataConnection) {
  if (const absl::Status st = net::TryTcpRtoMin(milliseconds(10)); !st.ok()) {
    GTEST_SKIP() << st;
  }
  if (std::system("ss -V > /dev/null 2>&1") != 0) GTEST_SKIP() << "no ss (Debian: iproute2)";
  std::map<int, std::vector<double>> rtos;  // by --tcp-rto-min-ms
  for (const int rto_min_ms : {0, 10, -1}) {
    server::ServerOptions so = Options(1);
    so.tcp_rto_min = milliseconds(rto_min_ms);
    testing::Cluster c = testing::StartCluster(1, so);
    ASSERT_EQ(c.num_shards(), 1u);
    auto layout = core::ModelLayout::Create({{"w", 4096, 0}}, 1024, 1);
    ASSERT_TRUE(layout.ok());
    const std::vector<std::vector<float>> init = {std::vector<float>(4096, 0.0f)};
    auto worker = Worker::Start(ClientOptions(c, 0), *layout, Spans(init));
    ASSERT_TRUE(worker.ok()) << worker.status();
    ASSERT_TRUE((*worker)->Push(0, 0, std::vector<float>(4096, 1.0f)).ok());
    ASSERT_TRUE((*worker)->WaitPushes().ok());
    std::vector<float> out(4096);
    const std::vector<std::span<float>> outs = {out};
    ASSERT_TRUE((*worker)->PullAll(1, outs, milliseconds(20000)).ok());
    EXPECT_EQ(out[0], -1.0f);
    rtos[rto_min_ms] = RtoOfConnections(c.shard(0).data_port());
  }
  for (const auto& [rto_min_ms, seen] : rtos) {
    ASSERT_GE(seen.size(), 2u) << "both ends of the worker's data connection";
    for (const double rto : seen) {
      if (rto_min_ms == 0) {
        EXPECT_GE(rto, 200) << "the kernel's least timeout";
      } else {  // 10, or auto (-1), which is 10 on a kernel that has the option
        EXPECT_GE(rto, 10);
        EXPECT_LT(rto, 50) << "--tcp-rto-min-ms " << rto_min_ms;
      }
    }
  }
}

// With the default chunk size (one packet of loopback's MTU, 16,353 fp32 values), a
// codec whose encoding takes 8 bytes a value (every value kept, each with a raw index)
// gets chunks that fit one datagram, and the push arrives whole.
TEST(UdpTest, ACodecWiderThanFp32GetsChunksThatFitADatagram) {
  server::ServerOptions so = Options(1);
  so.udp_port = 0;
  testing::Cluster c = testing::StartCluster(1, so);
  ASSERT_EQ(c.num_shards(), 1u);
  constexpr uint32_t kNumel = 40000;
  auto layout = core::ModelLayout::Create({{"w", kNumel, 0}}, kNumel, 1);
  ASSERT_TRUE(layout.ok());
  WorkerOptions o = ClientOptions(c, 0);
  o.push.path = PushPath::kUdp;
  o.push.codec = "threshold(0.5)+raw+raw";
  ASSERT_EQ(o.udp.chunk_elems, 0u) << "the default";
  auto worker = Worker::Start(o, *layout, Spans({std::vector<float>(kNumel, 0.0f)}));
  ASSERT_TRUE(worker.ok()) << worker.status();
  const std::vector<float> grad(kNumel, 1.0f);
  ASSERT_TRUE((*worker)->Push(0, 0, grad).ok());
  ASSERT_TRUE((*worker)->WaitPushes().ok());
  std::vector<float> out(kNumel);
  const std::vector<std::span<float>> outs = {out};
  auto version = (*worker)->PullAll(1, outs, milliseconds(20000));
  ASSERT_TRUE(version.ok()) << version.status();
  for (uint32_t i = 0; i < kNumel; ++i) ASSERT_EQ(out[i], -1.0f) << i;
  // More datagrams than 40,000 values in chunks of 16,353 would take (3), and an end.
  EXPECT_GT((*worker)->stats().udp_datagrams_sent, 4u);
}

TEST(UdpTest, AWorkerPushingOverUdpNeedsAShardWithTheUdpPath) {
  testing::Cluster c = testing::StartCluster(1, Options(1));
  ASSERT_EQ(c.num_shards(), 1u);
  auto layout = core::ModelLayout::Create({{"w", 10, 0}}, 65536, 1);
  WorkerOptions o = ClientOptions(c, 0);
  o.push.udp = true;  // the deprecated alias of path = PushPath::kUdp
  auto worker = Worker::Start(o, *layout, Spans({std::vector<float>(10, 0.0f)}));
  ASSERT_FALSE(worker.ok());
  EXPECT_THAT(std::string(worker.status().message()), ::testing::HasSubstr("--udp-port"));
}

}  // namespace
}  // namespace ps
