// `ps-bench hostile`: how well honest training keeps going while a hostile client
// attacks a real ps-server process, as a ratio against a baseline measured alternately
// in the same run (docs/bench.md, "Hostile clients").
//
// Every attack gets a fresh ps-server (the binary, authenticated by the secret of a
// fresh private run directory) on 127.0.0.1 with n = 4 workers, f = 1 and the trimmed
// mean. Three honest ps::Worker clients (workers 0..2, each with its own token) train a
// two-tensor model in this process, round after round: pull version t, push round t,
// wait for the answers. The attacker holds worker 3's token (an authenticated Byzantine
// worker; it proves it as every client does) and, for the impersonation attack, no token
// or forged ones (it sends their proofs, which the shard refuses).
//
// Worker 3 also pushes a valid gradient in every round, as a Byzantine worker that wants
// to stay in the rounds would (the "cover"; --no-cover turns it off). Rounds then close
// on four pushes, and the round rate measures the server rather than the round
// deadline, which every round would otherwise wait for (a silent worker 3 makes each
// round last --round-deadline-ms).
//
// Phases alternate: baseline (no attack) for --seconds, attack for --seconds, repeated
// --alternations times. Reported per attack: honest rounds per second in both kinds of
// phase and the median over alternations of their ratio; the server's peak VmRSS
// (/proc/PID/status every 50 ms, and VmHWM restarted at every phase) during the attack
// against --max-shard-bytes; the attack's requests and the status codes it got; how much
// the server's log (its stderr, a file) grew; the server's and this process's CPU time.
// Attacks on the layout also run before the honest workers register theirs, the only
// time a shard builds a layout from a request.
//
// The server, the honest workers and the attacker share one machine: an attack that
// burns client CPU slows honest training even where the server does no extra work. The
// CPU columns tell the two apart.
#include <fcntl.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <latch>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "bench/bench_util.h"
#include "bench/commands.h"
#include "codecs/codec.h"
#include "core/auth_proof.h"
#include "core/cluster_secret.h"
#include "core/credentials.h"
#include "core/json_line.h"
#include "core/layout.h"
#include "core/status.h"
#include "net/channel_auth.h"
#include "net/grpc_credentials.h"
#include "net/udp_frame.h"
#include "ps/v1/ps.grpc.pb.h"
#include "spdlog/spdlog.h"
#include "worker_lib/worker.h"
#if PS_HAVE_H2_ATTACKER
#include "tests/support/h2_attacker.h"
#endif
#if PS_HAVE_DATA_PORT_CLIENT
#include "bench/hostile_data_phases.h"
#endif

namespace ps::bench {
namespace {

using std::chrono::milliseconds;

// The cluster every attack runs against (the server's flags are in Runner::RunIn).
constexpr uint32_t kWorkers = 4;     // n
constexpr uint32_t kHonest = 3;      // workers 0..2
constexpr uint32_t kAttackerId = 3;  // the Byzantine worker's rank
constexpr uint32_t kMaxPullsPerWorker = 16;
constexpr uint32_t kSliceElems = 8192;
constexpr milliseconds kCallDeadline{2000};
constexpr int kStatusCodes = 17;  // grpc::StatusCode 0..16

struct HostileFlags {
  double seconds = 5;
  int alternations = 2;
  std::vector<std::string> attacks;
  bool quick = false;
  std::string server_bin;
  std::string max_shard_bytes = "512M";
  uint32_t inflight = 4;
  uint32_t round_deadline_ms = 500;
  // The server's --quarantine-ms; every baseline phase waits until worker 3 is out of a
  // quarantine its attack earned, so that it measures the rounds with worker 3 in them.
  uint32_t quarantine_ms = 2000;
  bool no_cover = false;
  bool keep_dirs = false;
  bool list = false;
  std::string json;
};

// Options whose count() tells whether the user gave them (--quick fills the rest).
struct GivenOptions {
  CLI::Option* seconds = nullptr;
  CLI::Option* alternations = nullptr;
  CLI::Option* inflight = nullptr;
  CLI::Option* quarantine = nullptr;
};

// How much each attack may do; --quick shrinks it.
struct Limits {
  uint64_t max_requests = 200000;  // per attack phase, all of the attack's threads together
  uint32_t pull_batch = 64;        // far-future pulls opened at once (above the per-worker limit)
  uint32_t idle_streams = 16;      // never-read pulls opened at once
  milliseconds idle_deadline{1000};
  uint32_t grpc_connections = 128;  // conn_flood: channels of their own, one call each
  uint32_t raw_connections = 256;   // conn_flood: TCP connections that never speak
  double prelude_seconds = 1;       // layout attacks before the honest layout exists
  double warmup_seconds = 0.5;
  uint32_t inflight = 4;  // layout_tensors, big_messages: 7 MB requests in flight at once
};

absl::Status Errno(std::string_view what) {
  return absl::InternalError(absl::StrCat(core::AsAbsl(what), ": ", std::strerror(errno)));
}

std::string CodeName(int code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

// ---- The server process ------------------------------------------------------------

// A ps-server child with stdout and stderr in a log file. The kernel kills it when this
// process dies (PR_SET_PDEATHSIG), so no server outlives a killed benchmark; that
// signal follows the forking thread, so Start() is called from the main thread only.
// The destructor kills and reaps it if it still runs. Not thread-safe, except pid().
class ServerProcess {
 public:
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(const std::string& bin,
                                                              const std::vector<std::string>& args,
                                                              const std::string& log_path) {
    if (::access(bin.c_str(), X_OK) != 0) {
      return absl::NotFoundError(absl::StrCat("ps-server binary ", bin, " is not executable (",
                                              std::strerror(errno), "); pass --server-bin"));
    }
    std::vector<std::string> all = {bin};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    // Between fork and exec only async-signal-safe calls: gRPC threads may hold locks.
    const pid_t pid = ::fork();
    if (pid < 0) return Errno("fork");
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0600);
      const int null = ::open("/dev/null", O_RDONLY);
      if (log < 0 || null < 0) ::_exit(127);
      ::dup2(null, 0);
      ::dup2(log, 1);
      ::dup2(log, 2);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    return std::unique_ptr<ServerProcess>(new ServerProcess(pid, log_path));
  }

  ~ServerProcess() {
    if (!Exited()) {
      ::kill(pid_, SIGKILL);
      Reap(/*block=*/true);
    }
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }

  // Whether the child has exited (reaps it without blocking).
  bool Exited() {
    if (!status_.has_value()) Reap(/*block=*/false);
    return status_.has_value();
  }
  // "running", "exit 1", "killed by signal 11 (Segmentation fault)".
  std::string Describe() {
    if (!Exited()) return "running";
    if (WIFEXITED(*status_)) return absl::StrCat("exit ", WEXITSTATUS(*status_));
    if (WIFSIGNALED(*status_)) {
      return absl::StrCat("killed by signal ", WTERMSIG(*status_), " (",
                          strsignal(WTERMSIG(*status_)), ")");
    }
    return "ended";
  }

  uint64_t LogBytes() const {
    struct stat st {};
    return ::stat(log_path_.c_str(), &st) == 0 ? uint64_t(st.st_size) : 0;
  }
  // The last `bytes` bytes of the log.
  std::string LogTail(size_t bytes) const {
    std::ifstream in(log_path_, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    return text.size() > bytes ? text.substr(text.size() - bytes) : text;
  }

  // Waits for the port file; fails when the child exits or `timeout` passes first.
  absl::StatusOr<uint16_t> WaitForPort(const std::string& port_file, milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      std::ifstream in(port_file);
      unsigned port = 0;
      if (in >> port && port > 0 && port < 65536) return uint16_t(port);
      if (Exited()) {
        return absl::UnavailableError(
            absl::StrCat("ps-server ", Describe(), " before serving:\n", LogTail(2000)));
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
    return absl::DeadlineExceededError(
        absl::StrCat("ps-server wrote no port file in ", timeout.count(), " ms:\n", LogTail(2000)));
  }

  // SIGTERM, then SIGKILL after `timeout`; returns how it ended.
  std::string Stop(milliseconds timeout) {
    if (!Exited()) {
      ::kill(pid_, SIGTERM);
      const auto until = std::chrono::steady_clock::now() + timeout;
      while (!Exited() && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(milliseconds(10));
      }
      if (!Exited()) {
        ::kill(pid_, SIGKILL);
        Reap(/*block=*/true);
        return absl::StrCat("did not exit within ", timeout.count(), " ms of SIGTERM; killed");
      }
    }
    return Describe();
  }

 private:
  ServerProcess(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}

  void Reap(bool block) {
    int status = 0;
    pid_t r;
    do {
      r = ::waitpid(pid_, &status, block ? 0 : WNOHANG);
    } while (r < 0 && errno == EINTR);
    if (r == pid_) status_ = status;
  }

  pid_t pid_;
  std::string log_path_;
  std::optional<int> status_;  // raw wait status once reaped
};

// ---- Process figures ---------------------------------------------------------------

// VmRSS and VmHWM (the peak since the last ResetHwm) of `pid` in KiB, 0 when unreadable.
struct Rss {
  uint64_t rss_kib = 0, hwm_kib = 0;
};

Rss ReadRss(pid_t pid) {
  Rss r;
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) r.rss_kib = std::strtoull(line.c_str() + 6, nullptr, 10);
    if (line.rfind("VmHWM:", 0) == 0) r.hwm_kib = std::strtoull(line.c_str() + 6, nullptr, 10);
  }
  return r;
}

// Restarts the kernel's peak-RSS count (VmHWM) of `pid` at its current RSS; "5" touches
// nothing else (proc(5), /proc/pid/clear_refs). False where that is not allowed.
bool ResetHwm(pid_t pid) {
  std::ofstream out(absl::StrCat("/proc/", pid, "/clear_refs"));
  out << "5";
  out.close();
  return bool(out);
}

uint64_t OpenFds(pid_t pid) {
  std::error_code ec;
  uint64_t n = 0;
  for (std::filesystem::directory_iterator it(absl::StrCat("/proc/", pid, "/fd"), ec), end;
       !ec && it != end; it.increment(ec)) {
    ++n;
  }
  return n;
}

// User + system CPU seconds of process `pid` so far (/proc/PID/stat), 0 when unreadable.
double CpuSecondsOf(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)), {});
  const size_t close = text.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  uint64_t utime = 0, stime = 0;
  for (int i = 3; fields >> field; ++i) {  // field 3 is the state
    if (i == 14) utime = std::strtoull(field.c_str(), nullptr, 10);
    if (i == 15) {
      stime = std::strtoull(field.c_str(), nullptr, 10);
      break;
    }
  }
  return double(utime + stime) / double(::sysconf(_SC_CLK_TCK));
}

// Samples the server's VmRSS and open file descriptors every 50 ms on a thread of its
// own and keeps the peaks since the last Reset(). The kernel's own peak (VmHWM, restarted
// by Reset() where allowed) also counts, so a spike between samples is not missed.
// Thread-safe.
class Sampler {
 public:
  explicit Sampler(pid_t pid) : pid_(pid) {
    Sample();
    thread_ = std::thread([this] {
      while (!done_.WaitForNotificationWithTimeout(absl::Milliseconds(50))) Sample();
    });
  }
  ~Sampler() {
    done_.Notify();
    thread_.join();
  }
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  // Starts a new peak at the current values.
  void Reset() {
    const bool hwm = ResetHwm(pid_);
    const Rss r = ReadRss(pid_);
    hwm_valid_.store(hwm);
    peak_rss_kib_.store(hwm ? std::max(r.rss_kib, r.hwm_kib) : r.rss_kib);
    peak_fds_.store(OpenFds(pid_));
  }
  double peak_rss_mib() {
    Sample();
    return double(peak_rss_kib_.load()) / 1024;
  }
  uint64_t peak_fds() {
    Sample();
    return peak_fds_.load();
  }

 private:
  void Sample() {
    const Rss r = ReadRss(pid_);
    const uint64_t rss = hwm_valid_.load() ? std::max(r.rss_kib, r.hwm_kib) : r.rss_kib;
    const uint64_t fds = OpenFds(pid_);
    uint64_t seen = peak_rss_kib_.load();
    while (rss > seen && !peak_rss_kib_.compare_exchange_weak(seen, rss)) {
    }
    seen = peak_fds_.load();
    while (fds > seen && !peak_fds_.compare_exchange_weak(seen, fds)) {
    }
  }

