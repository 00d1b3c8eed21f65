// A training binary's first steps, built outside the ps-server tree against an installed
// prefix (tests/install/consumer_test.sh: once with find_package(PsServer), once with
// pkg-config). Needs no server: it cuts a layout, has Worker::Start refuse bad options,
// and has it fail to reach a loopback port that refuses connections. Exits 0 when every
// step behaves as documented in worker_lib/worker.h, 1 otherwise.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "worker_lib/worker.h"

namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "consumer: FAILED: %s\n", what.c_str());
  return 1;
}

// A loopback port that refuses connections: bound, so that nothing else takes it, but
// not listening. Returns the port (0 on failure); *fd is closed by the caller.
int RefusingPort(int* fd) {
  *fd = socket(AF_INET, SOCK_STREAM, 0);
  if (*fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(*fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(*fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return 0;
  }
  return ntohs(addr.sin_port);
}

}  // namespace

int main() {
  // 1000 + 10 elements in slices of 256: 4 + 1 slices on one shard.
  auto layout = ps::core::ModelLayout::Create({{"w", 1000, 0}, {"b", 10, 1}}, 256, 1);
  if (!layout.ok()) return Fail("ModelLayout::Create: " + layout.status().ToString());
  if (layout->slices().size() != 5 || layout->total_elems() != 1010) {
    return Fail("the layout has " + std::to_string(layout->slices().size()) + " slices");
  }

  // Two addresses for a layout cut for one shard: refused before any connection.
  ps::WorkerOptions options;
  options.shard_addresses = {"127.0.0.1:1", "127.0.0.1:2"};
  auto mismatched = ps::Worker::Start(options, *layout);
  if (mismatched.ok() || mismatched.status().code() != absl::StatusCode::kInvalidArgument) {
    return Fail("Start with 2 addresses for 1 shard gave " +
                (mismatched.ok() ? std::string("a worker") : mismatched.status().ToString()));
  }

  // A shard that refuses connections: Start gives up after connect_timeout.
  int fd = -1;
  const int port = RefusingPort(&fd);
  if (port == 0) return Fail("no loopback port to refuse connections");
  options.shard_addresses = {"127.0.0.1:" + std::to_string(port)};
  options.connect_timeout = std::chrono::milliseconds(1500);
  options.initial_backoff = std::chrono::milliseconds(20);
  options.max_backoff = std::chrono::milliseconds(200);
  const auto start = std::chrono::steady_clock::now();
  auto unreachable = ps::Worker::Start(options, *layout);
  const auto waited = std::chrono::steady_clock::now() - start;
  close(fd);
  if (unreachable.ok()) return Fail("Start reached a port that refuses connections");
  const absl::StatusCode code = unreachable.status().code();
  if (code != absl::StatusCode::kUnavailable && code != absl::StatusCode::kDeadlineExceeded) {
    return Fail("Start against a closed port gave " + unreachable.status().ToString());
  }
  if (waited > std::chrono::seconds(30)) return Fail("Start ignored connect_timeout");

  std::printf("consumer: ok: a layout of %zu slices; a closed port gives %s\n",
              layout->slices().size(), unreachable.status().ToString().c_str());
  return 0;
}
