// The handshake part of a shard's data connection (connection.h): HELLO names a data
// session, answered by CHALLENGE with the shard's proof; PROOF, the worker's, is checked
// against the one expected and admits the connection with ADMIT and its limits. Also the
// check, before every push and pull, that the admitted session is still the worker's.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "crypto/auth_proof.h"
#include "core/refusal.h"
#include "server/transport/tcp/connection.h"

namespace ps::server::transport::tcp {

void Connection::Hello(std::string_view meta) {
  absl::StatusOr<net::HelloMeta> hello = net::ParseHelloMeta(meta);
  if (!hello.ok()) {
    hub_->Abusive(id_);
    return GoAway(front_->shard()->Refuse(Refusal::kMalformed, hello.status().message()));
  }
  // The session first, before any HMAC: an unknown id costs a table lookup.
  absl::StatusOr<std::shared_ptr<const DataSession>> session =
      front_->shard()->FindDataSession(hello->data_session, "data connection");
  if (!session.ok()) return GoAway(session.status());
  if ((*session)->worker_id != hello->worker_id) {
    return GoAway(front_->shard()->Refuse(
        Refusal::kUnknownSession,
        absl::StrCat("data connection names worker ", hello->worker_id,
                     " under the data session of another worker: join (again) first")));
  }
  if (absl::Status s = CertifiedAs(hello->worker_id); !s.ok()) return GoAway(s);
  absl::StatusOr<std::string> server_nonce = crypto::NewNonce();
  if (!server_nonce.ok()) return GoAway(server_nonce.status());
  session_ = *std::move(session);
  session_id_ = hello->data_session;
  const std::string& key = session_->tcp_key;
  const std::string server =
      core::Identity{core::Identity::Kind::kShard, front_->shard()->shard_id()}.Name();
  const std::string_view client_nonce(hello->client_nonce.data(), hello->client_nonce.size());
  expected_proof_ =
      crypto::DataClientProof(key, server, session_id_, client_nonce, *server_nonce);
  net::ChallengeMeta challenge;
  challenge.shard_index = front_->shard()->shard_id();
  std::copy(server_nonce->begin(), server_nonce->end(), challenge.server_nonce.begin());
  const std::string proof =
      crypto::DataServerProof(key, server, session_id_, client_nonce, *server_nonce);
  std::copy(proof.begin(), proof.end(), challenge.proof.begin());
  Outgoing frame;
  (void)net::AppendChallenge(challenge, &frame.head);  // fixed sizes: cannot fail
  Queue(std::move(frame));
  state_ = net::ConnectionState::kShardAwaitsProof;
  ReadHeader();
}

void Connection::Proof(std::string_view meta) {
  absl::StatusOr<net::ProofMeta> proof = net::ParseProofMeta(meta);
  if (!proof.ok() ||
      !crypto::SameProof(std::string_view(proof->proof.data(), proof->proof.size()),
                       expected_proof_)) {
    // Charged to the anonymous client, as a wrong proof on the control port: a forger
    // is held by the tarpit, and reading stops meanwhile.
    const absl::Status refused = front_->shard()->Refuse(
        Refusal::kUnauthenticated,
        "wrong data connection proof: it was not made with this data session's key for this "
        "shard (the key binds the Join answer's data_secret to the worker's token)");
    going_away_ = true;
    return AnswerLater(kAnonymousClient, refused,
                       net::kFrameHeaderBytes + header_.meta_bytes, net::FrameType::kGoaway, 0);
  }
  expected_proof_.clear();
  const uint32_t worker = session_->worker_id;
  const core::Identity identity{core::Identity::Kind::kWorker, worker};
  peer_ = DataPeer{.worker = worker, .client = identity.Name()};
  // The handshake proved the worker: its key is bound to the worker's token (or, without
  // tokens, to the secret only the worker's Join answer carried).
  caller_ = Caller{.identity = identity, .address = peer_name_};
  state_ = net::ConnectionState::kShardAdmitted;
  socket_.ReadAhead();  // an admitted worker's frames come in runs
  const Options& o = hub_->options();
  limits_.max_body_bytes = o.max_body_bytes;
  limits_.max_pull_slices = front_->shard()->MaxPullSlices();
  net::AdmitMeta admit{
      .max_body_bytes = o.max_body_bytes,
      .max_unanswered_pushes = o.max_unanswered_pushes,
      .max_pull_slices = static_cast<uint32_t>(
          std::min<uint64_t>(limits_.max_pull_slices, UINT32_MAX)),
      .idle_timeout_ms = static_cast<uint32_t>(std::min<int64_t>(
          std::chrono::duration_cast<std::chrono::milliseconds>(o.idle_timeout).count(),
          UINT32_MAX))};
  // The table first (it may evict the identity's least recently used connection), then
  // the worker learns it is admitted.
  hub_->Admitted(id_, peer_name_, peer_.client);
  Outgoing frame;
  (void)net::AppendAdmit(admit, &frame.head);  // fixed sizes: cannot fail
  Queue(std::move(frame));
  ReadHeader();
}

absl::Status Connection::Current() const {
  absl::StatusOr<std::shared_ptr<const DataSession>> now =
      front_->shard()->FindDataSession(session_id_, "data connection");
  if (!now.ok()) return now.status();
  if (now->get() != session_.get()) {
    return front_->shard()->Refuse(Refusal::kUnknownSession,
                                   "data connection under a replaced data session: join again");
  }
  return absl::OkStatus();
}

}  // namespace ps::server::transport::tcp
