#include "server/connection_table.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"

namespace ps::server {

std::string_view CloseReasonName(CloseReason r) {
  switch (r) {
    case CloseReason::kSourceUnproven: return "source_unproven";
    case CloseReason::kUnproven: return "unproven";
    case CloseReason::kFull: return "full";
    case CloseReason::kProofTimeout: return "proof_timeout";
    case CloseReason::kIdentity: return "identity";
    case CloseReason::kDescriptors: return "descriptors";
    case CloseReason::kResets: return "resets";
    case CloseReason::kUnprovenBytes: return "unproven_bytes";
    case CloseReason::kPenalized: return "penalized";
    case CloseReason::kTlsHandshake: return "tls_handshake";
    case CloseReason::kShutdown: return "shutdown";
    case CloseReason::kCount: break;
  }
  return "unknown";
}

ConnectionTable::Admission ConnectionTable::Open(std::string source, std::string peer,
                                                 core::SteadyTime now) {
  absl::MutexLock lock(&mu_);
  Admission a;
  // A peer string names one open connection: an entry still holding it belongs to a
  // connection that closed unnoticed.
  if (auto it = by_peer_.find(peer); it != by_peer_.end()) EraseLocked(it->second);
  if (auto pit = source_penalties_.find(source);
      pit != source_penalties_.end() && now < pit->second.until) {
    Penalty& p = pit->second;
    if (now - p.window >= std::chrono::seconds(1)) {
      p.window = now;
      p.admitted = 0;
    }
    if (p.admitted >= limits_.probation_per_second) {
      a.refused = CloseReason::kPenalized;
      return a;
    }
    ++p.admitted;
    a.probation = true;
  }
  const uint32_t max = limits_.max_connections;
  const uint32_t max_unproven = max > limits_.reserved_for_proven ? max - limits_.reserved_for_proven : 1;
  auto source_it = unproven_by_source_.find(source);
  if (source_it != unproven_by_source_.end() &&
      source_it->second.size() >= limits_.max_unproven_per_source) {
    a.evict.push_back(EvictOldestLocked(source_it->second, CloseReason::kSourceUnproven));
  } else if (unproven_.size() >= max_unproven) {
    a.evict.push_back(EvictOldestLocked(unproven_, CloseReason::kUnproven));
  } else if (entries_.size() >= max) {
    if (unproven_.empty()) {
      a.refused = CloseReason::kFull;
      return a;
    }
    a.evict.push_back(EvictOldestLocked(unproven_, CloseReason::kUnproven));
  }
  a.accepted = true;
  a.id = next_id_++;
  unproven_.insert(a.id);
  unproven_by_source_[source].insert(a.id);
  if (a.probation) probation_.insert(a.id);
  by_peer_.emplace(peer, a.id);
  entries_.emplace(a.id, Entry{std::move(source), std::move(peer), now, false, {}});
  return a;
}

std::vector<ConnectionTable::Victim> ConnectionTable::Proven(const std::string& peer,
                                                             std::string_view identity,
                                                             core::SteadyTime now) {
  std::vector<Victim> victims;
  absl::MutexLock lock(&mu_);
  auto it = by_peer_.find(peer);
  if (it == by_peer_.end()) return victims;  // not accepted here (or already closed)
  const Id id = it->second;
  Entry& e = entries_.at(id);
  e.last_call = now;
  if (e.proven) return victims;
  if (!identity.empty() && PenalizedLocked(identity_penalties_, std::string(identity), now)) {
    victims.push_back({id, CloseReason::kPenalized, e.source});
    EraseLocked(id);
    return victims;
  }
  ForgetUnprovenLocked(id, e);
  e.proven = true;
  e.identity = std::string(identity);
  if (identity.empty()) return victims;  // anonymous (--insecure): no identity to bound
  std::set<Id>& mine = by_identity_[e.identity];
  mine.insert(id);
  while (limits_.max_per_identity != 0 && mine.size() > limits_.max_per_identity) {
    // The least recently used goes (the oldest of those): a client that reconnects
    // leaves its old connection behind, idle, while a connection that serves calls
    // stays, whatever the client's other connections do.
    const auto lru = std::min_element(mine.begin(), mine.end(), [&](Id a, Id b) {
      return entries_.at(a).last_call < entries_.at(b).last_call;
    });
    const Id victim = *lru;
    victims.push_back(Victim{victim, CloseReason::kIdentity, entries_.at(victim).source});
    EraseLocked(victim);  // changes `mine`
  }
  return victims;
}

std::vector<ConnectionTable::Victim> ConnectionTable::Expired(core::SteadyTime now) {
  std::vector<Victim> out;
  absl::MutexLock lock(&mu_);
  // Ids grow with time: the oldest unproven connection comes first.
  while (!unproven_.empty() && now - entries_.at(*unproven_.begin()).opened >= limits_.proof_timeout) {
    out.push_back(EvictOldestLocked(unproven_, CloseReason::kProofTimeout));
  }
  while (!probation_.empty() &&
         now - entries_.at(*probation_.begin()).opened >= limits_.probation_timeout) {
    out.push_back(EvictOldestLocked(probation_, CloseReason::kPenalized));
  }
  return out;
}

std::vector<ConnectionTable::Victim> ConnectionTable::Abusive(const std::string& peer,
                                                              CloseReason reason,
                                                              core::SteadyTime now) {
  Id id;
  {
    absl::MutexLock lock(&mu_);
    auto it = by_peer_.find(peer);
    if (it == by_peer_.end()) return {};
    id = it->second;
  }
  return Abusive(id, reason, now);
}

std::vector<ConnectionTable::Victim> ConnectionTable::Abusive(Id id, CloseReason reason,
                                                              core::SteadyTime now) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return {};
  PenalizeLocked(source_penalties_, it->second.source, now);
  if (it->second.proven && !it->second.identity.empty()) {
    PenalizeLocked(identity_penalties_, it->second.identity, now);
  }
  Victim v{id, reason, it->second.source};
  EraseLocked(id);
  return {std::move(v)};
}

