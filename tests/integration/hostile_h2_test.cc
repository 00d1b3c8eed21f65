// The hostile suite below the messages (issue 45): a client that speaks HTTP/2 frame by
// frame (tests/support/h2_attacker.h), or only TCP or TLS, attacks a real ps-server
// process while three honest ps::Worker clients train on it (n = 4, f = 1; the attacker
// holds worker 3's credentials where an attack needs them).
//
// Each test measures the honest rounds per second in the same run: for kBefore before
// the attack, over the whole attack (kAttackFor, its setup included), and in sliding
// kRecoveryWindow windows after it stops. It asserts the acceptance: during >=
// 0.8 x before, some window ending within 5 s of the stop >= 0.95 x before (give or take
// the one round a window's edge may cut off: about 5% of a 2 s window), no honest
// call failed (the finding: gRPC reset honest streams), the shard alive, its
// resident memory within the documented bound (--max-shard-bytes plus
// --max-request-memory-bytes plus 128 MiB for code and threads, docs/operations.md),
// its log grown by less than 64 KiB, a new client and health probes served after the
// attack, and the shard's open descriptors back to where they were (nothing the
// attacker did persists). Every test prints its figures on a "[ hostile-h2 ]" line.
// The control-frame floods are one parameterized suite (Floods/HostileH2FloodTest).
//
// Tests that fail against a shard that lacks the defences of issue 45 are kept enabled:
// each failure is a finding (which fail on which code, and how, is in the commit log).
//
// Rounds close 100 ms after their first push (worker 3 never pushes, so every round
// waits for the deadline): the honest rate is set by the deadline and the shard's
// answers, which keeps it steady on a loaded machine, and an attack that delays pulls
// or pushes by tens of milliseconds, or stops them, shows.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cluster_util.h"
#include "crypto/auth_proof.h"
#include "crypto/cluster_secret.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "net/channel_auth.h"
#include "net/grpc_credentials.h"
#include "process_util.h"
#include "ps/v1/ps.grpc.pb.h"
#include "tests/support/h2_attacker.h"
#include "tests/support/sanitized.h"
#include "harness/process_stats.h"
#include "worker_lib/worker.h"

namespace ps {
namespace {

namespace h2 = testing::h2;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The shard's --max-shard-bytes, and --max-request-memory-bytes at its default.
constexpr uint64_t kMaxShardBytes = 256ull << 20;
constexpr uint64_t kRequestMemoryBytes = 256ull << 20;
#if PS_SANITIZED
constexpr uint64_t kOverheadBytes = 2048ull << 20;
#else
constexpr uint64_t kOverheadBytes = 128ull << 20;
#endif
constexpr uint64_t kRssBound = kMaxShardBytes + kRequestMemoryBytes + kOverheadBytes;
// An attack is cut short when the shard's resident memory passes this (the machine is
// shared); the memory assertion fails then anyway.
constexpr uint64_t kRssGuard = 2 * kRssBound;
constexpr uint64_t kLogBound = 64u << 10;
// Descriptors the shard may hold after an attack beyond those it held before (a probe's
// connection, gRPC's own).
constexpr uint64_t kFdSlack = 16;
constexpr double kDuringRatio = 0.8;
constexpr double kRecoveredRatio = 0.95;
constexpr milliseconds kBefore{3000};
constexpr milliseconds kAttackFor{4000};
constexpr milliseconds kRecoveryWithin{5000};
constexpr milliseconds kRecoveryWindow{2000};
// Where the rounds did not recover within kRecoveryWithin: how much longer to watch, to
// report when (if) they did.
constexpr milliseconds kWatchLonger{10000};
constexpr uint32_t kAttacker = 3;

std::string TempDir(const std::string& name) {
  std::string dir = (std::filesystem::temp_directory_path() / (name + "-XXXXXX")).string();
  EXPECT_NE(mkdtemp(dir.data()), nullptr);
  return dir;
}

// CA, shard-0 and worker-0..3 certificates (deploy/tls/make-certs.sh), once per binary.
const std::string& CertDir() {
  static const std::string dir = [] {
    const std::string d = TempDir("ps-hostile-h2-certs");
    const std::string cmd = absl::StrCat(PS_SOURCE_DIR, "/deploy/tls/make-certs.sh ", d, " 1 4 >/dev/null");
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return d;
  }();
  return dir;
}
std::string Cert(const std::string& name) { return CertDir() + "/" + name; }

struct ShardSetup {
  bool tls = false;         // mTLS: the shard requires a client certificate its CA signed
  uint64_t open_files = 0;  // the shard's RLIMIT_NOFILE (set through prlimit(1)); 0: inherited
  bool tcp = false;         // --data-plane tcp on a free port, else grpc (the workers follow)
  std::vector<std::string> extra;  // more flags
};

// A ps-server process on loopback: authenticated by its run directory (and with TLS,
// also by certificates), n = 4, f = 1, the trimmed mean, rounds of 100 ms, a plaintext
// health port, stderr in a file.
class Shard {
 public:
  explicit Shard(ShardSetup setup) : setup_(setup), run_dir_(TempDir("ps-hostile-h2-run")) {
    const std::vector<uint16_t> health = testing::PickFreePorts(1);
    health_port_ = health.empty() ? 0 : health[0];
    const std::string port_file = run_dir_ + ".port";
    std::vector<std::string> args;
    if (setup.open_files > 0) {
      args = {"/usr/bin/prlimit", absl::StrCat("--nofile=", setup.open_files, ":", setup.open_files),
              "--"};
    }
    args.insert(args.end(),
                {PS_SERVER_BINARY, "--host", "127.0.0.1", "--port", "0", "--port-file", port_file,
                 "--run-dir", run_dir_, "--health-port", std::to_string(health_port_),
                 "--max-shard-bytes", std::to_string(kMaxShardBytes), "--threads", "2",
                 "--workers", "4", "--byzantine", "1", "--aggregator", "trimmed_mean",
                 "--round-deadline-ms", "100"});
    if (setup.tls) {
      args.insert(args.end(), {"--tls-cert", Cert("shard-0.pem"), "--tls-key", Cert("shard-0.key"),
                               "--tls-ca", Cert("ca.pem")});
    }
    if (setup.tcp) {
      const std::vector<uint16_t> data = testing::PickFreePorts(1);
      data_port_ = data.empty() ? 0 : data[0];
    }
    const std::vector<std::string> plane = testing::PlaneFlags(this->plane(), data_port_);
    args.insert(args.end(), plane.begin(), plane.end());
    args.insert(args.end(), setup.extra.begin(), setup.extra.end());
    process_ = std::make_unique<testing::Process>(args);
    const std::string port = testing::ReadPortFile(port_file, milliseconds(20000));
    std::filesystem::remove(port_file);
    EXPECT_FALSE(port.empty()) << process_->Log();
    port_ = port.empty() ? 0 : static_cast<uint16_t>(std::stoi(port));
  }
  ~Shard() {
    process_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(run_dir_, ignored);
  }

