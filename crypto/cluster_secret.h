// The cluster secret: the default way shards tell their clients apart (docs/operations.md,
// "Securing"). One random 32-byte secret per deployment; the token of every identity
// (worker-N, shard-N, admin) is derived from it,
//   token = "<identity>.<hex HMAC-SHA256(secret, "ps-server token v1 <identity>")>",
// so shards that share the secret accept each other and every client, while a client
// holding only its own token cannot act as anybody else.
//
// A run directory (like Jupyter's runtime directory) holds a generated secret and the
// token file of each client: RUN/secret, RUN/token-worker-N, RUN/token-admin. It must be
// private: owned by this user and closed to group and others (0700), its files 0600, and
// the directory itself, not a symbolic link to one (RunDirectory).
//
// The cryptography is OpenSSL's (RAND_bytes, HMAC-SHA256, CRYPTO_memcmp), which is why this
// lives in crypto/ (ps_crypto) and not in core/ (docs/architecture.md, "Parts").
//
// Grpc-free; all functions are thread-safe (they touch only the files they name).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"
#include "core/credentials.h"

namespace ps::crypto {

inline constexpr size_t kSecretBytes = 32;

// `n` bytes from OpenSSL's random generator.
absl::StatusOr<std::string> RandomBytes(size_t n);
// A fresh random secret (kSecretBytes raw bytes).
absl::StatusOr<std::string> NewSecret();
// The token of `identity` under `secret` (raw bytes).
std::string DeriveToken(std::string_view secret, const core::Identity& identity);
// Whether `token` is the derived token of some identity under `secret`; that identity.
// The comparison takes the same time however much of a wrong token matched.
std::optional<core::Identity> VerifyDerivedToken(std::string_view secret, std::string_view token);

// Reads a secret file: 64 hex digits (surrounding whitespace ignored). Refuses a file
// that group or others may read, or that another user owns (checked on the opened file).
absl::StatusOr<std::string> ReadSecretFile(const std::string& path);

// A run directory, opened once and used through its descriptor, so that nobody can swap
// another directory (or a symbolic link to one) in between the checks and the use:
// every file in it is opened relative to the descriptor (openat) and never through a
// symbolic link.
class RunDirectory {
 public:
  // Opens `dir` (its canonical form: CanonicalRunDirectory). With `create`, makes it
  // (mode 0700, and missing parents) when it does not exist. Refuses a symbolic link, a
  // non-directory, and a directory that is not this user's or is open to group or others
  // (what the other user could read or plant there); the error says how to fix it.
  static absl::StatusOr<RunDirectory> Open(std::string_view dir, bool create);

  RunDirectory(RunDirectory&& other) noexcept;
  RunDirectory& operator=(RunDirectory&& other) noexcept;
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;
  ~RunDirectory();

  // The canonical path (for messages and for clients).
  const std::string& path() const { return path_; }
  // DIR/secret: read when present, else created (mode 0600). Shards starting together
  // in one run directory all end up with the same secret (the first one written wins).
  absl::StatusOr<std::string> LoadOrCreateSecret() const;
  // Writes `token` to DIR/token-<identity> (mode 0600, atomically); returns the path.
  absl::StatusOr<std::string> WriteToken(const core::Identity& identity,
                                         std::string_view token) const;
  // The token in DIR/token-<identity> (ReadTokenFile's rules; the file must be this
  // user's, mode 0600, and not a symbolic link).
  absl::StatusOr<std::string> ReadToken(const core::Identity& identity) const;

 private:
  RunDirectory(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

// `dir` as a run directory is used: lexically normal, without trailing slashes ("DIR/"
// or "DIR/." would make the kernel follow a symbolic link at DIR).
std::string CanonicalRunDirectory(std::string_view dir);
// RunDirectory::Open(dir, /*create=*/true), for its checks only.
absl::Status EnsurePrivateDirectory(const std::string& dir);
// RunDirectory::Open(run_dir, /*create=*/true), then its LoadOrCreateSecret.
absl::StatusOr<std::string> LoadOrCreateSecret(const std::string& run_dir);
// RunDirectory::Open(run_dir, /*create=*/true), then its WriteToken.
absl::StatusOr<std::string> WriteTokenFile(const std::string& run_dir,
                                           const core::Identity& identity, std::string_view token);
// RunDirectory::Open(run_dir, /*create=*/false), then its ReadToken: how clients
// (ps-admin --run-dir, the trainer's --run-dir) read their token.
absl::StatusOr<std::string> ReadRunDirectoryToken(const std::string& run_dir,
                                                  const core::Identity& identity);
// RUN/token-<identity> (RUN canonical).
std::string TokenFilePath(const std::string& run_dir, const core::Identity& identity);
// Where ps-server keeps its run directory when none is given: $XDG_RUNTIME_DIR/ps-server,
// else $HOME/.ps-server; NOT_FOUND when neither variable is set.
absl::StatusOr<std::string> DefaultRunDirectory();

}  // namespace ps::crypto
