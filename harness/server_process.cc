#include "harness/server_process.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "crypto/cluster_secret.h"
#include "core/credentials.h"
#include "server/port_file.h"

namespace ps::harness {

using std::chrono::milliseconds;

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(
    const std::string& bin, const std::vector<std::string>& args, const std::string& log_path,
    const std::vector<std::string>& env) {
  if (::access(bin.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("ps-server binary ", bin, " is not executable (",
                                            std::strerror(errno), "); pass --server-bin"));
  }
  SpawnOptions options;
  options.path = bin;
  options.args = args;
  options.env = env;
  options.stdout_file = log_path;
  options.stderr_file = log_path;
  absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Spawn(options);
  if (!child.ok()) return child.status();
  return std::unique_ptr<ServerProcess>(new ServerProcess(*std::move(child), log_path));
}

uint64_t ServerProcess::LogBytes() const {
  struct stat st {};
  return ::stat(log_path_.c_str(), &st) == 0 ? uint64_t(st.st_size) : 0;
}

std::string ServerProcess::Log() const {
  std::ifstream in(log_path_, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

std::string ServerProcess::LogTail(size_t bytes) const {
  const std::string text = Log();
  return text.size() > bytes ? text.substr(text.size() - bytes) : text;
}

absl::StatusOr<uint16_t> ServerProcess::WaitForPort(const std::string& port_file,
                                                    milliseconds timeout) {
  if (std::optional<uint16_t> port = PollPortFile(port_file, timeout, [this] { return Exited(); })) {
    return *port;
  }
  if (Exited()) {
    return absl::UnavailableError(
        absl::StrCat("ps-server ", Describe(), " before serving:\n", LogTail(2000)));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("ps-server wrote no port file in ", timeout.count(), " ms:\n", LogTail(2000)));
}

std::optional<uint16_t> PollPortFile(const std::string& path, milliseconds timeout,
                                     const std::function<bool()>& gone) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (std::optional<uint16_t> port = server::ReadPortFile(path)) return port;
    if ((gone && gone()) || std::chrono::steady_clock::now() >= until) return std::nullopt;
    std::this_thread::sleep_for(milliseconds(20));
  }
}

absl::StatusOr<std::vector<std::string>> ReadWorkerTokens(const std::string& run_dir,
                                                          uint32_t count) {
  std::vector<std::string> tokens;
  for (uint32_t w = 0; w < count; ++w) {
    const std::string path =
        crypto::TokenFilePath(run_dir, core::Identity{core::Identity::Kind::kWorker, w});
    absl::StatusOr<std::string> token = core::ReadTokenFile(path);
    for (int i = 0; i < 100 && !token.ok(); ++i) {
      std::this_thread::sleep_for(milliseconds(50));
      token = core::ReadTokenFile(path);
    }
    if (!token.ok()) return token.status();
    tokens.push_back(*token);
  }
  return tokens;
}

absl::StatusOr<std::string> MakeTempDir(const std::string& prefix) {
  std::string dir = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
  if (::mkdtemp(dir.data()) == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat("mkdtemp ", dir));
  }
  return dir;
}

}  // namespace ps::harness
