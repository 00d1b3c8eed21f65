// udp::Receiver: the shard's end of the lossy UDP gradient path, its UDP data backend
// (docs/transport.md, "Receiving"; docs/data-plane.md). It binds a UDP socket, and for
// every datagram: parses it (net::ParseDatagram), looks up the session's key
// (Shard::UdpSession), checks the MAC and that the sender is the session's worker, and
// hands the chunk to ShardFront::PushChunk. Nothing is answered and nothing is
// retransmitted: a datagram that fails any step is dropped and counted by why (the
// shard's refusals by their kind).
//
// A DataBackend (server/transport/backend.h), started from the backend list.
//
// Thread safety: `threads` owned threads share the socket, each taking up to 16
// datagrams per recvmmsg call and handling them in turn; an end of a push waits until
// the batches other threads held when it came were handled. Handle() and stats() may be
// called from any thread. The front (and its shard) is borrowed and must outlive the
// receiver.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "server/shard_front.h"
#include "server/transport/backend.h"

namespace ps::server::transport::udp {

struct Stats {
  uint64_t received = 0;         // chunks taken by the shard
  uint64_t bytes = 0;            // datagram bytes received (all of them)
  uint64_t malformed = 0;        // does not parse, bad geometry, or does not decode (malformed)
  uint64_t unknown_session = 0;  // no such UDP session (never was, or replaced by a re-join)
  uint64_t forged = 0;           // MAC does not verify, or a worker id not the session's
  uint64_t replayed = 0;         // a chunk already taken this round (duplicate)
  uint64_t stale = 0;            // for a round already closed (late)
  uint64_t refused = 0;          // other refusals (unknown slice, future round, no layout, ...)
  uint64_t ends = 0;             // ends of pushes taken by the shard (a repeated one too)
  uint64_t ends_after_close = 0;  // ends for a round already closed (an end's later copy)
  uint64_t end_datagrams = 0;    // end datagrams past the MAC check (each ends one push or more)
};

class Receiver final : public DataBackend {
 public:
  // Binds `host`:`port` (0: a free port) with a receive buffer of `receive_buffer`
  // bytes (the kernel may grant less) and starts `threads` (>= 1) receiving threads.
  static absl::StatusOr<std::unique_ptr<Receiver>> Start(const std::string& host, uint16_t port,
                                                         uint32_t receive_buffer, uint32_t threads,
                                                         ShardFront* front);
  ~Receiver() override;
  Receiver(const Receiver&) = delete;
  Receiver& operator=(const Receiver&) = delete;

  std::string_view name() const override { return "udp"; }
  uint16_t port() const override;
  Stats stats() const;
  // "UDP gradient path on HOST:PORT".
  std::string ServingLine() const override;
  // Its datagram bytes (ps_received_bytes_total{transport="udp"}), ps_udp_* and
  // ps_worker_udp_chunks_total (docs/metrics.md).
  BackendScrape Collect(const ShardStats& shard,
                        std::span<const Membership::State> states) const override;
  // "UDP: N chunks taken, M lost, ..." (the shard's chunks never received among them).
  std::string TotalsLine(const ShardStats& shard) const override;
  // Stops the receiving threads (a datagram being handled is finished). Idempotent.
  void Stop() override;
  // What the receiving thread does with one datagram (also used by tests and the fuzz
  // target); an end is applied at once. Returns why it was dropped, or OK when the shard
  // took the chunk or end.
  absl::Status Handle(std::string_view datagram);

 private:
  class Impl;
  explicit Receiver(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ps::server::transport::udp
