// SessionTable: the sessions of the workers joined to one shard. A worker id has at most
// one gRPC session (a random 16-byte token, not a credential: it only names the join)
// and one data session, which every data plane beside gRPC shares (docs/data-plane.md):
// a public 64-bit id, carried in every UDP datagram and in a TCP connection's HELLO, with
// two secrets of its own, the UDP datagrams' secret and the TCP handshake's (one key per
// primitive: an AEAD key is never an HMAC key). Both are handed to the worker in the Join
// answer; the keys the shard uses bind them to the token the worker proved on that Join
// (crypto::BoundUdpKey, crypto::BoundDataKey), so a reader of a plaintext Join answer
// holds neither. A re-join replaces both sessions, so requests, datagrams and connections
// under the old ones are refused.
//
// Thread-safe: one mutex, taken by nothing else and holding no other lock.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "net/udp_frame.h"

namespace ps::server {

// Who may send data under a data session id, and the session's keys.
struct DataSession {
  uint32_t worker_id = 0;
  net::DatagramKey key;  // UDP: the datagrams' key (crypto::BoundUdpKey of the UDP secret)
  std::string tcp_key;   // TCP: the handshake proofs' key (crypto::BoundDataKey of its secret)
};

class SessionTable {
 public:
  // `server`: the shard's name the keys are bound to ("shard-N").
  SessionTable(uint32_t num_workers, std::string server);

  static constexpr size_t kDataSecretBytes = 32;

  struct Issued {
    std::string session;
    uint64_t data_session = 0;
    std::string udp_key;      // the UDP secret, handed to the worker over gRPC
    std::string data_secret;  // the TCP handshake's secret, handed over likewise
    uint64_t joins = 0;       // joins of this worker so far, this one included
  };
  // Fresh sessions for `worker_id` (< num_workers), replacing its earlier ones, their
  // keys bound to `token`, the token the join proved (empty: none, for a client
  // certificate or --insecure; the keys are then the secrets). INTERNAL when the system
  // has no randomness.
  absl::StatusOr<Issued> Issue(uint32_t worker_id, std::string_view token = {});
  // The worker behind a gRPC session.
  std::optional<uint32_t> WorkerOf(std::string_view session) const;
  // The worker and secrets behind a data session id (null when unknown or replaced). A
  // connection holding the pointer it was admitted with is current while this returns
  // the same pointer.
  std::shared_ptr<const DataSession> DataSessionOf(uint64_t data_session) const;
  // Workers that joined at least once.
  uint32_t joined() const;
  // Whether `worker` joined at least once (false for an id out of range).
  bool Joined(uint32_t worker) const;

 private:
  const std::string server_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, uint32_t> sessions_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> session_of_worker_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<const DataSession>> data_sessions_
      ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> data_session_of_worker_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> joins_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::server
