// Child processes for integration tests: the real ps-server binary and friends, started
// through the harness (harness/child_process.h) with their stderr in a log file.
#pragma once

#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/data_plane.h"
#include "harness/child_process.h"
#include "harness/server_process.h"

namespace ps::testing {

using std::chrono::milliseconds;

// A child process (args[0] is the executable) whose stderr (and with `with_stdout` its
// stdout too) goes to a file; killed if still running at the end. A failure to start is
// a test failure.
class Process {
 public:
  // `env`: NAME=VALUE entries replacing (or, with an empty value after '=', clearing)
  // those of this process's environment for the child.
  explicit Process(std::vector<std::string> args, std::vector<std::string> env = {},
                   bool with_stdout = false) {
    log_ = std::filesystem::temp_directory_path() /
           ("ps_integration_process_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++) + ".log");
    harness::SpawnOptions options;
    options.path = args.at(0);
    options.args.assign(args.begin() + 1, args.end());
    options.env = std::move(env);
    options.stderr_file = log_.string();
    if (with_stdout) options.stdout_file = log_.string();
    absl::StatusOr<std::unique_ptr<harness::ChildProcess>> child = harness::ChildProcess::Spawn(options);
    EXPECT_TRUE(child.ok()) << child.status();
    if (child.ok()) child_ = *std::move(child);
  }
  ~Process() {
    child_.reset();  // kills and reaps it if it still runs
    std::filesystem::remove(log_);
  }

  // Waits up to `timeout` for exit; returns the exit status (128 + the signal when one
  // ended it) or -1 on timeout.
  int Wait(milliseconds timeout) {
    if (child_ == nullptr || !child_->WaitFor(timeout)) return -1;
    return *child_->shell_code();
  }

  void Signal(int sig) {
    if (child_ != nullptr) child_->Signal(sig);
  }
  pid_t pid() const { return child_ != nullptr ? child_->pid() : -1; }
  std::string Log() const {
    std::ifstream in(log_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  static inline int counter_ = 0;
  std::unique_ptr<harness::ChildProcess> child_;
  std::filesystem::path log_;
};

// The ps-server flags that run data plane `plane` (docs/data-plane.md), named even for
// TCP, the default; for TCP the plane on `data_port`, 0 for one the kernel picks, which
// the Join answer names (workers follow it, so a test sets only the server's side).
inline std::vector<std::string> PlaneFlags(core::DataPlane plane, uint16_t data_port = 0) {
  if (plane == core::DataPlane::kGrpc) return {"--data-plane", "grpc"};
  return {"--data-plane", std::string(core::DataPlaneName(plane)), "--data-port",
          std::to_string(data_port)};
}

// The port a shard wrote to --port-file `path` (harness::PollPortFile), waited for up
// to `timeout`; "" when none came.
inline std::string ReadPortFile(const std::string& path, milliseconds timeout) {
  const std::optional<uint16_t> port = harness::PollPortFile(path, timeout);
  return port ? std::to_string(*port) : "";
}

}  // namespace ps::testing