  bool tls() const { return setup_.tls; }
  core::DataPlane plane() const { return setup_.tcp ? core::DataPlane::kTcp : core::DataPlane::kGrpc; }
  uint16_t data_port() const { return data_port_; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  std::string health_address() const { return absl::StrCat("127.0.0.1:", health_port_); }
  h2::Target target() const {
    h2::Target t;
    t.port = port_;
    t.tls = setup_.tls;
    return t;
  }
  h2::Target health_target() const {
    h2::Target t;
    t.port = health_port_;
    return t;
  }
  std::string Token(uint32_t worker) const {
    absl::StatusOr<std::string> t = core::ReadTokenFile(
        crypto::TokenFilePath(run_dir_, core::Identity{core::Identity::Kind::kWorker, worker}));
    EXPECT_TRUE(t.ok()) << t.status();
    return t.value_or("");
  }
  // The `authorization` header value of `worker`'s calls to this shard process: the proof
  // of its token (a challenge first, as net::ChannelAuth runs one), never the token.
  std::string Authorization(uint32_t worker) const {
    const core::ClientCredentials creds = Credentials(worker);
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> channel_creds =
        net::MakeChannelCredentials(creds);
    EXPECT_TRUE(channel_creds.ok()) << channel_creds.status();
    if (!channel_creds.ok()) return "";
    grpc::ChannelArguments args;
    net::ApplyChannelArguments(creds, &args);
    const auto channel = grpc::CreateCustomChannel(address(), *channel_creds, args);
    const std::string key = crypto::TokenKey(creds.token);
    absl::StatusOr<std::string> nonce = crypto::NewNonce();
    EXPECT_TRUE(nonce.ok()) << nonce.status();
    if (!nonce.ok()) return "";
    const grpc::Status answer = net::SendChallenge(
        channel, key, *nonce, std::chrono::system_clock::now() + std::chrono::seconds(10), true);
    std::optional<crypto::ChallengeReply> r = crypto::ParseChallengeAnswer(answer.error_message());
    EXPECT_TRUE(r.has_value()) << answer.error_message();
    if (!r.has_value()) return "";
    return crypto::ProofHeader(key, r->server_nonce,
                             crypto::CallProof(creds.token, key, r->server.Name(), r->server_nonce));
  }
  core::ClientCredentials Credentials(uint32_t worker) const {
    core::ClientCredentials c;
    c.token = Token(worker);
    if (setup_.tls) {
      c.tls_ca = Cert("ca.pem");
      c.tls_cert = Cert(absl::StrCat("worker-", worker, ".pem"));
      c.tls_key = Cert(absl::StrCat("worker-", worker, ".key"));
    }
    return c;
  }

  pid_t pid() const { return process_->pid(); }
  bool Alive() { return process_->Wait(milliseconds(0)) == -1; }
  uint64_t Resident() const { return harness::ResidentBytes(pid()); }
  uint64_t Fds() const { return harness::OpenFds(pid()); }
  std::string Log() const { return process_->Log(); }
  uint64_t LogBytes() const { return Log().size(); }

 private:
  ShardSetup setup_;
  std::string run_dir_;
  std::unique_ptr<testing::Process> process_;
  uint16_t port_ = 0, health_port_ = 0, data_port_ = 0;
};

core::ModelLayout TrainingLayout() {
  return *core::ModelLayout::Create({{"a", 32768, 0}, {"b", 1024, 1}}, 8192, 1);
}

// Workers 0..2 training on the shard until destroyed. Keeps the time worker 0 saw each
// new version, from which Rate() measures the rounds per second of any window.
class Training {
 public:
  explicit Training(Shard& shard) {
    for (uint32_t w = 0; w < 3; ++w) {
      WorkerOptions wo;
      wo.shard_addresses = {shard.address()};
      wo.worker_id = w;
      wo.credentials = shard.Credentials(w);
      wo.connect_timeout = milliseconds(20000);
      wo.data_plane = shard.plane();
      const std::vector<float> a(32768, 0.0f), b(1024, 0.0f);
      const std::span<const float> inits[2] = {a, b};
      auto worker = Worker::Start(wo, TrainingLayout(), inits);
      EXPECT_TRUE(worker.ok()) << worker.status();
      if (!worker.ok()) return;
      workers_.push_back(*std::move(worker));
    }
    for (size_t w = 0; w < workers_.size(); ++w) {
      threads_.emplace_back([this, w] { Loop(w); });
    }
  }
  ~Training() {
    stop_.store(true);
    for (auto& t : threads_) t.join();
  }

