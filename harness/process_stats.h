// Figures of a process from /proc, for tests and benchmarks that watch a server they
// started: resident memory, open descriptors, CPU time, and a sampler that keeps their
// peaks. Each figure is 0 when the process or its file is gone.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"

namespace ps::harness {

// A "Name:   123 kB" line of /proc/PID/status in bytes ("VmRSS:", "VmHWM:").
uint64_t StatusBytes(pid_t pid, const std::string& field);
inline uint64_t ResidentBytes(pid_t pid) { return StatusBytes(pid, "VmRSS:"); }
uint64_t OpenFds(pid_t pid);
// User and system CPU seconds so far, to the nanosecond (the process's CPU-time clock,
// clock_getcpuclockid); 0 for a process that is gone. (/proc/PID/stat counts whole
// clock ticks of 10 ms: a shard that served a short test showed none.)
double CpuSeconds(pid_t pid);
// Whether the process runs: exists and is neither a zombie nor dead (/proc/PID/stat
// field 3); an orphan's zombie waits for init, which may never reap it.
bool Running(pid_t pid);

// Samples a process's VmRSS and open file descriptors every 50 ms on a thread of its
// own and keeps the peaks since the last Reset(). The kernel's own peak (VmHWM, restarted
// by Reset() where allowed) also counts, so a spike between samples is not missed.
// Thread-safe.
class PeakSampler {
 public:
  explicit PeakSampler(pid_t pid);
  ~PeakSampler();
  PeakSampler(const PeakSampler&) = delete;
  PeakSampler& operator=(const PeakSampler&) = delete;

  // Starts a new peak at the current values.
  void Reset();
  uint64_t peak_rss_bytes();
  double peak_rss_mib() { return double(peak_rss_bytes()) / (1 << 20); }
  uint64_t peak_fds();

 private:
  void Sample();

  const pid_t pid_;
  std::atomic<uint64_t> peak_rss_kib_{0}, peak_fds_{0};
  std::atomic<bool> hwm_valid_{false};  // VmHWM counts from the last Reset()
  absl::Notification done_;
  std::thread thread_;
};

}  // namespace ps::harness