  const pid_t pid_;
  std::atomic<uint64_t> peak_rss_kib_{0}, peak_fds_{0};
  std::atomic<bool> hwm_valid_{false};  // VmHWM counts from the last Reset()
  absl::Notification done_;
  std::thread thread_;
};

// ---- Calls ---------------------------------------------------------------------------

// The proofs (core/auth_proof.h) the attacker sends with the tokens it holds or forges,
// for the shard of the current attack: it asks that shard for a challenge and makes the
// call proof from the answer without checking the shard's proof, as a client that wants
// to act as someone else would. For worker 3's own token that is what ps::Worker sends;
// a forged token's proof is refused. Thread-safe.
class AttackerProofs {
 public:
  static AttackerProofs& Get() {
    static AttackerProofs* proofs = new AttackerProofs();
    return *proofs;
  }
  // A new shard process at `address`: forgets the proofs made for the last one.
  void Reset(const std::string& address) {
    absl::MutexLock lock(&mu_);
    channel_ = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    headers_.clear();
  }
  // The authorization header for `token` ("" when it could not be made).
  std::string Header(std::string_view token) {
    absl::MutexLock lock(&mu_);
    auto it = headers_.find(token);
    if (it != headers_.end()) return it->second;
    const std::string key = core::TokenKey(token);
    absl::StatusOr<std::string> nonce = core::NewNonce();
    std::string header;
    if (nonce.ok() && channel_ != nullptr) {
      const grpc::Status s = net::SendChallenge(
          channel_, key, *nonce, std::chrono::system_clock::now() + kCallDeadline, true);
      if (std::optional<core::ChallengeReply> r = core::ParseChallengeAnswer(s.error_message())) {
        header = core::ProofHeader(
            key, r->server_nonce, core::CallProof(token, key, r->server.Name(), r->server_nonce));
      }
    }
    headers_.emplace(std::string(token), header);
    return header;
  }

 private:
  absl::Mutex mu_;
  std::shared_ptr<grpc::Channel> channel_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string, std::less<>> headers_ ABSL_GUARDED_BY(mu_);
};

// Sets the deadline and, unless `token` is empty, the proof of `token` of one call.
void Prepare(grpc::ClientContext& ctx, std::string_view token,
             milliseconds deadline = kCallDeadline) {
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  if (token.empty()) return;
  if (const std::string header = AttackerProofs::Get().Header(token); !header.empty()) {
    ctx.AddMetadata("authorization", header);
  }
}

// A channel with a TCP connection of its own: gRPC shares one connection between the
// channels of a process that have the same arguments, so without this the attacker's
// streams would share flow control with the honest workers' and each other's.
std::shared_ptr<grpc::Channel> OwnChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(-1);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
      net::MakeChannelCredentials(core::ClientCredentials{});
  return grpc::CreateCustomChannel(address,
                                   creds.ok() ? *creds : grpc::InsecureChannelCredentials(), args);
}