  bool started() const { return workers_.size() == 3; }
  size_t rounds() const {
    std::lock_guard lock(mu_);
    return done_.size();
  }
  // Waits up to `within` for `more` rounds past now.
  bool AdvancesBy(size_t more, milliseconds within) {
    const size_t goal = rounds() + more;
    const auto until = Clock::now() + within;
    while (rounds() < goal && Clock::now() < until) std::this_thread::sleep_for(milliseconds(10));
    return rounds() >= goal;
  }
  // Rounds per second in [from, to]: the rounds completed, with the one in progress at
  // either end counted by the fraction of its time inside (so the figure does not jump
  // by a whole round with where the window happens to start).
  double Rate(Clock::time_point from, Clock::time_point to) const {
    const double seconds = std::chrono::duration<double>(to - from).count();
    return seconds > 0 ? (Progress(to) - Progress(from)) / seconds : 0;
  }
  // Failed pulls and pushes of all three workers so far, and the first two.
  std::pair<uint64_t, std::string> Errors() const {
    std::lock_guard lock(mu_);
    return {errors_, absl::StrJoin(first_errors_, " | ")};
  }
  // The latest completion.
  std::optional<Clock::time_point> Last() const {
    std::lock_guard lock(mu_);
    if (done_.empty()) return std::nullopt;
    return done_.back();
  }

 private:
  // Rounds completed by `t`, plus the fraction of the next one's time elapsed if it
  // completed later.
  double Progress(Clock::time_point t) const {
    std::lock_guard lock(mu_);
    const auto after = std::upper_bound(done_.begin(), done_.end(), t);
    const auto whole = static_cast<double>(after - done_.begin());
    if (after == done_.begin() || after == done_.end()) return whole;
    const double span = std::chrono::duration<double>(*after - *(after - 1)).count();
    return whole + std::chrono::duration<double>(t - *(after - 1)).count() / span;
  }

  // Pull version t, push round t, t + 1. A pull that times out may wait for a round
  // that lost this worker's push (refused or reset under an attack): the push goes
  // again (a duplicate is refused harmlessly) and the pull is retried, so that training
  // resumes once the shard serves again. Worker 0 records every new version it pulls.
  void Loop(size_t w) {
    Worker& worker = *workers_[w];
    std::vector<float> a(32768), b(1024);
    const std::span<float> outs[2] = {a, b};
    const std::vector<float> ga(32768, 0.01f), gb(1024, 0.01f);
    // A repeated push's refusal (duplicate, late) is expected: not counted.
    const auto push = [&](uint64_t round, bool again) {
      (void)worker.Push(0, round, ga);
      (void)worker.Push(1, round, gb);
      if (absl::Status s = worker.WaitPushes(); !s.ok() && !again) Fail(s);
    };
    uint64_t t = worker.start_version(), seen = t;
    for (int i = 0; !stop_.load() && i < 1000000; ++i) {
      absl::StatusOr<uint64_t> v = worker.PullAll(t, outs, milliseconds(3000));
      if (!v.ok()) {
        if (!stop_.load()) Fail(v.status());
        if (t > worker.start_version()) push(t - 1, /*again=*/true);
        continue;
      }
      t = std::max(t, *v);
      if (w == 0 && t > seen) {
        std::lock_guard lock(mu_);
        done_.insert(done_.end(), t - seen, Clock::now());
        seen = t;
      }
      push(t, /*again=*/false);
      ++t;
    }
  }

