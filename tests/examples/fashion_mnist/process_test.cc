#include "examples/fashion_mnist/process.h"

#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::fashion_mnist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

// Running, not merely a zombie (an orphan waits for init, which may never reap it).
bool Alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z' &&
         line[paren + 2] != 'X';
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Reads the child's stdout pipe until end of file.
std::vector<std::string> ReadAllLines(int fd) {
  LineReader reader;
  std::vector<std::string> lines;
  while (true) {
    pollfd pfd{fd, POLLIN, 0};
    poll(&pfd, 1, 1000);
    if (!reader.ReadAvailable(fd, lines)) return lines;
  }
}

class ProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "process_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  SpawnOptions Shell(const std::string& script) {
    SpawnOptions options;
    options.path = "/bin/sh";
    options.args = {"-c", script};
    return options;
  }

  std::filesystem::path dir_;
};

TEST_F(ProcessTest, ReportsExitCode) {
  auto child = ChildProcess::Spawn(Shell("exit 3"));
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_TRUE((*child)->WaitFor(10s));
  EXPECT_EQ((*child)->exit_code(), 3);
  EXPECT_EQ((*child)->Describe(), "exit 3");
}

TEST_F(ProcessTest, PipesStdoutLineByLine) {
  SpawnOptions options = Shell("printf 'one\\ntwo\\nthree'");
  options.stdout_pipe = true;
  auto child = ChildProcess::Spawn(options);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_THAT(ReadAllLines((*child)->stdout_fd()), ElementsAre("one", "two", "three"));
  ASSERT_TRUE((*child)->WaitFor(10s));
  EXPECT_EQ((*child)->exit_code(), 0);
}

TEST_F(ProcessTest, WritesStdoutAndStderrToOneFile) {
  SpawnOptions options = Shell("echo out; echo err >&2");
  options.stdout_file = (dir_ / "both.log").string();
  options.stderr_file = options.stdout_file;
  auto child = ChildProcess::Spawn(options);
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_TRUE((*child)->WaitFor(10s));
  EXPECT_EQ(ReadFile(options.stdout_file), "out\nerr\n");
}

TEST_F(ProcessTest, KillEndsTheChildAndWhatItStarted) {
  // The shell starts a grandchild in the same group and reports its pid.
  SpawnOptions options = Shell("sleep 300 & echo $!; wait");
  options.stdout_pipe = true;
  auto child = ChildProcess::Spawn(options);
  ASSERT_TRUE(child.ok()) << child.status();
  LineReader reader;
  std::vector<std::string> lines;
  for (int i = 0; i < 100 && lines.empty(); ++i) {
    pollfd pfd{(*child)->stdout_fd(), POLLIN, 0};
    poll(&pfd, 1, 100);
    reader.ReadAvailable((*child)->stdout_fd(), lines);
  }
  ASSERT_FALSE(lines.empty());
  const pid_t grandchild = std::stoi(lines[0]);
  EXPECT_TRUE(Alive(grandchild));
  (*child)->Kill();
  EXPECT_THAT((*child)->Describe(), HasSubstr("signal 9"));
  // The grandchild was reparented; give the kernel a moment to deliver SIGKILL.
  for (int i = 0; i < 100 && Alive(grandchild); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(Alive(grandchild));
}

TEST_F(ProcessTest, DestructorKillsARunningChild) {
  pid_t pid = 0;
  {
    auto child = ChildProcess::Spawn(Shell("sleep 300"));
    ASSERT_TRUE(child.ok()) << child.status();
    pid = (*child)->pid();
    EXPECT_TRUE(Alive(pid));
  }
  EXPECT_FALSE(Alive(pid));  // killed and reaped, not even a zombie
}

TEST_F(ProcessTest, SignalTermLetsTheChildExitItsWay) {
  auto child = ChildProcess::Spawn(Shell("trap 'exit 0' TERM; while :; do sleep 0.05; done"));
  ASSERT_TRUE(child.ok()) << child.status();
  std::this_thread::sleep_for(200ms);  // let the shell install its trap
  (*child)->Signal(SIGTERM);
  ASSERT_TRUE((*child)->WaitFor(10s));
  EXPECT_EQ((*child)->exit_code(), 0);
}

TEST_F(ProcessTest, WaitForTimesOutOnARunningChild) {
  auto child = ChildProcess::Spawn(Shell("sleep 300"));
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_FALSE((*child)->WaitFor(50ms));
  EXPECT_EQ((*child)->Describe(), "running");
}

TEST_F(ProcessTest, MissingExecutableIsAnError) {
  SpawnOptions options;
  options.path = (dir_ / "no-such-binary").string();
  auto child = ChildProcess::Spawn(options);
  EXPECT_FALSE(child.ok());
}

TEST_F(ProcessTest, ChildDoesNotInheritTheLaunchersOtherPipes) {
  // A second child's pipe must not leak into the first child, or EOF never comes.
  SpawnOptions long_lived = Shell("sleep 300");
  long_lived.stdout_pipe = true;
  auto first = ChildProcess::Spawn(long_lived);
  ASSERT_TRUE(first.ok());
  SpawnOptions quick = Shell("echo hi");
  quick.stdout_pipe = true;
  auto second = ChildProcess::Spawn(quick);
  ASSERT_TRUE(second.ok());
  EXPECT_THAT(ReadAllLines((*second)->stdout_fd()), ElementsAre("hi"));
}

TEST(LineReader, CutsOverlongLines) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  ASSERT_EQ(write(fds[1], "abcdefgh\nxy", 11), 11);
  close(fds[1]);
  LineReader reader(4);
  std::vector<std::string> lines;
  EXPECT_FALSE(reader.ReadAvailable(fds[0], lines));
  close(fds[0]);
  EXPECT_THAT(lines, ElementsAre("abcd", "efgh", "xy"));
}

TEST(SelfDirectory, IsTheTestBinarysDirectory) {
  auto dir = SelfDirectory();
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_TRUE(std::filesystem::is_directory(*dir));
}

}  // namespace
}  // namespace ps::fashion_mnist
