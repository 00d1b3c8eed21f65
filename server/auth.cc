#include <openssl/sha.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/status.h"
#include "crypto/auth_proof.h"
#include "crypto/cluster_secret.h"
#include "server/auth_internal.h"

namespace ps::server {
namespace {

std::string Digest(std::string_view token) {
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), md);
  return std::string(reinterpret_cast<const char*>(md), sizeof(md));
}

std::string_view View(const grpc::string_ref& s) { return std::string_view(s.data(), s.size()); }

// "ipv4:127.0.0.1:5123" -> "ipv4:127.0.0.1"; "ipv6:[::1]:5123" -> "ipv6:[::1]".
std::string WithoutPort(std::string_view peer) {
  const size_t colon = peer.rfind(':');
  const size_t bracket = peer.rfind(']');
  if (colon == std::string_view::npos || colon < 5 ||
      (bracket != std::string_view::npos && colon < bracket)) {
    return std::string(peer);
  }
  return std::string(peer.substr(0, colon));
}

// Workers whose keys are made at start; the proofs of higher worker ids (unusual) are
// derived per call. Bounds the table at about 1 MB.
constexpr uint32_t kKeysMadeAtStart = 4096;

}  // namespace

absl::StatusOr<TokenTable> TokenTable::Parse(std::string_view text, std::string_view source) {
  TokenTable table;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(core::AsAbsl(text), '\n')) {
    ++line_no;
    const size_t hash = line.find('#');
    if (hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat(core::AsAbsl(source), " line ", line_no, ": ", why));
    };
    if (fields.size() != 2) return bad("want 'IDENTITY TOKEN'");
    const std::string_view name(fields[0].data(), fields[0].size());
    const std::string_view token(fields[1].data(), fields[1].size());
    absl::StatusOr<core::Identity> id = core::ParseIdentity(name);
    if (!id.ok()) return bad(id.status().message());
    if (absl::Status st = core::CheckToken(token); !st.ok()) return bad(st.message());
    if (!table.by_digest_.emplace(Digest(token), *id).second) {
      return bad("this token is listed twice");
    }
    if (!table.by_name_.emplace(id->Name(), std::string(token)).second) {
      return bad(absl::StrCat(id->Name(), " has a token already"));
    }
  }
  return table;
}

