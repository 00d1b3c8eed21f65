#include "server/local_cluster.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "core/credentials.h"
#include "crypto/cluster_secret.h"
#include "server/server.h"

namespace ps::server {

absl::StatusOr<std::vector<uint16_t>> PickFreePorts(size_t count) {
  std::vector<int> fds;
  std::vector<uint16_t> ports;
  absl::Status status;
  for (size_t i = 0; i < count && status.ok(); ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      status = absl::ErrnoToStatus(errno, "picking a free port: socket");
      break;
    }
    fds.push_back(fd);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      status = absl::ErrnoToStatus(errno, "picking a free port: bind 127.0.0.1:0");
    } else if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      status = absl::ErrnoToStatus(errno, "picking a free port: getsockname");
    } else {
      ports.push_back(ntohs(addr.sin_port));
    }
  }
  for (int fd : fds) ::close(fd);
  if (!status.ok()) return status;
  return ports;
}

absl::StatusOr<LocalCluster> LocalCluster::Start(uint32_t num_shards, ServerOptions base,
                                                 const PortPicker& pick_ports) {
  if (num_shards == 0) return absl::InvalidArgumentError("a local cluster needs a shard");
  LocalCluster c;
  if (!base.insecure && !base.ClientAuthRequired()) {
    // Private (mkdtemp makes it 0700), as EnsurePrivateDirectory wants it.
    std::string dir = (std::filesystem::temp_directory_path() / "ps-local-cluster-XXXXXX").string();
    if (::mkdtemp(dir.data()) == nullptr) {
      return absl::ErrnoToStatus(errno, absl::StrCat("making a run directory like ", dir));
    }
    base.run_dir = dir;
    c.owns_run_dir_ = true;
  }
  c.run_dir_ = base.run_dir;
  // One shard takes any free port when it binds; several must know each other's first,
  // and a picked port another process takes in between fails that shard's listen
  // (gRPC's SO_REUSEPORT is off, server.cc): then all start again on fresh ports.
  constexpr int kAttempts = 4;
  absl::Status failed;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    std::vector<uint16_t> ports(num_shards, 0);
    if (num_shards > 1) {
      absl::StatusOr<std::vector<uint16_t>> picked = pick_ports(num_shards);
      if (!picked.ok()) return picked.status();  // `c` removes the run directory
      if (picked->size() != num_shards) {
        return absl::InternalError(
            absl::StrCat("picked ", picked->size(), " ports for ", num_shards, " shards"));
      }
      ports = *std::move(picked);
    }
    failed = c.StartShards(base, ports);
    if (failed.ok()) return c;
    c.shards_.clear();
    c.addresses_.clear();
    // Only a port taken in between is worth another try; one shard bound port 0.
    if (num_shards == 1 || !absl::IsUnavailable(failed)) break;
  }
  return failed;
}

absl::Status LocalCluster::StartShards(const ServerOptions& base,
                                       const std::vector<uint16_t>& ports) {
  const auto num_shards = static_cast<uint32_t>(ports.size());
  for (uint16_t port : ports) addresses_.push_back(absl::StrCat("127.0.0.1:", port));
  for (uint32_t i = 0; i < num_shards; ++i) {
    ServerOptions o = base;
    o.host = "127.0.0.1";
    o.port = ports[i];
    o.shard_id = static_cast<int>(i);
    o.tls_cert = absl::StrReplaceAll(base.tls_cert, {{"{shard}", absl::StrCat(i)}});
    o.tls_key = absl::StrReplaceAll(base.tls_key, {{"{shard}", absl::StrCat(i)}});
    o.num_shards = num_shards;
    if (num_shards > 1) o.peers = addresses_;
    absl::StatusOr<std::unique_ptr<Server>> started = Server::Start(o);
    if (!started.ok()) {
      return absl::Status(started.status().code(),
                          absl::StrCat("shard ", i, ": ", started.status().message()));
    }
    addresses_[i] = absl::StrCat("127.0.0.1:", (*started)->port());
    shards_.push_back(*std::move(started));
  }
  return absl::OkStatus();
}

LocalCluster::LocalCluster() = default;

LocalCluster::LocalCluster(LocalCluster&& other) noexcept
    : shards_(std::exchange(other.shards_, {})),
      addresses_(std::exchange(other.addresses_, {})),
      run_dir_(std::exchange(other.run_dir_, {})),
      owns_run_dir_(std::exchange(other.owns_run_dir_, false)) {}

LocalCluster& LocalCluster::operator=(LocalCluster&& other) noexcept {
  if (this != &other) {
    Stop();
    shards_ = std::exchange(other.shards_, {});
    addresses_ = std::exchange(other.addresses_, {});
    run_dir_ = std::exchange(other.run_dir_, {});
    owns_run_dir_ = std::exchange(other.owns_run_dir_, false);
  }
  return *this;
}

LocalCluster::~LocalCluster() { Stop(); }

Server& LocalCluster::shard(size_t i) const { return *shards_.at(i); }

absl::StatusOr<std::string> LocalCluster::WorkerToken(uint32_t id) const {
  if (run_dir_.empty()) return std::string();
  return core::ReadTokenFile(
      crypto::TokenFilePath(run_dir_, core::Identity{core::Identity::Kind::kWorker, id}));
}

void LocalCluster::Shutdown() {
  for (const std::unique_ptr<Server>& s : shards_) s->Shutdown();
}

void LocalCluster::Stop() {
  shards_.clear();
  addresses_.clear();
  if (owns_run_dir_) {
    std::error_code ignored;
    std::filesystem::remove_all(run_dir_, ignored);
  }
  run_dir_.clear();
  owns_run_dir_ = false;
}

}  // namespace ps::server
