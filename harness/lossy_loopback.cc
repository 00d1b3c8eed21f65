#include "harness/lossy_loopback.h"

#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "harness/child_process.h"

namespace ps::harness {
namespace {

constexpr char kTable[] = "ps_bench_loss";

// Errno's error, naming the fix where a privilege is missing.
absl::Status ErrnoError(std::string_view what) {
  const int err = errno;
  const std::string message = absl::StrCat(std::string(what), ": ", std::strerror(err));
  if (err != EPERM) return absl::InternalError(message);
  return absl::PermissionDeniedError(
      absl::StrCat(message, " (a network namespace of its own needs root: run as root)"));
}

// A file under $TMPDIR (or /tmp) removed when this goes away.
class TempFile {
 public:
  static absl::StatusOr<TempFile> Create() {
    const char* dir = std::getenv("TMPDIR");
    std::string path = absl::StrCat(dir != nullptr && *dir != '\0' ? dir : "/tmp",
                                    "/ps-nft-XXXXXX");
    const int fd = ::mkstemp(path.data());
    if (fd < 0) return ErrnoError(absl::StrCat("cannot create ", path));
    ::close(fd);
    return TempFile(std::move(path));
  }
  TempFile(TempFile&& other) noexcept : path_(std::move(other.path_)) { other.path_.clear(); }
  TempFile(const TempFile&) = delete;
  ~TempFile() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  explicit TempFile(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

}  // namespace

absl::StatusOr<LossyLoopback> LossyLoopback::Enter() {
  std::string nft;
  for (const char* candidate : {"/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft"}) {
    if (::access(candidate, X_OK) == 0) {
      nft = candidate;
      break;
    }
  }
  if (nft.empty()) {
    return absl::NotFoundError(
        "kernel loss needs the nft program (Debian: apt-get install nftables)");
  }
  if (::unshare(CLONE_NEWNET) != 0) return ErrnoError("unshare(CLONE_NEWNET)");
  // A new namespace's loopback is down.
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoError("socket");
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  absl::Status status;
  if (::ioctl(fd, SIOCGIFFLAGS, &ifr) != 0) {
    status = ErrnoError("reading the loopback's flags");
  } else {
    ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP);
    if (::ioctl(fd, SIOCSIFFLAGS, &ifr) != 0) status = ErrnoError("bringing the loopback up");
  }
  ::close(fd);
  if (!status.ok()) return status;
  LossyLoopback loopback(std::move(nft));
  if (absl::Status st = loopback.SetLoss(0); !st.ok()) return st;
  return loopback;
}

absl::StatusOr<std::string> LossyLoopback::Nft(const std::string& script) const {
  absl::StatusOr<TempFile> input = TempFile::Create();
  if (!input.ok()) return input.status();
  absl::StatusOr<TempFile> output = TempFile::Create();
  if (!output.ok()) return output.status();
  {
    std::ofstream out(input->path());
    out << script;
    if (!out.flush()) return absl::InternalError(absl::StrCat("cannot write ", input->path()));
  }
  harness::SpawnOptions options;
  options.path = nft_;
  options.args = {"-f", input->path()};
  options.stdout_file = output->path();
  options.stderr_file = output->path();
  absl::StatusOr<std::unique_ptr<harness::ChildProcess>> child =
      harness::ChildProcess::Spawn(options);
  if (!child.ok()) return child.status();
  if (!(*child)->WaitFor(std::chrono::seconds(20))) {
    (*child)->Kill();
    return absl::DeadlineExceededError(absl::StrCat(nft_, " took over 20 s"));
  }
  std::ifstream in(output->path());
  std::stringstream text;
  text << in.rdbuf();
  if ((*child)->exit_code() != 0) {
    return absl::InternalError(absl::StrCat(nft_, " -f (", (*child)->Describe(), "): ", text.str(),
                                            "\nscript:\n", script));
  }
  return text.str();
}

absl::Status LossyLoopback::SetLoss(double loss) {
  if (!(loss >= 0 && loss < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("loss ", loss, " is not in [0, 1)"));
  }
  // In millionths: numgen draws a uniform number per packet.
  const uint64_t below = static_cast<uint64_t>(std::llround(loss * 1e6));
  // Declaring the table first makes the delete succeed on the first call too; the
  // script is one transaction, so no packet sees the table missing. Without loss there
  // is no rule at all, so the lossless rows pay nothing for the hook (docs/bench.md).
  std::string script = absl::StrCat("table inet ", kTable, "\n", "delete table inet ", kTable, "\n");
  if (below > 0) {
    absl::StrAppend(&script, "table inet ", kTable,
                    " {\n  chain in {\n    type filter hook input priority 0; policy accept;\n",
                    "    iif \"lo\" numgen random mod 1000000 < ", below, " counter drop\n  }\n}\n");
  }
  PS_RETURN_IF_ERROR(Nft(script).status());
  rule_ = below > 0;
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> LossyLoopback::Dropped() const {
  if (!rule_) return 0;
  absl::StatusOr<std::string> listing = Nft(absl::StrCat("list chain inet ", kTable, " in\n"));
  if (!listing.ok()) return listing.status();
  const size_t at = listing->find("packets ");
  uint64_t packets = 0;
  if (at == std::string::npos) {
    return absl::InternalError(absl::StrCat("no packet counter in nft's listing: ", *listing));
  }
  const size_t begin = at + std::strlen("packets ");
  const size_t end = listing->find(' ', begin);
  if (!absl::SimpleAtoi(listing->substr(begin, end - begin), &packets)) {
    return absl::InternalError(absl::StrCat("cannot read nft's packet counter: ", *listing));
  }
  return packets;
}

}  // namespace ps::harness
