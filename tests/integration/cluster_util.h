// Helpers for integration tests: in-process shards on ephemeral loopback ports.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "core/cluster_secret.h"
#include "core/credentials.h"
#include "server/server.h"

namespace ps::testing {

// A free TCP port on 127.0.0.1 (bound and released; the kernel does not hand it out
// again right away).
inline uint16_t PickFreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

struct Cluster {
  std::vector<std::unique_ptr<server::Server>> shards;
  std::vector<std::string> addresses;
  // The shards' run directory when they authenticate the default way (a temporary one,
  // removed with the Cluster); empty otherwise.
  std::string run_dir;

  Cluster() = default;
  Cluster(Cluster&&) = default;
  Cluster& operator=(Cluster&&) = default;
  ~Cluster() {
    shards.clear();
    if (!run_dir.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(run_dir, ignored);
    }
  }

  // The token of worker `id` from the run directory ("" without one).
  std::string WorkerToken(uint32_t id) const {
    if (run_dir.empty()) return "";
    absl::StatusOr<std::string> token = core::ReadTokenFile(
        core::TokenFilePath(run_dir, core::Identity{core::Identity::Kind::kWorker, id}));
    EXPECT_TRUE(token.ok()) << token.status();
    return token.value_or("");
  }
};

// Starts `num_shards` shards on loopback, all with `base` options (shard id, ports
// and peers filled in). Unless `base` says how to authenticate (or is insecure), the
// shards use a fresh run directory, as ps-server does by default: clients then need
// Cluster::WorkerToken.
inline Cluster StartCluster(uint32_t num_shards, server::ServerOptions base) {
  Cluster c;
  if (!base.insecure && !base.ClientAuthRequired()) {
    c.run_dir = (std::filesystem::temp_directory_path() / "ps-test-run-XXXXXX").string();
    EXPECT_NE(mkdtemp(c.run_dir.data()), nullptr);
    base.run_dir = c.run_dir;
  }
  std::vector<uint16_t> ports;
  for (uint32_t i = 0; i < num_shards; ++i) {
    ports.push_back(PickFreePort());
    c.addresses.push_back(absl::StrCat("127.0.0.1:", ports.back()));
  }
  for (uint32_t i = 0; i < num_shards; ++i) {
    server::ServerOptions o = base;
    o.host = "127.0.0.1";
    o.port = ports[i];
    o.shard_id = static_cast<int>(i);
    o.num_shards = num_shards;
    if (num_shards > 1) o.peers = c.addresses;
    auto s = server::Server::Start(o);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return c;
    c.shards.push_back(*std::move(s));
  }
  return c;
}

}  // namespace ps::testing
