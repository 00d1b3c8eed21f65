#include "server/session_table.h"

#include <openssl/rand.h>

#include <algorithm>
#include <utility>

#include "core/status.h"
#include "crypto/auth_proof.h"

namespace ps::server {
namespace {

constexpr size_t kSessionBytes = 16;

}  // namespace

SessionTable::SessionTable(uint32_t num_workers, std::string server)
    : server_(std::move(server)),
      session_of_worker_(num_workers), data_session_of_worker_(num_workers, 0),
      joins_(num_workers, 0) {}

absl::StatusOr<SessionTable::Issued> SessionTable::Issue(uint32_t worker_id,
                                                        std::string_view token) {
  Issued issued;
  issued.session.resize(kSessionBytes);
  issued.data_secret.resize(kDataSecretBytes);
  if (RAND_bytes(reinterpret_cast<unsigned char*>(issued.session.data()), kSessionBytes) != 1 ||
      RAND_bytes(reinterpret_cast<unsigned char*>(&issued.data_session),
                 sizeof(issued.data_session)) != 1 ||
      RAND_bytes(reinterpret_cast<unsigned char*>(issued.data_secret.data()),
                 kDataSecretBytes) != 1) {
    return absl::InternalError("no randomness for a session token");
  }
  PS_ASSIGN_OR_RETURN(const net::DatagramKey secret, net::DatagramKey::Random());
  issued.udp_key = std::string(secret.bytes());
  PS_ASSIGN_OR_RETURN(net::DatagramKey udp_key,
                      net::DatagramKey::FromBytes(crypto::BoundUdpKey(
                          token, server_, issued.data_session, issued.udp_key)));
  auto data = std::make_shared<const DataSession>(DataSession{
      worker_id, std::move(udp_key),
      crypto::BoundDataKey(token, server_, issued.data_session, issued.data_secret)});
  absl::MutexLock lock(&mu_);
  std::string& old = session_of_worker_[worker_id];
  if (!old.empty()) sessions_.erase(old);
  old = issued.session;
  sessions_[issued.session] = worker_id;
  // The data session follows the gRPC one: datagrams and connections under the old id
  // are refused.
  data_sessions_.erase(data_session_of_worker_[worker_id]);
  data_session_of_worker_[worker_id] = issued.data_session;
  data_sessions_[issued.data_session] = std::move(data);
  issued.joins = ++joins_[worker_id];
  return issued;
}

std::optional<uint32_t> SessionTable::WorkerOf(std::string_view session) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(core::AsAbsl(session));
  if (it == sessions_.end()) return std::nullopt;
  return it->second;
}

std::shared_ptr<const DataSession> SessionTable::DataSessionOf(uint64_t data_session) const {
  absl::MutexLock lock(&mu_);
  auto it = data_sessions_.find(data_session);
  return it == data_sessions_.end() ? nullptr : it->second;
}

uint32_t SessionTable::joined() const {
  absl::MutexLock lock(&mu_);
  return static_cast<uint32_t>(std::count_if(session_of_worker_.begin(), session_of_worker_.end(),
                                             [](const std::string& s) { return !s.empty(); }));
}

bool SessionTable::Joined(uint32_t worker) const {
  absl::MutexLock lock(&mu_);
  return worker < session_of_worker_.size() && !session_of_worker_[worker].empty();
}

}  // namespace ps::server
