// ConnectionTable: which client connections a listening port keeps, and which it closes
// (docs/operations.md, "Threat model and limits"; docs/connections.md). Pure bookkeeping
// on a clock, without sockets: server/listener.h owns the descriptors and acts on its
// answers.
//
// A connection is *unproven* from its accept until a call on it passes authentication
// (the call's credentials were checked from its headers); then it is *proven* and
// belongs to the identity that call carried. The limits:
// - at most `max_connections` open in all; unproven ones may use all but
//   `reserved_for_proven` of them, so a flood of connections that never authenticate
//   cannot keep authenticated clients (or their reconnections) out;
// - at most `max_unproven_per_source` unproven connections per source address;
// - unproven connections are closed `proof_timeout` after their accept;
// - at most `max_per_identity` proven connections per identity (0: no bound).
// When a new connection would exceed a bound on unproven connections, the oldest
// unproven one (of its source, else of all) is closed for it: an attacker's stale
// connections make room, and an honest client's new connection, which proves itself
// with its first call, survives unless the attacker opens a bound's worth of
// connections within that time. A new connection is refused only when proven ones fill
// the table. An identity over its bound loses its oldest proven connection.
//
// A connection that misbehaves below the messages (cancels many calls before their
// requests arrived: HTTP/2 rapid reset; or sends max_unproven_bytes without ever
// authenticating: a flood of refused calls or control frames) is closed, and its source
// and identity are penalized for a time that doubles with each repeat. While its source
// is penalized, new connections from it are admitted *on probation*, a few a second
// (the rest refused at accept): each is closed if it stays unproven for
// probation_timeout, and closed as abusive (renewing the penalty) when it sends
// max_probation_bytes. An honest client on the same address still gets in once the
// flood stops or between its attempts (its first call proves the connection within
// milliseconds); a reconnecting flood costs the shard a few connections a second. An
// identity under penalty may not keep new proven connections.
//
// Thread safety: all methods may be called concurrently.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "core/clock.h"

namespace ps::server {

struct ConnectionLimits {
  uint32_t max_connections = 4096;
  uint32_t reserved_for_proven = 1024;
  uint32_t max_unproven_per_source = 256;
  uint32_t max_per_identity = 4;  // 0: unbounded
  core::Duration proof_timeout = std::chrono::seconds(10);
  // Bytes an unproven connection may send before the listener closes it as abusive: an
  // honest client's handshake and first headers take a few KiB.
  uint64_t max_unproven_bytes = 256 << 10;
  // After a connection is closed as abusive, its source (and identity, if proven) may
  // not open new ones for `penalty`, doubled for each repeat within a minute, at most
  // `max_penalty`.
  core::Duration penalty = std::chrono::milliseconds(500);
  core::Duration max_penalty = std::chrono::seconds(4);
  // Connections from a penalized source: at most `probation_per_second` admitted per
  // source in each second (the rest refused), each closed after `probation_timeout`
  // without a proof, and closed as abusive after `max_probation_bytes` (an honest TLS
  // handshake and first call's headers take 2-5 KiB).
  uint32_t probation_per_second = 4;
  core::Duration probation_timeout = std::chrono::seconds(1);
  uint64_t max_probation_bytes = 32 << 10;
};

// Why a connection is closed or refused (a label of ps_connections_closed_total).
enum class CloseReason : uint8_t {
  kSourceUnproven,  // its source's unproven connections are at their bound
  kUnproven,        // unproven connections are at their bound
  kFull,            // proven connections fill the table (new connection refused)
  kProofTimeout,    // unproven for proof_timeout
  kIdentity,        // its identity's proven connections are over their bound
  kDescriptors,     // accepted and closed at once: no descriptor left
  kResets,          // it cancelled too many calls before their requests arrived
  kUnprovenBytes,   // it sent max_unproven_bytes without an authenticated call
  kPenalized,       // its source is penalized and used its probation admissions (new
                    // connection refused); on probation past its timeout; or its
                    // identity is penalized
  kTlsHandshake,    // its TLS handshake failed (no or a refused certificate, no TLS at
                    // all); the TCP data port's (the gRPC ports' TLS is gRPC's)
  kShutdown,        // still open when the shard shut down with no call left on it
  kCount
};
std::string_view CloseReasonName(CloseReason r);

class ConnectionTable {
 public:
  using Id = uint64_t;
  struct Victim {
    Id id;
    CloseReason reason;
    std::string source;  // its address, for the log
  };
  struct Admission {
    bool accepted = false;
    Id id = 0;
    bool probation = false;                    // its source is penalized
    CloseReason refused = CloseReason::kFull;  // when !accepted
    std::vector<Victim> evict;                 // connections to close for this one
  };
  struct Stats {
    uint32_t open = 0;
    uint32_t unproven = 0;
    uint32_t proven = 0;
    uint32_t probation = 0;  // of the unproven
  };

