#include "crypto/cluster_secret.h"

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

namespace ps::crypto {

using core::AsAbsl;
using core::CheckToken;
using core::Identity;
using core::ParseIdentity;

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

// The secret in a secret file's text (64 hex digits); errors name `path`.
absl::StatusOr<std::string> ParseSecret(std::string_view text, const std::string& path) {
  const absl::string_view hex = absl::StripAsciiWhitespace(AsAbsl(text));
  if (hex.size() != 2 * kSecretBytes ||
      hex.find_first_not_of("0123456789abcdefABCDEF") != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "secret file ", path, " must hold ", 2 * kSecretBytes,
        " hex digits (ps-admin secret > FILE makes one)"));
  }
  return absl::HexStringToBytes(hex);
}

// Reads `name` relative to `dir_fd` (AT_FDCWD: a path) and checks the opened file:
// a regular file of this user's, closed to others. With `follow` false a symbolic link
// is refused. At most 64 KiB.
absl::StatusOr<std::string> ReadPrivateFile(int dir_fd, const std::string& name,
                                            const std::string& shown, bool follow,
                                            std::string_view what) {
  const int fd = openat(dir_fd, name.c_str(), O_RDONLY | O_CLOEXEC | (follow ? 0 : O_NOFOLLOW));
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat("cannot read the ", AsAbsl(what), " ", shown, ": ",
                                              std::strerror(err)));
    }
    if (err == ELOOP) {
      return absl::PermissionDeniedError(
          absl::StrCat(AsAbsl(what), " ", shown,
                       " is a symbolic link: another user could have planted it; remove it"));
    }
    return absl::UnavailableError(
        absl::StrCat("cannot read the ", AsAbsl(what), " ", shown, ": ", std::strerror(err)));
  }
  struct stat st {};
  absl::Status checked;
  if (fstat(fd, &st) != 0) {
    checked = absl::UnavailableError(Errno("cannot read", shown));
  } else if (!S_ISREG(st.st_mode)) {
    checked = absl::FailedPreconditionError(
        absl::StrCat(AsAbsl(what), " ", shown, " is not a regular file"));
  } else {
    checked = CheckPrivate(shown, st, /*directory=*/false);
  }
  std::string data;
  if (checked.ok()) {
    char buf[4096];
    for (;;) {
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        checked = absl::UnavailableError(Errno("cannot read", shown));
        break;
      }
      if (n == 0) break;
      data.append(buf, static_cast<size_t>(n));
      if (data.size() > (64u << 10)) {
        checked = absl::InvalidArgumentError(
            absl::StrCat(AsAbsl(what), " ", shown, " is larger than 64 KiB"));
        break;
      }
    }
  }
  close(fd);
  if (!checked.ok()) return checked;
  return data;
}

// Writes `data` to `name` in the directory `dir_fd` through a temporary file there:
// mode 0600, fsync'd, never through a symbolic link. With `replace` false an existing
// `name` is left as it is (linkat refuses atomically): ALREADY_EXISTS then.
absl::Status WritePrivateFileAt(int dir_fd, const std::string& dir, const std::string& name,
                                std::string_view data, bool replace) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = absl::StrCat(name, ".tmp.", getpid(), ".", counter.fetch_add(1));
  const std::string path = absl::StrCat(dir, "/", name);
  const int fd =
      openat(dir_fd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return absl::UnavailableError(Errno("cannot create", absl::StrCat(dir, "/", tmp)));
  const bool written = write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size()) &&
                       fsync(fd) == 0;
  close(fd);
  absl::Status st;
  if (!written) {
    st = absl::UnavailableError(Errno("cannot write", absl::StrCat(dir, "/", tmp)));
  } else if (replace) {
    if (renameat(dir_fd, tmp.c_str(), dir_fd, name.c_str()) != 0) {
      st = absl::UnavailableError(Errno("cannot rename to", path));
    }
  } else if (linkat(dir_fd, tmp.c_str(), dir_fd, name.c_str(), 0) != 0) {
    st = errno == EEXIST ? absl::AlreadyExistsError(path)
                         : absl::UnavailableError(Errno("cannot create", path));
  }
  unlinkat(dir_fd, tmp.c_str(), 0);
  return st;
}

std::string TokenFileName(const Identity& identity) {
  return absl::StrCat("token-", identity.Name());
}

}  // namespace

absl::StatusOr<std::string> RandomBytes(size_t n) {
  std::string bytes(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(bytes.data()), static_cast<int>(n)) != 1) {
    return absl::InternalError("no randomness from OpenSSL");
  }
  return bytes;
}

absl::StatusOr<std::string> NewSecret() { return RandomBytes(kSecretBytes); }

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
  PS_ASSIGN_OR_RETURN(std::string text, ReadPrivateFile(AT_FDCWD, path, path, /*follow=*/true,
                                                        "secret file"));
  return ParseSecret(text, path);
}

