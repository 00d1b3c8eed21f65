// Child processes for integration tests: the real ps-server binary and friends.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/data_plane.h"

extern char** environ;

namespace ps::testing {

using std::chrono::milliseconds;

// A child process whose stderr goes to a file; killed if still running at the end.
class Process {
 public:
  // `env`: NAME=VALUE entries replacing (or, with an empty value after '=', clearing)
  // those of this process's environment for the child.
  explicit Process(std::vector<std::string> args, std::vector<std::string> env = {}) {
    log_ = std::filesystem::temp_directory_path() /
           ("ps_integration_process_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++) + ".log");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> vars;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string var = *e;
      const std::string name = var.substr(0, var.find('='));
      bool replaced = false;
      for (const std::string& o : env) replaced |= o.substr(0, o.find('=')) == name;
      if (!replaced) vars.push_back(var);
    }
    for (const std::string& o : env) {
      if (o.back() != '=') vars.push_back(o);
    }
    std::vector<char*> envp;
    for (auto& v : vars) envp.push_back(v.data());
    envp.push_back(nullptr);
    EXPECT_EQ(posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), envp.data()), 0);
    posix_spawn_file_actions_destroy(&fa);
  }
  ~Process() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    std::filesystem::remove(log_);
  }

  // Waits up to `timeout` for exit; returns the exit status or -1 on timeout.
  int Wait(milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
    return -1;
  }

  void Signal(int sig) { ::kill(pid_, sig); }
  pid_t pid() const { return pid_; }
  std::string Log() const {
    std::ifstream in(log_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  static inline int counter_ = 0;
  pid_t pid_ = -1;
  bool exited_ = false;
  std::filesystem::path log_;
};

// The ps-server flags that run data plane `plane` (docs/data-plane.md): none for gRPC,
// the default; for TCP the plane on `data_port`, 0 for one the kernel picks, which the
// Join answer names (workers follow it, so a test sets only the server's side).
inline std::vector<std::string> PlaneFlags(core::DataPlane plane, uint16_t data_port = 0) {
  if (plane == core::DataPlane::kGrpc) return {};
  return {"--data-plane", std::string(core::DataPlaneName(plane)), "--data-port",
          std::to_string(data_port)};
}

inline std::string ReadPortFile(const std::string& path, milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    std::ifstream in(path);
    std::string port;
    if (in >> port) return port;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return "";
}

}  // namespace ps::testing
