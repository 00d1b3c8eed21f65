#include "examples/fashion_mnist/process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace ps::fashion_mnist {
namespace {

absl::Status Errno(absl::string_view what, int error) { return absl::ErrnoToStatus(error, what); }

// Closes an fd on scope exit unless released.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// RAII for the two posix_spawn attribute objects.
struct SpawnAttributes {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  SpawnAttributes() {
    posix_spawn_file_actions_init(&actions);
    posix_spawnattr_init(&attr);
  }
  ~SpawnAttributes() {
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
  }
  SpawnAttributes(const SpawnAttributes&) = delete;
  SpawnAttributes& operator=(const SpawnAttributes&) = delete;
};

}  // namespace

int RunExecGuard(int argc, char** argv) {
  // argv: self, --exec-guard, parent pid, path, args...
  if (argc < 4) {
    std::fprintf(stderr, "%s: usage: %s <parent pid> <path> [args...]\n", argv[0], kExecGuardFlag);
    return 127;
  }
  const long parent = std::strtol(argv[2], nullptr, 10);
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
    std::fprintf(stderr, "exec guard: prctl: %s\n", std::strerror(errno));
    return 127;
  }
  // The launcher may have died between the spawn and the prctl above.
  if (getppid() != static_cast<pid_t>(parent)) return 127;
  execv(argv[3], argv + 3);
  std::fprintf(stderr, "exec guard: cannot run %s: %s\n", argv[3], std::strerror(errno));
  return 127;
}

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Spawn(const SpawnOptions& options) {
  std::vector<std::string> argv_strings;
  if (!options.guard.empty()) {
    argv_strings = {options.guard, kExecGuardFlag, std::to_string(getpid())};
  }
  argv_strings.push_back(options.path);
  argv_strings.insert(argv_strings.end(), options.args.begin(), options.args.end());
  std::vector<char*> argv;
  for (std::string& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);

  SpawnAttributes spawn;
  posix_spawn_file_actions_addopen(&spawn.actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);

  int pipe_fds[2] = {-1, -1};
  if (options.stdout_file.empty() && options.stdout_pipe) {
    if (pipe2(pipe_fds, O_CLOEXEC) != 0) return Errno("pipe2", errno);
  }
  FdCloser read_end(pipe_fds[0]);
  FdCloser write_end(pipe_fds[1]);

  const int kCreate = O_WRONLY | O_CREAT | O_TRUNC;
  if (!options.stdout_file.empty()) {
    posix_spawn_file_actions_addopen(&spawn.actions, STDOUT_FILENO, options.stdout_file.c_str(),
                                     kCreate, 0644);
  } else if (options.stdout_pipe) {
    // dup2 clears close-on-exec on the child's copy; both pipe ends close at exec.
    posix_spawn_file_actions_adddup2(&spawn.actions, pipe_fds[1], STDOUT_FILENO);
  } else {
    posix_spawn_file_actions_addopen(&spawn.actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  }
  if (!options.stderr_file.empty() && options.stderr_file == options.stdout_file) {
    posix_spawn_file_actions_adddup2(&spawn.actions, STDOUT_FILENO, STDERR_FILENO);
  } else if (!options.stderr_file.empty()) {
    posix_spawn_file_actions_addopen(&spawn.actions, STDERR_FILENO, options.stderr_file.c_str(),
                                     kCreate, 0644);
  } else {
    posix_spawn_file_actions_addopen(&spawn.actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  }

  // Own process group; default dispositions and an empty mask whatever the launcher set.
  sigset_t defaults;
  sigemptyset(&defaults);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGCHLD}) sigaddset(&defaults, sig);
  sigset_t empty;
  sigemptyset(&empty);
  posix_spawnattr_setpgroup(&spawn.attr, 0);
  posix_spawnattr_setsigdefault(&spawn.attr, &defaults);
  posix_spawnattr_setsigmask(&spawn.attr, &empty);
  posix_spawnattr_setflags(&spawn.attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);

  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &spawn.actions, &spawn.attr, argv.data(), environ);
  if (rc != 0) return Errno(absl::StrCat("posix_spawn ", argv_strings[0]), rc);

  int stdout_fd = -1;
  if (read_end.release() >= 0) {
    stdout_fd = pipe_fds[0];
    fcntl(stdout_fd, F_SETFL, fcntl(stdout_fd, F_GETFL) | O_NONBLOCK);
  }
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid, stdout_fd));
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

}  // namespace ps::fashion_mnist