std::optional<core::Identity> TokenTable::Find(std::string_view token) const {
  auto it = by_digest_.find(Digest(token));
  if (it == by_digest_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> TokenTable::TokenOf(const core::Identity& identity) const {
  auto it = by_name_.find(identity.Name());
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::pair<core::Identity, std::string>> TokenTable::Entries() const {
  std::vector<std::pair<core::Identity, std::string>> out;
  for (const auto& [name, token] : by_name_) out.emplace_back(*core::ParseIdentity(name), token);
  return out;
}

std::string Caller::Name() const {
  return identity.has_value() ? identity->Name() : WithoutPort(address);
}

bool Caller::loopback() const {
  return address.starts_with("ipv4:127.") || address.starts_with("ipv6:[::1]") ||
         address.starts_with("ipv6:[::ffff:127.") || address.starts_with("unix:");
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(const ServerOptions& o) {
  std::unique_ptr<Authenticator> a(new Authenticator());
  a->required_ = o.ClientAuthRequired();
  a->self_ = core::Identity{core::Identity::Kind::kShard, static_cast<uint32_t>(o.shard_id)};
  PS_ASSIGN_OR_RETURN(a->nonce_, crypto::NewNonce());
  a->instance_ = crypto::InstanceId(a->nonce_);
  a->cert_path_ = o.tls_cert;
  a->key_path_ = o.tls_key;
  a->ca_path_ = o.tls_ca;
  if (!o.tls_cert.empty()) {
    PS_ASSIGN_OR_RETURN(a->cert_pem_, core::ReadSmallFile(o.tls_cert, "--tls-cert"));
    PS_ASSIGN_OR_RETURN(a->key_pem_, core::ReadSmallFile(o.tls_key, "--tls-key"));
  }
  if (!o.tls_ca.empty()) {
    PS_ASSIGN_OR_RETURN(a->ca_pem_, core::ReadSmallFile(o.tls_ca, "--tls-ca"));
  }
  std::optional<crypto::RunDirectory> run_dir;
  if (!o.secret_file.empty()) {
    PS_ASSIGN_OR_RETURN(a->secret_, crypto::ReadSecretFile(o.secret_file));
  }
  if (!o.run_dir.empty()) {
    // Opened once: the secret and the token files are read and written through the
    // directory's descriptor (no symbolic link, no swap in between).
    PS_ASSIGN_OR_RETURN(run_dir, crypto::RunDirectory::Open(o.run_dir, /*create=*/true));
    if (a->secret_.empty()) {
      PS_ASSIGN_OR_RETURN(a->secret_, run_dir->LoadOrCreateSecret());
    }
  }
  if (!a->secret_.empty()) {
    std::vector<core::Identity> derived;  // the identities whose keys are made now
    for (uint32_t w = 0; w < std::min(o.WorkerIds(), kKeysMadeAtStart); ++w) {
      derived.push_back(core::Identity{core::Identity::Kind::kWorker, w});
    }
    for (uint32_t s = 0; s < o.num_shards; ++s) {
      derived.push_back(core::Identity{core::Identity::Kind::kShard, s});
    }
    derived.push_back(core::Identity{core::Identity::Kind::kAdmin, 0});
    for (const core::Identity& id : derived) {
      std::string token = crypto::DeriveToken(a->secret_, id);
      a->keys_.emplace(id.Name(), a->MakeKey(id.Name(), id, std::move(token)));
    }
  }
  if (run_dir.has_value()) {
    // What local launchers hand out: each worker gets its own file, the operator's tools
    // the admin's. Derived, so every shard of the run directory writes the same bytes.
    std::vector<core::Identity> clients;
    for (uint32_t w = 0; w < o.WorkerIds(); ++w) {
      clients.push_back(core::Identity{core::Identity::Kind::kWorker, w});
    }
    clients.push_back(core::Identity{core::Identity::Kind::kAdmin, 0});
    for (const core::Identity& id : clients) {
      PS_RETURN_IF_ERROR(run_dir->WriteToken(id, crypto::DeriveToken(a->secret_, id)).status());
    }
  }
  if (!o.tokens_file.empty()) {
    PS_ASSIGN_OR_RETURN(std::string text, core::ReadSmallFile(o.tokens_file, "--tokens"));
    PS_ASSIGN_OR_RETURN(TokenTable table,
                        TokenTable::Parse(text, absl::StrCat("--tokens ", o.tokens_file)));
    if (table.size() == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tokens ", o.tokens_file, " lists no identity"));
    }
    a->tokens_ = std::move(table);
    // A token-file token in the derived form of an identity that the secret covers
    // already is shadowed by the secret's (its key, the identity, is taken).
    for (auto& [id, token] : a->tokens_->Entries()) {
      std::string key = crypto::TokenKey(token);
      a->keys_.try_emplace(key, a->MakeKey(key, id, std::move(token)));
    }
  }
  return a;
}

Authenticator::Key Authenticator::MakeKey(std::string key, const core::Identity& identity,
                                          std::string token) const {
  Key k{identity, std::move(token), std::string()};
  k.call_proof = crypto::CallProof(k.token, key, self_.Name(), nonce_);
  return k;
}

std::optional<Authenticator::Key> Authenticator::FindKey(std::string_view key) const {
  if (auto it = keys_.find(core::AsAbsl(key)); it != keys_.end()) return it->second;
  std::optional<core::Identity> id = crypto::KeyIdentity(key);
  if (!id.has_value() || secret_.empty()) return std::nullopt;
  return MakeKey(std::string(key), *id, crypto::DeriveToken(secret_, *id));
}

absl::StatusOr<std::string> Authenticator::AnswerChallenge(
    std::optional<std::string_view> authorization) const {
  if (!takes_tokens()) {
    return absl::UnauthenticatedError(
        "this shard takes no tokens (it was started with client certificates only): a client "
        "with a certificate needs no challenge");
  }
  if (!authorization.has_value()) {
    return absl::UnauthenticatedError(absl::StrCat(
        "a challenge must carry 'authorization: ", core::AsAbsl(crypto::kChallengeScheme),
        " KEY NONCE'"));
  }
  PS_ASSIGN_OR_RETURN(crypto::ChallengeRequest req, crypto::ParseChallengeHeader(*authorization));
  std::optional<Key> key = FindKey(req.key);
  if (!key.has_value()) return absl::UnauthenticatedError("unknown token");
  return crypto::ChallengeAnswer(
      self_, nonce_,
      crypto::ServerProof(key->token, req.key, self_.Name(), req.client_nonce, nonce_));
}

absl::StatusOr<core::Identity> Authenticator::VerifyProof(std::string_view value,
                                                          std::string* charge_to,
                                                          std::string* token_key) const {
  PS_ASSIGN_OR_RETURN(crypto::PresentedProof p, crypto::ParseProofHeader(value));
  std::optional<Key> key = FindKey(p.key);
  if (!key.has_value()) return absl::UnauthenticatedError("unknown token");
  if (p.instance != instance_) {
    if (charge_to != nullptr) *charge_to = kStaleProofClient;
    return absl::UnauthenticatedError(crypto::StaleMessage(p.instance, self_));
  }
  if (!crypto::SameProof(p.proof, key->call_proof)) {
    return absl::UnauthenticatedError(
        "wrong proof: it was not made with the token the key names, for this shard");
  }
  if (token_key != nullptr) *token_key = std::move(p.key);
  return key->identity;
}

absl::StatusOr<core::Identity> Authenticator::Verify(const Presented& presented,
                                                     std::string* charge_to,
                                                     std::string* token_key) const {
  if (charge_to != nullptr) *charge_to = kAnonymousClient;
  if (token_key != nullptr) token_key->clear();
  std::optional<core::Identity> from_cert;
  if (!ca_pem_.empty() && presented.common_name.has_value()) {
    absl::StatusOr<core::Identity> id = core::ParseIdentity(*presented.common_name);
    if (!id.ok()) {
      return absl::UnauthenticatedError(
          absl::StrCat("client certificate: ", id.status().message()));
    }
    from_cert = *id;
  }
  std::optional<core::Identity> from_token;
  if (presented.authorization.has_value()) {
    const std::string_view value = *presented.authorization;
    if (!takes_tokens()) {
      return absl::UnauthenticatedError(
          "this shard takes no tokens (it was started with client certificates only)");
    }
    if (value.starts_with("Bearer ")) {
      if (cert_pem_.empty()) {
        return absl::UnauthenticatedError(absl::StrCat(
            "bearer tokens are refused on a plaintext port (a token sent there goes to whoever "
            "listens on it): prove the token instead ('authorization: ",
            core::AsAbsl(crypto::kProofScheme),
            " ...' after a challenge, as ps::Worker and ps-admin do; docs/protocol.md, "
            "\"Authentication\"), or serve TLS (--tls-cert, --tls-key)"));
      }
      const std::string_view token = value.substr(7);
      if (tokens_.has_value()) from_token = tokens_->Find(token);
      if (!from_token.has_value() && !secret_.empty()) {
        from_token = crypto::VerifyDerivedToken(secret_, token);
      }
      if (!from_token.has_value()) return absl::UnauthenticatedError("unknown token");
      if (token_key != nullptr) *token_key = crypto::TokenKey(token);
    } else {
      PS_ASSIGN_OR_RETURN(from_token, VerifyProof(value, charge_to, token_key));
    }
  }
  if (from_cert.has_value() && from_token.has_value() && !(*from_cert == *from_token)) {
    if (token_key != nullptr) token_key->clear();  // a refused call proved nothing
    return absl::UnauthenticatedError(absl::StrCat("the client certificate says ",
                                                   from_cert->Name(), " but the token is ",
                                                   from_token->Name(), "'s"));
  }
  if (from_cert.has_value()) return *from_cert;
  if (from_token.has_value()) return *from_token;
  return absl::UnauthenticatedError(
      !ca_pem_.empty() && tokens_.has_value()
          ? "credentials required: a client certificate or a token's proof"
      : !ca_pem_.empty()
          ? "credentials required: a client certificate signed by --tls-ca"
          : "credentials required: the proof of a token ('authorization: PS-Proof-v1 ...' after a "
            "challenge; a worker's token is in the shard's run directory, token-worker-N)");
}

absl::StatusOr<Caller> Authenticator::Identify(const grpc::ServerContextBase& ctx) const {
  Caller caller;
  caller.address = ctx.peer();
  if (!required_) return caller;
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  Presented presented;
  std::vector<grpc::string_ref> cn;
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    cn = auth->FindPropertyValues("x509_common_name");
    if (cn.size() == 1) presented.common_name = View(cn[0]);
  }
  const auto& metadata = ctx.client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    presented.authorization = View(it->second);
  }
  absl::StatusOr<core::Identity> id = Verify(presented, nullptr, &caller.token_key);
  if (!id.ok()) return id.status();
  caller.identity = *id;
  return caller;
}

std::string Authenticator::TokenNamed(std::string_view key) const {
  if (key.empty()) return std::string();
  std::optional<Key> named = FindKey(key);
  return named.has_value() ? std::move(named->token) : std::string();
}

core::ClientCredentials Authenticator::PeerCredentials(uint32_t shard_id) const {
  core::ClientCredentials c;
  if (!cert_pem_.empty()) {
    // Without --tls-ca the peers' certificates cannot be verified against anything but
    // the system roots; give the CA so that shards verify each other.
    c.tls_ca = ca_path_;
    c.tls_cert = ca_path_.empty() ? std::string() : cert_path_;
    c.tls_key = ca_path_.empty() ? std::string() : key_path_;
  }
  const core::Identity self{core::Identity::Kind::kShard, shard_id};
  if (tokens_.has_value()) c.token = tokens_->TokenOf(self).value_or("");
  if (c.token.empty() && !secret_.empty()) c.token = crypto::DeriveToken(secret_, self);
  return c;
}

RateLimiter::RateLimiter(double per_second, uint32_t burst, core::Clock* clock)
    : per_second_(per_second),
      burst_(burst != 0 ? static_cast<double>(burst) : std::max(1.0, per_second)),
      clock_(clock) {}

bool RateLimiter::Allow(const std::string& key) {
  if (per_second_ <= 0) return true;
  const core::SteadyTime now = clock_->Now();
  absl::MutexLock lock(&mu_);
  if (buckets_.size() > 4096) {
    // Forget clients whose bucket has refilled: a new bucket starts full anyway.
    absl::erase_if(buckets_, [&](const auto& kv) { return kv.second.FullAt(now); });
  }
  auto it = buckets_.try_emplace(key, per_second_, burst_, now).first;
  return it->second.TryTake(1.0, now);
}

}  // namespace ps::server