std::vector<ConnectionTable::Id> ConnectionTable::Unproven() const {
  absl::MutexLock lock(&mu_);
  return std::vector<Id>(unproven_.begin(), unproven_.end());
}

std::vector<ConnectionTable::Id> ConnectionTable::OnProbation() const {
  absl::MutexLock lock(&mu_);
  return std::vector<Id>(probation_.begin(), probation_.end());
}

void ConnectionTable::PenalizeLocked(absl::flat_hash_map<std::string, Penalty>& map,
                                     const std::string& key, core::SteadyTime now) {
  if (map.size() > 4096) {  // forget those long over
    absl::erase_if(map, [&](const auto& kv) {
      return now - kv.second.until > std::chrono::minutes(1);
    });
  }
  Penalty& p = map[key];
  const bool repeat = p.length.count() > 0 && now - p.until < std::chrono::minutes(1);
  p.length = repeat ? std::min(p.length * 2, limits_.max_penalty) : limits_.penalty;
  p.until = now + p.length;
}

bool ConnectionTable::PenalizedLocked(const absl::flat_hash_map<std::string, Penalty>& map,
                                      const std::string& key, core::SteadyTime now) {
  auto it = map.find(key);
  return it != map.end() && now < it->second.until;
}

std::vector<ConnectionTable::Victim> ConnectionTable::ShedUnproven(size_t count) {
  std::vector<Victim> out;
  absl::MutexLock lock(&mu_);
  while (!unproven_.empty() && out.size() < count) {
    out.push_back(EvictOldestLocked(unproven_, CloseReason::kDescriptors));
  }
  return out;
}

void ConnectionTable::Closed(Id id) {
  absl::MutexLock lock(&mu_);
  EraseLocked(id);
}

ConnectionTable::Stats ConnectionTable::stats() const {
  absl::MutexLock lock(&mu_);
  Stats s;
  s.open = static_cast<uint32_t>(entries_.size());
  s.unproven = static_cast<uint32_t>(unproven_.size());
  s.proven = s.open - s.unproven;
  s.probation = static_cast<uint32_t>(probation_.size());
  return s;
}

ConnectionTable::Victim ConnectionTable::EvictOldestLocked(const std::set<Id>& ids,
                                                           CloseReason reason) {
  const Id id = *ids.begin();
  Victim v{id, reason, entries_.at(id).source};
  EraseLocked(id);  // may change `ids`
  return v;
}

void ConnectionTable::EraseLocked(Id id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  by_peer_.erase(e.peer);
  if (e.proven) {
    if (auto m = by_identity_.find(e.identity); m != by_identity_.end()) {
      m->second.erase(id);
      if (m->second.empty()) by_identity_.erase(m);
    }
  } else {
    ForgetUnprovenLocked(id, e);
  }
  entries_.erase(it);
}

void ConnectionTable::ForgetUnprovenLocked(Id id, const Entry& e) {
  unproven_.erase(id);
  if (auto m = unproven_by_source_.find(e.source); m != unproven_by_source_.end()) {
    m->second.erase(id);
    if (m->second.empty()) unproven_by_source_.erase(m);
  }
  probation_.erase(id);
}

}  // namespace ps::server
