#include "bench/server_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "bench/bench_util.h"
#include "core/cluster_secret.h"
#include "core/credentials.h"
#include "tests/support/process_stats.h"

namespace ps::bench {

using std::chrono::milliseconds;

// ---- ServerProcess ----------------------------------------------------------------

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(
    const std::string& bin, const std::vector<std::string>& args, const std::string& log_path) {
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

ServerProcess::ServerProcess(pid_t pid, std::string log_path)
    : pid_(pid), log_path_(std::move(log_path)) {}

ServerProcess::~ServerProcess() {
  if (!Exited()) {
    ::kill(pid_, SIGKILL);
    Reap(/*block=*/true);
  }
}

bool ServerProcess::Exited() {
  if (!status_.has_value()) Reap(/*block=*/false);
  return status_.has_value();
}

std::string ServerProcess::Describe() {
  if (!Exited()) return "running";
  if (WIFEXITED(*status_)) return absl::StrCat("exit ", WEXITSTATUS(*status_));
  if (WIFSIGNALED(*status_)) {
    return absl::StrCat("killed by signal ", WTERMSIG(*status_), " (",
                        strsignal(WTERMSIG(*status_)), ")");
  }
  return "ended";
}

uint64_t ServerProcess::LogBytes() const {
  struct stat st {};
  return ::stat(log_path_.c_str(), &st) == 0 ? uint64_t(st.st_size) : 0;
}

std::string ServerProcess::LogTail(size_t bytes) const {
  std::ifstream in(log_path_, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  return text.size() > bytes ? text.substr(text.size() - bytes) : text;
}

absl::StatusOr<uint16_t> ServerProcess::WaitForPort(const std::string& port_file,
                                                    milliseconds timeout) {
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

std::string ServerProcess::Stop(milliseconds timeout) {
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

void ServerProcess::Reap(bool block) {
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &status, block ? 0 : WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) status_ = status;
}

// ---- Tokens -------------------------------------------------------------------------

absl::StatusOr<std::vector<std::string>> ReadWorkerTokens(const std::string& run_dir,
                                                          uint32_t count) {
  std::vector<std::string> tokens;
  for (uint32_t w = 0; w < count; ++w) {
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
  return tokens;
}

// ---- PeakSampler ----------------------------------------------------------------------

namespace {

// VmRSS and VmHWM (the peak since the last ResetHwm) of `pid` in KiB, 0 when unreadable.
struct Rss {
  uint64_t rss_kib = 0, hwm_kib = 0;
};

Rss ReadRss(pid_t pid) {
  return {.rss_kib = testing::StatusBytes(pid, "VmRSS:") / 1024,
          .hwm_kib = testing::StatusBytes(pid, "VmHWM:") / 1024};
}

// Restarts the kernel's peak-RSS count (VmHWM) of `pid` at its current RSS; "5" touches
// nothing else (proc(5), /proc/pid/clear_refs). False where that is not allowed.
bool ResetHwm(pid_t pid) {
  std::ofstream out(absl::StrCat("/proc/", pid, "/clear_refs"));
  out << "5";
  out.close();
  return bool(out);
}

}  // namespace

PeakSampler::PeakSampler(pid_t pid) : pid_(pid) {
  Sample();
  thread_ = std::thread([this] {
    while (!done_.WaitForNotificationWithTimeout(absl::Milliseconds(50))) Sample();
  });
}

PeakSampler::~PeakSampler() {
  done_.Notify();
  thread_.join();
}

void PeakSampler::Reset() {
  const bool hwm = ResetHwm(pid_);
  const Rss r = ReadRss(pid_);
  hwm_valid_.store(hwm);
  peak_rss_kib_.store(hwm ? std::max(r.rss_kib, r.hwm_kib) : r.rss_kib);
  peak_fds_.store(testing::OpenFds(pid_));
}

double PeakSampler::peak_rss_mib() {
  Sample();
  return double(peak_rss_kib_.load()) / 1024;
}

uint64_t PeakSampler::peak_fds() {
  Sample();
  return peak_fds_.load();
}

void PeakSampler::Sample() {
  const Rss r = ReadRss(pid_);
  const uint64_t rss = hwm_valid_.load() ? std::max(r.rss_kib, r.hwm_kib) : r.rss_kib;
  const uint64_t fds = testing::OpenFds(pid_);
  uint64_t seen = peak_rss_kib_.load();
  while (rss > seen && !peak_rss_kib_.compare_exchange_weak(seen, rss)) {
  }
  seen = peak_fds_.load();
  while (fds > seen && !peak_fds_.compare_exchange_weak(seen, fds)) {
  }
}

}  // namespace ps::bench
