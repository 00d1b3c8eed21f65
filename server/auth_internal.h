// Who is calling a shard, and whether they may (docs/operations.md, "Securing" and
// "Threat model and limits").
//
// An Authenticator is made from the server options once at start. With --tls-ca
// (mTLS), --tokens or a cluster secret (--secret-file, --run-dir: the default), every
// call must carry an identity: the common name of a client certificate signed by the
// CA, a bearer token from the token file, or a token derived from the secret
// (core/cluster_secret.h). With --insecure, calls are anonymous and the worker id is
// taken from the request (the server is then bound to loopback unless
// --allow-insecure-remote).
//
// The listening port's credentials (server/metadata_auth.h) check the same identities
// from each call's metadata before gRPC reads its body.
//
// A RateLimiter gives each client (identity, or address when anonymous) a token
// bucket of requests.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/clock.h"
#include "core/credentials.h"
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
  size_t size() const { return by_digest_.size(); }

 private:
  absl::flat_hash_map<std::string, core::Identity> by_digest_;
  absl::flat_hash_map<std::string, std::string> by_name_;
};

// Who made a call; nullopt identity = anonymous (no client authentication configured).
struct Caller {
  std::optional<core::Identity> identity;
  std::string address;  // gRPC peer string, e.g. "ipv4:127.0.0.1:5123"

  // The identity's name, or the address when anonymous (rate-limit key, log text).
  std::string Name() const;
  bool loopback() const;
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
  // bearer token's. UNAUTHENTICATED when it is missing or unknown, or when certificate
  // and token disagree. Only when required().
  absl::StatusOr<core::Identity> Verify(const Presented& presented) const;
  // The caller of one call: Verify of what it presents.
  absl::StatusOr<Caller> Identify(const grpc::ServerContextBase& ctx) const;

  // The listening port's TLS material (PEM text; all empty: plaintext).
  const std::string& cert_pem() const { return cert_pem_; }
  const std::string& key_pem() const { return key_pem_; }
  const std::string& ca_pem() const { return ca_pem_; }
  // How this shard authenticates to its peers: TLS against the same CA with its own
  // certificate, and its own shard-N token if the token file lists one.
  core::ClientCredentials PeerCredentials(uint32_t shard_id) const;

 private:
  Authenticator() = default;

  bool required_ = false;
  std::string cert_pem_, key_pem_, ca_pem_;
  std::string cert_path_, key_path_, ca_path_;
  std::optional<TokenTable> tokens_;
  std::string secret_;  // the cluster secret (raw bytes); empty: none
};

class RateLimiter {
 public:
  // `per_second` <= 0: everything is allowed. `burst` 0 means max(1, per_second).
  RateLimiter(double per_second, uint32_t burst, core::Clock* clock);
  // Takes one request from `key`'s bucket; false when it is empty.
  bool Allow(const std::string& key);

 private:
  struct Bucket {
    double tokens = 0;
    core::SteadyTime last{};
  };
  const double per_second_;
  const double burst_;
  core::Clock* const clock_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::server
