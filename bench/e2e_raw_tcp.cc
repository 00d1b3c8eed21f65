#include "bench/e2e_raw_tcp.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <latch>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "bench/bench_util.h"
#include "core/status.h"

namespace ps::bench {
namespace {

struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd, o.fd);
    return *this;
  }
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

absl::Status SendAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::send(fd, p, std::min<size_t>(n, 1u << 20), MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return Errno("send");
    p += k;
    n -= size_t(k);
  }
  return absl::OkStatus();
}

absl::Status RecvAll(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0) return absl::InternalError("recv: connection closed early");
    if (k < 0) return Errno("recv");
    p += k;
    n -= size_t(k);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RawResult> RunRawTcp(int workers, const std::vector<uint64_t>& shard_bytes,
                                    int rounds, const std::vector<char>& source, bool one_copy) {
  Fd listener(::socket(AF_INET, SOCK_STREAM, 0));
  if (listener.fd < 0) return Errno("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(listener.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return Errno("bind");
  socklen_t len = sizeof(addr);
  if (::getsockname(listener.fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return Errno("getsockname");
  if (::listen(listener.fd, 1024) != 0) return Errno("listen");
  const size_t shards = shard_bytes.size();
  const size_t n = size_t(workers) * shards;
  std::vector<Fd> clients, servers;
  for (size_t c = 0; c < n; ++c) {
    Fd client(::socket(AF_INET, SOCK_STREAM, 0));
    if (client.fd < 0) return Errno("socket");
    if (::connect(client.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return Errno("connect");
    Fd server(::accept(listener.fd, nullptr, nullptr));
    if (server.fd < 0) return Errno("accept");
    const int one = 1;  // as gRPC does
    ::setsockopt(client.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ::setsockopt(server.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    clients.push_back(std::move(client));
    servers.push_back(std::move(server));
  }
  // Where each shard's share starts in the worker's buffer.
  std::vector<uint64_t> offset(shards + 1, 0);
  for (size_t s = 0; s < shards; ++s) offset[s + 1] = offset[s] + shard_bytes[s];
  std::vector<std::vector<char>> pulled(static_cast<size_t>(workers));
  for (std::vector<char>& p : pulled) p.resize(offset[shards]);
  std::vector<std::vector<char>> received(n);
  for (size_t c = 0; c < n; ++c) received[c].resize(shard_bytes[c % shards]);
  // one_copy: each side also copies what it sends and what it receives once in user
  // space, as a parameter server must at the least (the worker encodes its gradient
  // and copies the pulled values into its caller's buffers; the shard decodes each push
  // into the round's row, whose result it sends).
  std::vector<std::vector<char>> staged(one_copy ? n : 0), inbox(one_copy ? n : 0),
      rows(one_copy ? n : 0);
  for (size_t c = 0; one_copy && c < n; ++c) {
    staged[c].resize(shard_bytes[c % shards]);
    inbox[c].resize(shard_bytes[c % shards]);
    rows[c].resize(shard_bytes[c % shards]);
  }
  std::vector<absl::Status> errors(2 * n);
  // One untimed round first, as the cluster gets: the buffers' pages are faulted in and
  // the connections' windows open before the clock starts.
  std::latch warm(std::ptrdiff_t(2 * n) + 1);
  std::latch go(1);
  std::vector<std::thread> threads;
  for (size_t c = 0; c < n; ++c) {
    const size_t w = c / shards, s = c % shards;
    threads.emplace_back([&, c, w, s] {  // the worker side
      bool warmed = false;
      for (int r = -1; r < rounds && errors[c].ok(); ++r) {
        if (r == 0) {
          warmed = true;
          warm.count_down();
          go.wait();
        }
        if (!one_copy) {
          errors[c] = SendAll(clients[c].fd, source.data() + offset[s], shard_bytes[s]);
          if (errors[c].ok()) errors[c] = RecvAll(clients[c].fd, pulled[w].data() + offset[s], shard_bytes[s]);
          continue;
        }
        std::memcpy(staged[c].data(), source.data() + offset[s], shard_bytes[s]);
        errors[c] = SendAll(clients[c].fd, staged[c].data(), shard_bytes[s]);
        if (errors[c].ok()) errors[c] = RecvAll(clients[c].fd, inbox[c].data(), shard_bytes[s]);
        if (errors[c].ok()) std::memcpy(pulled[w].data() + offset[s], inbox[c].data(), shard_bytes[s]);
      }
      if (!warmed) warm.count_down();  // failed in the warm-up: do not hold the start
      if (!errors[c].ok()) ::shutdown(clients[c].fd, SHUT_RDWR);
    });
    threads.emplace_back([&, c] {  // the shard side
      bool warmed = false;
      for (int r = -1; r < rounds && errors[n + c].ok(); ++r) {
        if (r == 0) {
          warmed = true;
          warm.count_down();
          go.wait();
        }
        errors[n + c] = RecvAll(servers[c].fd, received[c].data(), received[c].size());
        if (!errors[n + c].ok()) continue;
        const char* out = received[c].data();
        if (one_copy) {
          std::memcpy(rows[c].data(), received[c].data(), received[c].size());
          out = rows[c].data();
        }
        errors[n + c] = SendAll(servers[c].fd, out, received[c].size());
      }
      if (!warmed) warm.count_down();
      if (!errors[n + c].ok()) ::shutdown(servers[c].fd, SHUT_RDWR);
    });
  }
  warm.arrive_and_wait();
  const double cpu0 = ProcessCpuSeconds(), t0 = NowSeconds();
  go.count_down();
  for (std::thread& t : threads) t.join();
  RawResult result{NowSeconds() - t0, ProcessCpuSeconds() - cpu0};
  for (const absl::Status& st : errors) PS_RETURN_IF_ERROR(st);
  return result;
}

}  // namespace ps::bench