// One unary call with a request given as raw bytes (to send what the protobuf
// serializer would not, such as invalid UTF-8 in a string field).
grpc::Status CallRaw(grpc::GenericStub& stub, const std::string& method, const std::string& bytes,
                     std::string_view token) {
  grpc::ClientContext ctx;
  Prepare(ctx, token);
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

// `message` serialized, with the bytes of every occurrence of `marker` (the value of a
// string field) replaced by 0xff, which is never valid UTF-8. The lengths stay right.
constexpr std::string_view kUtf8Marker = "PS-BENCH-INVALID-UTF8-MARKER";
std::string WithInvalidUtf8(const google::protobuf::Message& message) {
  std::string bytes = message.SerializeAsString();
  for (size_t at = bytes.find(kUtf8Marker); at != std::string::npos;
       at = bytes.find(kUtf8Marker, at)) {
    std::fill_n(bytes.begin() + std::ptrdiff_t(at), kUtf8Marker.size(), '\xff');
  }
  return bytes;
}

// What one attack sent and got. Thread-safe.
class Tally {
 public:
  void Count(const grpc::Status& s) {
    requests_.fetch_add(1);
    phase_requests_.fetch_add(1);
    codes_[std::clamp(int(s.error_code()), 0, kStatusCodes - 1)].fetch_add(1);
  }
  // Requests that are not calls (connections opened, streams, frames).
  void CountOther(uint64_t n = 1) {
    requests_.fetch_add(n);
    phase_requests_.fetch_add(n);
  }
  // A request the server should have refused but did not.
  void Accepted(std::string what) {
    accepted_.fetch_add(1);
    Note(std::move(what));
  }
  // Kept once, the first 8 distinct notes.
  void Note(std::string note) {
    absl::MutexLock lock(&mu_);
    if (notes_.size() < 8 && std::find(notes_.begin(), notes_.end(), note) == notes_.end()) {
      notes_.push_back(std::move(note));
    }
  }
  void StartPhase() { phase_requests_.store(0); }

  uint64_t requests() const { return requests_.load(); }
  uint64_t phase_requests() const { return phase_requests_.load(); }
  uint64_t accepted() const { return accepted_.load(); }
  uint64_t code(int c) const { return codes_[size_t(c)].load(); }
  std::vector<std::string> notes() const {
    absl::MutexLock lock(&mu_);
    return notes_;
  }

 private:
  std::atomic<uint64_t> requests_{0}, phase_requests_{0}, accepted_{0};
  std::array<std::atomic<uint64_t>, kStatusCodes> codes_{};
  mutable absl::Mutex mu_;
  std::vector<std::string> notes_ ABSL_GUARDED_BY(mu_);
};

// ---- The attacker's identity ------------------------------------------------------------

// Worker 3's token and its current session on the shard. A Join replaces the worker's
// session, so attacks that join keep it current here for the cover and the others.
// Thread-safe.
class Attacker {
 public:
  Attacker(std::string address, uint16_t port, std::string token, uint64_t layout_hash)
      : address_(std::move(address)),
        port_(port),
        token_(std::move(token)),
        layout_hash_(layout_hash) {}

  const std::string& address() const { return address_; }
  uint16_t port() const { return port_; }
  const std::string& token() const { return token_; }
  uint64_t layout_hash() const { return layout_hash_; }
  std::string session() const {
    absl::MutexLock lock(&mu_);
    return session_;
  }

  // Joins as worker 3 with its token; the session becomes current.
  grpc::Status Join(v1::WorkerService::Stub& stub) {
    grpc::ClientContext ctx;
    Prepare(ctx, token_);
    v1::JoinRequest req;
    req.set_worker_id(kAttackerId);
    req.set_layout_hash(layout_hash_);
    // Either plane: the data_* attacks' servers run --data-plane tcp.
    req.set_data_plane(v1::DATA_PLANE_ANY);
    v1::JoinResponse resp;
    grpc::Status s = stub.Join(&ctx, req, &resp);
    if (s.ok()) {
      absl::MutexLock lock(&mu_);
      session_ = resp.session();
      udp_port_ = static_cast<uint16_t>(resp.udp_port());
      udp_session_ = resp.udp_session();
      udp_key_ = resp.udp_key();
      data_port_ = static_cast<uint16_t>(resp.data_port());
      data_session_ = resp.data_session();
      data_secret_ = resp.data_secret();
    }
    return s;
  }
  // The TCP data port and worker 3's data session from the newest join (port 0: none).
  uint16_t data_port() const {
    absl::MutexLock lock(&mu_);
    return data_port_;
  }
#if PS_HAVE_DATA_PORT_CLIENT
  DataPortTarget data_target() const {
    absl::MutexLock lock(&mu_);
    return {.port = data_port_,
            .worker = kAttackerId,
            .token = token_,
            .data_session = data_session_,
            .data_secret = data_secret_};
  }
#endif
  // The UDP path's port, session id and key from the newest join (port 0: none).
  uint16_t udp_port() const {
    absl::MutexLock lock(&mu_);
    return udp_port_;
  }
  uint64_t udp_session() const {
    absl::MutexLock lock(&mu_);
    return udp_session_;
  }
  std::string udp_key() const {
    absl::MutexLock lock(&mu_);
    return udp_key_;
  }

 private:
  const std::string address_;
  const uint16_t port_;
  const std::string token_;
  const uint64_t layout_hash_;
  mutable absl::Mutex mu_;
  std::string session_ ABSL_GUARDED_BY(mu_);
  uint16_t udp_port_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t udp_session_ ABSL_GUARDED_BY(mu_) = 0;
  std::string udp_key_ ABSL_GUARDED_BY(mu_);
  uint16_t data_port_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t data_session_ ABSL_GUARDED_BY(mu_) = 0;
  std::string data_secret_ ABSL_GUARDED_BY(mu_);
};

// Codec specs MakeCodec accepts, each never returned before by this source (three
// families with a bucket size and a level count that count up). Thread-safe.
class SpecSource {
 public:
  std::string Next() {
    const uint64_t k = next_.fetch_add(1);
    const uint64_t step = k / 3;
    const uint64_t bucket = 1 + step % (uint64_t{1} << 24);
    switch (k % 3) {
      case 0:
        return absl::StrCat("int8(bucket=", bucket, ")");
      case 1:
        return absl::StrCat("terngrad(bucket=", bucket, ")");
      default:
        return absl::StrCat("qsgd(s=", 1 + step % 65536, ",bucket=", 1 + step / 65536 % 4096, ")");
    }
  }

 private:
  std::atomic<uint64_t> next_{0};
};

// Random bytes of random length in [1, max_bytes], starting with the codecs' format
// version so that decoders look past the first byte.
std::string Garbage(std::mt19937_64& rng, size_t max_bytes) {
  std::string out(1 + rng() % std::max<size_t>(max_bytes, 1), '\0');
  for (size_t i = 1; i < out.size(); i += 8) {
    const uint64_t r = rng();
    std::memcpy(out.data() + i, &r, std::min<size_t>(8, out.size() - i));
  }
  out[0] = '\x01';
  return out;
}

// ---- Honest training -------------------------------------------------------------------

core::ModelLayout HonestLayout() {
  return *core::ModelLayout::Create({{"w1", 32768, 0}, {"w2", 1024, 1}}, kSliceElems, 1);
}

// Workers 0..2 in a loop: pull version t, push round t, wait for the answers, t + 1.
// Thread-safe readers; Stop() (or the destructor) ends the loops.
class Training {
 public:
  static absl::StatusOr<std::unique_ptr<Training>> Start(const std::string& address,
                                                         const std::vector<std::string>& tokens,
                                                         const core::ModelLayout& layout) {
    std::unique_ptr<Training> t(new Training(layout));
    std::vector<std::vector<float>> init;
    for (const core::TensorSpec& s : layout.tensors()) init.emplace_back(s.numel, 0.01f);
    const std::vector<std::span<const float>> init_spans(init.begin(), init.end());
    for (uint32_t w = 0; w < kHonest; ++w) {
      WorkerOptions wo;
      wo.shard_addresses = {address};
      wo.worker_id = w;
      wo.credentials.token = tokens[w];
      wo.rpc_timeout = milliseconds(3000);
      wo.connect_timeout = milliseconds(15000);
      wo.max_attempts = 3;
      absl::StatusOr<std::unique_ptr<Worker>> worker = Worker::Start(wo, layout, init_spans);
      if (!worker.ok()) {
        return absl::Status(
            worker.status().code(),
            absl::StrCat("honest worker ", w, " could not start: ", worker.status().message()));
      }
      t->workers_.push_back(*std::move(worker));
    }
    for (size_t w = 0; w < kHonest; ++w) t->threads_.emplace_back([p = t.get(), w] { p->Loop(w); });
    return t;
  }

  ~Training() { Stop(); }
  Training(const Training&) = delete;
  Training& operator=(const Training&) = delete;

  void Stop() {
    stop_.store(true);
    for (std::thread& t : threads_) t.join();
    threads_.clear();
    open_cv_.notify_all();
  }

  // Rounds completed (pull, push accepted) by the honest workers together (each round
  // of the model counts once per honest worker).
  uint64_t rounds() const { return rounds_.load(); }
  // Failed pulls and refused or failed pushes.
  uint64_t errors() const { return errors_.load(); }
  std::string last_error() const {
    absl::MutexLock lock(&error_mu_);
    return last_error_;
  }
  // The newest version an honest worker has pulled: round open_version() is open (or
  // was just closed).
  uint64_t open_version() const {
    std::lock_guard lock(open_mu_);
    return open_;
  }
  // Waits until some honest worker pulled at least `version`; false after `timeout`.
  bool WaitOpen(uint64_t version, milliseconds timeout) const {
    std::unique_lock lock(open_mu_);
    return open_cv_.wait_for(lock, timeout, [&] { return open_ >= version || stop_.load(); }) &&
           open_ >= version;
  }

 private:
  explicit Training(core::ModelLayout layout) : layout_(std::move(layout)) {}

  void Fail(const absl::Status& st) {
    errors_.fetch_add(1);
    absl::MutexLock lock(&error_mu_);
    last_error_ = std::string(st.message());
  }

  void Loop(size_t w) {
    Worker& worker = *workers_[w];
    std::vector<std::vector<float>> params, grads;
    for (const core::TensorSpec& s : layout_.tensors()) {
      params.emplace_back(s.numel);
      grads.emplace_back(s.numel, 1e-4f * float(w + 1));
    }
    const std::vector<std::span<float>> outs(params.begin(), params.end());
    uint64_t t = worker.start_version();
    while (!stop_.load()) {
      absl::StatusOr<uint64_t> v = worker.PullAll(t, outs, milliseconds(1000));
      if (!v.ok()) {
        if (!stop_.load()) Fail(v.status());
        continue;
      }
      t = std::max(t, *v);
      {
        std::lock_guard lock(open_mu_);
        open_ = std::max(open_, t);
      }
      open_cv_.notify_all();
      bool ok = true;
      for (size_t i = 0; i < grads.size() && ok; ++i) {
        if (absl::Status st = worker.Push(i, t, grads[i]); !st.ok()) {
          Fail(st);
          ok = false;
        }
      }
      if (absl::Status st = worker.WaitPushes(); !st.ok()) {
        Fail(st);
        ok = false;
      }
      if (ok) rounds_.fetch_add(1);
      ++t;
    }
  }

  const core::ModelLayout layout_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> rounds_{0}, errors_{0};
  mutable absl::Mutex error_mu_;
  std::string last_error_ ABSL_GUARDED_BY(error_mu_);
  mutable std::mutex open_mu_;
  mutable std::condition_variable open_cv_;
  uint64_t open_ = 0;  // guarded by open_mu_
};

// Worker 3's own pushes: once an honest worker pulled version t, round t is open, and
// the cover pushes a valid fp32 gradient for every slice of it. While `poison` is set
// (codec_poison), every slice first gets a garbage push under a codec spec never seen
// before (counted for the attack), and the valid gradient goes under another new spec:
// each makes the shard build (and its cache drop) a decoder. The cover waits for the
// answers to its valid pushes only: a Byzantine worker that wants to stay in the rounds
// does not wait for its garbage (whose answers the shard's tarpit may hold).
class Cover {
 public:
  Cover(Attacker& attacker, const Training& training, const core::ModelLayout& layout,
        SpecSource& specs)
      : attacker_(attacker), training_(training), layout_(layout), specs_(specs) {
    for (const core::SliceInfo& s : layout_.slices()) {
      std::string payload(1 + size_t{s.numel} * 4, '\0');
      payload[0] = '\x01';
      const std::vector<float> values(s.numel, 2e-4f);
      std::memcpy(payload.data() + 1, values.data(), values.size() * 4);
      payloads_.push_back(std::move(payload));
    }
    thread_ = std::thread([this] { Loop(); });
  }
  ~Cover() {
    stop_.store(true);
    thread_.join();
    SetPoison(nullptr);  // the garbage pushes' callbacks use this object
  }
  Cover(const Cover&) = delete;
  Cover& operator=(const Cover&) = delete;

  // `tally` (borrowed until the next call) counts the garbage pushes; nullptr: plain,
  // once every garbage push sent has its answer.
  void SetPoison(Tally* tally) {
    std::unique_lock lock(garbage_mu_);
    poison_ = tally;
    garbage_done_.wait(lock, [&] { return poison_ != nullptr || garbage_open_ == 0; });
  }
  uint64_t pushed() const { return pushed_.load(); }
  uint64_t refused() const { return refused_.load(); }
  std::string last_refusal() const {
    absl::MutexLock lock(&mu_);
    return last_refusal_;
  }

 private:
  // One slice's pushes of a poisoned round, made before the round opens so that the
  // client's encoding is not on the round's critical path.
  struct Poisoned {
    std::string garbage_spec, garbage;  // refused by the decoder, after the shard made it
    std::string spec, encoded;          // a valid push under a new spec
  };

  std::vector<Poisoned> PreparePoison(uint64_t round, std::mt19937_64& rng) {
    std::vector<Poisoned> out;
    for (const core::SliceInfo& s : layout_.slices()) {
      Poisoned p;
      p.garbage_spec = specs_.Next();
      p.garbage = Garbage(rng, 4 * size_t{s.numel});
      p.spec = specs_.Next();
      absl::StatusOr<std::unique_ptr<codecs::Codec>> c = codecs::MakeCodec(p.spec);
      const std::vector<float> values(s.numel, 2e-4f);
      if (!c.ok() ||
          !(*c)->Encode(values, codecs::EncodeContext{round, s.id, kAttackerId}, &p.encoded).ok()) {
        p.spec = "fp32";
        p.encoded = payloads_[s.id];
      }
      out.push_back(std::move(p));
    }
    return out;
  }

  // One push in flight.
  struct PushCall {
    grpc::ClientContext ctx;
    v1::PushRequest req;
    v1::PushResponse resp;
    grpc::Status status;
  };

  std::unique_ptr<PushCall> MakePush(uint64_t round, uint32_t slice, const std::string& codec,
                                     const std::string& payload) const {
    auto c = std::make_unique<PushCall>();
    c->req.set_session(attacker_.session());
    c->req.set_layout_hash(attacker_.layout_hash());
    c->req.set_round(round);
    c->req.set_slice_id(slice);
    c->req.set_codec(codec);
    c->req.set_payload(payload);
    Prepare(c->ctx, attacker_.token());
    return c;
  }

  Tally* Poison() {
    std::lock_guard lock(garbage_mu_);
    return poison_;
  }

  // Sends a garbage push without waiting: its answer is counted on `tally` when it comes.
  void SendGarbage(v1::WorkerService::Stub& stub, std::unique_ptr<PushCall> call, Tally* tally) {
    PushCall* c = call.release();
    stub.async()->Push(&c->ctx, &c->req, &c->resp, [this, c, tally](grpc::Status s) {
      tally->Count(s);
      delete c;
      std::lock_guard lock(garbage_mu_);
      --garbage_open_;
      garbage_done_.notify_all();
    });
  }

  // Sends every call at once, in order, and waits for all the answers.
  static void SendAll(v1::WorkerService::Stub& stub,
                      const std::vector<std::unique_ptr<PushCall>>& calls) {
    std::latch done(std::ptrdiff_t(calls.size()));
    for (const std::unique_ptr<PushCall>& c : calls) {
      stub.async()->Push(&c->ctx, &c->req, &c->resp, [&done, p = c.get()](grpc::Status s) {
        p->status = std::move(s);
        done.count_down();
      });
    }
    done.wait();
  }

  void Loop() {
    std::unique_ptr<v1::WorkerService::Stub> stub =
        v1::WorkerService::NewStub(OwnChannel(attacker_.address()));
    std::mt19937_64 rng(7);
    std::vector<Poisoned> poisoned;
    uint64_t next = 0;
    while (!stop_.load()) {
      if (Poison() != nullptr && poisoned.empty()) poisoned = PreparePoison(next, rng);
      if (!training_.WaitOpen(next, milliseconds(100))) continue;
      const uint64_t round = std::max(next, training_.open_version());
      std::vector<std::unique_ptr<PushCall>> calls;
      Tally* poison = nullptr;
      {
        // Read with the garbage counted in flight under one lock: SetPoison(nullptr)
        // then waits for every push that counts on the tally.
        std::lock_guard lock(garbage_mu_);
        poison = poison_;
        if (poison != nullptr) garbage_open_ += static_cast<uint32_t>(layout_.slices().size());
      }
      if (poison != nullptr && poisoned.empty()) poisoned = PreparePoison(round, rng);
      // Every slice at once; under poison each valid push right behind its garbage one.
      for (const core::SliceInfo& s : layout_.slices()) {
        if (poison != nullptr) {
          SendGarbage(*stub,
                      MakePush(round, s.id, poisoned[s.id].garbage_spec, poisoned[s.id].garbage),
                      poison);
          calls.push_back(MakePush(round, s.id, poisoned[s.id].spec, poisoned[s.id].encoded));
        } else {
          calls.push_back(MakePush(round, s.id, kFp32, payloads_[s.id]));
        }
      }
      SendAll(*stub, calls);
      for (const std::unique_ptr<PushCall>& call : calls) {
        PushCall& c = *call;
        // A join by an attack may have replaced the session meanwhile (the shard may know
        // the new one before the joining thread does): retry with the newest one.
        grpc::Status st = c.status;
        for (int attempt = 0;
             attempt < 50 && st.error_code() == grpc::StatusCode::UNAUTHENTICATED && !stop_.load();
             ++attempt) {
          if (attacker_.session() == c.req.session())
            std::this_thread::sleep_for(std::chrono::microseconds(200));
          std::unique_ptr<PushCall> again =
              MakePush(round, c.req.slice_id(), c.req.codec(), c.req.payload());
          st = stub->Push(&again->ctx, again->req, &again->resp);
          c.req.set_session(again->req.session());
        }
        (st.ok() ? pushed_ : refused_).fetch_add(1);
        if (!st.ok()) {
          absl::MutexLock lock(&mu_);
          last_refusal_ = absl::StrCat(CodeName(int(st.error_code())), ": ", st.error_message());
        }
      }
      if (poison != nullptr) poisoned.clear();
      next = round + 1;
    }
  }

  static inline const std::string kFp32 = "fp32";

  Attacker& attacker_;
  const Training& training_;
  const core::ModelLayout& layout_;
  SpecSource& specs_;
  std::vector<std::string> payloads_;  // fp32 payload per slice id
  // The poison tally, and the garbage pushes counted on it still in flight.
  std::mutex garbage_mu_;
  std::condition_variable garbage_done_;
  Tally* poison_ = nullptr;    // guarded by garbage_mu_
  uint32_t garbage_open_ = 0;  // guarded by garbage_mu_
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> pushed_{0}, refused_{0};
  mutable absl::Mutex mu_;
  std::string last_refusal_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// ---- Attacks ---------------------------------------------------------------------------

// What an attack thread works with. Borrowed pointers live until the attack's threads
// are joined.
struct AttackEnv {
  Attacker* attacker = nullptr;
  const core::ModelLayout* layout = nullptr;
  const Training* training = nullptr;  // null before the honest layout exists
  Tally* tally = nullptr;
  const Limits* limits = nullptr;
  SpecSource* specs = nullptr;
  const std::atomic<bool>* stop = nullptr;

  // Whether to send another request: not told to stop, and within this phase's budget.
  bool more() const { return !stop->load() && tally->phase_requests() < limits->max_requests; }
  uint64_t open_round() const { return training != nullptr ? training->open_version() : 0; }
};

struct AttackCheck {
  std::string text;
  bool ok = true;
};

struct Attack {
  std::string name;
  std::string what;  // one line for --list
  int threads = 1;   // copies of `run`, told apart by their index
  std::function<void(AttackEnv&, int)> run;
  bool before_layout = false;  // also run against the shard before the honest layout exists
  bool poison_cover = false;   // the cover pushes with new specs and garbage too
  // After the attack phases (may be empty): whether the server is back to normal.
  std::function<AttackCheck(AttackEnv&, pid_t server)> check;
  // Worker 3 pushes no cover in this attack's run (as --no-cover): the attack is worker
  // 3's push itself.
  bool without_cover = false;
  bool by_name = false;  // runs only when --attacks names it
  // The server runs --data-plane tcp: the honest workers train over its data port (worker
  // 3's cover still pushes over gRPC, which the shard takes on either plane).
  bool tcp_data_plane = false;
};

v1::RegisterLayoutRequest LayoutRequest(uint64_t numel, uint32_t slice_elems) {
  v1::RegisterLayoutRequest req;
  v1::TensorSpec* t = req.mutable_layout()->add_tensors();
  t->set_name("hostile");
  t->set_numel(numel);
  req.mutable_layout()->set_slice_elems(slice_elems);
  req.mutable_layout()->set_num_shards(1);
  return req;
}

// RegisterLayout in a loop, cycling through `requests`. Before the honest layout exists
// the shard checks each; afterwards it answers from the layout hash.
void RegisterLayouts(AttackEnv& env, std::vector<v1::RegisterLayoutRequest> requests,
                     std::vector<std::string> names) {
  std::unique_ptr<v1::WorkerService::Stub> stub =
      v1::WorkerService::NewStub(OwnChannel(env.attacker->address()));
  for (size_t i = 0; env.more(); ++i) {
    v1::RegisterLayoutRequest& req = requests[i % requests.size()];
    req.set_session(env.attacker->session());
    grpc::ClientContext ctx;
    Prepare(ctx, env.attacker->token());
    v1::RegisterLayoutResponse resp;
    const grpc::Status s = stub->RegisterLayout(&ctx, req, &resp);
    env.tally->Count(s);
    if (s.ok())
      env.tally->Accepted(
          absl::StrCat("RegisterLayout of ", names[i % names.size()], " was accepted"));
  }
}

void LayoutWrap(AttackEnv& env, int) {
  RegisterLayouts(env, {LayoutRequest(std::numeric_limits<uint64_t>::max(), 1u << 22)},
                  {"2^64-1 elements in slices of 2^22"});
}

void LayoutHuge(AttackEnv& env, int) {
  RegisterLayouts(env, {LayoutRequest(uint64_t{1} << 24, 1), LayoutRequest(uint64_t{1} << 20, 1)},
                  {"2^24 slices", "2^20 slices"});
}

// Pushes for the open round with a new codec spec and garbage every time (the cover adds
// one of each per slice and round, and its valid pushes use new specs too).
void CodecPoison(AttackEnv& env, int thread) {
  std::unique_ptr<v1::WorkerService::Stub> stub =
      v1::WorkerService::NewStub(OwnChannel(env.attacker->address()));
  std::mt19937_64 rng(100 + uint64_t(thread));
  const std::vector<core::SliceInfo>& slices = env.layout->slices();
  for (size_t i = size_t(thread); env.more(); ++i) {
    const core::SliceInfo& s = slices[i % slices.size()];
    v1::PushRequest req;
    req.set_session(env.attacker->session());
    req.set_layout_hash(env.attacker->layout_hash());
    req.set_round(env.open_round());
    req.set_slice_id(s.id);
    req.set_codec(env.specs->Next());
    req.set_payload(Garbage(rng, 4 * size_t{s.numel}));
    grpc::ClientContext ctx;
    Prepare(ctx, env.attacker->token());
    v1::PushResponse resp;
    env.tally->Count(stub->Push(&ctx, req, &resp));
  }
}

// Opens `n` Pull streams of `req` at once, none of which is ever read, and waits for
// their status (each ends at `deadline` at the latest; all are cancelled when told to
// stop). Returns the statuses.
std::vector<grpc::Status> OpenUnreadPulls(AttackEnv& env, v1::WorkerService::Stub& stub,
                                          const v1::PullRequest& req, uint32_t n,
                                          milliseconds deadline) {
  struct Call {
    grpc::ClientContext ctx;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncReader<v1::PullResponse>> reader;
  };
  grpc::CompletionQueue cq;
  std::vector<std::unique_ptr<Call>> calls;
  for (uint32_t i = 0; i < n; ++i) {
    auto c = std::make_unique<Call>();
    Prepare(c->ctx, env.attacker->token(), deadline);
    c->reader = stub.PrepareAsyncPull(&c->ctx, req, &cq);
    c->reader->StartCall(reinterpret_cast<void*>(uintptr_t{2} * i));
    c->reader->Finish(&c->status, reinterpret_cast<void*>(uintptr_t{2} * i + 1));
    calls.push_back(std::move(c));
  }
  size_t events = 2 * size_t{n};
  bool cancelled = false;
  while (events > 0) {
    void* tag = nullptr;
    bool ok = false;
    const auto r = cq.AsyncNext(&tag, &ok, std::chrono::system_clock::now() + milliseconds(50));
    if (r == grpc::CompletionQueue::SHUTDOWN) break;
    if (r == grpc::CompletionQueue::TIMEOUT) {
      if (env.stop->load() && !cancelled) {
        for (auto& c : calls) c->ctx.TryCancel();
        cancelled = true;
      }
      continue;
    }
    --events;
  }
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
  std::vector<grpc::Status> out;
  for (auto& c : calls) out.push_back(c->status);
  return out;
}

v1::PullRequest AllSlices(const AttackEnv& env, uint64_t min_version) {
  v1::PullRequest req;
  req.set_session(env.attacker->session());
  req.set_layout_hash(env.attacker->layout_hash());
  for (const core::SliceInfo& s : env.layout->slices()) req.add_slice_ids(s.id);
  req.set_min_version(min_version);
  return req;
}

// Thread 0: batches of far-future pulls with a 50 ms deadline, more than
// --max-pulls-per-worker at once. Thread 1: pulls of version 0 that never read what the
// shard sends, each held until its deadline.
void PullLeak(AttackEnv& env, int thread) {
  std::unique_ptr<v1::WorkerService::Stub> stub =
      v1::WorkerService::NewStub(OwnChannel(env.attacker->address()));
  while (env.more()) {
    const std::vector<grpc::Status> statuses =
        thread == 0 ? OpenUnreadPulls(env, *stub, AllSlices(env, uint64_t{1} << 62),
                                      env.limits->pull_batch, milliseconds(50))
                    : OpenUnreadPulls(env, *stub, AllSlices(env, 0), env.limits->idle_streams,
                                      env.limits->idle_deadline);
    for (const grpc::Status& s : statuses) env.tally->Count(s);
  }
}

// After the attack: every one of worker 3's pull slots must be free again.
AttackCheck PullSlotsFree(AttackEnv& env, pid_t) {
  std::this_thread::sleep_for(milliseconds(300));
  std::unique_ptr<v1::WorkerService::Stub> stub =
      v1::WorkerService::NewStub(OwnChannel(env.attacker->address()));
  const std::vector<grpc::Status> statuses = OpenUnreadPulls(
      env, *stub, AllSlices(env, uint64_t{1} << 62), kMaxPullsPerWorker, milliseconds(300));
  const auto busy =
      size_t(std::count_if(statuses.begin(), statuses.end(), [](const grpc::Status& s) {
        return s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
      }));
  return {
      absl::StrCat("pull slots free afterwards: ", statuses.size() - busy, "/", statuses.size()),
      busy == 0};
}

// Calls in the name of others, each of which must be refused as unauthenticated or not
// permitted; any other answer counts as accepted.
void Impersonation(AttackEnv& env, int thread) {
  const std::shared_ptr<grpc::Channel> channel = OwnChannel(env.attacker->address());
  std::unique_ptr<v1::WorkerService::Stub> worker = v1::WorkerService::NewStub(channel);
  std::unique_ptr<v1::PeerService::Stub> peer = v1::PeerService::NewStub(channel);
  std::unique_ptr<v1::AdminService::Stub> admin = v1::AdminService::NewStub(channel);
  const std::string own = env.attacker->token();
  const std::string forged = absl::StrCat("worker-0.", std::string(64, '0'));
  // Tokens of the right form for other identities, derived from a secret of our own.
  const std::string other_secret(core::kSecretBytes, '\x5a');
  using Kind = core::Identity::Kind;
  const std::string other_worker0 = core::DeriveToken(other_secret, {Kind::kWorker, 0});
  const std::string other_shard1 = core::DeriveToken(other_secret, {Kind::kShard, 1});
  const std::string other_admin = core::DeriveToken(other_secret, {Kind::kAdmin, 0});
  const auto join = [&](uint32_t id, const std::string& token) {
    grpc::ClientContext ctx;
    Prepare(ctx, token);
    v1::JoinRequest req;
    req.set_worker_id(id);
    req.set_layout_hash(env.attacker->layout_hash());
    v1::JoinResponse resp;
    return worker->Join(&ctx, req, &resp);
  };
  const auto push = [&](const std::string& session, const std::string& token) {
    grpc::ClientContext ctx;
    Prepare(ctx, token);
    v1::PushRequest req;
    req.set_session(session);
    req.set_layout_hash(env.attacker->layout_hash());
    req.set_round(env.open_round());
    req.set_slice_id(0);
    req.set_codec("fp32");
    req.set_payload(std::string(1 + 4 * size_t{kSliceElems}, '\0'));
    v1::PushResponse resp;
    return worker->Push(&ctx, req, &resp);
  };
  const auto pull = [&](const std::string& token) {
    grpc::ClientContext ctx;
    Prepare(ctx, token);
    const std::unique_ptr<grpc::ClientReader<v1::PullResponse>> reader =
        worker->Pull(&ctx, AllSlices(env, 0));
    v1::PullResponse r;
    while (reader->Read(&r)) {
    }
    return reader->Finish();
  };
  const auto hello = [&](uint32_t shard, const std::string& token) {
    grpc::ClientContext ctx;
    Prepare(ctx, token);
    v1::PeerHelloRequest req;
    req.set_shard_id(shard);
    req.set_num_shards(2);
    v1::PeerHelloResponse resp;
    return peer->Hello(&ctx, req, &resp);
  };
  const auto share = [&](uint32_t shard, const std::string& token) {
    grpc::ClientContext ctx;
    Prepare(ctx, token);
    v1::RoundShareRequest req;
    req.set_layout_hash(env.attacker->layout_hash());
    req.set_shard_id(shard);
    req.set_round(env.open_round());
    req.add_participants(0);
    req.add_gram(1.0);
    v1::RoundShareResponse resp;
    return peer->ShareRound(&ctx, req, &resp);
  };
  const auto status = [&](const std::string& token) {
    grpc::ClientContext ctx;
    Prepare(ctx, token);
    v1::StatusResponse resp;
    return admin->Status(&ctx, v1::StatusRequest(), &resp);
  };
  const auto checkpoint = [&](const std::string& token) {
    grpc::ClientContext ctx;
    Prepare(ctx, token);
    v1::CheckpointResponse resp;
    return admin->Checkpoint(&ctx, v1::CheckpointRequest(), &resp);
  };
  const std::vector<std::pair<std::string, std::function<grpc::Status()>>> attempts = {
      {"Join as worker 0 without a token", [&] { return join(0, ""); }},
      {"Join as worker 0 with worker 3's token", [&] { return join(0, own); }},
      {"Join as worker 0 with a forged token", [&] { return join(0, forged); }},
      {"Join as worker 0 with its token under another secret",
       [&] { return join(0, other_worker0); }},
      {"Join as worker 3 without a token", [&] { return join(kAttackerId, ""); }},
      {"Push with worker 3's session and no token",
       [&] { return push(env.attacker->session(), ""); }},
      {"Push with worker 3's session and worker 0's token under another secret",
       [&] { return push(env.attacker->session(), other_worker0); }},
      {"Push with a made-up session and worker 3's token",
       [&] { return push(std::string(16, 'x'), own); }},
      {"Pull with worker 3's session and no token", [&] { return pull(""); }},
      {"Hello as shard 1 with worker 3's token", [&] { return hello(1, own); }},
      {"Hello as shard 0 with worker 3's token", [&] { return hello(0, own); }},
      {"Hello as shard 1 without a token", [&] { return hello(1, ""); }},
      {"Hello as shard 1 with its token under another secret",
       [&] { return hello(1, other_shard1); }},
      {"ShareRound as shard 1 with worker 3's token", [&] { return share(1, own); }},
      {"ShareRound as shard 0 without a token", [&] { return share(0, ""); }},
      {"ShareRound as shard 1 with its token under another secret",
       [&] { return share(1, other_shard1); }},
      {"Admin Status with worker 3's token", [&] { return status(own); }},
      {"Admin Status without a token", [&] { return status(""); }},
      {"Admin Status with the admin token under another secret",
       [&] { return status(other_admin); }},
      {"Admin Checkpoint with worker 3's token", [&] { return checkpoint(own); }},
  };
  for (size_t i = size_t(thread); env.more(); ++i) {
    const auto& [name, attempt] = attempts[i % attempts.size()];
    const grpc::Status s = attempt();
    env.tally->Count(s);
    if (s.error_code() != grpc::StatusCode::UNAUTHENTICATED &&
        s.error_code() != grpc::StatusCode::PERMISSION_DENIED) {
      env.tally->Accepted(
          absl::StrCat(name, ": ", CodeName(int(s.error_code())), " ", s.error_message()));
    }
  }
}

// Joins in a loop with worker 3's token, and requests whose string fields are invalid
// UTF-8 (which the server's protobuf parser refuses, and used to log, every time).
void LogFlood(AttackEnv& env, int thread) {
  const std::shared_ptr<grpc::Channel> channel = OwnChannel(env.attacker->address());
  std::unique_ptr<v1::WorkerService::Stub> stub = v1::WorkerService::NewStub(channel);
  grpc::GenericStub generic(channel);
  const std::string marker(kUtf8Marker);
  for (size_t i = size_t(thread); env.more(); ++i) {
    switch (i % 5) {
      case 0:
        env.tally->Count(env.attacker->Join(*stub));
        break;
      case 1: {
        v1::RegisterLayoutRequest req = LayoutRequest(1024, 1024);
        req.set_session(env.attacker->session());
        req.mutable_layout()->mutable_tensors(0)->set_name(marker);
        env.tally->Count(CallRaw(generic, "/ps.v1.WorkerService/RegisterLayout",
                                 WithInvalidUtf8(req), env.attacker->token()));
        break;
      }
      case 2: {
        v1::PushRequest req;
        req.set_session(env.attacker->session());
        req.set_layout_hash(env.attacker->layout_hash());
        req.set_round(env.open_round());
        req.set_codec(marker);
        req.set_payload("\x01");
        env.tally->Count(CallRaw(generic, "/ps.v1.WorkerService/Push", WithInvalidUtf8(req),
                                 env.attacker->token()));
        break;
      }
      case 3: {
        v1::PeerHelloRequest req;
        req.set_shard_id(1);
        req.set_num_shards(2);
        req.set_config_summary(marker);
        env.tally->Count(CallRaw(generic, "/ps.v1.PeerService/Hello", WithInvalidUtf8(req), ""));
        break;
      }
      default: {
        grpc::ClientContext ctx;
        Prepare(ctx, env.attacker->token());
        v1::JoinRequest req;
        req.set_worker_id(1000 + uint32_t(i));
        req.set_layout_hash(env.attacker->layout_hash());
        v1::JoinResponse resp;
        env.tally->Count(stub->Join(&ctx, req, &resp));
        break;
      }
    }
  }
}

// Connections of one identity that a flood with worker 3's token opens: the shard keeps
// 4 per identity (--max-connections-per-client) and closes the least recently used one
// for a fifth, so a flood on more would close worker 3's own connections, the cover's
// among them, and the rounds would wait for worker 3 as if it pushed nothing (the cost
// lands on the attacker's identity, and the tests of the connection table show it). The
// flood stays within the bound, beside the cover's connection, to measure what its
// requests cost.
constexpr uint32_t kIdentityFloodConnections = 3;

// Keeps `limits->inflight` copies of one request, given as raw bytes, in flight on up to
// 8 connections (kIdentityFloodConnections with a token) until told to stop (a cheap
// client: the bytes are serialized once and shared by every call), with `token` (empty:
// none). Counts the answers.
void FloodRaw(AttackEnv& env, const std::string& method, const std::string& bytes,
              const std::string& token) {
  const uint32_t inflight = std::max<uint32_t>(env.limits->inflight, 1);
  const uint32_t connections =
      std::min<uint32_t>(inflight, token.empty() ? 8 : kIdentityFloodConnections);
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
  for (uint32_t i = 0; i < connections; ++i) {
    stubs.push_back(std::make_unique<grpc::GenericStub>(OwnChannel(env.attacker->address())));
  }
  grpc::Slice slice(bytes);
  const grpc::ByteBuffer request(&slice, 1);
  struct Call {
    grpc::ClientContext ctx;
    grpc::ByteBuffer response;
    bool done = false;  // guarded by mu
  };
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::unique_ptr<Call>> calls;  // guarded by mu; reaped by this thread
  uint32_t open = 0;                         // guarded by mu
  for (uint64_t i = 0;; ++i) {
    std::unique_lock lock(mu);
    cv.wait_for(lock, milliseconds(50), [&] { return open < inflight; });
    std::erase_if(calls, [](const std::unique_ptr<Call>& c) { return c->done; });
    if (!env.more()) break;
    if (open >= inflight) continue;
    calls.push_back(std::make_unique<Call>());
    Call* call = calls.back().get();
    ++open;
    lock.unlock();
    Prepare(call->ctx, token, milliseconds(10000));
    stubs[i % stubs.size()]->UnaryCall(&call->ctx, method, grpc::StubOptions(), &request,
                                       &call->response, [&, call](grpc::Status s) {
                                         env.tally->Count(s);
                                         std::lock_guard done_lock(mu);
                                         call->done = true;
                                         --open;
                                         cv.notify_all();
                                       });
  }
  std::unique_lock lock(mu);
  for (const std::unique_ptr<Call>& c : calls) {
    if (!c->done) c->ctx.TryCancel();
  }
  cv.wait(lock, [&] { return open == 0; });
}

// RegisterLayout of 2^16 tensors (the most a layout may have) with 100-byte names, a 7 MB
// message, after the layout exists (the shard answers from the hash of the tensor list).
void LayoutTensors(AttackEnv& env, int) {
  v1::RegisterLayoutRequest req;
  req.set_session(env.attacker->session());
  for (uint32_t i = 0; i < core::kMaxTensors; ++i) {
    v1::TensorSpec* t = req.mutable_layout()->add_tensors();
    std::string name = absl::StrCat("t", i, "-");
    name.resize(100, 'n');
    t->set_name(std::move(name));
    t->set_numel(1);
  }
  req.mutable_layout()->set_slice_elems(1);
  req.mutable_layout()->set_num_shards(1);
  FloodRaw(env, "/ps.v1.WorkerService/RegisterLayout", req.SerializeAsString(),
           env.attacker->token());
}

// The same bytes per request as layout_tensors, but in one `bytes` field, which costs the
// shard one copy to parse: pushes of 7 MiB payloads for round 0 (long closed: refused as
// late), to tell the cost of the bytes from that of the tensors. `token`: whose.
void BigPushes(AttackEnv& env, const std::string& token) {
  v1::PushRequest req;
  req.set_session(env.attacker->session());
  req.set_layout_hash(env.attacker->layout_hash());
  req.set_round(0);
  req.set_slice_id(0);
  req.set_codec("fp32");
  req.set_payload(std::string(7 << 20, '\x01'));
  FloodRaw(env, "/ps.v1.WorkerService/Push", req.SerializeAsString(), token);
}

void BigMessages(AttackEnv& env, int) { BigPushes(env, env.attacker->token()); }

// The same without any token: refused as unauthenticated, once the whole message arrived.
void AnonMessages(AttackEnv& env, int) { BigPushes(env, ""); }

// Requests that are wrong in every other way a client can make them wrong.
void JunkRequests(AttackEnv& env, int thread) {
  const std::shared_ptr<grpc::Channel> channel = OwnChannel(env.attacker->address());
  std::unique_ptr<v1::WorkerService::Stub> stub = v1::WorkerService::NewStub(channel);
  const uint64_t hash = env.attacker->layout_hash();
  v1::PullRequest pull_ids, pull_dups;
  for (uint32_t i = 0; i < 100000; ++i) {
    pull_ids.add_slice_ids(i);
    pull_dups.add_slice_ids(0);
  }
  const std::string spec_1mb(1 << 20, 'a');
  const std::string fp32_slice(1 + 4 * size_t{kSliceElems}, '\0');
  const std::string values_9mb(9 << 20, '\0');
  const auto unary = [&](auto method, auto& req, auto resp) {
    req.set_session(env.attacker->session());
    grpc::ClientContext ctx;
    Prepare(ctx, env.attacker->token());
    env.tally->Count(((*stub).*method)(&ctx, req, &resp));
  };
  const auto pull = [&](v1::PullRequest& req) {
    req.set_session(env.attacker->session());
    req.set_layout_hash(hash);
    grpc::ClientContext ctx;
    Prepare(ctx, env.attacker->token());
    const std::unique_ptr<grpc::ClientReader<v1::PullResponse>> reader = stub->Pull(&ctx, req);
    v1::PullResponse r;
    while (reader->Read(&r)) {
    }
    env.tally->Count(reader->Finish());
  };
  for (size_t i = size_t(thread); env.more(); ++i) {
    switch (i % 8) {
      case 0: {  // InitSlice of an initialized slice, with 3 bytes
        v1::InitSliceRequest req;
        req.set_layout_hash(hash);
        req.set_slice_id(0);
        req.set_values("abc");
        unary(&v1::WorkerService::Stub::InitSlice, req, v1::InitSliceResponse());
        break;
      }
      case 1: {  // InitSlice of slice 2^32-1
        v1::InitSliceRequest req;
        req.set_layout_hash(hash);
        req.set_slice_id(std::numeric_limits<uint32_t>::max());
        req.set_values(fp32_slice);
        unary(&v1::WorkerService::Stub::InitSlice, req, v1::InitSliceResponse());
        break;
      }
      case 2:  // Pull naming 100,000 slice ids
        pull(pull_ids);
        break;
      case 3:  // Pull naming slice 0 100,000 times
        pull(pull_dups);
        break;
      case 4: {  // Push under a 1 MiB codec spec
        v1::PushRequest req;
        req.set_layout_hash(hash);
        req.set_round(env.open_round());
        req.set_slice_id(1);
        req.set_codec(spec_1mb);
        req.set_payload(fp32_slice);
        unary(&v1::WorkerService::Stub::Push, req, v1::PushResponse());
        break;
      }
      case 5: {  // Push for round 2^64-1
        v1::PushRequest req;
        req.set_layout_hash(hash);
        req.set_round(std::numeric_limits<uint64_t>::max());
        req.set_slice_id(2);
        req.set_codec("fp32");
        req.set_payload(fp32_slice);
        unary(&v1::WorkerService::Stub::Push, req, v1::PushResponse());
        break;
      }
      case 6: {  // Join as worker 2^32-1
        grpc::ClientContext ctx;
        Prepare(ctx, env.attacker->token());
        v1::JoinRequest req;
        req.set_worker_id(std::numeric_limits<uint32_t>::max());
        req.set_layout_hash(hash);
        v1::JoinResponse resp;
        env.tally->Count(stub->Join(&ctx, req, &resp));
        break;
      }
      default: {  // InitSlice of 9 MiB, above the message limit
        v1::InitSliceRequest req;
        req.set_layout_hash(hash);
        req.set_slice_id(3);
        req.set_values(values_9mb);
        unary(&v1::WorkerService::Stub::InitSlice, req, v1::InitSliceResponse());
        break;
      }
    }
  }
}

// Issue 45, finding 5: as each round opens, one valid datagram per slice (chunk 0 of 512
// values of 1e4) under worker 3's UDP session, and nothing more of its push. Before, that
// started the round's deadline with a quorum of 0: rounds closed on the attacker's
// chunk and the honest pushes were late. Runs without the cover (its gRPC pushes would
// complete worker 3's push), so its baseline also waits for the deadline each round.
void UdpQuorum(AttackEnv& env, int) {
  absl::StatusOr<net::DatagramKey> key = net::DatagramKey::FromBytes(env.attacker->udp_key());
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (!key.ok() || fd < 0 || env.attacker->udp_port() == 0 || env.training == nullptr) {
    env.tally->Note("udp_quorum: no UDP session (does the server run --udp-port?)");
    if (fd >= 0) ::close(fd);
    return;
  }
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  to.sin_port = htons(env.attacker->udp_port());
  constexpr uint32_t kChunk = 512;
  std::string payload(1 + 4 * size_t{kChunk}, '\0');
  payload[0] = '\x01';  // fp32's format version, then 1e4 in every value
  const float big = 1e4f;
  for (uint32_t i = 0; i < kChunk; ++i) std::memcpy(payload.data() + 1 + 4 * i, &big, 4);
  std::string datagram;
  for (uint64_t next = env.open_round(); env.more();) {
    if (!env.training->WaitOpen(next, milliseconds(100))) continue;
    const uint64_t round = std::max(next, env.open_round());
    for (const core::SliceInfo& s : env.layout->slices()) {
      net::DatagramHeader h;
      h.session_id = env.attacker->udp_session();
      h.worker_id = kAttackerId;
      h.slice_id = s.id;
      h.round = round;
      h.chunk_elems = kChunk;
      h.chunk_count = static_cast<uint16_t>(net::ChunkCount(s.numel, kChunk));
      if (!net::EncodeDatagram(h, "fp32", payload, *key, &datagram).ok()) continue;
      ::sendto(fd, datagram.data(), datagram.size(), 0, reinterpret_cast<const sockaddr*>(&to),
               sizeof(to));
      env.tally->CountOther();
    }
    next = round + 1;
  }
  ::close(fd);
}

// Issue 45, finding 6: pulls naming 7.6 million slice ids (7.6 MB), 8 in flight. Before,
// each cost the shard 0.28 s of CPU before it was refused; the id past the shard's slice
// count is now refused where it is read.
void PullSlices(AttackEnv& env, int) {
  v1::PullRequest req;
  req.set_session(env.attacker->session());
  req.set_layout_hash(env.attacker->layout_hash());
  const uint32_t slices = static_cast<uint32_t>(env.layout->slices().size());
  req.mutable_slice_ids()->Reserve(7'600'000);
  for (uint32_t i = 0; i < 7'600'000; ++i) req.add_slice_ids(i % slices);
  Limits eight = *env.limits;
  eight.inflight = 8;
  AttackEnv with_eight = env;
  with_eight.limits = &eight;
  FloodRaw(with_eight, "/ps.v1.WorkerService/Pull", req.SerializeAsString(), env.attacker->token());
}

// Thread 0: channels with connections of their own, each making one call (without a
// token) and then held open. Thread 1: TCP connections that never send a byte.
void ConnFlood(AttackEnv& env, int thread) {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<int> sockets;
  if (thread == 0) {
    for (uint32_t i = 0; i < env.limits->grpc_connections && env.more(); ++i) {
      channels.push_back(OwnChannel(env.attacker->address()));
      std::unique_ptr<v1::WorkerService::Stub> stub = v1::WorkerService::NewStub(channels.back());
      grpc::ClientContext ctx;
      Prepare(ctx, "");
      v1::JoinRequest req;
      req.set_worker_id(kAttackerId);
      req.set_layout_hash(env.attacker->layout_hash());
      v1::JoinResponse resp;
      env.tally->Count(stub->Join(&ctx, req, &resp));
    }
  } else {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(env.attacker->port());
    for (uint32_t i = 0; i < env.limits->raw_connections && env.more(); ++i) {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) break;
      if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
        env.tally->Note(absl::StrCat("connect: ", std::strerror(errno)));
        ::close(fd);
        break;
      }
      sockets.push_back(fd);
      env.tally->CountOther();
    }
  }
  while (!env.stop->load()) std::this_thread::sleep_for(milliseconds(20));
  for (int fd : sockets) ::close(fd);
}

