// SessionTable: the sessions of the workers joined to one shard. A worker id has at most
// one gRPC session (a random 16-byte token, not a credential: it only names the join)
// and one UDP session (a public id carried in every datagram and a secret MAC key); a
// re-join replaces both, so requests and datagrams under the old ones are refused.
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

// Who may send datagrams under a UDP session id.
struct UdpPeer {
  uint32_t worker_id = 0;
  net::DatagramKey key;
};

class SessionTable {
 public:
  explicit SessionTable(uint32_t num_workers);

  struct Issued {
    std::string session;
    uint64_t udp_session = 0;
    std::string udp_key;  // the MAC key's bytes, handed to the worker over gRPC
    uint64_t joins = 0;   // joins of this worker so far, this one included
  };
  // Fresh sessions for `worker_id` (< num_workers), replacing its earlier ones. INTERNAL
  // when the system has no randomness.
  absl::StatusOr<Issued> Issue(uint32_t worker_id);
  // The worker behind a gRPC session.
  std::optional<uint32_t> WorkerOf(std::string_view session) const;
  // The peer behind a UDP session id (null when unknown).
  std::shared_ptr<const UdpPeer> UdpPeerOf(uint64_t udp_session) const;
  // Workers that joined at least once.
  uint32_t joined() const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, uint32_t> sessions_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> session_of_worker_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<const UdpPeer>> udp_sessions_
      ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> udp_session_of_worker_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> joins_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::server
