// Who is calling a shard, and whether they may (docs/operations.md, "Securing" and
// "Threat model and limits").
//
// An Authenticator is made from the server options once at start. With --tls-ca
// (mTLS), --tokens or a cluster secret (--secret-file, --run-dir: the default), every
// call must carry an identity: the common name of a client certificate signed by the
// CA, or a proof that the caller holds a token of the token file or one derived from
// the secret (crypto/cluster_secret.h). Clients prove a token without sending it, by the
// challenge and response of crypto/auth_proof.h, after this shard proved it holds the
// token too; the proofs are valid for this process only (its instance nonce, drawn at
// start). A bearer token itself ("authorization: Bearer TOKEN") is taken only over TLS,
// where the client authenticated the shard by its certificate before sending it. With
// --insecure, calls are anonymous and the worker id is taken from the request (the
// server is then bound to loopback unless --allow-insecure-remote).
//
// The listening port's credentials (server/metadata_auth.h) answer challenges and check
// the same identities from each call's metadata before gRPC reads its body.
//
// A RateLimiter gives each client (identity, or address when anonymous) a token
// bucket of requests.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/clock.h"
#include "core/credentials.h"
#include "core/token_bucket.h"
#include "server/caller.h"
#include "server/options.h"

namespace ps::server {

// The identities and tokens of a token file. Parse errors name the line.
class TokenTable {
 public:
  static absl::StatusOr<TokenTable> Parse(std::string_view text, std::string_view source);
  // The identity holding `token`, if any. The lookup goes through the token's SHA-256,
  // so its time does not depend on how much of a wrong token matched.
  std::optional<core::Identity> Find(std::string_view token) const;
  // The token of `identity`, if listed (a shard's own token toward its peers).
  std::optional<std::string> TokenOf(const core::Identity& identity) const;
  // Every identity and its token.
  std::vector<std::pair<core::Identity, std::string>> Entries() const;
  size_t size() const { return by_digest_.size(); }

 private:
  absl::flat_hash_map<std::string, core::Identity> by_digest_;
  absl::flat_hash_map<std::string, std::string> by_name_;
};


class Authenticator {
 public:
  // Reads the certificate, key, CA, token and secret files named in `options`; with a
  // run directory, makes its secret if missing and writes the workers' and the admin's
  // token files there.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(const ServerOptions& options);

  // Whether calls must carry an identity (mTLS or tokens configured).
  bool required() const { return required_; }
  // What a call presents: the common name of its verified client certificate, and its
  // "authorization" metadata.
  struct Presented {
    std::optional<std::string_view> common_name;
    std::optional<std::string_view> authorization;
  };
  // The identity behind what a call presents: the certificate's common name, else the
  // token's whose proof it carries (or, over TLS, the bearer token's). UNAUTHENTICATED
  // when it is missing or unknown, when the proof is wrong or stale (made for an earlier
  // process of this shard: the message then starts with crypto::kStalePrefix), or when
  // certificate and token disagree. Only when required(). On a refusal `charge_to`, if
  // given, is set to the tarpit client the refusal counts against: kAnonymousClient, or
  // for a stale proof of a known token kStaleProofClient, so that the honest clients'
  // stale calls after a restart are not held behind other refusals of strangers. (One
  // client for all stale proofs: a bucket per identity would give one who names ever
  // new identities a fresh budget each time.)
  // `token_key`, if given, is set to the key of the token proved (crypto::TokenKey; the
  // bearer token's too), empty when none was (a client certificate alone).
  absl::StatusOr<core::Identity> Verify(const Presented& presented,
                                        std::string* charge_to = nullptr,
                                        std::string* token_key = nullptr) const;
  // The answer to a challenge (crypto/auth_proof.h) carrying `authorization`: the text
  // "ps-auth-challenge-v1 shard-N NONCE PROOF" that the port's processor sends back as
  // the call's status message. UNAUTHENTICATED when it is no challenge, or names a token
  // this shard does not know.
  absl::StatusOr<std::string> AnswerChallenge(std::optional<std::string_view> authorization) const;
  // This process: its identity (shard-N) and its instance nonce (random, drawn at start).
  const core::Identity& self() const { return self_; }
  const std::string& instance_nonce() const { return nonce_; }
  // The caller of one call: Verify of what it presents.
  absl::StatusOr<Caller> Identify(const grpc::ServerContextBase& ctx) const;

  // The token named `key` (a Caller's token_key), to which the keys of the data session
  // its Join opens are bound (docs/data-plane.md, "The key"); empty for an empty or
  // unknown key.
  std::string TokenNamed(std::string_view key) const;

  // The listening port's TLS material (PEM text; all empty: plaintext).
  const std::string& cert_pem() const { return cert_pem_; }
  const std::string& key_pem() const { return key_pem_; }
  const std::string& ca_pem() const { return ca_pem_; }
  // How this shard authenticates to its peers: TLS against the same CA with its own
  // certificate, and its own shard-N token if the token file lists one.
  core::ClientCredentials PeerCredentials(uint32_t shard_id) const;

 private:
  Authenticator() = default;

  // A token a client may name in a challenge or a proof (crypto::TokenKey), with the
  // proof its calls to this process carry.
  struct Key {
    core::Identity identity;
    std::string token;
    std::string call_proof;  // crypto::CallProof for this process (raw)
  };
  Key MakeKey(std::string key, const core::Identity& identity, std::string token) const;
  // The token `key` names: from keys_, else (an identity beyond those made at start)
  // derived from the secret now.
  std::optional<Key> FindKey(std::string_view key) const;
  bool takes_tokens() const { return tokens_.has_value() || !secret_.empty(); }
  absl::StatusOr<core::Identity> VerifyProof(std::string_view value, std::string* charge_to,
                                             std::string* token_key) const;

  bool required_ = false;
  std::string cert_pem_, key_pem_, ca_pem_;
  std::string cert_path_, key_path_, ca_path_;
  std::optional<TokenTable> tokens_;
  std::string secret_;  // the cluster secret (raw bytes); empty: none
  core::Identity self_;
  std::string nonce_;     // this process's instance nonce (raw)
  std::string instance_;  // crypto::InstanceId(nonce_)
  // Every token of the token file, and the derived tokens of the workers (the first
  // kKeysMadeAtStart), shards and admin of this configuration: immutable after Create,
  // so a call's proof is checked with one lookup and no lock.
  absl::flat_hash_map<std::string, Key> keys_;
};

class RateLimiter {
 public:
  // `per_second` <= 0: everything is allowed. `burst` 0 means max(1, per_second).
  RateLimiter(double per_second, uint32_t burst, core::Clock* clock);
  // Takes one request from `key`'s bucket; false when it is empty.
  bool Allow(const std::string& key);

 private:
  const double per_second_;
  const double burst_;
  core::Clock* const clock_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, core::TokenBucket> buckets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::server
