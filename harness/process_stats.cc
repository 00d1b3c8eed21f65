#include "harness/process_stats.h"

#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace ps::harness {

uint64_t StatusBytes(pid_t pid, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stoull(line.substr(field.size())) * 1024;
  }
  return 0;
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

double CpuSeconds(pid_t pid) {
  // The clock's id packs the pid into fewer bits than a pid_t has: a pid beyond them
  // names another clock (0x3fffffff gave this process's, as 0 does), so whether the
  // process exists is asked first.
  std::error_code ec;
  if (pid <= 0 || !std::filesystem::exists(absl::StrCat("/proc/", pid), ec)) return 0;
  clockid_t clock;
  timespec t{};
  if (::clock_getcpuclockid(pid, &clock) != 0 || ::clock_gettime(clock, &t) != 0) return 0;
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

bool Running(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(in, line)) return false;
  const size_t name_end = line.rfind(')');  // the command name may hold spaces
  if (name_end == std::string::npos || name_end + 2 >= line.size()) return false;
  const char state = line[name_end + 2];
  return state != 'Z' && state != 'X';
}

namespace {

// VmRSS and VmHWM (the peak since the last ResetHwm) of `pid` in KiB, 0 when unreadable.
struct Rss {
  uint64_t rss_kib = 0, hwm_kib = 0;
};

Rss ReadRss(pid_t pid) {
  return {.rss_kib = StatusBytes(pid, "VmRSS:") / 1024, .hwm_kib = StatusBytes(pid, "VmHWM:") / 1024};
}

// Restarts the kernel's peak-RSS count (VmHWM) of `pid` at its current RSS; "5" touches
// nothing else (proc(5), /proc/pid/clear_refs). False where that is not allowed.
bool ResetHwm(pid_t pid) {
  std::ofstream out(absl::StrCat("/proc/", pid, "/clear_refs"));
  out << "5";
  out.close();
  return bool(out);
}

void RaiseTo(std::atomic<uint64_t>& peak, uint64_t value) {
  uint64_t seen = peak.load();
  while (value > seen && !peak.compare_exchange_weak(seen, value)) {
  }
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
  peak_fds_.store(OpenFds(pid_));
}

uint64_t PeakSampler::peak_rss_bytes() {
  Sample();
  return peak_rss_kib_.load() * 1024;
}

uint64_t PeakSampler::peak_fds() {
  Sample();
  return peak_fds_.load();
}

void PeakSampler::Sample() {
  const Rss r = ReadRss(pid_);
  RaiseTo(peak_rss_kib_, hwm_valid_.load() ? std::max(r.rss_kib, r.hwm_kib) : r.rss_kib);
  RaiseTo(peak_fds_, OpenFds(pid_));
}

}  // namespace ps::harness
