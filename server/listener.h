// Listener: a shard's listening TCP port, owned by ps-server instead of gRPC
// (docs/connections.md). It accepts connections on its own thread, keeps the bounds of a
// ConnectionTable (server/connection_table.h), and hands each admitted connection to gRPC
// through an external connection acceptor, which runs the same handshake (TLS or
// plaintext) and credential checks as a port gRPC listens on itself.
//
// Why not gRPC's own listener: gRPC 1.51 stops accepting for good after one accept4()
// fails with EMFILE, and it has no bound on connections. Here:
// - a spare descriptor is held open; when accept4() fails for lack of descriptors, it is
//   given up to accept the pending connection and close it at once, and taken again, so
//   the listener drains its backlog and keeps accepting the moment descriptors are free;
// - connections are counted per source and in all, and closed by the table's rules;
// - a connection gRPC closed is noticed by its descriptor no longer naming the same
//   socket (fstat's inode), checked on each sweep (every 250 ms) and before any
//   refusal.
// Connections are closed with shutdown(2), which gRPC sees as the peer closing; gRPC
// then releases the descriptor.
//
// Thread safety: Proven() and stats() may be called from any thread; Start() and Stop()
// from the owner.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <grpcpp/server_builder.h>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/clock.h"
#include "server/spare_descriptor.h"
#include "server/connection_table.h"
#include "server/port_stats.h"

namespace ps::server {

class Listener {
 public:
  // Binds `host`:`port` (0: a free port) on every address `host` resolves to, and
  // listens. `name` labels log lines ("port", "health port").
  static absl::StatusOr<std::unique_ptr<Listener>> Bind(const std::string& host, uint16_t port,
                                                        const ConnectionLimits& limits,
                                                        std::string name, core::Clock* clock);
  ~Listener();

  uint16_t port() const { return port_; }

  // Starts accepting; every admitted connection goes to `acceptor` (from
  // ServerBuilder::experimental().AddExternalConnectionAcceptor, after BuildAndStart).
  void Start(std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor);
  // Stops accepting and closes the listening sockets; connections already handed to
  // gRPC stay its own. Idempotent.
  void Stop();

  // A call on the connection gRPC names `peer` passed authentication as `identity`
  // (empty: anonymous).
  void Proven(const std::string& peer, std::string_view identity);
  // The connection misbehaved (ConnectionTable::Abusive): closed, its source and
  // identity penalized.
  void Abusive(const std::string& peer, CloseReason reason);

  ListenerStats stats() const;

  // At shutdown, once the port has no call open: closes every connection still handed
  // to gRPC (counted as CloseReason::kShutdown). gRPC's shutdown waits for each of its
  // connections to go, and a client with no call open may read the GOAWAY only seconds
  // later (its channel is not polled meanwhile); closing them ends that wait. Returns
  // how many it closed.
  size_t CloseAll();

 private:
  struct Handed {
    int fd = -1;
    uint64_t inode = 0;
  };

  Listener(std::vector<int> fds, uint16_t port, const ConnectionLimits& limits, std::string name,
           core::Clock* clock);

  void Loop();
  void AcceptFrom(int listen_fd);
  void Admit(int listen_fd, int fd);
  // Closes the connections the table named (shutdown(2), after checking that the
  // descriptor still names the connection handed out).
  void CloseVictims(const std::vector<ConnectionTable::Victim>& victims);
  // Forgets connections gRPC closed and closes unproven ones past their time (every
  // 250 ms).
  void Sweep();
  // Closes the connections `ids` (unproven) that received more than `limit` bytes, as
  // abusive: every unproven one against max_unproven_bytes every 50 ms, those on
  // probation against max_probation_bytes every 10 ms.
  void CheckBytes(const std::vector<ConnectionTable::Id>& ids, uint64_t limit);
  void Count(CloseReason reason, std::string_view detail);

  const std::vector<int> listen_fds_;
  const uint16_t port_;
  const std::string name_;
  core::Clock* const clock_;
  ConnectionTable table_;
  int wake_fd_ = -1;   // eventfd: Stop()
  SpareDescriptor spare_;  // given up to accept (and close) when descriptors run out
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};

  mutable absl::Mutex mu_;
  absl::flat_hash_map<ConnectionTable::Id, Handed> handed_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> accepted_{0};
  std::array<std::atomic<uint64_t>, static_cast<size_t>(CloseReason::kCount)> closed_{};
};

// Raises this process's soft limit on open files to its hard limit; returns the soft
// limit in effect afterwards.
uint64_t RaiseOpenFileLimit();

}  // namespace ps::server
