// ChildProcess and LineReader (harness/child_process.h) on /bin/sh children.
#include "harness/child_process.h"

#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "harness/process_stats.h"

namespace ps::harness {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

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

// The first line(s) the child writes to its stdout pipe, waited for up to 10 s.
std::vector<std::string> FirstLines(int fd) {
  LineReader reader;
  std::vector<std::string> lines;
  for (int i = 0; i < 100 && lines.empty(); ++i) {
    pollfd pfd{fd, POLLIN, 0};
    poll(&pfd, 1, 100);
    reader.ReadAvailable(fd, lines);
  }
  return lines;
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
  const std::vector<std::string> lines = FirstLines((*child)->stdout_fd());
  ASSERT_FALSE(lines.empty());
  const pid_t grandchild = std::stoi(lines[0]);
  EXPECT_TRUE(Running(grandchild));
  (*child)->Kill();
  EXPECT_THAT((*child)->Describe(), HasSubstr("signal 9"));
  // The grandchild was reparented; give the kernel a moment to deliver SIGKILL.
  for (int i = 0; i < 100 && Running(grandchild); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(Running(grandchild));
}

TEST_F(ProcessTest, DestructorKillsARunningChild) {
  pid_t pid = 0;
  {
    auto child = ChildProcess::Spawn(Shell("sleep 300"));
    ASSERT_TRUE(child.ok()) << child.status();
    pid = (*child)->pid();
    EXPECT_TRUE(Running(pid));
  }
  EXPECT_FALSE(Running(pid));  // killed and reaped, not even a zombie
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
  ASSERT_FALSE(child.ok());
  EXPECT_EQ(child.status().code(), absl::StatusCode::kNotFound) << child.status();
  EXPECT_THAT(std::string(child.status().message()), HasSubstr("cannot run " + options.path));
}

TEST_F(ProcessTest, AnOutputFileThatCannotBeOpenedIsAnError) {
  SpawnOptions options = Shell("true");
  options.stdout_file = (dir_ / "no-such-dir" / "out.log").string();
  auto child = ChildProcess::Spawn(options);
  ASSERT_FALSE(child.ok());
  EXPECT_THAT(std::string(child.status().message()),
              HasSubstr("cannot open stdout file " + options.stdout_file));
}

TEST_F(ProcessTest, EnvironmentEntriesReplaceAndRemoveTheLaunchers) {
  ASSERT_EQ(setenv("PS_CHILD_TEST_KEPT", "kept", 1), 0);
  ASSERT_EQ(setenv("PS_CHILD_TEST_GONE", "here", 1), 0);
  ASSERT_EQ(setenv("PS_CHILD_TEST_NEW", "old", 1), 0);
  SpawnOptions options =
      Shell("echo \"$PS_CHILD_TEST_KEPT/${PS_CHILD_TEST_GONE-unset}/$PS_CHILD_TEST_NEW\"");
  options.env = {"PS_CHILD_TEST_GONE=", "PS_CHILD_TEST_NEW=new"};
  options.stdout_pipe = true;
  auto child = ChildProcess::Spawn(options);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_THAT(ReadAllLines((*child)->stdout_fd()), ElementsAre("kept/unset/new"));
}

TEST_F(ProcessTest, StopKillsAChildThatIgnoresSigterm) {
  SpawnOptions options = Shell("trap '' TERM; echo ready; while :; do sleep 0.05; done");
  options.stdout_pipe = true;
  auto child = ChildProcess::Spawn(options);
  ASSERT_TRUE(child.ok()) << child.status();
  const std::vector<std::string> lines = FirstLines((*child)->stdout_fd());
  ASSERT_THAT(lines, ElementsAre("ready"));  // the trap is set
  EXPECT_THAT((*child)->Stop(200ms), HasSubstr("did not exit within 200 ms of SIGTERM; killed"));
  EXPECT_EQ((*child)->shell_code(), 128 + SIGKILL);
}

TEST_F(ProcessTest, TheKernelKillsTheChildWhenTheSpawningThreadEnds) {
  // What a SIGKILLed launcher gets (PR_SET_PDEATHSIG): here the spawning thread ends.
  std::unique_ptr<ChildProcess> child;
  std::thread([&] {
    auto spawned = ChildProcess::Spawn(Shell("sleep 300"));
    ASSERT_TRUE(spawned.ok()) << spawned.status();
    child = *std::move(spawned);
  }).join();
  ASSERT_NE(child, nullptr);
  ASSERT_TRUE(child->WaitFor(10s));
  EXPECT_EQ(child->shell_code(), 128 + SIGKILL) << child->Describe();
}

TEST_F(ProcessTest, TheChildHoldsItsOutputFileOnlyAsStdoutAndStderr) {
  // The files the spawn opens for the child reach it as 0, 1 and 2 only, not also as the
  // descriptors they were opened on.
  SpawnOptions options = Shell("for f in /proc/$$/fd/*; do readlink \"$f\"; done");
  options.stdout_file = (dir_ / "out.log").string();
  options.stderr_file = options.stdout_file;
  auto child = ChildProcess::Spawn(options);
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_TRUE((*child)->WaitFor(10s));
  std::istringstream links(ReadFile(options.stdout_file));
  int to_log = 0;
  for (std::string line; std::getline(links, line);) to_log += line == options.stdout_file;
  EXPECT_EQ(to_log, 2) << ReadFile(options.stdout_file);  // stdout and stderr, nothing else
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
}  // namespace ps::harness
