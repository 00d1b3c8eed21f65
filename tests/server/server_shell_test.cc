// The parts of the server shell (server/server.cc is wiring over them): the deadline
// ticker on a ManualClock, the health a shard reports from its facts, the peer checks and
// the catch-up of a restored shard against fake peers, and what the options say for each
// part.
#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "server/deadline_ticker.h"
#include "server/peer_monitor.h"
#include "server/server_settings.h"
#include "server/serving_state.h"

namespace ps::server {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;

// ---- DeadlineTicker ----

TEST(DeadlineTickerTest, TicksAtTheDeadlineOnTheClockNotBefore) {
  core::ManualClock clock;
  const core::SteadyTime deadline = clock.Now() + seconds(30);
  absl::Mutex mu;
  std::vector<core::SteadyTime> ticks;
  DeadlineTicker ticker(
      &clock, [&]() -> std::optional<core::SteadyTime> { return deadline; },
      [&](core::SteadyTime now) {
        absl::MutexLock lock(&mu);
        ticks.push_back(now);
      },
      /*max_sleep=*/milliseconds(20));
  ticker.Start();
  // The deadline is 30 s away on the clock: the ticker sleeps at most 20 ms at a time and
  // each tick sees the clock's time, before the deadline.
  std::this_thread::sleep_for(milliseconds(100));
  clock.Advance(seconds(30));
  ticker.Wake();
  const auto last_tick = [&] {
    absl::MutexLock lock(&mu);
    return ticks.empty() ? core::SteadyTime{} : ticks.back();
  };
  for (int i = 0; i < 2000 && last_tick() < deadline; ++i) std::this_thread::sleep_for(milliseconds(5));
  ticker.Stop();
  absl::MutexLock lock(&mu);
  ASSERT_GE(ticks.size(), 2u);
  EXPECT_LT(ticks.front(), deadline);
  EXPECT_GE(ticks.back(), deadline);
}

TEST(DeadlineTickerTest, AWakeEndsALongSleepAndStopEndsTheThread) {
  core::ManualClock clock;
  std::atomic<int> ticks{0};
  DeadlineTicker ticker(
      &clock, []() -> std::optional<core::SteadyTime> { return std::nullopt; },
      [&](core::SteadyTime) { ++ticks; }, /*max_sleep=*/milliseconds(60000));
  ticker.Start();
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(ticks.load(), 0) << "nothing due: the ticker sleeps its whole minute";
  ticker.Wake();
  for (int i = 0; i < 1000 && ticks.load() == 0; ++i) std::this_thread::sleep_for(milliseconds(5));
  EXPECT_EQ(ticks.load(), 1);
  const auto t0 = std::chrono::steady_clock::now();
  ticker.Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, seconds(5)) << "Stop ends the sleep";
  ticker.Stop();  // idempotent
}

