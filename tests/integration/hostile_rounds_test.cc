// Issue 45, findings 5, 6 and the decode-budget race of 7, in the hostile-client suite
// (docs/operations.md, "Threat model and limits"): a Byzantine worker holding its own
// token
//  - sends one valid datagram per slice as each round opens, which gave UDP rounds a
//    quorum of 0 (the median then closed every round on that one input; the trimmed
//    mean dropped every round);
//  - sends pulls naming millions of slice ids, each costing 0.28 s of shard CPU before
//    it was refused;
//  - pushes many slices at once, which passed the decode budget's check all before any
//    of their costs was recorded.
// Each runs against the real ps-server binary (its CPU time and log are read).
//
// The shard process, the honest workers and the memory bound are hostile_util.h's.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <latch>
#include <functional>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "codecs/codec.h"
#include "crypto/auth_proof.h"
#include "crypto/cluster_secret.h"
#include "core/refusal.h"
#include "net/grpc_credentials.h"
#include "net/grpc_status.h"
#include "net/udp_frame.h"
#include "auth_util.h"
#include "cluster_util.h"
#include "hand_client.h"
#include "net/data_frame.h"
#include "hostile_util.h"
#include "process_util.h"
#include "ps/v1/ps.grpc.pb.h"
#include "tests/support/data_port_client.h"
#include "worker_lib/worker.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using std::chrono::milliseconds;

using testing::Context;
using testing::HonestLayout;
using testing::HonestTraining;
using testing::kGccSanitized;
using testing::kRssBoundBytes;
using testing::kThreadSanitized;
using testing::ShardProcess;

// Why the tests that compare CPU time or the timing of three threads against a deadline
// do not run under ThreadSanitizer: it slows the shard and the test's threads 5-15x, and
// unevenly (a round's decoding took 60 ms in one run and 181 ms in the next, and the
// honest threads drifted past a 400 ms deadline), so their figures say nothing about the
// code. They run in the plain build and under ASan; TSan runs every other test here.
constexpr char kTimingUnderTsan[] =
    "timing against a deadline or a CPU budget; ThreadSanitizer's uneven 5-15x slowdown "
    "makes it meaningless (runs in the plain and ASan builds)";

// ---- Finding 5: UDP rounds keep their quorum -------------------------------------------

constexpr uint32_t kUdpRounds = 12;
// What the honest workers take between pulling a version and pushing its gradient (the
// forward and backward passes): longer than the round deadline, as in real training.
constexpr milliseconds kCompute{200};
constexpr int kUdpDeadlineMs = 100;
constexpr float kLearningRate = 0.1f;
// Honest worker w's gradient, everywhere: 0.020, 0.021 and 0.022.
float HonestGradient(uint32_t w) { return 0.020f + 0.001f * static_cast<float>(w); }
constexpr float kHonestSpread = 0.002f;

// n = 4, f = 1, --udp-port, plain SGD. Worker 3's pushes are never whole here: every
// round waits for its deadline.
std::vector<std::string> UdpShard(const std::string& rule) {
  return {"--workers", "4", "--byzantine", "1", "--aggregator", rule, "--udp-port", "0",
          "--lr", absl::StrCat(kLearningRate), "--momentum", "0",
          "--round-deadline-ms", absl::StrCat(kUdpDeadlineMs)};
}

// The model after `rounds` rounds of workers 0, 1 and 2 pushing HonestGradient(w) over
// gRPC, and how long the rounds took.
struct Trained {
  std::vector<float> a = std::vector<float>(32768), b = std::vector<float>(1024);
  double seconds = 0;
  uint64_t push_errors = 0;
};

