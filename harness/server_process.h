// A real ps-server as a child process, for the tests, `ps-bench` and the demo: started
// with its stdout and stderr in a log file, waited for through the --port-file it writes
// (server/port_file.h), stopped with SIGTERM and then SIGKILL; the tokens it writes into
// its run directory; and scratch directories for both.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "harness/child_process.h"

namespace ps::harness {

// A ps-server child (see ChildProcess: it dies with the thread that started it). The
// destructor kills and reaps it if it still runs; the log file stays. Not thread-safe,
// except pid().
class ServerProcess {
 public:
  // `env` as SpawnOptions::env. NOT_FOUND when `bin` is not executable (naming it and
  // --server-bin, the flag the benchmarks and the demo take it from).
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(
      const std::string& bin, const std::vector<std::string>& args, const std::string& log_path,
      const std::vector<std::string>& env = {});

  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  pid_t pid() const { return child_->pid(); }
  const std::string& log_path() const { return log_path_; }
  ChildProcess& child() { return *child_; }

  // Whether the child has exited (reaps it without blocking).
  bool Exited() { return child_->Poll(); }
  // "running", "exit 1", "killed by signal 11 (Segmentation fault)".
  std::string Describe() {
    child_->Poll();
    return child_->Describe();
  }

  uint64_t LogBytes() const;
  std::string Log() const;
  // The last `bytes` bytes of the log.
  std::string LogTail(size_t bytes) const;

  // Waits for the port file; UNAVAILABLE when the child exits first, DEADLINE_EXCEEDED
  // when `timeout` passes first (each with the log's tail).
  absl::StatusOr<uint16_t> WaitForPort(const std::string& port_file,
                                       std::chrono::milliseconds timeout);

  // SIGTERM, then SIGKILL after `timeout`; returns how it ended.
  std::string Stop(std::chrono::milliseconds timeout) { return child_->Stop(timeout); }

 private:
  ServerProcess(std::unique_ptr<ChildProcess> child, std::string log_path)
      : child_(std::move(child)), log_path_(std::move(log_path)) {}

  std::unique_ptr<ChildProcess> child_;
  std::string log_path_;
};

// The port in the --port-file at `path` (server/port_file.h), polled every 20 ms until
// it holds one; nullopt once `timeout` passed or `gone()` (when given) says the server
// that would write it has exited.
std::optional<uint16_t> PollPortFile(const std::string& path, std::chrono::milliseconds timeout,
                                     const std::function<bool()>& gone = {});

// The tokens of workers 0..count-1 that a server started with --run-dir `run_dir` writes
// there (crypto::TokenFilePath), each waited for up to 5 s; the first that cannot be read
// is the error.
absl::StatusOr<std::vector<std::string>> ReadWorkerTokens(const std::string& run_dir,
                                                          uint32_t count);

// A new empty directory under the system's temporary directory, named `prefix`-XXXXXX.
absl::StatusOr<std::string> MakeTempDir(const std::string& prefix);

}  // namespace ps::harness
