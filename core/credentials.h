// Identities and client credentials of ps-server connections (docs/operations.md,
// "Securing"). Grpc-free; net/grpc_credentials.h turns ClientCredentials into gRPC
// channel credentials.
//
// Every client of a shard has an identity: "worker-N" (worker rank N), "shard-N" (peer
// shard N) or "admin" (the operator's tools). A shard learns it from the common name of
// the client's certificate (mTLS) or from the token whose proof the client gives (a token
// of its token file or one derived from its cluster secret; crypto/auth_proof.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ps::core {

struct Identity {
  enum class Kind { kWorker, kShard, kAdmin };
  Kind kind = Kind::kWorker;
  uint32_t index = 0;  // N of worker-N / shard-N; 0 for admin

  std::string Name() const;
  bool operator==(const Identity&) const = default;
};

// "worker-3" -> {kWorker, 3}; "shard-0"; "admin". INVALID_ARGUMENT for anything else
// (no sign, no leading zeros, index < 2^31).
absl::StatusOr<Identity> ParseIdentity(std::string_view name);

// How a client (worker, peer shard, ps-admin) authenticates to a shard.
struct ClientCredentials {
  // CA bundle (PEM file) that signed the shards' certificates: set, the channel uses
  // TLS and verifies the shard.
  std::string tls_ca;
  // Client certificate and key (PEM files), for shards that require mTLS.
  std::string tls_cert;
  std::string tls_key;
  // Name checked in the shard's certificate instead of the address's host (for
  // connections by IP address or through a relay).
  std::string tls_server_name;
  // Token (the value, see ReadTokenFile). Never sent: every call carries a proof of it
  // for the shard process that proved it holds it too (net/channel_auth.h).
  std::string token;

  bool tls() const { return !tls_ca.empty(); }
  // Checks the combination (cert and key together, cert needs TLS, token characters).
  absl::Status Validate() const;
};

// The whole of a small file (certificates, keys, tokens), or an error naming `what`
// and the path. Refuses files over 1 MiB.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, std::string_view what);
// A token file: one token, surrounding whitespace ignored; printable ASCII without
// spaces, 16 to 4096 characters.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);
// Checks a token's characters and length (as ReadTokenFile).
absl::Status CheckToken(std::string_view token);

}  // namespace ps::core
