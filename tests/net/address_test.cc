// Host and port parsing and host resolution for our own sockets (net/address.h).
#include "net/address.h"

#include <gtest/gtest.h>

namespace ps::net {
namespace {

TEST(SplitHostPortTest, SplitsNamesAndBracketedV6) {
  absl::StatusOr<HostPort> a = SplitHostPort("shard-0.example:5000", "shard address");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host, "shard-0.example");
  EXPECT_EQ(a->port, 5000);
  absl::StatusOr<HostPort> v6 = SplitHostPort("[::1]:65535", "shard address");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 65535);
}

TEST(SplitHostPortTest, RefusesWhatIsNoHostPort) {
  for (const char* bad : {"", "host", ":80", "host:", "host:0", "host:65536", "host:8x", "::1:80",
                          "[::1]80", "[::1"}) {
    absl::StatusOr<HostPort> r = SplitHostPort(bad, "upstream address");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("upstream address '"), std::string::npos) << bad;
  }
}

TEST(ParseHostPortTest, SaysWhatIsWrongWithoutNamingTheAddress) {
  const std::pair<const char*, const char*> cases[] = {
      {"host", "expected host:port"},
      {"[::1", "expected [v6-address]:port"},
      {"::1:80", "write IPv6 addresses as [addr]:port, the address in brackets"},
      {":80", "empty host"},
      {"host:", "empty port; a port must be a number in [1, 65535]"},
      {"host:http", "port is not a number ('http'); a port must be a number in [1, 65535]"},
      {"host:-1", "port is not a number ('-1')"},
      {"host:0", "port out of range (0); a port must be a number in [1, 65535]"},
      {"host:65536", "port out of range (65536)"},
      {"host:99999999999999999999", "port out of range (99999999999999999999)"},
  };
  for (const auto& [address, message] : cases) {
    absl::StatusOr<HostPort> r = ParseHostPort(address);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << address;
    EXPECT_EQ(r.status().message().find(message), 0u) << address << ": " << r.status();
  }
  EXPECT_EQ(ParseHostPort("[fe80::1]:1")->host, "fe80::1");
  EXPECT_EQ(ParseHostPort("a:65535")->port, 65535);
}

TEST(ResolveHostTest, LiteralsAndLocalhostNeedNoResolver) {
  EXPECT_EQ(ResolveHost("127.0.0.1", "x")->to_string(), "127.0.0.1");
  EXPECT_EQ(ResolveHost("0.0.0.0", "x")->to_string(), "0.0.0.0");
  EXPECT_EQ(ResolveHost("::1", "x")->to_string(), "::1");
  EXPECT_EQ(ResolveHost("[::1]", "x")->to_string(), "::1");
  EXPECT_EQ(ResolveHost("localhost", "x")->to_string(), "127.0.0.1");
  EXPECT_EQ(ResolveHost("LocalHost", "x")->to_string(), "127.0.0.1");
}

TEST(ResolveHostTest, RefusesAnEmptyHostAndNamesWhatDoesNotResolve) {
  EXPECT_EQ(ResolveHost("", "UDP listen address").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveHost("[]", "UDP listen address").status().code(),
            absl::StatusCode::kInvalidArgument);
  // .invalid never resolves (RFC 2606).
  absl::StatusOr<boost::asio::ip::address> r = ResolveHost("no-such-host.invalid", "shard address");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("shard address 'no-such-host.invalid'"), std::string::npos)
      << r.status();
}

}  // namespace
}  // namespace ps::net
