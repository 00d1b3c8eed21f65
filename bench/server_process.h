// A real ps-server as a child process, for `ps-bench hostile` (docs/bench.md, "Hostile
// clients"): started with its output in a log file, waited for through the --port-file
// it writes, stopped with SIGTERM and then SIGKILL; the worker tokens it writes into its
// run directory; and the peaks of its resident memory and open descriptors, sampled on
// a thread of their own (the figures come from tests/support/process_stats.h).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"

namespace ps::bench {

// A ps-server child with stdout and stderr in a log file. The kernel kills it when this
// process dies (PR_SET_PDEATHSIG), so no server outlives a killed benchmark; that
// signal follows the forking thread, so Start() is called from the main thread only.
// The destructor kills and reaps it if it still runs. Not thread-safe, except pid().
class ServerProcess {
 public:
  // NOT_FOUND when `bin` is not executable; INTERNAL when fork fails.
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(const std::string& bin,
                                                              const std::vector<std::string>& args,
                                                              const std::string& log_path);

  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }

  // Whether the child has exited (reaps it without blocking).
  bool Exited();
  // "running", "exit 1", "killed by signal 11 (Segmentation fault)".
  std::string Describe();

  uint64_t LogBytes() const;
  // The last `bytes` bytes of the log.
  std::string LogTail(size_t bytes) const;

  // Waits for the port file; UNAVAILABLE when the child exits first, DEADLINE_EXCEEDED
  // when `timeout` passes first (each with the log's tail).
  absl::StatusOr<uint16_t> WaitForPort(const std::string& port_file,
                                       std::chrono::milliseconds timeout);

  // SIGTERM, then SIGKILL after `timeout`; returns how it ended.
  std::string Stop(std::chrono::milliseconds timeout);

 private:
  ServerProcess(pid_t pid, std::string log_path);
  void Reap(bool block);

  pid_t pid_;
  std::string log_path_;
  std::optional<int> status_;  // raw wait status once reaped
};

// The tokens of workers 0..count-1 that a server started with --run-dir `run_dir` writes
// there (core::TokenFilePath), each waited for up to 5 s; the first that cannot be read
// is the error.
absl::StatusOr<std::vector<std::string>> ReadWorkerTokens(const std::string& run_dir,
                                                          uint32_t count);

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
  double peak_rss_mib();
  uint64_t peak_fds();

 private:
  void Sample();

  const pid_t pid_;
  std::atomic<uint64_t> peak_rss_kib_{0}, peak_fds_{0};
  std::atomic<bool> hwm_valid_{false};  // VmHWM counts from the last Reset()
  absl::Notification done_;
  std::thread thread_;
};

}  // namespace ps::bench
