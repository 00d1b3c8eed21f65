// Helpers for integration tests: in-process shards on ephemeral loopback ports.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
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
};

// Starts `num_shards` shards on loopback, all with `base` options (shard id, ports
// and peers filled in).
inline Cluster StartCluster(uint32_t num_shards, server::ServerOptions base) {
  Cluster c;
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