  void Fail(const absl::Status& s) {
    std::lock_guard lock(mu_);
    ++errors_;
    if (first_errors_.size() < 2) {
      first_errors_.push_back(absl::StrCat(absl::StatusCodeToString(s.code()), ": ",
                                           s.message().substr(0, 200)));
    }
  }

  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::vector<Clock::time_point> done_;  // guarded by mu_
  uint64_t errors_ = 0;                    // guarded by mu_
  std::vector<std::string> first_errors_;  // guarded by mu_
};

// The shard's peak resident memory and descriptors, sampled every 25 ms.
class Sampler {
 public:
  explicit Sampler(pid_t pid) : pid_(pid) {
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        peak_rss_.store(std::max(peak_rss_.load(), harness::ResidentBytes(pid_)));
        if (peak_rss_.load() > kRssGuard) guard_.store(true);
        peak_fds_.store(std::max(peak_fds_.load(), harness::OpenFds(pid_)));
        std::this_thread::sleep_for(milliseconds(25));
      }
    });
  }
  ~Sampler() { Stop(); }
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  uint64_t peak_rss() const { return peak_rss_.load(); }
  uint64_t peak_fds() const { return peak_fds_.load(); }
  // Whether the peak passed kRssGuard.
  bool guard() const { return guard_.load(); }

 private:
  const pid_t pid_;
  std::atomic<bool> stop_{false}, guard_{false};
  std::atomic<uint64_t> peak_rss_{0}, peak_fds_{0};
  std::thread thread_;
};

std::shared_ptr<grpc::Channel> FreshChannel(const std::string& address,
                                            const core::ClientCredentials& creds) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> c = net::MakeChannelCredentials(creds);
  EXPECT_TRUE(c.ok()) << c.status();
  return grpc::CreateCustomChannel(address, c.ok() ? *c : grpc::InsecureChannelCredentials(), args);
}

// A health Check of "" on a connection of its own, with the proof of `creds`' token if
// it has one (the main port needs it; the health port takes none): "" when SERVING,
// else what happened.
std::string HealthProbe(const std::string& address, const core::ClientCredentials& creds) {
  const auto channel = FreshChannel(address, creds);
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  const auto deadline = std::chrono::system_clock::now() + milliseconds(5000);
  ctx.set_deadline(deadline);
  net::ChannelAuth auth(channel, creds, address);
  if (const grpc::Status a = auth.Attach(&ctx, deadline); !a.ok()) {
    return absl::StrCat("proof: ", a.error_message());
  }
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  const grpc::Status s = stub->Check(&ctx, req, &resp);
  if (!s.ok()) return absl::StrCat("status ", s.error_code(), ": ", s.error_message());
  if (resp.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    return absl::StrCat("health ", resp.status());
  }
  return "";
}

// A Join of worker 3 on a connection of its own: "" when it is accepted.
std::string NewClientJoins(Shard& shard) {
  const auto channel = FreshChannel(shard.address(), shard.Credentials(kAttacker));
  auto stub = v1::WorkerService::NewStub(channel);
  grpc::ClientContext ctx;
  const auto deadline = std::chrono::system_clock::now() + milliseconds(5000);
  ctx.set_deadline(deadline);
  net::ChannelAuth auth(channel, shard.Credentials(kAttacker), shard.address());
  if (const grpc::Status a = auth.Attach(&ctx, deadline); !a.ok()) {
    return absl::StrCat("proof: ", a.error_message());
  }
  v1::JoinRequest req;
  req.set_worker_id(kAttacker);
  req.set_layout_hash(TrainingLayout().hash());
  req.set_data_plane(v1::DATA_PLANE_ANY);  // whichever the shard runs
  v1::JoinResponse resp;
  const grpc::Status s = stub->Join(&ctx, req, &resp);
  return s.ok() ? "" : absl::StrCat("status ", s.error_code(), ": ", s.error_message());
}

struct Figures {
  double before = 0, during = 0;
  double best_after = 0;        // the best kRecoveryWindow window ending within kRecoveryWithin
  double recovered_in_s = -1;   // when a window first reached kRecoveredRatio x before; -1: never
  double first_round_after_s = -1;  // the first new version after the attack ended
  uint64_t honest_errors = 0;   // failed pulls and pushes
  std::string honest_error;     // the first ones
  uint64_t rss_before = 0, rss_peak = 0, rss_after = 0;
  uint64_t fds_before = 0, fds_peak = 0, fds_after = 0;
  uint64_t log_bytes = 0;
  // CPU seconds per second of the shard and of this process (honest workers, attacker)
  // before and during the attack.
  double shard_cpu_before = 0, shard_cpu_during = 0, own_cpu_before = 0, own_cpu_during = 0;
  std::string log_sample;  // the start of what the shard logged from the attack on
  bool alive = false;
  std::string new_client, health, health_port;  // "" when served
  h2::Report report;

  double during_ratio() const { return before > 0 ? during / before : 0; }
  double after_ratio() const { return before > 0 ? best_after / before : 0; }
  std::string Summary() const {
    const auto mib = [](uint64_t b) { return absl::StrCat(b >> 20, " MiB"); };
    return absl::StrCat(
        "rounds/s before ", before, ", during ", during, " (x", during_ratio(), "), best after ",
        best_after, " (x", after_ratio(), ", recovered ",
        recovered_in_s < 0 ? std::string("never") : absl::StrCat("in ", recovered_in_s, " s"),
        "; first round after ", first_round_after_s, " s); honest errors ", honest_errors,
        honest_error.empty() ? "" : absl::StrCat(" (first: ", honest_error, ")"),
        "; RSS ", mib(rss_before), " -> peak ", mib(rss_peak), " -> ", mib(rss_after),
        " (bound ", mib(kRssBound), "); CPU s/s shard ", shard_cpu_before, " -> ",
        shard_cpu_during, ", tests ", own_cpu_before, " -> ", own_cpu_during, "; fds ", fds_before, " -> peak ", fds_peak, " -> ",
        fds_after, "; log +", log_bytes, " bytes; alive ", alive, "; new client ",
        new_client.empty() ? "ok" : new_client, "; health ", health.empty() ? "ok" : health,
        "; health port ", health_port.empty() ? "ok" : health_port, "; attack: ", report.Summary());
  }
};

