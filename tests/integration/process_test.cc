// The real ps-server binary: start-up refusals, serving a worker, SIGTERM drain.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "worker_lib/worker.h"

extern char** environ;

namespace ps {
namespace {

using ::testing::HasSubstr;
using std::chrono::milliseconds;

// A child process whose stderr goes to a file; killed if still running at the end.
class Process {
 public:
  explicit Process(std::vector<std::string> args) {
    log_ = std::filesystem::temp_directory_path() /
           ("ps_process_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++) + ".log");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    EXPECT_EQ(posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ), 0);
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

std::string ReadPortFile(const std::string& path, milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    std::ifstream in(path);
    std::string port;
    if (in >> port) return port;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return "";
}

TEST(ProcessTest, RefusesAnImpossibleRuleAtStartUp) {
  Process p({PS_SERVER_BINARY, "--aggregator", "krum", "--workers", "6", "--byzantine", "2",
             "--port", "0"});
  EXPECT_NE(p.Wait(milliseconds(10000)), 0);
  EXPECT_THAT(p.Log(), HasSubstr("2f + 3"));
}

TEST(ProcessTest, RefusesUnknownFlagWithExitCode2) {
  Process p({PS_SERVER_BINARY, "--no-such-flag"});
  EXPECT_EQ(p.Wait(milliseconds(10000)), 2);
  EXPECT_THAT(p.Log(), HasSubstr("no-such-flag"));
}

TEST(ProcessTest, ServesAWorkerAndDrainsOnSigterm) {
  const std::string port_file = (std::filesystem::temp_directory_path() /
                                 ("ps_port_" + std::to_string(::getpid()))).string();
  std::filesystem::remove(port_file);
  Process server({PS_SERVER_BINARY, "--port", "0", "--port-file", port_file, "--workers", "1",
                  "--lr", "1", "--momentum", "0", "--drain-timeout-ms", "3000"});
  const std::string port = ReadPortFile(port_file, milliseconds(15000));
  ASSERT_FALSE(port.empty()) << server.Log();
  std::filesystem::remove(port_file);

  auto layout = *core::ModelLayout::Create({{"w", 3, 0}}, 128, 1);
  WorkerOptions wo;
  wo.shard_addresses = {"127.0.0.1:" + port};
  wo.max_attempts = 1;
  std::vector<float> init = {1, 2, 3};
  std::vector<std::span<const float>> spans = {init};
  auto worker = Worker::Start(wo, layout, spans);
  ASSERT_TRUE(worker.ok()) << worker.status();
  std::vector<float> w(3);
  ASSERT_TRUE((*worker)->Pull(0, 0, w, milliseconds(5000)).ok());
  ASSERT_TRUE((*worker)->Push(0, 0, std::vector<float>{1, 1, 1}).ok());
  ASSERT_TRUE((*worker)->WaitPushes().ok());
  ASSERT_TRUE((*worker)->Pull(0, 1, w, milliseconds(5000)).ok());
  EXPECT_EQ(w, (std::vector<float>{0, 1, 2}));

  // A pull waiting for a version that never comes is ended by the drain.
  std::thread waiter([&] {
    std::vector<float> out(3);
    auto v = (*worker)->Pull(0, 5, out, milliseconds(20000));
    EXPECT_FALSE(v.ok());
  });
  std::this_thread::sleep_for(milliseconds(200));
  server.Signal(SIGTERM);
  EXPECT_EQ(server.Wait(milliseconds(15000)), 0) << server.Log();
  waiter.join();
  EXPECT_THAT(server.Log(), HasSubstr("SIGTERM"));
}

}  // namespace
}  // namespace ps
