#include "core/cluster_secret.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace ps::core {
namespace {

constexpr std::string_view kTokenLabel = "ps-server token v1 ";

std::string Hmac(std::string_view secret, std::string_view message) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int md_len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), md, &md_len);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(md), md_len));
}

std::string Errno(std::string_view what, const std::string& path) {
  return absl::StrCat(AsAbsl(what), " ", path, ": ", std::strerror(errno));
}

// Group or other permission bits, or another owner: not private.
absl::Status CheckPrivate(const std::string& path, const struct stat& st, bool directory) {
  if (st.st_uid != geteuid()) {
    return absl::PermissionDeniedError(absl::StrCat(
        path, " belongs to user ", st.st_uid, ", not to this user (", geteuid(),
        "): another user could have planted it; use a directory of your own"));
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return absl::PermissionDeniedError(absl::StrCat(
        path, " is open to other users (mode ", mode, "): chmod ", directory ? "700" : "600", " ",
        path));
  }
  return absl::OkStatus();
}

// Writes `data` to `path` through a temporary file: mode 0600, fsync'd. With
// `replace` false an existing `path` is left as it is (link(2) refuses atomically):
// ALREADY_EXISTS then.
absl::Status WritePrivateFile(const std::string& path, std::string_view data, bool replace) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid(), ".", counter.fetch_add(1));
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return absl::UnavailableError(Errno("cannot create", tmp));
  const bool written = write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size()) &&
                       fsync(fd) == 0;
  close(fd);
  absl::Status st;
  if (!written) {
    st = absl::UnavailableError(Errno("cannot write", tmp));
  } else if (replace) {
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      st = absl::UnavailableError(Errno("cannot rename to", path));
    }
  } else if (link(tmp.c_str(), path.c_str()) != 0) {
    st = errno == EEXIST ? absl::AlreadyExistsError(path)
                         : absl::UnavailableError(Errno("cannot create", path));
  }
  unlink(tmp.c_str());
  return st;
}

}  // namespace

absl::StatusOr<std::string> NewSecret() {
  std::string secret(kSecretBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(secret.data()), kSecretBytes) != 1) {
    return absl::InternalError("no randomness for a secret");
  }
  return secret;
}

std::string DeriveToken(std::string_view secret, const Identity& identity) {
  const std::string name = identity.Name();
  return absl::StrCat(name, ".", Hmac(secret, absl::StrCat(AsAbsl(kTokenLabel), name)));
}

std::optional<Identity> VerifyDerivedToken(std::string_view secret, std::string_view token) {
  const size_t dot = token.find('.');
  if (dot == std::string_view::npos) return std::nullopt;
  absl::StatusOr<Identity> id = ParseIdentity(token.substr(0, dot));
  if (!id.ok()) return std::nullopt;
  const std::string want = DeriveToken(secret, *id);
  if (want.size() != token.size() || CRYPTO_memcmp(want.data(), token.data(), want.size()) != 0) {
    return std::nullopt;
  }
  return *id;
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(Errno("cannot read the secret file", path));
  }
  PS_RETURN_IF_ERROR(CheckPrivate(path, st, /*directory=*/false));
  PS_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, "secret file"));
  const absl::string_view hex = absl::StripAsciiWhitespace(text);
  if (hex.size() != 2 * kSecretBytes ||
      hex.find_first_not_of("0123456789abcdefABCDEF") != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "secret file ", path, " must hold ", 2 * kSecretBytes,
        " hex digits (ps-admin secret > FILE makes one)"));
  }
  return absl::HexStringToBytes(hex);
}

absl::Status EnsurePrivateDirectory(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) {
    const std::filesystem::path parent = std::filesystem::path(dir).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return absl::UnavailableError(Errno("cannot create the run directory", dir));
    }
  }
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0) {
    return absl::UnavailableError(Errno("cannot read the run directory", dir));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("run directory ", dir, " is not a directory"));
  }
  return CheckPrivate(dir, st, /*directory=*/true);
}

absl::StatusOr<std::string> LoadOrCreateSecret(const std::string& run_dir) {
  PS_RETURN_IF_ERROR(EnsurePrivateDirectory(run_dir));
  const std::string path = absl::StrCat(run_dir, "/secret");
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    PS_ASSIGN_OR_RETURN(std::string secret, NewSecret());
    absl::Status written = WritePrivateFile(
        path, absl::StrCat(absl::BytesToHexString(secret), "\n"), /*replace=*/false);
    if (written.ok()) return secret;
    if (!absl::IsAlreadyExists(written)) return written;
    // Another shard of this run directory wrote it first: use theirs.
  }
  return ReadSecretFile(path);
}

std::string TokenFilePath(const std::string& run_dir, const Identity& identity) {
  return absl::StrCat(run_dir, "/token-", identity.Name());
}

absl::StatusOr<std::string> WriteTokenFile(const std::string& run_dir, const Identity& identity,
                                           std::string_view token) {
  const std::string path = TokenFilePath(run_dir, identity);
  PS_RETURN_IF_ERROR(WritePrivateFile(path, absl::StrCat(AsAbsl(token), "\n"), /*replace=*/true));
  return path;
}

absl::StatusOr<std::string> DefaultRunDirectory() {
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg != nullptr && *xdg == '/') {
    return absl::StrCat(xdg, "/ps-server");
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home == '/') {
    return absl::StrCat(home, "/.ps-server");
  }
  return absl::NotFoundError(
      "neither XDG_RUNTIME_DIR nor HOME is set: give --run-dir (or --secret-file)");
}

}  // namespace ps::core