using AttackFn = std::function<h2::Report(const h2::Control&)>;

// Trains, measures kBefore, attacks for kAttackFor, stops the attack, waits for the
// recovery (at most kRecoveryWithin), probes the shard. The attack must return soon
// after its control's stop() turns true.
Figures Measure(Shard& shard, const AttackFn& attack) {
  Figures f;
  Training training(shard);
  EXPECT_TRUE(training.started());
  EXPECT_TRUE(training.AdvancesBy(5, milliseconds(30000))) << "honest training did not start";
  const double shard_cpu0 = harness::CpuSeconds(shard.pid()), own_cpu0 = harness::CpuSeconds(::getpid());
  std::this_thread::sleep_for(kBefore);
  const auto t0 = Clock::now();
  const double shard_cpu1 = harness::CpuSeconds(shard.pid()), own_cpu1 = harness::CpuSeconds(::getpid());
  const double seconds = std::chrono::duration<double>(kBefore).count();
  f.shard_cpu_before = (shard_cpu1 - shard_cpu0) / seconds;
  f.own_cpu_before = (own_cpu1 - own_cpu0) / seconds;
  EXPECT_EQ(training.Errors().first, 0u) << "honest calls failed before the attack: "
                                         << training.Errors().second;
  f.rss_before = shard.Resident();
  f.fds_before = shard.Fds();
  const uint64_t log0 = shard.LogBytes();
  Sampler sampler(shard.pid());
  std::atomic<bool> stop{false};
  h2::Control control{.stop = [&] { return stop.load() || sampler.guard(); },
                      .duration = kAttackFor + milliseconds(30000)};
  std::thread attacker([&] { f.report = attack(control); });
  std::this_thread::sleep_for(kAttackFor);
  const auto t_stop = Clock::now();
  const double attack_seconds = std::chrono::duration<double>(t_stop - t0).count();
  f.shard_cpu_during = (harness::CpuSeconds(shard.pid()) - shard_cpu1) / attack_seconds;
  f.own_cpu_during = (harness::CpuSeconds(::getpid()) - own_cpu1) / attack_seconds;
  stop.store(true);
  attacker.join();
  const auto t_gone = Clock::now();  // the attacker's connections are closed
  // Recovery: windows of kRecoveryWindow ending at each round completed up to
  // kRecoveryWithin after the attack ended (and, only to report it, kWatchLonger more).
  f.before = training.Rate(t0 - kBefore, t0);
  while (Clock::now() < t_gone + kRecoveryWithin + kWatchLonger) {
    std::this_thread::sleep_for(milliseconds(50));
    const std::optional<Clock::time_point> last = training.Last();
    if (last && *last > t_gone && f.first_round_after_s < 0) {
      f.first_round_after_s = std::chrono::duration<double>(*last - t_gone).count();
    }
    if (!last || *last < t_gone + kRecoveryWindow) continue;
    const double rate = training.Rate(*last - kRecoveryWindow, *last);
    if (*last <= t_gone + kRecoveryWithin) f.best_after = std::max(f.best_after, rate);
    // One round of slack: a window holds about 19 rounds, so one round fewer than the
    // rate before (a completion just outside the window) is already 5%.
    if (rate + 1.0 / std::chrono::duration<double>(kRecoveryWindow).count() >=
        kRecoveredRatio * f.before) {
      f.recovered_in_s = std::chrono::duration<double>(*last - t_gone).count();
      break;
    }
  }
  f.during = training.Rate(t0, t_stop);
  std::tie(f.honest_errors, f.honest_error) = training.Errors();
  f.alive = shard.Alive();
  // Descriptors: the attacker's connections take a moment to be seen closed.
  for (int i = 0; i < 40; ++i) {
    f.fds_after = shard.Fds();
    if (f.fds_after <= f.fds_before + kFdSlack) break;
    std::this_thread::sleep_for(milliseconds(50));
  }
  f.new_client = NewClientJoins(shard);
  f.health = HealthProbe(shard.address(), shard.Credentials(kAttacker));
  f.health_port = HealthProbe(shard.health_address(), core::ClientCredentials{});
  f.rss_after = shard.Resident();
  sampler.Stop();
  f.rss_peak = std::max(sampler.peak_rss(), f.rss_after);
  f.fds_peak = sampler.peak_fds();
  const std::string log = shard.Log();
  f.log_bytes = log.size() > log0 ? log.size() - log0 : 0;
  f.log_sample = log.substr(std::min<size_t>(log0, log.size()), 2048);
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  std::printf("[ hostile-h2 ] %s: %s\n", test != nullptr ? test->name() : "?", f.Summary().c_str());
  if (f.log_bytes > 0) {
    std::printf("[ hostile-h2 ] the shard's log from the attack on (%zu of %llu bytes):\n%s\n",
                std::min<size_t>(f.log_sample.size(), 600),
                static_cast<unsigned long long>(f.log_bytes), f.log_sample.substr(0, 600).c_str());
  }
  std::fflush(stdout);
  ::testing::Test::RecordProperty("figures", f.Summary());
  return f;
}