std::string CanonicalRunDirectory(std::string_view dir) {
  std::string p = std::filesystem::path(dir).lexically_normal().string();
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p.empty() ? std::string(".") : p;
}

absl::StatusOr<RunDirectory> RunDirectory::Open(std::string_view dir, bool create) {
  const std::string path = CanonicalRunDirectory(dir);
  if (create) {
    std::error_code ec;
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    if (mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
      return absl::UnavailableError(Errno("cannot create the run directory", path));
    }
  }
  const int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    struct stat st {};
    if (lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      std::error_code ec;
      const std::filesystem::path target = std::filesystem::read_symlink(path, ec);
      return absl::PermissionDeniedError(absl::StrCat(
          "run directory ", path, " is a symbolic link (to ", target.string(),
          ", link owned by user ", st.st_uid, "): give the directory itself, not a link to it (a link another user can "
          "change could hand them the secret)"));
    }
    if (err == ENOTDIR) {
      return absl::FailedPreconditionError(
          absl::StrCat("run directory ", path, " is not a directory"));
    }
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat("run directory ", path, " does not exist"));
    }
    errno = err;
    return absl::UnavailableError(Errno("cannot open the run directory", path));
  }
  RunDirectory opened(fd, path);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    return absl::UnavailableError(Errno("cannot read the run directory", path));
  }
  PS_RETURN_IF_ERROR(CheckPrivate(path, st, /*directory=*/true));
  return opened;
}

RunDirectory::RunDirectory(RunDirectory&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

RunDirectory& RunDirectory::operator=(RunDirectory&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

RunDirectory::~RunDirectory() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<std::string> RunDirectory::LoadOrCreateSecret() const {
  const std::string shown = absl::StrCat(path_, "/secret");
  absl::StatusOr<std::string> text =
      ReadPrivateFile(fd_, "secret", shown, /*follow=*/false, "secret file");
  if (absl::IsNotFound(text.status())) {
    PS_ASSIGN_OR_RETURN(std::string secret, NewSecret());
    absl::Status written =
        WritePrivateFileAt(fd_, path_, "secret", absl::StrCat(absl::BytesToHexString(secret), "\n"),
                           /*replace=*/false);
    if (written.ok()) return secret;
    if (!absl::IsAlreadyExists(written)) return written;
    // Another shard of this run directory wrote it first: use theirs.
    text = ReadPrivateFile(fd_, "secret", shown, /*follow=*/false, "secret file");
  }
  if (!text.ok()) return text.status();
  return ParseSecret(*text, shown);
}

absl::StatusOr<std::string> RunDirectory::WriteToken(const Identity& identity,
                                                     std::string_view token) const {
  const std::string name = TokenFileName(identity);
  PS_RETURN_IF_ERROR(WritePrivateFileAt(fd_, path_, name, absl::StrCat(AsAbsl(token), "\n"),
                                        /*replace=*/true));
  return absl::StrCat(path_, "/", name);
}

absl::StatusOr<std::string> RunDirectory::ReadToken(const Identity& identity) const {
  const std::string name = TokenFileName(identity);
  const std::string shown = absl::StrCat(path_, "/", name);
  PS_ASSIGN_OR_RETURN(std::string text,
                      ReadPrivateFile(fd_, name, shown, /*follow=*/false, "token file"));
  std::string token(absl::StripAsciiWhitespace(text));
  if (absl::Status st = CheckToken(token); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", shown, ": ", st.message()));
  }
  return token;
}

absl::Status EnsurePrivateDirectory(const std::string& dir) {
  return RunDirectory::Open(dir, /*create=*/true).status();
}

absl::StatusOr<std::string> LoadOrCreateSecret(const std::string& run_dir) {
  PS_ASSIGN_OR_RETURN(RunDirectory dir, RunDirectory::Open(run_dir, /*create=*/true));
  return dir.LoadOrCreateSecret();
}

absl::StatusOr<std::string> WriteTokenFile(const std::string& run_dir, const Identity& identity,
                                           std::string_view token) {
  PS_ASSIGN_OR_RETURN(RunDirectory dir, RunDirectory::Open(run_dir, /*create=*/true));
  return dir.WriteToken(identity, token);
}

absl::StatusOr<std::string> ReadRunDirectoryToken(const std::string& run_dir,
                                                  const Identity& identity) {
  PS_ASSIGN_OR_RETURN(RunDirectory dir, RunDirectory::Open(run_dir, /*create=*/false));
  return dir.ReadToken(identity);
}

std::string TokenFilePath(const std::string& run_dir, const Identity& identity) {
  return absl::StrCat(CanonicalRunDirectory(run_dir), "/", TokenFileName(identity));
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

}  // namespace ps::crypto
