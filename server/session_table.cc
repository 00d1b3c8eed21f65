#include "server/session_table.h"

#include <openssl/rand.h>

#include <algorithm>
#include <utility>

#include "core/status.h"

namespace ps::server {
namespace {

constexpr size_t kSessionBytes = 16;

}  // namespace

SessionTable::SessionTable(uint32_t num_workers)
    : session_of_worker_(num_workers), udp_session_of_worker_(num_workers, 0),
      joins_(num_workers, 0) {}

absl::StatusOr<SessionTable::Issued> SessionTable::Issue(uint32_t worker_id) {
  Issued issued;
  issued.session.resize(kSessionBytes);
  if (RAND_bytes(reinterpret_cast<unsigned char*>(issued.session.data()), kSessionBytes) != 1 ||
      RAND_bytes(reinterpret_cast<unsigned char*>(&issued.udp_session),
                 sizeof(issued.udp_session)) != 1) {
    return absl::InternalError("no randomness for a session token");
  }
  PS_ASSIGN_OR_RETURN(net::DatagramKey udp_key, net::DatagramKey::Random());
  issued.udp_key = std::string(udp_key.bytes());
  auto udp_peer = std::make_shared<const UdpPeer>(UdpPeer{worker_id, std::move(udp_key)});
  absl::MutexLock lock(&mu_);
  std::string& old = session_of_worker_[worker_id];
  if (!old.empty()) sessions_.erase(old);
  old = issued.session;
  sessions_[issued.session] = worker_id;
  // The UDP session follows the gRPC one: datagrams under the old id are refused.
  udp_sessions_.erase(udp_session_of_worker_[worker_id]);
  udp_session_of_worker_[worker_id] = issued.udp_session;
  udp_sessions_[issued.udp_session] = std::move(udp_peer);
  issued.joins = ++joins_[worker_id];
  return issued;
}

std::optional<uint32_t> SessionTable::WorkerOf(std::string_view session) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(core::AsAbsl(session));
  if (it == sessions_.end()) return std::nullopt;
  return it->second;
}

std::shared_ptr<const UdpPeer> SessionTable::UdpPeerOf(uint64_t udp_session) const {
  absl::MutexLock lock(&mu_);
  auto it = udp_sessions_.find(udp_session);
  return it == udp_sessions_.end() ? nullptr : it->second;
}

uint32_t SessionTable::joined() const {
  absl::MutexLock lock(&mu_);
  return static_cast<uint32_t>(std::count_if(session_of_worker_.begin(), session_of_worker_.end(),
                                             [](const std::string& s) { return !s.empty(); }));
}

}  // namespace ps::server