// The acceptance, for every attack.
void ExpectAcceptance(const Figures& f) {
  const std::string all = f.Summary();
  EXPECT_TRUE(f.alive) << all;
  EXPECT_GT(f.before, 0) << "no honest rounds before the attack: " << all;
  EXPECT_GE(f.during, kDuringRatio * f.before) << "honest rounds during the attack: " << all;
  EXPECT_EQ(f.honest_errors, 0u) << "honest calls failed: " << all;
  EXPECT_TRUE(f.recovered_in_s >= 0 && f.recovered_in_s <= 5)
      << "honest rounds did not recover to " << kRecoveredRatio << " of their rate within 5 s: "
      << all;
  EXPECT_LT(f.rss_peak, kRssBound) << all;
  EXPECT_LT(f.log_bytes, kLogBound) << all << "\nthe log from the attack on:\n" << f.log_sample;
  EXPECT_LE(f.fds_after, f.fds_before + kFdSlack) << "descriptors held after the attack: " << all;
  EXPECT_EQ(f.new_client, "") << "a new client after the attack: " << all;
  EXPECT_EQ(f.health, "") << "a health probe on the port after the attack: " << all;
  EXPECT_EQ(f.health_port, "") << "a probe on the health port after the attack: " << all;
}

h2::Request PushAs(const Shard& shard, uint32_t worker) {
  h2::Request r{.path = std::string(h2::kPushPath), .authorization = shard.Authorization(worker)};
  if (shard.tls()) r.scheme = "https";
  return r;
}

// Finding: one authenticated worker's 40 Push streams on one connection, each stopping
// one byte short of its 8 MB message (317 MB once), filled gRPC's request memory quota;
// gRPC then reset honest streams (RST_STREAM code 11) and training stopped.
// Now the shard reads at most 4 bodies of one client at once (--max-reads-per-client),
// and a stream it does not read holds its initial window (64 KiB): the attacker, on
// the 4 connections its identity may hold with 32 streams each, gets at most that much
// of its bodies into the shard, and each stalled read is cancelled after
// --request-read-timeout-ms.
TEST(HostileH2Test, HalfSentPushStreamsDoNotStarveHonestRounds) {
  Shard shard({});
  constexpr uint32_t kConnections = 4, kStreams = 40;
  const Figures f = Measure(shard, [&](const h2::Control& control) {
    h2::HalfSentOptions o;
    o.target = shard.target();
    o.request = PushAs(shard, kAttacker);
    o.connections = kConnections;
    o.streams_per_connection = kStreams;
    o.message_bytes = (8u << 20) - 1024;
    o.control = control;
    return h2::HalfSentRequests(o);
  });
  EXPECT_GE(f.report.streams, 100u) << "the attack opened few streams: " << f.Summary();
  // What the shard let in: the initial windows of every stream, and 4 whole bodies.
  const uint64_t bound = uint64_t{kConnections} * 32 * (64u << 10) + 4 * (8u << 20) + (1u << 20);
  EXPECT_LE(f.report.data_bytes, bound) << f.Summary();
  ExpectAcceptance(f);
}

// `count` TCP connections to `target` that never send a byte, opened in batches of
// `batch` and held until the attack ends.
AttackFn BareFlood(h2::Target target, uint32_t count, uint32_t batch) {
  return [=](const h2::Control& control) {
    h2::BareConnectionOptions o;
    o.target = target;
    o.count = count;
    o.batch = batch;
    o.connect_timeout = milliseconds(300);
    o.control = control;
    return h2::BareConnections(o);
  };
}

// Finding: about 20,000 bare TCP connections reached the shard's open-file limit; gRPC
// logged "Failed accept4: Too many open files" and never accepted again on either port.
// Here the shard's limit is 1024 (prlimit), and the attack opens 1500.
TEST(HostileH2Test, BareConnectionsToTheOpenFileLimitDoNotLockNewClientsOut) {
  if (::access("/usr/bin/prlimit", X_OK) != 0) GTEST_SKIP() << "needs /usr/bin/prlimit";
  Shard shard({.open_files = 1024});
  const Figures f = Measure(shard, BareFlood(shard.target(), 1500, 250));
  EXPECT_GE(f.report.connections, 1024u) << "the attack did not reach the limit: " << f.Summary();
  ExpectAcceptance(f);
}