#if PS_HAVE_H2_ATTACKER
// ---- Attacks below the messages (tests/support/h2_attacker.h) ---------------------------
// Each runs until its phase ends, within its own bounds (not --quick's request budget),
// and counts the streams it opened, or the frames or connections where it opens none.

namespace h2 = ps::testing::h2;

h2::Control H2Control(const AttackEnv& env) {
  return {.stop = [stop = env.stop] { return stop->load(); }, .duration = std::chrono::hours(1)};
}

h2::Request H2Push(const AttackEnv& env, bool with_token) {
  return {.path = std::string(h2::kPushPath),
          .authorization = with_token ? AttackerProofs::Get().Header(env.attacker->token()) : ""};
}

void H2Count(AttackEnv& env, const h2::Report& r) {
  env.tally->CountOther(r.streams > 0 ? r.streams : r.frames > 0 ? r.frames : r.connections);
  env.tally->Note(r.Summary());
}

h2::Report H2Flood(AttackEnv& env, h2::FloodKind kind, h2::Request request, bool read_replies) {
  h2::FloodOptions o;
  o.target.port = env.attacker->port();
  o.kind = kind;
  o.request = std::move(request);
  o.max_connections = 1000;
  o.max_frames = 100000000;
  o.frames_per_write = 128;
  o.read_replies = read_replies;
  o.control = H2Control(env);
  return h2::Flood(o);
}