TEST(DeadlineTickerTest, APastDeadlineTicksAtOnce) {
  core::ManualClock clock;
  clock.Advance(seconds(100));
  absl::Notification ticked;
  DeadlineTicker ticker(
      &clock, [&]() -> std::optional<core::SteadyTime> { return clock.Now() - seconds(1); },
      [&](core::SteadyTime) {
        if (!ticked.HasBeenNotified()) ticked.Notify();
      },
      /*max_sleep=*/milliseconds(60000));
  ticker.Start();
  EXPECT_TRUE(ticked.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

// ---- ServingState ----

struct Published {
  std::map<std::string, bool> status;
  int calls = 0;
};

TEST(ServingStateTest, TheRuleOfTheThreeServices) {
  // stopping, peers agree, admitting, model ready -> alive, serving, model.
  EXPECT_EQ(ServingState::ViewOf(false, true, true, true), (HealthView{true, true, true}));
  EXPECT_EQ(ServingState::ViewOf(false, false, true, true), (HealthView{true, false, true}));
  EXPECT_EQ(ServingState::ViewOf(false, true, false, false), (HealthView{true, false, false}));
  EXPECT_EQ(ServingState::ViewOf(true, true, true, true), (HealthView{false, false, false}));
}

TEST(ServingStateTest, EveryChangeIsPublishedToEveryPort) {
  Published a, b;
  bool ready = false;
  auto port = [](Published* p) {
    return [p](const std::string& service, bool on) {
      p->status[service] = on;
      ++p->calls;
    };
  };
  ServingState state({port(&a), port(&b)}, [&] { return ready; });
  EXPECT_FALSE(state.serving()) << "nothing published before the ports are up";
  EXPECT_EQ(a.calls, 0);
  state.SetPeersAgree(true);
  for (Published* p : {&a, &b}) {
    EXPECT_TRUE(p->status[""]);
    EXPECT_TRUE(p->status["ps.v1.WorkerService"]);
    EXPECT_FALSE(p->status["ps.v1.Model"]);
  }
  ready = true;
  state.Refresh();
  EXPECT_TRUE(b.status["ps.v1.Model"]);
  state.SetAdmitting(false);  // a restored shard catching up
  EXPECT_FALSE(a.status["ps.v1.WorkerService"]);
  EXPECT_FALSE(state.admitting()->load());
  state.SetAdmitting(true);
  state.SetPeersAgree(false);
  EXPECT_FALSE(state.serving());
  EXPECT_TRUE(a.status[""]);
  state.SetPeersAgree(true);
  EXPECT_TRUE(state.serving());
  state.Stop();
  EXPECT_FALSE(state.serving());
  for (Published* p : {&a, &b}) {
    EXPECT_FALSE(p->status[""]);
    EXPECT_FALSE(p->status["ps.v1.WorkerService"]);
    EXPECT_FALSE(p->status["ps.v1.Model"]);
  }
  state.SetPeersAgree(true);  // a late verdict cannot revive a stopping shard
  EXPECT_FALSE(a.status[""]);
}

// ---- PeerMonitor ----

class FakePeers final : public PeerGreeter {
 public:
  absl::StatusOr<PeerReply> Hello(uint32_t peer) override {
    ++hellos[peer];
    auto it = replies.find(peer);
    if (it == replies.end()) return absl::UnavailableError("connection refused");
    return it->second;
  }
  std::map<uint32_t, absl::StatusOr<PeerReply>> replies;
  std::map<uint32_t, int> hellos;
};

struct MonitorRig {
  explicit MonitorRig(bool restored, core::Duration timeout = seconds(10)) : catching_up(restored) {
    PeerMonitor::Hooks hooks{
        .agreement = [this](bool agree) { verdicts.push_back(agree); },
        .catching_up = [this] { return catching_up; },
        .own_version = [this] { return own_version; },
        .fast_forward = [this](uint64_t v) {
          forwarded_to = v;
          return 3u;
        },
        .admit = [this] { catching_up = false; }};
    monitor = std::make_unique<PeerMonitor>(
        PeerMonitor::Options{.self = 1, .peers = {"a:1", "b:2", "c:3"}, .peer_timeout = timeout},
        &peers, &clock, std::move(hooks));
  }
  core::ManualClock clock;
  FakePeers peers;
  std::vector<bool> verdicts;
  bool catching_up;
  uint64_t own_version = 5;
  std::optional<uint64_t> forwarded_to;
  std::unique_ptr<PeerMonitor> monitor;
};

TEST(PeerMonitorTest, UnreachablePeersAreNoDisagreementAndEachVerdictIsToldOnce) {
  MonitorRig rig(/*restored=*/false);
  rig.monitor->Round();
  EXPECT_EQ(rig.verdicts, std::vector<bool>{true}) << "the first verdict is always told";
  EXPECT_EQ(rig.peers.hellos[0], 1);
  EXPECT_EQ(rig.peers.hellos[1], 0) << "a shard does not greet itself";
  EXPECT_EQ(rig.peers.hellos[2], 1);
  rig.peers.replies[2] = PeerReply{.agreement = absl::FailedPreconditionError("shard 2 runs another configuration")};
  rig.monitor->Round();
  rig.monitor->Round();
  EXPECT_EQ(rig.verdicts, (std::vector<bool>{true, false}));
  rig.peers.replies[2] = PeerReply{};
  rig.monitor->Round();
  EXPECT_EQ(rig.verdicts, (std::vector<bool>{true, false, true}));
  // An error other than unreachable is a disagreement too.
  rig.peers.replies[0] = absl::PermissionDeniedError("not shard-0 of this run");
  rig.monitor->Round();
  EXPECT_EQ(rig.verdicts.back(), false);
}

TEST(PeerMonitorTest, ARestoredShardCatchesUpOnceEveryPeerAnsweredToTheHighestReadyVersion) {
  MonitorRig rig(/*restored=*/true);
  rig.peers.replies[0] = PeerReply{.ready = true, .max_version = 9};
  rig.monitor->Round();
  EXPECT_TRUE(rig.catching_up) << "peer 2 has not answered and the timeout is 10 s away";
  EXPECT_FALSE(rig.forwarded_to.has_value());
  // A peer that is not ready counts as heard, but its version does not.
  rig.peers.replies[2] = PeerReply{.ready = false, .max_version = 40};
  rig.monitor->Round();
  EXPECT_FALSE(rig.catching_up);
  EXPECT_EQ(rig.forwarded_to, 9u);
}

TEST(PeerMonitorTest, ARestoredShardAdmitsWorkersAfterThePeerTimeoutWithoutEveryPeer) {
  MonitorRig rig(/*restored=*/true, seconds(10));
  rig.monitor->Round();
  EXPECT_TRUE(rig.catching_up);
  rig.clock.Advance(seconds(10));
  rig.monitor->Round();
  EXPECT_FALSE(rig.catching_up);
  EXPECT_EQ(rig.forwarded_to, 0u) << "no peer answered: nothing to move up to";
}

TEST(PeerMonitorTest, StartGreetsOnItsThreadUntilStop) {
  MonitorRig rig(/*restored=*/false);
  rig.monitor->Start();
  for (int i = 0; i < 400 && rig.peers.hellos[0] < 2; ++i) std::this_thread::sleep_for(milliseconds(5));
  rig.monitor->Stop();
  EXPECT_GE(rig.peers.hellos[0], 2) << "rounds every 250 ms at start";
}

// ---- what the options say ----

TEST(ServerSettingsTest, BoundsFollowTheOptions) {
  ServerOptions o;
  o.max_connections = 0;
  EXPECT_EQ(ConnectionBounds(o, 100).max_connections, 64u) << "at least 64";
  EXPECT_EQ(ConnectionBounds(o, 3000).max_connections, 1976u) << "the limit less 1024";
  EXPECT_EQ(ConnectionBounds(o, 1 << 20).max_connections, 4096u) << "at most 4096";
  EXPECT_EQ(ConnectionBounds(o, 3000).reserved_for_proven, 494u);
  o.max_connections = 10;
  EXPECT_EQ(ConnectionBounds(o, 1 << 20).max_connections, 10u);
  o.max_request_memory_bytes = 64 << 20;
  o.max_message_bytes = 4 << 20;
  EXPECT_EQ(CallBounds(o).max_reads, 16u);
  EXPECT_EQ(TarpitSettings(o).max_held, 16u);
  EXPECT_EQ(TarpitSettings(o).max_held_per_client, 8u);
  o.max_request_memory_bytes = 1 << 20;
  EXPECT_EQ(CallBounds(o).max_reads, 2u);
  EXPECT_EQ(TarpitSettings(o).max_held, 8u);
}

TEST(ServerSettingsTest, HostPortBracketsV6AndTheSummaryNamesTheCredentials) {
  EXPECT_EQ(HostPort("127.0.0.1", 7070), "127.0.0.1:7070");
  EXPECT_EQ(HostPort("::1", 7070), "[::1]:7070");
  EXPECT_EQ(HostPort("[::1]", 7070), "[::1]:7070");
  ServerOptions o;
  o.insecure = true;
  EXPECT_THAT(SecuritySummary(o), HasSubstr("no client authentication"));
  o.insecure = false;
  o.tls_cert = "cert.pem";
  o.tls_ca = "ca.pem";
  o.run_dir = "/run/ps";
  EXPECT_EQ(SecuritySummary(o),
            "TLS, client certificates accepted, tokens derived from the secret in /run/ps "
            "(clients' token files there: token-worker-N, token-admin)");
}

}  // namespace
}  // namespace ps::server
