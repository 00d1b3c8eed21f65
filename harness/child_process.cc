#include "harness/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace ps::harness {
namespace {

// Closes an fd on scope exit unless released.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// This process's environment with `overrides` applied (SpawnOptions::env).
std::vector<std::string> ChildEnvironment(const std::vector<std::string>& overrides) {
  auto name_of = [](const std::string& var) { return var.substr(0, var.find('=')); };
  std::vector<std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string var = *e;
    bool replaced = false;
    for (const std::string& o : overrides) replaced |= name_of(o) == name_of(var);
    if (!replaced) vars.push_back(var);
  }
  for (const std::string& o : overrides) {
    if (!o.empty() && o.back() != '=') vars.push_back(o);
  }
  return vars;
}

// What the child reports through the exec pipe when a step before exec fails.
struct ChildFailure {
  int step;  // 0: stdout file, 1: stderr file, 2: exec
  int error;
};

// The child's side, between fork and exec: async-signal-safe calls only (the launcher
// may have threads that hold locks). Never returns.
[[noreturn]] void RunChild(char* const* argv, char* const* envp, const char* stdout_file,
                           int stdout_pipe, const char* stderr_file, bool same_file,
                           bool die_with_launcher, pid_t launcher, int report_fd) {
  auto fail = [report_fd](int step) {
    const ChildFailure f{step, errno};
    [[maybe_unused]] ssize_t ignored = write(report_fd, &f, sizeof(f));
    _exit(127);
  };
  if (die_with_launcher) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    // The launcher may have died between the fork and the prctl above.
    if (getppid() != launcher) _exit(127);
  }
  setpgid(0, 0);
  // Default dispositions and an empty mask, whatever the launcher set.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGCHLD}) sigaction(sig, &dfl, nullptr);
  sigset_t empty;
  sigemptyset(&empty);
  sigprocmask(SIG_SETMASK, &empty, nullptr);

  // Each file is opened close-on-exec and dup2'd onto 0, 1 or 2 (dup2 clears the flag
  // on the copy), so the child gets those three and no stray descriptor of them.
  const int null_in = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_in >= 0) dup2(null_in, STDIN_FILENO);
  constexpr int kCreate = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  int out = -1;
  if (stdout_file != nullptr) {
    out = open(stdout_file, kCreate, 0644);
    if (out < 0) fail(0);
  } else if (stdout_pipe >= 0) {
    out = stdout_pipe;
  } else {
    out = open("/dev/null", O_WRONLY | O_CLOEXEC);
  }
  if (out >= 0) dup2(out, STDOUT_FILENO);
  if (same_file) {
    dup2(STDOUT_FILENO, STDERR_FILENO);
  } else {
    const int err = stderr_file != nullptr ? open(stderr_file, kCreate, 0644)
                                           : open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (err < 0) fail(1);
    dup2(err, STDERR_FILENO);
  }
  execve(argv[0], argv, envp);
  fail(2);
  _exit(127);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Spawn(const SpawnOptions& options) {
  // Everything the child needs is made before the fork.
  std::vector<std::string> argv_strings = {options.path};
  argv_strings.insert(argv_strings.end(), options.args.begin(), options.args.end());
  std::vector<char*> argv;
  for (std::string& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings = ChildEnvironment(options.env);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  const bool pipe_stdout = options.stdout_file.empty() && options.stdout_pipe;
  const bool same_file = !options.stderr_file.empty() && options.stderr_file == options.stdout_file;

  int out_pipe[2] = {-1, -1};
  if (pipe_stdout && pipe2(out_pipe, O_CLOEXEC) != 0) return absl::ErrnoToStatus(errno, "pipe2");
  FdCloser read_end(out_pipe[0]), write_end(out_pipe[1]);
  int report[2] = {-1, -1};
  if (pipe2(report, O_CLOEXEC) != 0) return absl::ErrnoToStatus(errno, "pipe2");
  FdCloser report_read(report[0]), report_write(report[1]);

  const pid_t launcher = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::ErrnoToStatus(errno, "fork");
  if (pid == 0) {
    RunChild(argv.data(), envp.data(),
             options.stdout_file.empty() ? nullptr : options.stdout_file.c_str(), write_end.get(),
             options.stderr_file.empty() ? nullptr : options.stderr_file.c_str(), same_file,
             options.die_with_launcher, launcher, report_write.get());
  }
  // The parent's copy of the pipe's write end closes so that the child's exec (which
  // closes its copy) ends the read below.
  close(report_write.release());
  close(write_end.release());
  // Either way the group exists before anyone signals it (the child sets it too).
  setpgid(pid, pid);

  ChildFailure failure{};
  ssize_t got;
  do {
    got = read(report_read.get(), &failure, sizeof(failure));
  } while (got < 0 && errno == EINTR);
  std::unique_ptr<ChildProcess> child(new ChildProcess(pid, -1));
  if (got == static_cast<ssize_t>(sizeof(failure))) {
    child->Kill();  // reaps it
    constexpr const char* kSteps[] = {"cannot open stdout file ", "cannot open stderr file ",
                                      "cannot run "};
    const std::string& what = failure.step == 0   ? options.stdout_file
                              : failure.step == 1 ? options.stderr_file
                                                  : options.path;
    return absl::ErrnoToStatus(failure.error, absl::StrCat(kSteps[failure.step % 3], what));
  }
  if (pipe_stdout) {
    child->stdout_fd_ = read_end.release();
    fcntl(child->stdout_fd_, F_SETFL, fcntl(child->stdout_fd_, F_GETFL) | O_NONBLOCK);
  }
  return child;
}

ChildProcess::~ChildProcess() {
  if (!status_) Kill();
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

bool ChildProcess::Poll() {
  if (status_) return true;
  int status = 0;
  pid_t got;
  do {
    got = waitpid(pid_, &status, WNOHANG);
  } while (got < 0 && errno == EINTR);
  if (got == pid_) {
    status_ = status;
    // Anything the child left in its group goes with it.
    kill(-pid_, SIGKILL);
    return true;
  }
  return false;
}

std::optional<int> ChildProcess::exit_code() const {
  if (!status_ || !WIFEXITED(*status_)) return std::nullopt;
  return WEXITSTATUS(*status_);
}

std::optional<int> ChildProcess::shell_code() const {
  if (!status_) return std::nullopt;
  if (WIFEXITED(*status_)) return WEXITSTATUS(*status_);
  if (WIFSIGNALED(*status_)) return 128 + WTERMSIG(*status_);
  return 255;
}

std::string ChildProcess::Describe() const {
  if (!status_) return "running";
  if (WIFEXITED(*status_)) return absl::StrCat("exit ", WEXITSTATUS(*status_));
  if (WIFSIGNALED(*status_)) {
    const int sig = WTERMSIG(*status_);
    return absl::StrCat("killed by signal ", sig, " (", strsignal(sig), ")");
  }
  return absl::StrCat("wait status ", *status_);
}

void ChildProcess::Signal(int signal) {
  if (!status_) kill(-pid_, signal);
}

bool ChildProcess::WaitFor(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!Poll()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

std::string ChildProcess::Stop(std::chrono::milliseconds grace) {
  Signal(SIGTERM);
  if (WaitFor(grace)) return Describe();
  Kill();
  return absl::StrCat("did not exit within ", grace.count(), " ms of SIGTERM; killed");
}

void ChildProcess::Kill() {
  if (status_) return;
  kill(-pid_, SIGKILL);
  kill(pid_, SIGKILL);  // in case it left its group
  int status = 0;
  pid_t got;
  do {
    got = waitpid(pid_, &status, 0);
  } while (got < 0 && errno == EINTR);
  status_ = got == pid_ ? status : -1;
}

bool LineReader::ReadAvailable(int fd, std::vector<std::string>& lines) {
  char buffer[4096];
  while (true) {
    const ssize_t got = read(fd, buffer, sizeof(buffer));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (got <= 0) {
      if (!partial_.empty()) lines.push_back(std::exchange(partial_, {}));
      return false;
    }
    for (ssize_t i = 0; i < got; ++i) {
      if (buffer[i] == '\n') {
        lines.push_back(std::exchange(partial_, {}));
      } else {
        if (partial_.size() >= max_line_) lines.push_back(std::exchange(partial_, {}));
        partial_.push_back(buffer[i]);
      }
    }
  }
}

absl::StatusOr<std::string> SelfDirectory() {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) {
    return absl::NotFoundError(absl::StrCat("/proc/self/exe: ", error.message()));
  }
  return self.parent_path().string();
}

}  // namespace ps::harness