// `attack` again and again, each time for up to `each` with the next of `variants`
// options, until the phase ends.
template <typename Options>
h2::Report H2InTurns(AttackEnv& env, std::vector<Options> variants, milliseconds each,
                     h2::Report (*attack)(const Options&)) {
  h2::Report all;
  for (size_t i = 0; !env.stop->load(); ++i) {
    Options o = variants[i % variants.size()];
    o.target.port = env.attacker->port();
    o.control = H2Control(env);
    o.control.duration = each;
    all.Add(attack(o));
  }
  return all;
}

void AddH2Attacks(std::vector<Attack>& attacks) {
  const auto add = [&](std::string name, std::string what,
                       std::function<h2::Report(AttackEnv&)> attack, bool without_cover = false) {
    attacks.push_back({.name = std::move(name),
                       .what = std::move(what),
                       .run = [attack](AttackEnv& env, int) { H2Count(env, attack(env)); },
                       .without_cover = without_cover,
                       .by_name = true});
  };
  const auto flood = [](h2::FloodKind kind, bool read, bool token, std::string_view path) {
    return [=](AttackEnv& env) {
      h2::Request request = H2Push(env, token);
      request.path = std::string(path);
      return H2Flood(env, kind, std::move(request), read);
    };
  };
  // Worker 3's half-sent bodies hold its own reads (4 at once) until
  // --request-read-timeout-ms cuts them, and its other pushes wait behind them: the cover's
  // too, so with a cover the rounds would wait for worker 3 as if it pushed nothing. It
  // runs without one: the rounds wait for the deadline in both phases, and the ratio
  // shows what the attack costs the honest workers.
  add(
      "h2_half_sent",
      "40 Push streams on one connection, each 1 byte short of its 8 MiB message, held (runs "
      "without the cover)",
      [](AttackEnv& env) {
        h2::HalfSentOptions o;
        o.target.port = env.attacker->port();
        o.request = H2Push(env, true);
        o.control = H2Control(env);
        return h2::HalfSentRequests(o);
      },
      /*without_cover=*/true);
  add("h2_rapid_reset", "HEADERS of a Push with worker 3's token and RST_STREAM at once, repeated",
      flood(h2::FloodKind::kRapidReset, true, true, h2::kPushPath));
  add("h2_rapid_reset_anon", "h2_rapid_reset without a token",
      flood(h2::FloodKind::kRapidReset, true, false, h2::kPushPath));
  add("h2_watch_reset", "h2_rapid_reset of Health/Watch (no token needed)",
      flood(h2::FloodKind::kRapidReset, true, false, h2::kHealthWatchPath));
  add("h2_ping_flood", "PINGs as fast as they go, a new connection when one is closed",
      flood(h2::FloodKind::kPing, true, false, h2::kPushPath));
  add("h2_settings_flood", "SETTINGS frames as fast as they go, the ACKs never read",
      flood(h2::FloodKind::kSettings, false, false, h2::kPushPath));
  add("h2_window_update_flood", "WINDOW_UPDATEs of 1 byte on the connection",
      flood(h2::FloodKind::kWindowUpdate, true, false, h2::kPushPath));
  add("h2_hpack_bomb",
      "HPACK: a 4 KB table entry referenced 16,000 times per request, 100 headers of 4 KB, a 1 "
      "MB header, in turns",
      [](AttackEnv& env) {
        std::vector<h2::HpackOptions> kinds(3);
        kinds[0].kind = h2::HpackKind::kIndexedReferences;
        kinds[1].kind = h2::HpackKind::kManyLargeHeaders;
        kinds[2].kind = h2::HpackKind::kOversizedHeader;
        kinds[2].header_bytes = 1u << 20;
        for (h2::HpackOptions& o : kinds) {
          o.request = H2Push(env, true);
          o.max_bytes = 32u << 20;
        }
        return H2InTurns(env, kinds, milliseconds(1000), &h2::HpackBomb);
      });
  add("h2_continuation",
      "HEADERS without END_HEADERS, then CONTINUATION frames (16 KB literals, or empty) up to "
      "64 MB a connection",
      [](AttackEnv& env) {
        std::vector<h2::ContinuationOptions> variants(2);
        variants[1].empty_frames = true;
        for (h2::ContinuationOptions& o : variants) {
          o.request = H2Push(env, true);
          o.max_connections = 1;
        }
        return H2InTurns(env, variants, milliseconds(1000), &h2::ContinuationFlood);
      });
  add("h2_health_watches", "40,000 Health/Watch streams without a token on 10 connections, held",
      [](AttackEnv& env) {
        h2::HealthWatchOptions o;
        o.target.port = env.attacker->port();
        o.connections = 10;
        o.streams_per_connection = 4000;
        o.control = H2Control(env);
        return h2::HealthWatches(o);
      });
  add("h2_health_bodies", "Health/Check calls without a token with 8 MB bodies, 4 at a time",
      [](AttackEnv& env) {
        h2::HealthCheckBodyOptions o;
        o.target.port = env.attacker->port();
        o.max_calls = 100000;
        o.control = H2Control(env);
        return h2::HealthCheckBodies(o);
      });
}
#endif

