// Child processes for launchers, tests and benchmarks: spawn with redirected output and
// an edited environment, watch, signal, and always reap.
//
// A ChildProcess owns one child started in a process group of its own (so a terminal's
// Ctrl-C reaches only the launcher, which then decides) and kills and reaps it when
// destroyed, so no child outlives its owner on any return path. With
// `die_with_launcher` the kernel also SIGKILLs the child when the launcher dies, even by
// SIGKILL (PR_SET_PDEATHSIG, set between fork and exec). That signal follows the thread
// that spawned the child: spawn such children from a thread that lives as long as they
// should (the main thread).
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

namespace ps::harness {

struct SpawnOptions {
  // Executable to run (an absolute or relative path; PATH is not searched).
  std::string path;
  // Arguments after argv[0] (argv[0] is `path`).
  std::vector<std::string> args;
  // NAME=VALUE entries that replace those of this process's environment for the child;
  // "NAME=" (nothing after '=') removes NAME.
  std::vector<std::string> env;
  // Where stdout goes: a file (created or truncated) when set, else a pipe the owner
  // reads through stdout_fd() when stdout_pipe, else /dev/null.
  std::string stdout_file;
  bool stdout_pipe = false;
  // Where stderr goes: a file (the same open file when it is stdout_file), else
  // /dev/null.
  std::string stderr_file;
  // SIGKILL the child when the spawning thread ends (the launcher dies).
  bool die_with_launcher = true;
};

class ChildProcess {
 public:
  // Errors: the executable cannot be run (NOT_FOUND, PERMISSION_DENIED, with its path),
  // an output file cannot be opened, or fork fails. The child's exec is confirmed before
  // this returns.
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
  // The exit code, or 128 + the signal that ended it; nullopt while running.
  std::optional<int> shell_code() const;
  // "running", "exit 3", "killed by signal 9 (Killed)".
  std::string Describe() const;

  // Sends `signal` to the child's process group (the child and anything it started).
  void Signal(int signal);
  // Polls until the child exits or `timeout` passes; true when it exited.
  bool WaitFor(std::chrono::milliseconds timeout);
  // SIGTERM, then SIGKILL when it has not exited after `grace`; reaps it either way and
  // returns how it ended, or that it had to be killed.
  std::string Stop(std::chrono::milliseconds grace);
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

}  // namespace ps::harness