Trained TrainHonestly(ShardProcess& shard, uint32_t rounds) {
  Trained out;
  std::vector<std::unique_ptr<Worker>> workers;
  for (uint32_t w = 0; w < 3; ++w) {
    WorkerOptions wo;
    wo.shard_addresses = {shard.address()};
    wo.worker_id = w;
    wo.credentials.token = shard.Token(w);
    wo.connect_timeout = milliseconds(20000);
    const std::vector<float> a(32768, 0.0f), b(1024, 0.0f);
    const std::span<const float> inits[2] = {a, b};
    auto worker = Worker::Start(wo, HonestLayout(), inits);
    EXPECT_TRUE(worker.ok()) << worker.status();
    if (!worker.ok()) return out;
    workers.push_back(*std::move(worker));
  }
  std::atomic<uint64_t> errors{0};
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < 3; ++w) {
    threads.emplace_back([&, w] {
      Worker& worker = *workers[w];
      std::vector<float> a(32768), b(1024);
      const std::span<float> outs[2] = {a, b};
      const std::vector<float> ga(32768, HonestGradient(w)), gb(1024, HonestGradient(w));
      for (uint64_t t = 0; t < rounds; ++t) {
        if (!worker.PullAll(t, outs, milliseconds(30000)).ok()) {
          errors.fetch_add(1);
          return;
        }
        std::this_thread::sleep_for(kCompute);
        (void)worker.Push(0, t, ga);
        (void)worker.Push(1, t, gb);
        if (!worker.WaitPushes().ok()) errors.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  const std::span<float> outs[2] = {out.a, out.b};
  EXPECT_TRUE(workers[0]->PullAll(rounds, outs, milliseconds(30000)).ok());
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.push_errors = errors.load();
  return out;
}

// Worker 3 with its own token: joins over gRPC (which hands it its UDP port, session and
// secret, from which its token makes the datagrams' key) and, as each round opens (it pulls the round's version like a worker), sends one
// valid datagram for every slice: chunk 0 of 512 values of 1e4. Nothing else.
class UdpAttacker {
 public:
  explicit UdpAttacker(ShardProcess& shard) : address_(shard.address()), token_(shard.Token(3)) {
    stub_ = v1::WorkerService::NewStub(
        grpc::CreateChannel(shard.address(), grpc::InsecureChannelCredentials()));
    v1::JoinRequest join;
    join.set_worker_id(3);
    join.set_layout_hash(HonestLayout().hash());
    v1::JoinResponse joined;
    const grpc::Status s = stub_->Join(Context(address_, token_).get(), join, &joined);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_NE(joined.udp_port(), 0u) << "the shard runs --udp-port";
    session_ = joined.session();
    udp_session_ = joined.udp_session();
    // The key its datagrams are authenticated with: the UDP secret bound to its token.
    absl::StatusOr<net::DatagramKey> key = net::DatagramKey::FromBytes(
        crypto::BoundUdpKey(token_, absl::StrCat("shard-", joined.shard_id()), udp_session_,
                            joined.udp_key()));
    EXPECT_TRUE(key.ok()) << key.status();
    if (key.ok()) key_ = std::make_unique<net::DatagramKey>(*key);
    socket_ = ::socket(AF_INET, SOCK_DGRAM, 0);
    to_.sin_family = AF_INET;
    to_.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    to_.sin_port = htons(static_cast<uint16_t>(joined.udp_port()));
  }
  ~UdpAttacker() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    if (socket_ >= 0) ::close(socket_);
  }

  void Start() {
    thread_ = std::thread([this] {
      for (uint64_t t = 0; !stop_.load(); ++t) {
        if (!AwaitVersion(t)) return;
        for (const core::SliceInfo& s : HonestLayout().slices()) Send(s, t);
        rounds_.fetch_add(1);
      }
    });
  }
  // Rounds it sent its datagrams for.
  uint64_t rounds() const { return rounds_.load(); }

 private:
  // Pulls every slice at version `t` (a short deadline, so that stopping is prompt).
  bool AwaitVersion(uint64_t t) {
    while (!stop_.load()) {
      v1::PullRequest req;
      req.set_session(session_);
      req.set_layout_hash(HonestLayout().hash());
      req.set_min_version(t);
      for (const core::SliceInfo& s : HonestLayout().slices()) req.add_slice_ids(s.id);
      auto ctx = Context(address_, token_, milliseconds(500));
      auto reader = stub_->Pull(ctx.get(), req);
      v1::PullResponse r;
      size_t got = 0;
      while (reader->Read(&r)) ++got;
      if (reader->Finish().ok() && got == HonestLayout().slices().size()) return true;
    }
    return false;
  }

  void Send(const core::SliceInfo& s, uint64_t round) {
    constexpr uint32_t kChunk = 512;
    std::string payload;
    EXPECT_TRUE(
        (*codecs::MakeCodec("fp32"))->Encode(std::vector<float>(kChunk, 1e4f), &payload).ok());
    net::DatagramHeader h;
    h.session_id = udp_session_;
    h.worker_id = 3;
    h.slice_id = s.id;
    h.round = round;
    h.chunk_elems = kChunk;
    h.chunk_index = 0;
    h.chunk_count = static_cast<uint16_t>(net::ChunkCount(s.numel, kChunk));
    std::string datagram;
    ASSERT_TRUE(net::EncodeDatagram(h, "fp32", payload, *key_, &datagram).ok());
    EXPECT_EQ(::sendto(socket_, datagram.data(), datagram.size(), 0,
                       reinterpret_cast<const sockaddr*>(&to_), sizeof(to_)),
              static_cast<ssize_t>(datagram.size()));
  }

  const std::string address_;
  const std::string token_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  std::string session_;
  uint64_t udp_session_ = 0;
  std::unique_ptr<net::DatagramKey> key_;
  int socket_ = -1;
  sockaddr_in to_{};
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> rounds_{0};
  std::thread thread_;
};

class HostileRoundsTest : public ::testing::TestWithParam<const char*> {};

// Finding 5: n = 4, f = 1, --udp-port. The attacker's datagrams, one per slice as each
// round opens, neither start a round's deadline (one worker) nor close it (below the
// quorum of 3): every round closes at its deadline with the three honest pushes and the
// attacker's one chunk, and the robust rule bounds that chunk by the honest values.
//
// The honest workers take 200 ms from pulling a version to pushing its gradient, longer
// than the 100 ms deadline. Before, the attacker's datagram started the deadline as the
// round opened and the round closed on that one input: the median followed the
// attacker's 1e4 (a parameter went to -1000 in a round), the trimmed mean dropped every
// round (parameters stayed at 0, 0.025 from where honest training puts them), and every
// honest push was late.
//
// The tolerance: at each coordinate the median and the trimmed mean (f = 1) of the three
// honest values and one more lie within the honest values' range, 0.002 wide, so with
// learning rate 0.1 and no momentum a round moves a parameter at most 0.1 x 0.002 away
// from where the same round without the attacker moves it: 12 rounds, 0.0024.
TEST_P(HostileRoundsTest, UdpRoundsKeepTheirQuorumWhenOneWorkerSendsADatagramPerSlice) {
  if (kThreadSanitized) GTEST_SKIP() << kTimingUnderTsan;
  const std::string rule = GetParam();
  Trained clean, attacked;
  {
    ShardProcess shard(UdpShard(rule));
    clean = TrainHonestly(shard, kUdpRounds);
  }
  ShardProcess shard(UdpShard(rule));
  {
    std::optional<UdpAttacker> attacker;
    std::thread training([&] { attacked = TrainHonestly(shard, kUdpRounds); });
    // The honest workers register the layout (the attacker joins with its hash), then the
    // attacker joins and follows the rounds.
    for (int i = 0; i < 2000; ++i) {
      v1::JoinRequest join;
      join.set_worker_id(3);
      join.set_layout_hash(HonestLayout().hash());
      v1::JoinResponse joined;
      if (shard.workers().Join(Context(shard.address(), shard.Token(3)).get(), join, &joined).ok() &&
          joined.ready()) {
        break;
      }
      std::this_thread::sleep_for(milliseconds(5));
    }
    attacker.emplace(shard);
    attacker->Start();
    training.join();
    // The attack reached the rounds (the first ones may have closed before it joined).
    EXPECT_GE(attacker->rounds(), kUdpRounds / 2);
  }
  EXPECT_EQ(clean.push_errors, 0u);
  EXPECT_EQ(attacked.push_errors, 0u) << "no honest push was late";
  const float honest = -static_cast<float>(kUdpRounds) * kLearningRate * HonestGradient(1);
  EXPECT_NEAR(clean.a[0], honest, 1e-4f);
  const float tolerance = static_cast<float>(kUdpRounds) * kLearningRate * kHonestSpread + 1e-5f;
  float worst = 0;
  for (size_t i = 0; i < clean.a.size(); ++i) {
    worst = std::max(worst, std::abs(attacked.a[i] - clean.a[i]));
  }
  for (size_t i = 0; i < clean.b.size(); ++i) {
    worst = std::max(worst, std::abs(attacked.b[i] - clean.b[i]));
  }
  EXPECT_LE(worst, tolerance) << rule << ": a[0] " << attacked.a[0] << " against " << clean.a[0];
  // No round was dropped (a drop is logged at error level, "round R of slice S
  // dropped"; the attacker's datagrams for a closed round are "UDP datagram dropped
  // (stale ...)", which may happen when it falls behind), and the rounds did not freeze:
  // the attacked run took about as long as the clean one (every round of both waits for
  // its deadline).
  EXPECT_THAT(shard.Log(), ::testing::Not(::testing::ContainsRegex("round [0-9]+ of slice [0-9]+ dropped")));
  // The attacker's datagrams were authentic (the key its token binds, as a worker's):
  // none was dropped as forged, so they reached the rounds the test is about.
  EXPECT_THAT(shard.Log(), ::testing::Not(::testing::HasSubstr("UDP datagram dropped (forged")));
  EXPECT_LT(attacked.seconds, 3 * clean.seconds + 5)
      << attacked.seconds << " s against " << clean.seconds << " s";
  EXPECT_TRUE(shard.Alive());
}

INSTANTIATE_TEST_SUITE_P(Rules, HostileRoundsTest, ::testing::Values("median", "trimmed_mean"));

// ---- Finding 6: pulls naming millions of slices --------------------------------------

// A 7.6 MB PullRequest naming 7.6 million slice ids (ids 0..4, repeated).
std::string MillionsOfSliceIds() {
  v1::PullRequest req;
  req.set_session("no session needed: refused before it is looked at");
  req.set_layout_hash(HonestLayout().hash());
  req.mutable_slice_ids()->Reserve(7'600'000);
  for (uint32_t i = 0; i < 7'600'000; ++i) req.add_slice_ids(i % 5);
  return req.SerializeAsString();
}

// Sends `request` (a serialized PullRequest) as one Pull on `stub`'s connection and
// waits for the answer; 1 if it was refused as malformed (INVALID_ARGUMENT), else 0. The
// bytes are serialized once and shared by every call, so that the attacker costs this
// process (which also runs the honest workers) little: the attack is on the shard.
int RefusedPull(grpc::GenericStub& stub, const std::string& address, const std::string& token,
                const grpc::ByteBuffer& request) {
  std::unique_ptr<grpc::ClientContext> ctx = Context(address, token, milliseconds(30000));
  grpc::ByteBuffer response;
  std::latch done(1);
  grpc::Status status;
  stub.UnaryCall(ctx.get(), "/ps.v1.WorkerService/Pull", grpc::StubOptions(), &request,
                 &response, [&](grpc::Status s) {
                   status = std::move(s);
                   done.count_down();
                 });
  done.wait();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("slice ids"));
  return status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ? 1 : 0;
}

std::unique_ptr<grpc::GenericStub> OwnConnection(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxSendMessageSize(-1);
  return std::make_unique<grpc::GenericStub>(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

// Finding 6's two measures of an attack, `attempt` one refused pull (returning how many
// were refused as they should be; thread-safe): the shard's CPU for 8 attempts at once,
// idle otherwise (the tarpit's held answers cost nothing), under 0.05 s each; and the
// honest rate of workers 0-3 while 8 attackers loop `attempt`, at least 0.8 of the rate
// without them. The attack runs for a second unmeasured first: its first refusals are the
// tarpit's burst, answered at once by design (256 header-sized refusals on TCP), and what
// the bound is for is the attack sustained. Phases then alternate; on a loaded machine one
// pair may be unlucky, so the best of three pairs counts. Under TSan only the refusals run
// (their timing says nothing). The CPU bound is 0.1 s under clang's ASan, where receiving
// and parsing the 7.6 MB cost twice what they cost plain (55-60 ms against 29 ms on a
// 2-core VM), and 0.25 s under GCC's -O1 sanitizer builds; before the fix a refusal cost
// 0.28 s plain. The rate's bound is 0.6 under ASan: the attackers' side of each attempt
// (this process, beside the honest workers) costs twice what it costs plain too, and with
// another sanitized test beside this one on 2 cores the sustained attack left the honest
// rounds 0.60-1.10 of their rate in 20 runs (before the fix: 0.03).
void ExpectRefusalsCheapWhileRoundsGoOn(ShardProcess& shard, const std::function<int()>& attempt) {
  const auto at_once = [&](int count) {
    std::atomic<int> refused{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < count; ++i) threads.emplace_back([&] { refused.fetch_add(attempt()); });
    for (auto& t : threads) t.join();
    return refused.load();
  };
  const double cpu_before = harness::CpuSeconds(shard.pid());
  EXPECT_EQ(at_once(8), 8);
  const double per_request = (harness::CpuSeconds(shard.pid()) - cpu_before) / 8;
  ::testing::Test::RecordProperty("shard_cpu_ms_per_refused_pull",
                                  absl::StrCat(per_request * 1000));
  std::cout << "shard CPU per refused pull: " << per_request * 1000 << " ms" << std::endl;
  if (kThreadSanitized) {
    EXPECT_TRUE(shard.Alive());
    GTEST_SKIP() << kTimingUnderTsan;
  }
  const double bound = kGccSanitized ? 0.25 : PS_SANITIZED ? 0.1 : 0.05;
  EXPECT_LT(per_request, bound) << per_request << " s of shard CPU each";

  HonestTraining honest(shard, 4);
  for (int i = 0; i < 1000 && honest.rounds() < 3; ++i) std::this_thread::sleep_for(milliseconds(10));
  ASSERT_GE(honest.rounds(), 3u);
  // 8 attackers loop `attempt` while the honest rate is taken over `period`; returns
  // {that rate, how many were refused}.
  const auto attacked_rate = [&](milliseconds period) {
    std::atomic<bool> stop{false};
    std::atomic<int> refused{0};
    std::vector<std::thread> attackers;
    for (int a = 0; a < 8; ++a) {
      attackers.emplace_back([&] {
        while (!stop.load()) refused.fetch_add(attempt());
      });
    }
    const double rate = honest.RateOver(period);
    stop.store(true);
    for (auto& t : attackers) t.join();
    return std::pair<double, int>(rate, refused.load());
  };
  const auto [warm_rate, warm_refused] = attacked_rate(milliseconds(1000));
  EXPECT_GT(warm_refused, 0);
  const double rate_bound = PS_SANITIZED ? 0.6 : 0.8;
  double best = 0;
  std::string ratios = absl::StrCat("honest rounds per second attacked/baseline: (first second "
                                    "of the attack: ", warm_rate, " rounds/s, ", warm_refused,
                                    " refused)");
  for (int pair = 0; pair < 3 && best < rate_bound; ++pair) {
    const double baseline = honest.RateOver(milliseconds(1500));
    const auto [attacked, refused] = attacked_rate(milliseconds(1500));
    EXPECT_GT(refused, 0);
    const double ratio = baseline > 0 ? attacked / baseline : 0;
    absl::StrAppend(&ratios, " ", attacked, "/", baseline, "=", ratio, " (", refused,
                    " refused)");
    best = std::max(best, ratio);
  }
  ::testing::Test::RecordProperty("rounds_per_s_attacked_over_baseline", ratios);
  std::cout << ratios << std::endl;
  EXPECT_GE(best, rate_bound) << ratios;
  EXPECT_TRUE(shard.Alive());
  EXPECT_LT(shard.Resident(), kRssBoundBytes);
}

// Finding 6: the request cost 0.28 s of the shard's CPU before it was refused, and 8 in
// parallel from one worker took the honest rounds from 38.8 to 1.1 per second. The
// parser now refuses the first id past the shard's slice count where it reads it: the
// refusal costs the shard about what receiving 7.6 MB costs.
//
// n = 5, f = 1: workers 0 to 3 train honestly, worker 4 is the attacker. It sends one
// garbage push first, which quarantines it, so that the rounds close as soon as the four
// honest workers pushed (their rate is then the shard's, not the deadline's), and pulls
// with its own valid session (the shard looked at the list only after the session).
// gRPC-only: the attack is a protobuf Pull sent through a generic gRPC stub.
TEST(HostileRoundsPullTest, APullNamingMillionsOfSlicesIsRefusedAtThePriceOfWhatWasRead) {
  ShardProcess shard({"--workers", "5", "--byzantine", "1", "--aggregator", "trimmed_mean",
                      "--round-deadline-ms", "2000", "--quarantine-ms", "600000"});
  {
    // The layout, so that the shard knows how many slices it has.
    HonestTraining registrant(shard, 1);
  }
  const std::string token = shard.Token(4);
  v1::JoinRequest join;
  join.set_worker_id(4);
  join.set_layout_hash(HonestLayout().hash());
  v1::JoinResponse joined;
  ASSERT_TRUE(shard.workers().Join(Context(shard.address(), token).get(), join, &joined).ok());
  {
    v1::PushRequest garbage;
    garbage.set_session(joined.session());
    garbage.set_layout_hash(HonestLayout().hash());
    garbage.set_slice_id(0);
    garbage.set_codec("fp32");
    garbage.set_payload("\x01garbage");
    v1::PushResponse resp;
    const grpc::Status s = shard.workers().Push(Context(shard.address(), token).get(), garbage, &resp);
    ASSERT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  }
  v1::PullRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(MillionsOfSliceIds()));
  parsed.set_session(joined.session());
  grpc::Slice bytes(parsed.SerializeAsString());
  ASSERT_GT(bytes.size(), 7'000'000u);
  const grpc::ByteBuffer huge(&bytes, 1);
  std::unique_ptr<grpc::GenericStub> stub = OwnConnection(shard.address());

  ExpectRefusalsCheapWhileRoundsGoOn(
      shard, [&] { return RefusedPull(*stub, shard.address(), token, huge); });
}

// Finding 6 on the TCP data plane: a PULL naming 7.6 million slice ids claims a 30.4 MB
// body, over --max-message-bytes (8 MiB), so the shard refuses it from its 16-byte header
// (GOAWAY over_limit) and ends the connection. Each attempt then costs the attacker a new
// data connection and its handshake, and the shard an accept, the handshake's two HMACs
// and the header. The attacker sends the header, the meta and 64 KiB of the ids (what
// follows the header the shard reads only to discard); otherwise as above: worker 4
// quarantined by a garbage push, the shard's CPU per refusal, and the honest rate with 8
// attackers looping at least 0.8 of the rate without them (0.6 under ASan), best of three
// pairs.
TEST(HostileRoundsPullTest, OnTcpAPullNamingMillionsOfSlicesIsRefusedFromItsHeader) {
  std::vector<std::string> flags = {"--workers", "5", "--byzantine", "1", "--aggregator",
                                    "trimmed_mean", "--round-deadline-ms", "2000",
                                    "--quarantine-ms", "600000",
                                    "--max-connections-per-client", "16"};
  for (const std::string& f : testing::PlaneFlags(core::DataPlane::kTcp)) flags.push_back(f);
  ShardProcess shard(flags);
  {
    HonestTraining registrant(shard, 1);
  }
  testing::HandClient attacker(shard.address(), shard.Token(4), 4, HonestLayout().hash());
  ASSERT_TRUE(attacker.joined());
  ASSERT_EQ(attacker.plane(), core::DataPlane::kTcp);
  const absl::Status garbage = attacker.Push("fp32", "\x01garbage");
  ASSERT_EQ(garbage.code(), absl::StatusCode::kInvalidArgument) << garbage;

  std::string head;
  {
    std::vector<uint32_t> ids(7'600'000);
    for (uint32_t i = 0; i < ids.size(); ++i) ids[i] = i % 5;
    ASSERT_TRUE(net::AppendPull(1,
                                net::PullMeta{.layout_hash = HonestLayout().hash(),
                                              .min_version = 1,
                                              .count = static_cast<uint32_t>(ids.size())},
                                ids, {}, &head)
                    .ok());
    head.resize(std::min<size_t>(head.size(), 64 << 10));
  }
  // One attempt on a data connection of its own: whether the shard refused it from its
  // header as over_limit. Thread-safe.
  const auto attempt = [&]() -> bool {
    absl::StatusOr<std::unique_ptr<testing::DataPortClient>> c = attacker.NewDataConnection();
    if (!c.ok() || !(*c)->Send(head)) return false;
    const absl::StatusOr<testing::DataFrame> f = (*c)->Read();
    return f.ok() && f->header.type == net::FrameType::kGoaway &&
           core::RefusalOf(testing::DataPortClient::StatusOf(*f)) == core::Refusal::kOverLimit;
  };
  ExpectRefusalsCheapWhileRoundsGoOn(shard, [&] { return attempt() ? 1 : 0; });
}

// ---- Finding 7 (in part): the decode budget under concurrent pushes --------------------

// 32 slices of 65536 values.
const core::ModelLayout& WideLayout() {
  static const core::ModelLayout layout =
      *core::ModelLayout::Create({{"w", 32 * 65536, 0}}, 65536, 1);
  return layout;
}

// Finding 7: with --max-decode-ms 1, 19 pushes of one worker sent at once were accepted
// where 9 sent one after the other were: each passed the budget's check before any of
// their costs was recorded. Now each reserves what the worker's costliest decode so far
// took: pushes sent at once get no more decoding in a round than pushes sent one by
// one, the budget and the push that crosses it. (On the 2-core development machine the
// shard decoded at most two of them at a time, so the old code too often stayed within
// this bound; tests/server/decode_budget_test.cc shows the race deterministically.)
//
// Worker 0 registers and pushes every slice each round as signs, cheap to decode, well
// within the budget; worker 1, the attacker, pushes in the codec that is the costliest
// to decode (qsgd with 65536 levels in buckets of 100, about 100 times fp32), so the
// budget stops it after a few slices. A quorum of 1 lets every round close at its
// deadline, which leaves the attacker's pushes of a round (70-110 ms on a busy 2-core
// machine) time to finish before it. On each data plane: over gRPC the attacker pushes
// through eight generated-stub connections of its own, over TCP on a data connection per
// push sent at once (24), more than --max-connections-per-client allows by default.
class HostileRoundsDecodeTest : public ::testing::TestWithParam<core::DataPlane> {};
INSTANTIATE_TEST_SUITE_P(Planes, HostileRoundsDecodeTest, testing::DataPlanes(),
                         [](const auto& info) { return testing::PlaneName(info.param); });

TEST_P(HostileRoundsDecodeTest, PushesSentAtOnceSpendTheDecodeBudgetAsSequentialOnesDo) {
  if (kThreadSanitized) GTEST_SKIP() << kTimingUnderTsan;
  // Under GCC's ASan worker 0's 32 sign-coded slices alone took 18 ms of decoding: the budget
  // and the deadline are 10 and 5 times longer there.
  constexpr double kBudgetMs = kGccSanitized ? 200 : 20;
  std::vector<std::string> flags = {"--workers", "2", "--quorum", "1", "--aggregator", "mean",
                                    "--round-deadline-ms", kGccSanitized ? "2000" : "400",
                                    "--max-decode-ms", absl::StrCat(kBudgetMs),
                                    "--max-connections-per-client", "32"};
  for (const std::string& f : testing::PlaneFlags(GetParam())) flags.push_back(f);
  ShardProcess shard(flags);
  const std::vector<float> zeros(WideLayout().total_elems(), 0.0f);
  const std::span<const float> inits[1] = {zeros};
  WorkerOptions wo;
  wo.shard_addresses = {shard.address()};
  wo.worker_id = 0;
  wo.credentials.token = shard.Token(0);
  wo.push.codec = "sign";
  auto honest = Worker::Start(wo, WideLayout(), inits);
  ASSERT_TRUE(honest.ok()) << honest.status();

  constexpr char kCostly[] = "qsgd(s=65536, bucket=100)";
  std::string payload;
  {
    std::vector<float> values(65536);
    for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(0.01f * static_cast<float>(i));
    ASSERT_TRUE((*codecs::MakeCodec(kCostly))->Encode(values, &payload).ok());
  }
  constexpr uint32_t kAtOnce = 24;  // pushes sent at once
  // Connections of their own, so that the shard reads the pushes sent at once in
  // parallel (on one connection it reads them one after the other).
  std::function<absl::Status(uint64_t round, uint32_t slice)> push;
  v1::JoinResponse joined;
  std::vector<std::unique_ptr<v1::WorkerService::Stub>> stubs;
  std::unique_ptr<testing::HandClient> hand;
  std::vector<std::unique_ptr<testing::DataPortClient>> connections;
  std::atomic<uint64_t> tag{0};
  if (GetParam() == core::DataPlane::kGrpc) {
    v1::JoinRequest join;
    join.set_worker_id(1);
    join.set_layout_hash(WideLayout().hash());
    ASSERT_TRUE(
        shard.workers().Join(Context(shard.address(), shard.Token(1)).get(), join, &joined).ok());
    for (uint32_t i = 0; i < 8; ++i) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      stubs.push_back(v1::WorkerService::NewStub(
          grpc::CreateCustomChannel(shard.address(), grpc::InsecureChannelCredentials(), args)));
    }
    push = [&](uint64_t round, uint32_t slice) {
      v1::PushRequest req;
      req.set_session(joined.session());
      req.set_layout_hash(WideLayout().hash());
      req.set_round(round);
      req.set_slice_id(slice);
      req.set_codec(kCostly);
      req.set_payload(payload);
      v1::PushResponse resp;
      return net::FromGrpc(stubs[slice % stubs.size()]->Push(
          Context(shard.address(), shard.Token(1)).get(), req, &resp));
    };
  } else {
    hand = std::make_unique<testing::HandClient>(shard.address(), shard.Token(1), 1,
                                                 WideLayout().hash());
    ASSERT_TRUE(hand->joined());
    ASSERT_EQ(hand->plane(), core::DataPlane::kTcp);
    for (uint32_t i = 0; i < kAtOnce; ++i) {
      absl::StatusOr<std::unique_ptr<testing::DataPortClient>> c = hand->NewDataConnection();
      ASSERT_TRUE(c.ok()) << c.status();
      connections.push_back(*std::move(c));
    }
    // Slice s on connection s mod 24: the pushes sent at once each on their own.
    push = [&](uint64_t round, uint32_t slice) {
      return hand->PushOn(
          *connections[slice % connections.size()], ++tag,
          testing::HandPush{.codec = kCostly, .payload = payload, .slice = slice, .round = round});
    };
  }
  auto refused_for_budget = [](const absl::Status& s) {
    return core::RefusalOf(s) == core::Refusal::kDecodeBudget;
  };
  const uint32_t slices = static_cast<uint32_t>(WideLayout().slices().size());
  auto finish_round = [&](uint64_t round) {
    std::vector<float> out(zeros.size());
    ASSERT_TRUE((*honest)->Push(0, round, zeros).ok());
    const absl::Status pushed = (*honest)->WaitPushes();
    ASSERT_TRUE(pushed.ok()) << pushed;
    const std::span<float> outs[1] = {out};
    ASSERT_TRUE((*honest)->PullAll(round + 1, outs, milliseconds(30000)).ok());
  };

  // The decoding the shard granted worker 1 in its round, from the refusal that ends it
  // ("... already took X ms of CPU ...").
  auto granted_ms = [](const absl::Status& refusal) {
    const std::string m(refusal.message());
    const size_t at = m.find("already took ");
    EXPECT_NE(at, std::string::npos) << m;
    return at == std::string::npos ? 0.0 : std::atof(m.c_str() + at + 13);
  };
  struct Round {
    int at_once = 0;      // accepted out of the pushes sent at once
    int one_by_one = 0;   // accepted one after the other (after those sent at once)
    double granted = 0;   // ms of decoding the shard granted in all
  };
  // Pushes one after the other (from slice `first` on) until the budget refuses one.
  auto one_by_one = [&](uint64_t round, uint32_t first, Round* r) {
    for (uint32_t s = first; s < slices; ++s) {
      const absl::Status st = push(round, s);
      if (refused_for_budget(st)) {
        r->granted = granted_ms(st);
        return;
      }
      EXPECT_TRUE(st.ok()) << st;
      ++r->one_by_one;
    }
    ADD_FAILURE() << "round " << round << ": the budget was never reached";
  };
  // Pushes slices 0 .. kAtOnce - 1 at once, then the rest one after the other.
  auto at_once = [&](uint64_t round, Round* r) {
    std::atomic<int> accepted{0};
    std::vector<std::thread> threads;
    std::latch go(kAtOnce);
    for (uint32_t s = 0; s < kAtOnce; ++s) {
      threads.emplace_back([&, s] {
        go.arrive_and_wait();
        const absl::Status st = push(round, s);
        if (st.ok()) {
          accepted.fetch_add(1);
        } else {
          EXPECT_TRUE(refused_for_budget(st)) << st;
        }
      });
    }
    for (auto& t : threads) t.join();
    r->at_once = accepted.load();
    one_by_one(round, kAtOnce, r);
  };

  // Round 0 only warms the slices' buffers up (a slice's first push of a round allocates
  // them, which its decode pays for). Then rounds one by one and at once alternate. A
  // decode's cost drifts by half from round to round on a busy machine, so rounds are
  // compared in what the shard granted, against the cost of a push in the rounds beside.
  finish_round(0);
  std::vector<Round> rounds(5);
  for (uint64_t round = 1; round <= 5; ++round) {
    Round& r = rounds[round - 1];
    if (round % 2 == 1) {
      one_by_one(round, 0, &r);
    } else {
      at_once(round, &r);
    }
    ::testing::Test::RecordProperty(
        absl::StrCat("round_", round),
        absl::StrCat(r.at_once, " at once + ", r.one_by_one, " one by one, ", r.granted, " ms"));
    finish_round(round);
  }
  for (size_t i = 1; i < rounds.size(); i += 2) {
    const Round& before = rounds[i - 1];
    const Round& after = rounds[i + 1];
    const double push_ms = std::max(before.granted / std::max(before.one_by_one, 1),
                                    after.granted / std::max(after.one_by_one, 1));
    // The budget, the pushes that crossed it, and one more for the drift. Pushes sent
    // at once cross it two at a time: each data thread (two by default) may start one
    // while the budget is not yet spent. (24 pushes let through at once would be 34 ms.)
    EXPECT_LE(rounds[i].granted, kBudgetMs + 3 * push_ms)
        << "round " << i + 1 << ": " << rounds[i].at_once << " pushes at once and "
        << rounds[i].one_by_one << " after them were granted " << rounds[i].granted
        << " ms; a push costs about " << push_ms << " ms";
  }
  EXPECT_TRUE(shard.Alive());
}

}  // namespace
}  // namespace ps
