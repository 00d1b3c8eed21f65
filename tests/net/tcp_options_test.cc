// The TCP data plane's socket options (net/tcp_options.h) on real sockets.
#include "net/tcp_options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

namespace ps::net {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

// A TCP socket, closed at the end of the scope.
struct TcpSocket {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ~TcpSocket() {
    if (fd >= 0) ::close(fd);
  }
};

// Set, read back (the kernel rounds up to its clock ticks, at most 4 ms a tick), refused
// outside (0, 200] ms; 0 leaves the kernel's 200 ms. Skipped on a kernel before 6.15,
// which has no such option, after checking the error says so.
TEST(TcpOptionsTest, TheLeastRetransmissionTimeoutIsSetAndReadBack) {
  TcpSocket s;
  ASSERT_GE(s.fd, 0);
  const absl::StatusOr<microseconds> before = TcpRtoMin(s.fd);
  if (!before.ok()) {
    EXPECT_EQ(before.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(before.status().message()), ::testing::HasSubstr("Linux 6.15"));
    const absl::Status set = SetTcpRtoMin(s.fd, milliseconds(10));
    EXPECT_EQ(set.code(), absl::StatusCode::kFailedPrecondition) << set;
    GTEST_SKIP() << "this kernel has no TCP_RTO_MIN_US: " << before.status();
  }
  EXPECT_EQ(*before, milliseconds(200));
  ASSERT_TRUE(SetTcpRtoMin(s.fd, microseconds(0)).ok());
  EXPECT_EQ(*TcpRtoMin(s.fd), milliseconds(200)) << "0 leaves the kernel's";
  ASSERT_TRUE(SetTcpRtoMin(s.fd, milliseconds(10)).ok());
  const microseconds set = *TcpRtoMin(s.fd);
  EXPECT_GE(set, milliseconds(10));
  EXPECT_LE(set, milliseconds(14));
  for (const microseconds bad : {microseconds(-1), microseconds(200'001), microseconds(1)}) {
    const absl::Status st = SetTcpRtoMin(s.fd, bad);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad.count() << ": " << st;
  }
  EXPECT_EQ(*TcpRtoMin(s.fd), set) << "a refused value changes nothing";
}

}  // namespace
}  // namespace ps::net