// The TCP data port at the open-file limit. Each port's table has its own bound, so
// together (or with --max-connections set above what descriptors allow, as here) they can
// reach the limit: 1200 bare connections to the data port of a shard limited to 512
// descriptors. The port answers as the gRPC ports do: the pending connection is taken
// with the spare descriptor and reset, the oldest unproven connections are shed, and it
// keeps accepting. Honest rounds go on over their data connections, and a worker that
// connects afterwards trains.
TEST(HostileH2Test, BareConnectionsToTheOpenFileLimitOfTheDataPortDoNotLockNewClientsOut) {
  if (::access("/usr/bin/prlimit", X_OK) != 0) GTEST_SKIP() << "needs /usr/bin/prlimit";
  Shard shard({.open_files = 512,
               .tcp = true,
               .extra = {"--max-connections", "2048", "--max-connections-per-source", "2048"}});
  ASSERT_NE(shard.data_port(), 0);
  h2::Target data;
  data.port = shard.data_port();
  const Figures f = Measure(shard, BareFlood(data, 1200, 200));
  EXPECT_GE(f.report.connections, 512u) << "the attack did not reach the limit: " << f.Summary();
  ExpectAcceptance(f);
  EXPECT_THAT(shard.Log(), ::testing::HasSubstr("data port out of file descriptors"))
      << "the port never ran out: " << f.Summary();
  // A worker that connects now gets a data connection: it pulls the current version.
  WorkerOptions wo;
  wo.shard_addresses = {shard.address()};
  wo.worker_id = 3;
  wo.credentials = shard.Credentials(3);
  wo.connect_timeout = milliseconds(20000);
  wo.data_plane = core::DataPlane::kTcp;
  const std::vector<float> a(32768, 0.0f), b(1024, 0.0f);
  const std::span<const float> inits[2] = {a, b};
  auto worker = Worker::Start(wo, TrainingLayout(), inits);
  ASSERT_TRUE(worker.ok()) << worker.status();
  std::vector<float> oa(32768), ob(1024);
  const std::span<float> outs[2] = {oa, ob};
  absl::StatusOr<uint64_t> v = (*worker)->PullAll((*worker)->start_version(), outs, milliseconds(10000));
  EXPECT_TRUE(v.ok()) << v.status();
}

// Finding: TLS handshakes without a client certificate wrote 17,000 lines (3.2 MB) of
// gRPC log in 20 s. Here: handshakes without a certificate, bare ClientHellos and
// garbage, in turns, against a shard that requires client certificates.
TEST(HostileH2Test, TlsHandshakeFloodsDoNotFloodTheLog) {
  Shard shard({.tls = true});
  const Figures f = Measure(shard, [&](const h2::Control& control) {
    h2::Report all;
    const h2::TlsFloodMode modes[] = {h2::TlsFloodMode::kNoCertificate,
                                      h2::TlsFloodMode::kClientHello, h2::TlsFloodMode::kGarbage};
    static constexpr const char* kModeNames[] = {"no certificate", "ClientHello", "garbage"};
    for (int i = 0; i < 1000 && !control.stop(); ++i) {
      h2::TlsFloodOptions o;
      o.target = shard.target();
      o.mode = modes[i % 3];
      o.max_connections = 50;
      o.control = control;
      all.Add(h2::TlsHandshakeFlood(o), kModeNames[i % 3]);
    }
    return all;
  });
  EXPECT_GE(f.report.connections, 300u) << "the attack made few handshakes: " << f.Summary();
  ExpectAcceptance(f);
}

// Control-frame floods as fast as they go, each on a shard of its own.
struct FloodCase {
  const char* name;
  h2::FloodKind kind;
  std::string_view path;       // kRapidReset's requests
  bool token;                  // kRapidReset's requests carry worker 3's token
  uint32_t max_connections;    // a new one whenever the shard closes the last
  bool read_replies;
};

void PrintTo(const FloodCase& c, std::ostream* os) { *os << c.name; }

class HostileH2FloodTest : public ::testing::TestWithParam<FloodCase> {};

TEST_P(HostileH2FloodTest, HonestRoundsKeepTheirRate) {
  const FloodCase& c = GetParam();
  // RapidResetOfAuthenticatedPushes failed in about 1 run in 3 of this file before
  // ResetWatch's bound on calls held per connection: when the shard fell behind the
  // flood, gRPC delivered no cancel until the flood stopped, the connection was never
  // closed, the shard held 54,000 calls (1.2 GiB) and honest rounds fell to 0.04 of
  // their rate.
  Shard shard({});
  const Figures f = Measure(shard, [&](const h2::Control& control) {
    h2::FloodOptions o;
    o.target = shard.target();
    o.kind = c.kind;
    o.request = c.token ? PushAs(shard, kAttacker) : h2::Request{.path = std::string(c.path)};
    o.max_connections = c.max_connections;
    o.max_frames = 20000000;
    o.frames_per_write = 128;
    o.read_replies = c.read_replies;
    o.control = control;
    return h2::Flood(o);
  });
  EXPECT_GT(f.report.frames, 1000u) << "the attack sent little: " << f.Summary();
  ExpectAcceptance(f);
}