  explicit ConnectionTable(const ConnectionLimits& limits) : limits_(limits) {}

  const ConnectionLimits& limits() const { return limits_; }

  // A new connection from `source` (its address without port), known to gRPC as
  // `peer` (gRPC's peer string, e.g. "ipv4:127.0.0.1:5123", unique while it is open).
  Admission Open(std::string source, std::string peer, core::SteadyTime now);
  // A call on `peer` passed authentication as `identity` (empty: calls are anonymous,
  // --insecure). Cheap when the connection is already proven (it records the call's
  // time). Returns the connections to close (the identity's least recently used, when
  // it is over its bound; this one, when the identity is penalized).
  std::vector<Victim> Proven(const std::string& peer, std::string_view identity,
                             core::SteadyTime now);
  // The connection misbehaved (`reason`: kResets, kUnprovenBytes): it is to be closed,
  // and its source and identity are penalized. Empty when it is unknown.
  std::vector<Victim> Abusive(const std::string& peer, CloseReason reason, core::SteadyTime now);
  std::vector<Victim> Abusive(Id id, CloseReason reason, core::SteadyTime now);
  // The unproven connections (ids), for the listener's byte check.
  std::vector<Id> Unproven() const;
  // The connections on probation (a subset of Unproven()), for the frequent check.
  std::vector<Id> OnProbation() const;
  // Unproven connections older than the proof timeout (on probation: the probation
  // timeout).
  std::vector<Victim> Expired(core::SteadyTime now);
  // Up to `count` of the oldest unproven connections, to make room when the process ran
  // out of descriptors below max_connections.
  std::vector<Victim> ShedUnproven(size_t count);
  // The connection is gone (closed by either side); unknown ids are ignored. A victim
  // returned by any method is forgotten at once (it no longer counts).
  void Closed(Id id);
  Stats stats() const;

 private:
  struct Entry {
    std::string source;
    std::string peer;
    core::SteadyTime opened;
    bool proven = false;
    std::string identity;
    core::SteadyTime last_call{};  // of the proven calls on it
  };
  struct Penalty {
    core::SteadyTime until{};
    core::Duration length{};
    // Connections admitted on probation in the second from `window` (sources only).
    core::SteadyTime window{};
    uint32_t admitted = 0;
  };
  // Penalizes `key` from `now`: the penalty after one that ended less than a minute ago
  // is twice as long.
  void PenalizeLocked(absl::flat_hash_map<std::string, Penalty>& map, const std::string& key,
                      core::SteadyTime now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static bool PenalizedLocked(const absl::flat_hash_map<std::string, Penalty>& map,
                              const std::string& key, core::SteadyTime now);
  // Forgets the oldest connection of `ids` (which must not be empty) and names it a
  // victim: the caller closes it.
  Victim EvictOldestLocked(const std::set<Id>& ids, CloseReason reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseLocked(Id id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes unproven connection `id` (`e`) from the unproven and probation sets.
  void ForgetUnprovenLocked(Id id, const Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ConnectionLimits limits_;
  mutable absl::Mutex mu_;
  Id next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Ids grow with time, so the smallest id of a set is its oldest connection.
  std::map<Id, Entry> entries_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Id> by_peer_ ABSL_GUARDED_BY(mu_);
  std::set<Id> unproven_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::set<Id>> unproven_by_source_ ABSL_GUARDED_BY(mu_);
  std::set<Id> probation_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::set<Id>> by_identity_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Penalty> source_penalties_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Penalty> identity_penalties_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::server