#if PS_HAVE_DATA_PORT_CLIENT
// ---- Attacks on the TCP data port (bench/hostile_data_phases.h) ----------------------------

void AddDataPortAttacks(std::vector<Attack>& attacks) {
  for (DataPortAttack& a : DataPortAttacks()) {
    auto run = [run = std::move(a.run)](AttackEnv& env, int thread) {
      DataPortControl c;
      c.target = [&env] { return env.attacker->data_target(); };
      c.more = [&env] { return env.more(); };
      c.stopped = [&env] { return env.stop->load(); };
      c.max_connections = env.limits->raw_connections;
      c.refused = [&env](const absl::Status& s) {
        env.tally->Count(grpc::Status(static_cast<grpc::StatusCode>(s.code()), ""));
      };
      c.unanswered = [&env](uint64_t n) { env.tally->CountOther(n); };
      c.accepted = [&env](std::string what) { env.tally->Accepted(std::move(what)); };
      c.note = [&env](std::string note) { env.tally->Note(std::move(note)); };
      run(c, thread);
    };
    attacks.push_back({.name = std::move(a.name),
                       .what = std::move(a.what),
                       .threads = a.threads,
                       .run = std::move(run),
                       .tcp_data_plane = true});
  }
}
#endif

std::vector<Attack> AllAttacks() {
  std::vector<Attack> attacks;
  attacks.push_back({"layout_wrap",
                     "RegisterLayout of one tensor of 2^64-1 elements in slices of 2^22, in a loop",
                     2, LayoutWrap, /*before_layout=*/true});
  attacks.push_back({"layout_huge",
                     "RegisterLayout of 2^24 and of 2^20 slices of one element, in a loop", 2,
                     LayoutHuge, /*before_layout=*/true});
  attacks.push_back(
      {"layout_tensors",
       "RegisterLayout of 2^16 tensors with 100-byte names (7 MB) after the layout exists, "
       "--inflight at once",
       1, LayoutTensors});
  attacks.push_back(
      {"big_messages",
       "pushes with 7 MiB payloads, --inflight at once (the bytes of layout_tensors without the "
       "tensors)",
       1, BigMessages});
  attacks.push_back({"anon_messages",
                     "big_messages without a token: a client that cannot authenticate at all", 1,
                     AnonMessages});
  attacks.push_back(
      {"codec_poison",
       "pushes for the open round under ever new codec specs with garbage payloads; worker 3's "
       "own valid pushes use new specs too",
       2, CodecPoison, false, /*poison_cover=*/true});
  attacks.push_back(
      {"pull_leak",
       "batches of 64 far-future pulls with a 50 ms deadline, and pulls that never read, held "
       "to their deadline",
       2, PullLeak, false, false, PullSlotsFree});
  attacks.push_back(
      {"impersonation",
       "Join, Push, Pull, PeerService and AdminService calls as others: no token, worker 3's, "
       "forged ones, ones derived from another secret",
       2, Impersonation});
  attacks.push_back(
      {"log_flood",
       "Join in a loop with worker 3's token, joins as workers out of range, invalid UTF-8 in "
       "string fields",
       2, LogFlood});
  attacks.push_back(
      {"junk_requests",
       "InitSlice of wrong sizes, Pull of 100,000 slice ids, a 1 MiB codec spec, round 2^64-1, "
       "worker 2^32-1, 9 MiB messages",
       1, JunkRequests});
  attacks.push_back({"udp_quorum",
                     "one datagram per slice as each round opens, nothing more of worker 3's "
                     "push (runs without the cover)",
                     1, UdpQuorum, false, false, nullptr, /*without_cover=*/true});
  attacks.push_back({"pull_slices", "pulls naming 7.6 million slice ids (7.6 MB), 8 in flight",
                     1, PullSlices});
  attacks.push_back(
      {"conn_flood",
       "connections that make one call and stay open, and TCP connections that never speak", 2,
       ConnFlood});
#if PS_HAVE_DATA_PORT_CLIENT
  AddDataPortAttacks(attacks);
#endif
#if PS_HAVE_H2_ATTACKER
  AddH2Attacks(attacks);
#endif
  return attacks;
}

// ---- One attack against a fresh server ------------------------------------------------------

