#include "net/tcp_options.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace ps::net {

namespace {

// <linux/tcp.h> of Linux 6.15; the C library's headers may predate it.
#ifdef TCP_RTO_MIN_US
constexpr int kTcpRtoMinUs = TCP_RTO_MIN_US;
#else
constexpr int kTcpRtoMinUs = 45;
#endif

std::string KernelRelease() {
  utsname u{};
  return ::uname(&u) == 0 ? std::string(u.release) : std::string("unknown");
}

absl::Status Unsupported(int err) {
  return absl::FailedPreconditionError(absl::StrCat(
      "this kernel (", KernelRelease(), ") cannot set a TCP socket's least retransmission "
      "timeout (TCP_RTO_MIN_US, Linux 6.15 and later): ", std::strerror(err)));
}

}  // namespace

absl::Status SetTcpRtoMin(int fd, std::chrono::microseconds rto_min) {
  if (rto_min.count() == 0) return absl::OkStatus();
  if (rto_min.count() < 0 || rto_min > std::chrono::milliseconds(200)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a TCP least retransmission timeout lies in (0, 200] ms, got ", rto_min.count(), " us"));
  }
  const int value = static_cast<int>(rto_min.count());
  if (::setsockopt(fd, IPPROTO_TCP, kTcpRtoMinUs, &value, sizeof(value)) == 0) {
    return absl::OkStatus();
  }
  const int err = errno;
  if (err == ENOPROTOOPT) return Unsupported(err);
  if (err == EINVAL) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the kernel refused a TCP least retransmission timeout of ", rto_min.count(),
        " us (it takes at least two of its clock ticks): ", std::strerror(err)));
  }
  return absl::InternalError(
      absl::StrCat("setting TCP_RTO_MIN_US on a socket: ", std::strerror(err)));
}

absl::Status TryTcpRtoMin(std::chrono::microseconds rto_min) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("no TCP socket to try TCP_RTO_MIN_US on: ",
                                            std::strerror(errno)));
  }
  const absl::Status st = SetTcpRtoMin(fd, rto_min);
  ::close(fd);
  return st;
}

absl::StatusOr<std::chrono::microseconds> TcpRtoMin(int fd) {
  int value = 0;
  socklen_t size = sizeof(value);
  if (::getsockopt(fd, IPPROTO_TCP, kTcpRtoMinUs, &value, &size) != 0) {
    const int err = errno;
    if (err == ENOPROTOOPT) return Unsupported(err);
    return absl::InternalError(
        absl::StrCat("reading TCP_RTO_MIN_US of a socket: ", std::strerror(err)));
  }
  return std::chrono::microseconds(value);
}

}  // namespace ps::net
