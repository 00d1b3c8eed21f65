// The worker's end of the native TCP data plane (docs/data-plane.md, section 3): one
// connection per shard, opened on first use, bound to the shard's data session by the
// handshake of net/data_frame.h (the shard proves itself first; the worker's proof is
// keyed by crypto::DataKey over its token and the session's secret), then pushes and
// pulls as length-prefixed frames both ways: several queued frames leave in one gather
// write, each push's payload straight from its shared buffer; a pulled slice's dense
// values are read straight into the place its PullSink names (the caller's buffer).
// Answers come by tag in any order. With TLS credentials (ClientCredentials::tls_ca) the
// connection runs TLS under the handshake, as the gRPC channel does: the shard's
// certificate verified against the CA for tls_server_name (else the host dialled), the
// client certificate presented when given (net/data_stream_internal.h).
//
// A lost connection fails every push and pull in flight UNAVAILABLE (the push pipeline
// retries, the pull streams ask again) and the next call opens a new one; a GOAWAY fails
// them with the shard's status, its refusal kind rebuilt from the name on the wire
// (unknown_session after a re-join: the retry policy joins again).
//
// Thread safety and lifetimes as DataChannel. All socket work runs on one IoThread,
// shared by the channels to every shard; Asio's types stay in the .cc files and
// connection_internal.h (the connection to one shard).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/credentials.h"
#include "net/shaper.h"
#include "worker_lib/transport/data_channel.h"

namespace ps::internal::tcp_plane {

// One thread running the sockets of every TCP channel of a worker.
class IoThread;
std::shared_ptr<IoThread> StartIoThread();

struct TcpChannelOptions {
  uint32_t worker_id = 0;
  uint32_t shard = 0;   // the shard's index: its proofs name "shard-<index>"
  std::string address;  // the shard's control address, "host:port": names, and the host
                        // of a route that names none
  // The worker's credentials toward the shards: its token ("" without one: mTLS only or
  // --insecure, where the connection's key is the session's secret itself), and with
  // tls_ca the TLS of the gRPC channel (CA, client certificate, server name).
  core::ClientCredentials credentials;
  std::chrono::milliseconds connect_timeout{10000};
  // WorkerOptions::shaping: when enabled, the connection goes through a net::ShapingRelay
  // of its own to the data endpoint (the control channel has another; each is shaped
  // to the whole rate, and the data connection carries nearly all of the bytes).
  net::LinkShaping shaping;
};

// The errors of the TLS material (a file that cannot be read, a key that is not the
// certificate's), naming the shard.
absl::StatusOr<std::unique_ptr<DataChannel>> MakeTcpChannel(std::shared_ptr<IoThread> io,
                                                            TcpChannelOptions options);

}  // namespace ps::internal::tcp_plane