struct Phase {
  double seconds = 0;
  double rounds_per_s = 0;
  uint64_t honest_errors = 0;
  double peak_rss_mib = 0;
  uint64_t peak_fds = 0;
  uint64_t log_bytes = 0;
  double server_cpu = 0;  // CPU seconds per second
  double bench_cpu = 0;   // of this process (honest workers, attacker, gRPC), the same
  uint64_t requests = 0;
};

struct Row {
  std::string attack;
  std::vector<Phase> base, attack_phases;
  Phase prelude;
  bool ran_prelude = false;
  uint64_t requests = 0, accepted = 0;
  std::map<std::string, uint64_t> refusals;
  uint64_t cover_pushed = 0, cover_refused = 0;
  std::string honest_last_error;
  AttackCheck check;
  bool has_check = false;
  std::vector<std::string> notes;
  std::string server_end;  // how the server ended
  std::string error;       // the run itself failed

  double Mean(const std::vector<Phase>& phases) const {
    double sum = 0;
    for (const Phase& p : phases) sum += p.rounds_per_s;
    return phases.empty() ? 0 : sum / double(phases.size());
  }
  double MeanCpu(const std::vector<Phase>& phases) const {
    double sum = 0;
    for (const Phase& p : phases) sum += p.server_cpu;
    return phases.empty() ? 0 : sum / double(phases.size());
  }
  std::vector<double> Ratios() const {
    std::vector<double> r;
    for (size_t i = 0; i < std::min(base.size(), attack_phases.size()); ++i) {
      r.push_back(base[i].rounds_per_s > 0 ? attack_phases[i].rounds_per_s / base[i].rounds_per_s
                                           : 0);
    }
    return r;
  }
  double Ratio() const {
    std::vector<double> r = Ratios();
    if (r.empty()) return 0;
    std::sort(r.begin(), r.end());
    return r.size() % 2 == 1 ? r[r.size() / 2] : (r[r.size() / 2 - 1] + r[r.size() / 2]) / 2;
  }
  template <typename F>
  auto Max(F field, bool with_prelude) const {
    decltype(field(Phase{})) m{};
    for (const Phase& p : attack_phases) m = std::max(m, field(p));
    if (with_prelude && ran_prelude) m = std::max(m, field(prelude));
    return m;
  }
  double PeakRss() const {
    return Max([](const Phase& p) { return p.peak_rss_mib; }, true);
  }
  double BasePeakRss() const {
    double m = 0;
    for (const Phase& p : base) m = std::max(m, p.peak_rss_mib);
    return m;
  }
  uint64_t LogBytes() const {
    uint64_t n = ran_prelude ? prelude.log_bytes : 0;
    for (const Phase& p : attack_phases) n += p.log_bytes;
    return n;
  }
  template <typename F>
  static uint64_t Sum(const std::vector<Phase>& phases, F field) {
    uint64_t n = 0;
    for (const Phase& p : phases) n += field(p);
    return n;
  }
};

class Runner {
 public:
  Runner(const HostileFlags& f, const Limits& limits, uint64_t max_shard_bytes)
      : f_(f), limits_(limits), max_shard_bytes_(max_shard_bytes) {}

  Row Run(const Attack& attack) {
    Row row;
    row.attack = attack.name;
    char dir_template[] = "/tmp/ps-bench-hostile-XXXXXX";
    const char* dir = ::mkdtemp(dir_template);
    if (dir == nullptr) {
      row.error = absl::StrCat("mkdtemp: ", std::strerror(errno));
      return row;
    }
    const std::string run_dir = dir;
    if (absl::Status st = RunIn(attack, run_dir, row); !st.ok())
      row.error = std::string(st.message());
    if (f_.keep_dirs) {
      std::fprintf(stderr, "ps-bench hostile: %s: run directory and server log kept in %s\n",
                   attack.name.c_str(), run_dir.c_str());
    } else {
      std::error_code ec;
      std::filesystem::remove_all(run_dir, ec);
    }
    return row;
  }

 private:
  absl::Status RunIn(const Attack& attack, const std::string& run_dir, Row& row) {
    const std::string port_file = run_dir + "/port", log_file = run_dir + "/server.log";
    std::vector<std::string> args = {"--host",
                                           "127.0.0.1",
                                           "--port",
                                           "0",
                                           "--port-file",
                                           port_file,
                                           "--run-dir",
                                           run_dir,
                                           "--workers",
                                           absl::StrCat(kWorkers),
                                           "--byzantine",
                                           "1",
                                           "--aggregator",
                                           "trimmed_mean",
                                           "--round-deadline-ms",
                                           absl::StrCat(f_.round_deadline_ms),
                                           "--threads",
                                           "2",
                                           "--max-shard-bytes",
                                           absl::StrCat(max_shard_bytes_),
                                           "--max-pulls-per-worker",
                                           absl::StrCat(kMaxPullsPerWorker),
                                           "--drain-timeout-ms",
                                           "1000",
                                           "--quarantine-ms",
                                           absl::StrCat(f_.quarantine_ms),
                                           "--udp-port",
                                           "0"};
    if (attack.tcp_data_plane) args.insert(args.end(), {"--data-plane", "tcp", "--data-port", "0"});
    PS_ASSIGN_OR_RETURN(std::unique_ptr<ServerProcess> server,
                        ServerProcess::Start(f_.server_bin, args, log_file));
    PS_ASSIGN_OR_RETURN(const uint16_t port, server->WaitForPort(port_file, milliseconds(20000)));
    const std::string address = absl::StrCat("127.0.0.1:", port);
    AttackerProofs::Get().Reset(address);
    std::vector<std::string> tokens;
    for (uint32_t w = 0; w < kWorkers; ++w) {
      const std::string path =
          core::TokenFilePath(run_dir, core::Identity{core::Identity::Kind::kWorker, w});
      absl::StatusOr<std::string> token = core::ReadTokenFile(path);
      for (int i = 0; i < 100 && !token.ok(); ++i) {
        std::this_thread::sleep_for(milliseconds(50));
        token = core::ReadTokenFile(path);
      }
      if (!token.ok()) return token.status();
      tokens.push_back(*token);
    }
    const core::ModelLayout layout = HonestLayout();
    Sampler sampler(server->pid());
    Attacker attacker(address, port, tokens[kAttackerId], layout.hash());
    {
      std::unique_ptr<v1::WorkerService::Stub> stub =
          v1::WorkerService::NewStub(OwnChannel(address));
      if (grpc::Status s = attacker.Join(*stub); !s.ok()) {
        return absl::InternalError(absl::StrCat("worker 3 could not join: ", s.error_message()));
      }
    }
    Tally tally;
    SpecSource specs;
    AttackEnv env{&attacker, &layout, nullptr, &tally, &limits_, &specs, nullptr};
    const auto finish = [&](absl::Status st) {
      row.requests = tally.requests();
      row.accepted = tally.accepted();
      for (int c = 1; c < kStatusCodes; ++c) {
        if (tally.code(c) > 0) row.refusals[CodeName(c)] = tally.code(c);
      }
      if (tally.code(0) > 0 && attack.name != "impersonation") {
        row.notes.push_back(absl::StrCat(tally.code(0), " requests answered OK"));
      }
      for (std::string& n : tally.notes()) row.notes.push_back(std::move(n));
      row.server_end = server->Stop(milliseconds(5000));
      return st;
    };

    if (attack.before_layout) {
      row.ran_prelude = true;
      row.prelude = RunPhase(attack, env, *server, sampler, nullptr, limits_.prelude_seconds, true);
    }
    absl::StatusOr<std::unique_ptr<Training>> training = Training::Start(address, tokens, layout);
    if (!training.ok()) return finish(training.status());
    env.training = training->get();
    std::unique_ptr<Cover> cover;
#if PS_HAVE_DATA_PORT_CLIENT
    std::unique_ptr<DataPortCover> data_cover;  // the cover of a shard on the TCP plane
    if (!f_.no_cover && !attack.without_cover && attack.tcp_data_plane) {
      const Training* t = training->get();
      data_cover = std::make_unique<DataPortCover>(
          [&attacker] { return attacker.data_target(); }, layout,
          DataPortCover::Rounds{
              .wait_open = [t](uint64_t next, milliseconds within) { return t->WaitOpen(next, within); },
              .open_version = [t] { return t->open_version(); }});
    }
#endif
    if (!f_.no_cover && !attack.without_cover && !attack.tcp_data_plane)
      cover = std::make_unique<Cover>(attacker, **training, layout, specs);
    std::this_thread::sleep_for(std::chrono::duration<double>(limits_.warmup_seconds));
    for (int a = 0; a < f_.alternations && !server->Exited(); ++a) {
      row.base.push_back(
          RunPhase(attack, env, *server, sampler, training->get(), f_.seconds, false));
      if (cover != nullptr && attack.poison_cover) cover->SetPoison(&tally);
      row.attack_phases.push_back(
          RunPhase(attack, env, *server, sampler, training->get(), f_.seconds, true));
      if (cover != nullptr) cover->SetPoison(nullptr);
      // The next baseline measures the rounds with worker 3 in them again (an attack
      // phase may have earned it a quarantine).
      if (a + 1 < f_.alternations)
        std::this_thread::sleep_for(milliseconds(f_.quarantine_ms + 300));
    }
    if (cover != nullptr) CoverCounts(*cover, row);
    cover.reset();
#if PS_HAVE_DATA_PORT_CLIENT
    if (data_cover != nullptr) CoverCounts(*data_cover, row);
    data_cover.reset();
#endif
    (*training)->Stop();
    row.honest_last_error = (*training)->last_error();
    if (attack.check && !server->Exited()) {
      std::atomic<bool> stop{false};
      env.stop = &stop;
      row.check = attack.check(env, server->pid());
      row.has_check = true;
    }
    if (server->Exited()) {
      return finish(absl::InternalError(absl::StrCat(
          "ps-server ", server->Describe(), " during the attack:\n", server->LogTail(2000))));
    }
    return finish(absl::OkStatus());
  }

  // What worker 3's cover (of either plane) pushed, into `row`.
  template <typename AnyCover>
  static void CoverCounts(const AnyCover& cover, Row& row) {
    row.cover_pushed = cover.pushed();
    row.cover_refused = cover.refused();
    if (row.cover_refused > 0)
      row.notes.push_back(absl::StrCat("worker 3's last refused push: ", cover.last_refusal()));
  }

  // One phase of `seconds`: with the attack's threads running when `attacking`.
  Phase RunPhase(const Attack& attack, AttackEnv& env, ServerProcess& server, Sampler& sampler,
                 const Training* training, double seconds, bool attacking) {
    Phase p;
    std::atomic<bool> stop{false};
    env.stop = &stop;
    env.tally->StartPhase();
    sampler.Reset();
    const uint64_t log0 = server.LogBytes();
    const double cpu0 = CpuSecondsOf(server.pid()), own_cpu0 = CpuSecondsOf(::getpid());
    const uint64_t rounds0 = training != nullptr ? training->rounds() : 0;
    const uint64_t errors0 = training != nullptr ? training->errors() : 0;
    const double t0 = NowSeconds();
    std::vector<std::thread> threads;
    if (attacking) {
      for (int i = 0; i < attack.threads; ++i)
        threads.emplace_back([&env, &attack, i] { attack.run(env, i); });
    }
    while (NowSeconds() - t0 < seconds && !server.Exited())
      std::this_thread::sleep_for(milliseconds(20));
    p.seconds = NowSeconds() - t0;
    if (training != nullptr) {
      p.rounds_per_s = double(training->rounds() - rounds0) / kHonest / p.seconds;
      p.honest_errors = training->errors() - errors0;
    }
    stop.store(true);
    for (std::thread& t : threads) t.join();
    p.requests = env.tally->phase_requests();
    p.log_bytes = server.LogBytes() - log0;
    p.server_cpu = (CpuSecondsOf(server.pid()) - cpu0) / (NowSeconds() - t0);
    p.bench_cpu = (CpuSecondsOf(::getpid()) - own_cpu0) / (NowSeconds() - t0);
    p.peak_rss_mib = sampler.peak_rss_mib();
    p.peak_fds = sampler.peak_fds();
    return p;
  }

  const HostileFlags& f_;
  const Limits& limits_;
  const uint64_t max_shard_bytes_;
};

// ---- Report ------------------------------------------------------------------------------

// `a` and `b` (JSON objects) as one object, a's members first.
std::string MergeObjects(const std::string& a, const std::string& b) {
  if (a == "{}") return b;
  if (b == "{}") return a;
  return absl::StrCat(a.substr(0, a.size() - 1), ",", b.substr(1));
}

