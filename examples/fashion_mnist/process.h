// Child processes for the demo launcher: spawn with redirected output, watch, signal,
// and always reap.
//
// A ChildProcess owns one child started with posix_spawn in a process group of its own
// (so a terminal's Ctrl-C reaches only the launcher, which then decides) and kills and
// reaps it when destroyed, so no child outlives its owner on any return path. When a
// `guard` executable is given, the child is started through it (see RunExecGuard):
// the guard asks the kernel to SIGKILL the child if the launcher dies, even by SIGKILL.
//
// Not thread-safe: one owner thread drives a ChildProcess.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ps::fashion_mnist {

struct SpawnOptions {
  // Executable to run (an absolute or relative path; PATH is not searched).
  std::string path;
  // Arguments after argv[0] (argv[0] is `path`).
  std::vector<std::string> args;
  // Where stdout goes: a file (created or truncated) when set, else a pipe the owner
  // reads through stdout_fd() when stdout_pipe, else /dev/null.
  std::string stdout_file;
  bool stdout_pipe = false;
  // Where stderr goes: a file (appended to when it is the same as stdout_file), else
  // /dev/null.
  std::string stderr_file;
  // When set, run `guard --exec-guard <launcher pid> path args...` instead (the guard
  // arranges death with the launcher and then execs `path`).
  std::string guard;
};

// The first argument that makes a binary behave as the exec guard.
inline constexpr char kExecGuardFlag[] = "--exec-guard";

// Implements the guard side: argv = {self, "--exec-guard", parent_pid, path, args...}.
// Sets PR_SET_PDEATHSIG to SIGKILL, checks the parent is still `parent_pid`, and execs
// `path`. Returns only on failure, with the exit code to use (127).
int RunExecGuard(int argc, char** argv);

class ChildProcess {
 public:
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Spawn(const SpawnOptions& options);

  // Kills the child's process group with SIGKILL and reaps the child if it still runs.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Read end of the stdout pipe (non-blocking), or -1. Owned by this object.
  int stdout_fd() const { return stdout_fd_; }

  // Reaps the child without blocking if it has exited; true when it has.
  bool Poll();
  bool exited() const { return status_.has_value(); }
  // The exit code when it exited normally; nullopt while running or when a signal
  // ended it.
  std::optional<int> exit_code() const;
  // "running", "exit 3", "killed by signal 9 (Killed)".
  std::string Describe() const;

  // Sends `signal` to the child's process group (the child and anything it started).
  void Signal(int signal);
  // Polls until the child exits or `timeout` passes; true when it exited.
  bool WaitFor(std::chrono::milliseconds timeout);
  // SIGKILL to the group and reap (blocks until reaped, which SIGKILL makes prompt).
  void Kill();

 private:
  ChildProcess(pid_t pid, int stdout_fd) : pid_(pid), stdout_fd_(stdout_fd) {}

  pid_t pid_;
  int stdout_fd_;
  std::optional<int> status_;  // raw wait status once reaped
};

// Splits a non-blocking fd's bytes into lines. A line longer than `max_line` is cut
// into pieces of that length, so a misbehaving child cannot grow the buffer.
class LineReader {
 public:
  explicit LineReader(size_t max_line = 1 << 16) : max_line_(max_line) {}

  // Reads what `fd` has now and appends complete lines (without '\n') to `lines`.
  // Returns false once the fd reached end of file (or failed); the partial last line,
  // if any, is appended then.
  bool ReadAvailable(int fd, std::vector<std::string>& lines);

 private:
  size_t max_line_;
  std::string partial_;
};

// Directory of the running executable (from /proc/self/exe).
absl::StatusOr<std::string> SelfDirectory();

}  // namespace ps::fashion_mnist