INSTANTIATE_TEST_SUITE_P(
    Floods, HostileH2FloodTest,
    ::testing::Values(
        // SETTINGS frames, the ACKs the shard owes never read.
        FloodCase{"Settings", h2::FloodKind::kSettings, "", false, 8, false},
        // PINGs, on a new connection whenever the shard closes one.
        FloodCase{"Pings", h2::FloodKind::kPing, "", false, 2000, true},
        // Rapid reset (CVE-2023-44487): a request's HEADERS and its RST_STREAM at once, on
        // stream after stream: authenticated Pushes (worker 3's token), Pushes without
        // credentials (any process that reaches the port), health watches (which need
        // none).
        FloodCase{"RapidResetOfAuthenticatedPushes", h2::FloodKind::kRapidReset, h2::kPushPath,
                  true, 64, true},
        FloodCase{"RapidResetWithoutCredentials", h2::FloodKind::kRapidReset, h2::kPushPath,
                  false, 64, true},
        FloodCase{"RapidResetOfHealthWatches", h2::FloodKind::kRapidReset,
                  h2::kHealthWatchPath, false, 64, true},
        // WINDOW_UPDATEs of one byte on the connection.
        FloodCase{"WindowUpdates", h2::FloodKind::kWindowUpdate, "", false, 8, true}),
    [](const ::testing::TestParamInfo<FloodCase>& info) { return std::string(info.param.name); });

// HPACK bombs in turns: one 4 KB header entered into the dynamic table and referenced
// 16,000 times per request (64 MB decoded from 16 KB), 100 headers of 4 KB per request,
// one header of 1 MB.
TEST(HostileH2Test, HpackBombsAreBounded) {
  Shard shard({});
  const Figures f = Measure(shard, [&](const h2::Control& control) {
    h2::Report all;
    const h2::HpackKind kinds[] = {h2::HpackKind::kIndexedReferences,
                                   h2::HpackKind::kManyLargeHeaders,
                                   h2::HpackKind::kOversizedHeader};
    static constexpr const char* kKindNames[] = {"indexed references", "many large headers",
                                                 "oversized header"};
    for (int i = 0; i < 300 && !control.stop(); ++i) {
      h2::HpackOptions o;
      o.target = shard.target();
      o.kind = kinds[i % 3];
      o.request = PushAs(shard, kAttacker);
      o.header_bytes = o.kind == h2::HpackKind::kOversizedHeader ? (1u << 20) : 4000;
      o.max_streams = 200;
      o.max_connections = 4;
      o.max_bytes = 32u << 20;
      o.control = h2::Control{.stop = control.stop, .duration = milliseconds(1000)};
      const h2::Report r = h2::HpackBomb(o);
      if (i < 3) all.Note(absl::StrCat(kKindNames[i], " (first round): ", r.Summary()));
      all.Add(r);
    }
    return all;
  });
  EXPECT_GT(f.report.streams, 10u) << f.Summary();
  ExpectAcceptance(f);
}

// A request's header block that never ends: CONTINUATION frames of 16 KB literals, and
// empty ones, up to 64 MB per connection.
TEST(HostileH2Test, ContinuationFloodIsBounded) {
  Shard shard({});
  const Figures f = Measure(shard, [&](const h2::Control& control) {
    h2::Report all;
    for (int i = 0; i < 100 && !control.stop(); ++i) {
      h2::ContinuationOptions o;
      o.target = shard.target();
      o.request = PushAs(shard, kAttacker);
      o.empty_frames = i % 2 == 1;
      o.max_bytes = 64u << 20;
      o.max_connections = 1;
      o.control = h2::Control{.stop = control.stop, .duration = milliseconds(1000)};
      all.Add(h2::ContinuationFlood(o), o.empty_frames ? "empty" : "literals");
    }
    return all;
  });
  EXPECT_GT(f.report.frames, 100u) << f.Summary();
  ExpectAcceptance(f);
}

// grpc.health.v1.Health/Watch needs no credentials: 40,000 watches on 10 connections,
// held (gRPC's default health service bounds neither).
TEST(HostileH2Test, HealthWatchesWithoutCredentialsAreBounded) {
  Shard shard({});
  const Figures f = Measure(shard, [&](const h2::Control& control) {
    h2::HealthWatchOptions o;
    o.target = shard.target();
    o.connections = 10;
    o.streams_per_connection = 4000;
    o.control = control;
    return h2::HealthWatches(o);
  });
  EXPECT_GT(f.report.streams, 1000u) << f.Summary();
  ExpectAcceptance(f);
}

// Finding: Health/Check needed no credentials and the port took 8 MiB messages: 8 MB
// bodies, four at a time, were read and parsed. Now health on the main port needs
// credentials like any call, so each is refused from its headers and nothing beyond a
// stream's initial window of its body gets in.
TEST(HostileH2Test, HealthChecksWithEightMegabyteBodiesAreBounded) {
  Shard shard({});
  const Figures f = Measure(shard, [&](const h2::Control& control) {
    h2::HealthCheckBodyOptions o;
    o.target = shard.target();
    o.body_bytes = 8000000;
    o.concurrent = 4;
    o.max_calls = 10000;
    o.control = control;
    return h2::HealthCheckBodies(o);
  });
  EXPECT_GE(f.report.streams, 10u) << "the attack opened few streams: " << f.Summary();
  EXPECT_LE(f.report.data_bytes, f.report.streams * uint64_t{128u << 10}) << f.Summary();
  ExpectAcceptance(f);
}

}  // namespace
}  // namespace ps
