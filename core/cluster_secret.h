// The cluster secret: the default way shards tell their clients apart (docs/operations.md,
// "Securing"). One random 32-byte secret per deployment; the token of every identity
// (worker-N, shard-N, admin) is derived from it,
//   token = "<identity>.<hex HMAC-SHA256(secret, "ps-server token v1 <identity>")>",
// so shards that share the secret accept each other and every client, while a client
// holding only its own token cannot act as anybody else.
//
// A run directory (like Jupyter's runtime directory) holds a generated secret and the
// token file of each client: RUN/secret, RUN/token-worker-N, RUN/token-admin. It must be
// private: owned by this user and closed to group and others (0700), its files 0600.
//
// Grpc-free; all functions are thread-safe (they touch only the files they name).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "core/credentials.h"

namespace ps::core {

inline constexpr size_t kSecretBytes = 32;

// A fresh random secret (kSecretBytes raw bytes).
absl::StatusOr<std::string> NewSecret();
// The token of `identity` under `secret` (raw bytes).
std::string DeriveToken(std::string_view secret, const Identity& identity);
// Whether `token` is the derived token of some identity under `secret`; that identity.
// The comparison takes the same time however much of a wrong token matched.
std::optional<Identity> VerifyDerivedToken(std::string_view secret, std::string_view token);

// Reads a secret file: 64 hex digits (surrounding whitespace ignored). Refuses a file
// that group or others may read.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path);
// Makes `dir` (and missing parents) if needed, then checks that it is a directory owned
// by this user with no group or other permissions; the error says how to fix it.
absl::Status EnsurePrivateDirectory(const std::string& dir);
// RUN/secret: read when present, else created (mode 0600). Shards starting together
// in one run directory all end up with the same secret (the first one written wins).
absl::StatusOr<std::string> LoadOrCreateSecret(const std::string& run_dir);
// Writes `token` to RUN/token-<identity> (mode 0600, atomically); returns the path.
absl::StatusOr<std::string> WriteTokenFile(const std::string& run_dir, const Identity& identity,
                                           std::string_view token);
// RUN/token-<identity>.
std::string TokenFilePath(const std::string& run_dir, const Identity& identity);
// Where ps-server keeps its run directory when none is given: $XDG_RUNTIME_DIR/ps-server,
// else $HOME/.ps-server; NOT_FOUND when neither variable is set.
absl::StatusOr<std::string> DefaultRunDirectory();

}  // namespace ps::core