std::string JsonArray(const std::vector<double>& values) {
  std::vector<std::string> parts;
  for (double v : values) {
    std::string one = core::JsonObjectWriter().Add("v", v).str();  // {"v":...}
    parts.push_back(one.substr(5, one.size() - 6));
  }
  return absl::StrCat("[", absl::StrJoin(parts, ","), "]");
}

std::string RowJson(const Row& r, double bound_mib) {
  core::JsonObjectWriter head, codes, tail, notes;
  head.Add("attack", r.attack)
      .Add("baseline_rounds_per_s", r.Mean(r.base))
      .Add("attack_rounds_per_s", r.Mean(r.attack_phases))
      .Add("ratio", r.Ratio())
      .Add("peak_rss_mib", r.PeakRss())
      .Add("rss_bound_mib", bound_mib)
      .Add("requests", r.requests);
  for (const auto& [code, n] : r.refusals) codes.Add(code, n);
  tail.Add("accepted", r.accepted)
      .Add("baseline_log_bytes", Row::Sum(r.base, [](const Phase& p) { return p.log_bytes; }))
      .Add("baseline_peak_rss_mib", r.BasePeakRss())
      .Add("peak_fds", r.Max([](const Phase& p) { return p.peak_fds; }, true))
      .Add("baseline_peak_fds",
           [&] {
             uint64_t m = 0;
             for (const Phase& p : r.base) m = std::max(m, p.peak_fds);
             return m;
           }())
      .Add("server_cpu_baseline", r.MeanCpu(r.base))
      .Add("server_cpu_attack", r.MeanCpu(r.attack_phases))
      .Add("bench_cpu_baseline",
           [&] {
             double s = 0;
             for (const Phase& p : r.base) s += p.bench_cpu / double(r.base.size());
             return s;
           }())
      .Add("bench_cpu_attack",
           [&] {
             double s = 0;
             for (const Phase& p : r.attack_phases)
               s += p.bench_cpu / double(r.attack_phases.size());
             return s;
           }())
      .Add("honest_errors_baseline",
           Row::Sum(r.base, [](const Phase& p) { return p.honest_errors; }))
      .Add("honest_errors_attack",
           Row::Sum(r.attack_phases, [](const Phase& p) { return p.honest_errors; }))
      .Add("prelayout_requests", r.ran_prelude ? r.prelude.requests : uint64_t{0})
      .Add("prelayout_peak_rss_mib", r.ran_prelude ? r.prelude.peak_rss_mib : 0.0)
      .Add("cover_pushes", r.cover_pushed)
      .Add("cover_refused", r.cover_refused)
      .Add("check", r.has_check ? r.check.text : "")
      .Add("check_ok", r.check.ok)
      .Add("notes", absl::StrJoin(r.notes, "; "))
      .Add("server_end", r.server_end)
      .Add("error", r.error);
  std::string json =
      MergeObjects(head.str(), absl::StrCat("{\"refusals_by_code\":", codes.str(), "}"));
  json = MergeObjects(json, core::JsonObjectWriter().Add("log_bytes", r.LogBytes()).str());
  json =
      MergeObjects(json, absl::StrCat("{\"ratio_per_alternation\":", JsonArray(r.Ratios()), "}"));
  return MergeObjects(json, tail.str());
}

std::string CodesText(const Row& r) {
  std::vector<std::string> parts;
  for (const auto& [code, n] : r.refusals) parts.push_back(absl::StrCat(code, " ", n));
  return parts.empty() ? "-" : absl::StrJoin(parts, ", ");
}

// What a row shows that the hardening promises otherwise; empty when nothing.
std::vector<std::string> Findings(const Row& r, double bound_mib) {
  std::vector<std::string> out;
  if (!r.error.empty()) out.push_back(absl::StrCat("run failed: ", r.error));
  for (const Phase& p : r.base) {
    if (p.rounds_per_s <= 0) out.push_back("honest training made no round in a baseline phase");
  }
  for (const Phase& p : r.attack_phases) {
    if (p.rounds_per_s <= 0) out.push_back("honest training made no round in an attack phase");
  }
  if (r.PeakRss() > bound_mib) {
    out.push_back(absl::StrCat("peak VmRSS ", FormatG(r.PeakRss(), 4), " MiB above the bound ",
                               bound_mib, " MiB"));
  }
  if (r.accepted > 0) out.push_back(absl::StrCat(r.accepted, " requests not refused"));
  if (r.has_check && !r.check.ok) out.push_back(r.check.text);
  if (!r.server_end.empty() && r.server_end != "exit 0")
    out.push_back(absl::StrCat("server end: ", r.server_end));
  return out;
}

int RunHostile(HostileFlags f, const GivenOptions& given) {
  spdlog::set_level(spdlog::level::err);
  const std::vector<Attack> all = AllAttacks();
  if (f.list) {
    for (const Attack& a : all) {
      std::printf("%-22s %s%s\n", a.name.c_str(), a.what.c_str(),
                  a.by_name ? " (only by name)" : "");
    }
    return 0;
  }
  Limits limits;
  if (f.quick) {
    if (given.seconds->count() == 0) f.seconds = 1;
    if (given.alternations->count() == 0) f.alternations = 1;
    limits.max_requests = 20000;
    limits.pull_batch = 32;
    limits.idle_deadline = milliseconds(500);
    limits.grpc_connections = 32;
    limits.raw_connections = 64;
    limits.prelude_seconds = 0.3;
    limits.warmup_seconds = 0.3;
    if (given.quarantine->count() == 0) f.quarantine_ms = 500;
    if (given.inflight->count() == 0) f.inflight = 2;
  }
  limits.inflight = f.inflight;
  if (f.seconds <= 0 || f.alternations < 1) {
    std::fprintf(stderr, "ps-bench hostile: need --seconds > 0 and --alternations >= 1\n");
    return 2;
  }
  absl::StatusOr<uint64_t> max_shard_bytes = ParseSize(f.max_shard_bytes);
  if (!max_shard_bytes.ok() || *max_shard_bytes == 0) {
    std::fprintf(stderr, "ps-bench hostile: bad --max-shard-bytes '%s'\n",
                 f.max_shard_bytes.c_str());
    return 2;
  }
  if (f.server_bin.empty()) {
    std::error_code ec;
    const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
    f.server_bin = ec ? "ps-server" : (self.parent_path() / "ps-server").string();
  }
  std::vector<const Attack*> chosen;
  if (f.attacks.empty()) {
    for (const Attack& a : all) {
      if (!a.by_name) chosen.push_back(&a);
    }
  } else {
    for (const std::string& text : f.attacks) {
      for (const std::string& name : SplitList(text)) {
        auto it =
            std::find_if(all.begin(), all.end(), [&](const Attack& a) { return a.name == name; });
        if (it == all.end()) {
          std::vector<std::string> names;
          for (const Attack& a : all) names.push_back(a.name);
          std::fprintf(stderr, "ps-bench hostile: unknown attack '%s'; known: %s\n", name.c_str(),
                       absl::StrJoin(names, ", ").c_str());
          return 2;
        }
        if (std::find(chosen.begin(), chosen.end(), &*it) == chosen.end()) chosen.push_back(&*it);
      }
    }
  }
  const double bound_mib = double(*max_shard_bytes) / double(1 << 20);
  std::fprintf(
      stderr,
      "ps-bench hostile: %s; a fresh server per attack (n = %u, f = 1, trimmed_mean, deadline %u "
      "ms, --quarantine-ms %u, "
      "--max-shard-bytes %s); %d x (baseline %.3g s, attack %.3g s); worker 3 %s\n",
      f.server_bin.c_str(), kWorkers, f.round_deadline_ms, f.quarantine_ms,
      FormatSize(*max_shard_bytes).c_str(), f.alternations, f.seconds, f.seconds,
      f.no_cover ? "never pushes (rounds wait for the deadline)" : "pushes every round (cover)");
  Runner runner(f, limits, *max_shard_bytes);
  Table table({"attack", "base rounds/s", "attack rounds/s", "ratio", "server CPU", "peak RSS MiB",
               "bound MiB", "requests", "log bytes", "status codes", "check"});
  std::vector<std::string> json_rows;
  int failures = 0;
  for (const Attack* attack : chosen) {
    std::fprintf(stderr, "ps-bench hostile: %s ...\n", attack->name.c_str());
    const Row r = runner.Run(*attack);
    table.AddRow({r.attack, FormatG(r.Mean(r.base), 4), FormatG(r.Mean(r.attack_phases), 4),
                  FormatG(r.Ratio(), 3),
                  absl::StrCat(FormatG(r.MeanCpu(r.base), 2), " -> ",
                               FormatG(r.MeanCpu(r.attack_phases), 2)),
                  FormatG(r.PeakRss(), 4), FormatG(bound_mib, 4), absl::StrCat(r.requests),
                  absl::StrCat(r.LogBytes()), CodesText(r), r.has_check ? r.check.text : "-"});
    json_rows.push_back(RowJson(r, bound_mib));
    for (const std::string& finding : Findings(r, bound_mib)) {
      std::fprintf(stderr, "ps-bench hostile: %s: FINDING: %s\n", r.attack.c_str(),
                   finding.c_str());
      ++failures;
    }
    for (const std::string& note : r.notes) {
      std::fprintf(stderr, "ps-bench hostile: %s: note: %s\n", r.attack.c_str(), note.c_str());
    }
    if (!r.honest_last_error.empty()) {
      std::fprintf(stderr, "ps-bench hostile: %s: last honest error: %s\n", r.attack.c_str(),
                   r.honest_last_error.c_str());
    }
  }
  table.Print(stdout);
  std::fflush(stdout);
  if (!f.json.empty()) {
    std::ofstream out(f.json, std::ios::trunc);
    out << "[\n";
    for (size_t i = 0; i < json_rows.size(); ++i)
      out << json_rows[i] << (i + 1 < json_rows.size() ? ",\n" : "\n");
    out << "]\n";
    out.close();
    if (!out) {
      std::fprintf(stderr, "ps-bench hostile: cannot write %s\n", f.json.c_str());
      return 2;
    }
  }
  return failures > 0 ? 1 : 0;
}

}  // namespace

Command AddHostileCommand(CLI::App& app) {
  auto f = std::make_shared<HostileFlags>();
  auto given = std::make_shared<GivenOptions>();
  CLI::App* sub = app.add_subcommand(
      "hostile",
      "Honest rounds per second of a real ps-server while a hostile client attacks it, against "
      "the same without the attack, alternately in the same run; peak RSS, refusals, log growth");
  given->seconds =
      sub->add_option("--seconds", f->seconds, "Seconds per phase")->capture_default_str();
  given->alternations =
      sub->add_option("--alternations", f->alternations, "Baseline + attack pairs per attack")
          ->capture_default_str();
  sub->add_option("--attacks", f->attacks,
                  "Attacks to run, comma-separated (default: all; see --list)");
  sub->add_option("--server-bin", f->server_bin,
                  "The ps-server binary (default: ps-server beside ps-bench)")
      ->option_text("PATH");
  sub->add_option("--max-shard-bytes", f->max_shard_bytes,
                  "The server's --max-shard-bytes, also the bound its peak RSS is checked against")
      ->capture_default_str();
  given->quarantine =
      sub->add_option("--quarantine-ms", f->quarantine_ms,
                      "The server's --quarantine-ms (each baseline phase waits this long after an "
                      "attack phase, so that worker 3 is out of quarantine)")
          ->capture_default_str();
  sub->add_option("--round-deadline-ms", f->round_deadline_ms, "The server's --round-deadline-ms")
      ->capture_default_str();
  given->inflight =
      sub->add_option("--inflight", f->inflight,
                      "layout_tensors and big_messages: 7 MB requests in flight at once")
          ->check(CLI::Range(1, 1024))
          ->capture_default_str();
  sub->add_flag("--no-cover", f->no_cover,
                "Worker 3 never pushes a valid gradient: every round waits for the round deadline");
  sub->add_flag("--keep-dirs", f->keep_dirs,
                "Keep each server's run directory and log (path on stderr)");
  sub->add_option("--json", f->json, "Also write one row per attack as a JSON array to FILE")
      ->option_text("FILE");
  sub->add_flag(
      "--quick", f->quick,
      "Smoke test: 1 s phases, one alternation, small counts (flags given explicitly still win)");
  sub->add_flag("--list", f->list, "Print the attacks and exit");
  return Command{.app = sub, .run = [f, given] { return RunHostile(*f, *given); }};
}

}  // namespace ps::bench
