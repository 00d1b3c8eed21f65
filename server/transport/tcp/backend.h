// tcp::Backend: the shard's end of the native TCP data plane (docs/data-plane.md, "3. The
// TCP data plane"; the frames are net/data_frame.h). It listens on --data-port, accepts
// connections on --data-threads threads (an io_context each, every connection on one of
// them in turn, TCP_NODELAY), keeps
// the bounds of a ConnectionTable (server/connection_table.h: unproven connections per
// source and in all, proven ones per identity), and runs each connection
// (connection.h): the handshake that binds it to a worker's data session, then pushes
// and pulls through the ShardFront, whose rules and refusals are every plane's. With a
// certificate, every connection runs TLS first (net/data_stream_internal.h).
//
// A DataBackend (server/transport/backend.h): the server starts it from the backend list
// and sees it through that interface only. This header has no Asio type.
//
// Thread safety: port() and stats() from any thread; Stop() (also the destructor) from
// the owner, once serving is over. Borrowed: the front (and its shard) and the clock
// must outlive the backend. Stop() closes every connection, which frees what it holds
// (pulls and their watches and places, buffers), and joins the threads: call it before
// the front goes away.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "core/clock.h"
#include "server/connection_table.h"
#include "server/options.h"
#include "server/shard_front.h"
#include "server/transport/backend.h"

namespace ps::server::transport::tcp {

// What a connection is held to (docs/data-plane.md, "Per-connection bounds").
struct Options {
  std::string host = "127.0.0.1";  // the control port's
  uint16_t port = 0;               // 0: the kernel picks
  uint32_t threads = 2;
  // The largest PUSH body (--max-message-bytes), told at ADMIT.
  uint32_t max_body_bytes = 8u << 20;
  // Pushes read whose answers are not yet written: at this many the connection stops
  // reading until one is (told at ADMIT).
  uint32_t max_unanswered_pushes = 1024;
  // No frame, no open pull and no unanswered push for this long: GOAWAY, closed.
  core::Duration idle_timeout = std::chrono::seconds(60);
  // A frame's meta and body not received this long after its header: GOAWAY stalled.
  core::Duration read_timeout = std::chrono::seconds(10);
  // The table's bounds; its proof_timeout is the time from accept to ADMIT (the TLS
  // handshake included).
  ConnectionLimits limits;
  // The least retransmission timeout set on every accepted connection (0: the kernel's;
  // --tcp-rto-min-ms). Open() fails where the kernel cannot set it.
  std::chrono::microseconds tcp_rto_min{0};
  // TLS (docs/data-plane.md, "TLS."): the control port's certificate chain and key (PEM
  // text; empty: plaintext) and, when not empty, the CA whose client certificates are
  // required (mTLS; a certificate's common name must then be the session's worker-N).
  std::string tls_cert_pem, tls_key_pem, tls_ca_pem;
};

// The bounds of `o` (the port's connection limits are the caller's, ConnectionBounds in
// server.cc, so that both ports keep the same). The TLS material is the caller's too (the
// Authenticator read it for the control port).
Options OptionsFrom(const ServerOptions& o, const ConnectionLimits& limits);

struct Stats {
  uint64_t accepted = 0;  // connections taken by the table
  uint64_t refused = 0;   // closed at accept (the table's bounds)
  uint64_t admitted = 0;  // handshakes that ended in ADMIT
  uint64_t open = 0;      // connections open now
  // Connections closed or refused by the port's rules, by reason (the table's bounds and
  // penalties, the proof timeout), as ListenerStats::closed counts the gRPC ports'.
  std::array<uint64_t, static_cast<size_t>(CloseReason::kCount)> closed{};
};

class Backend final : public DataBackend {
 public:
  // Binds host:port and starts serving. UNAVAILABLE naming the address when it cannot;
  // INVALID_ARGUMENT when OpenSSL refuses the TLS material.
  static absl::StatusOr<std::unique_ptr<Backend>> Start(const Options& options, ShardFront* front,
                                                        core::Clock* clock);
  ~Backend() override;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  std::string_view name() const override { return "tcp"; }
  uint16_t port() const override;
  Stats stats() const;
  // "TCP data plane on HOST:PORT (N threads)".
  std::string ServingLine() const override;
  // ps_data_connections_* (docs/metrics.md); its bytes are the front's.
  BackendScrape Collect(const ShardStats& shard,
                        std::span<const Membership::State> states) const override;
  std::string TotalsLine(const ShardStats& shard) const override;
  // Stops accepting, closes every connection and joins the threads. Idempotent.
  void Stop() override;

 private:
  class Impl;
  explicit Backend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ps::server::transport::tcp
