// Identities, token files, the authenticator's configuration errors and the rate limiter
// (core/credentials.h, server/auth_internal.h). The end-to-end refusals over real gRPC
// are in tests/integration/security_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/clock.h"
#include "core/credentials.h"
#include "server/auth_internal.h"
#include "server/options.h"

namespace ps::server {
namespace {

using ::testing::HasSubstr;

TEST(IdentityTest, ParsesTheThreeKindsAndRoundTripsTheirNames) {
  for (const char* name : {"worker-0", "worker-17", "shard-3", "admin", "worker-2147483647"}) {
    auto id = core::ParseIdentity(name);
    ASSERT_TRUE(id.ok()) << name << ": " << id.status();
    EXPECT_EQ(id->Name(), name);
  }
  EXPECT_EQ(core::ParseIdentity("worker-12")->kind, core::Identity::Kind::kWorker);
  EXPECT_EQ(core::ParseIdentity("worker-12")->index, 12u);
  EXPECT_EQ(core::ParseIdentity("shard-1")->kind, core::Identity::Kind::kShard);
  EXPECT_EQ(core::ParseIdentity("admin")->kind, core::Identity::Kind::kAdmin);
}

TEST(IdentityTest, RefusesLookalikes) {
  for (const char* name : {"", "worker", "worker-", "worker-01", "worker--1", "worker-1x",
                           "worker-2147483648", "worker-99999999999", "Worker-1", "shard-",
                           "admin ", "admins", "root", "worker-1\n"}) {
    auto id = core::ParseIdentity(name);
    ASSERT_FALSE(id.ok()) << '"' << name << '"';
    EXPECT_THAT(std::string(id.status().message()), HasSubstr("is not worker-N, shard-N or admin"));
  }
}

constexpr char kTokenA[] = "aaaaaaaaaaaaaaaaaaaaaaaa";
constexpr char kTokenB[] = "bbbbbbbbbbbbbbbbbbbbbbbb";

TEST(TokenTableTest, FindsIdentitiesByTokenAndTokensByIdentity) {
  const std::string text = std::string("# comment line\n\nworker-0 ") + kTokenA +
                           "   # trailing comment\n\tadmin\t" + kTokenB + "\r\n";
  auto table = TokenTable::Parse(text, "tokens.txt");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->size(), 2u);
  ASSERT_TRUE(table->Find(kTokenA).has_value());
  EXPECT_EQ(table->Find(kTokenA)->Name(), "worker-0");
  EXPECT_EQ(table->Find(kTokenB)->Name(), "admin");
  EXPECT_FALSE(table->Find("aaaaaaaaaaaaaaaaaaaaaaab").has_value());
  EXPECT_FALSE(table->Find("").has_value());
  EXPECT_EQ(table->TokenOf(*core::ParseIdentity("worker-0")), kTokenA);
  EXPECT_FALSE(table->TokenOf(*core::ParseIdentity("worker-1")).has_value());
}

TEST(TokenTableTest, ErrorsNameTheSourceAndLine) {
  struct Case {
    std::string text;
    const char* expected;
  };
  const Case cases[] = {
      {std::string("worker-0 ") + kTokenA + " extra\n", "tokens.txt line 1: want 'IDENTITY TOKEN'"},
      {std::string("\nworker-0\n"), "line 2: want 'IDENTITY TOKEN'"},
      {std::string("wrkr-0 ") + kTokenA, "line 1: identity \"wrkr-0\""},
      {std::string("worker-0 short"), "line 1: a token must have 16 to 4096 characters"},
      {std::string("worker-0 ") + kTokenA + "\nworker-1 " + kTokenA, "line 2: this token is listed twice"},
      {std::string("worker-0 ") + kTokenA + "\nworker-0 " + kTokenB, "line 2: worker-0 has a token already"},
  };
  for (const Case& c : cases) {
    auto table = TokenTable::Parse(c.text, "tokens.txt");
    ASSERT_FALSE(table.ok()) << c.text;
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(table.status().message()), HasSubstr(c.expected)) << c.text;
  }
}

TEST(CallerTest, LoopbackAndNames) {
  Caller anon{std::nullopt, "ipv4:127.0.0.1:5123"};
  EXPECT_TRUE(anon.loopback());
  EXPECT_EQ(anon.Name(), "ipv4:127.0.0.1");
  EXPECT_TRUE((Caller{std::nullopt, "ipv6:[::1]:80"}).loopback());
  EXPECT_TRUE((Caller{std::nullopt, "ipv6:[::ffff:127.0.0.2]:80"}).loopback());
  EXPECT_FALSE((Caller{std::nullopt, "ipv4:10.0.0.7:5123"}).loopback());
  EXPECT_FALSE((Caller{std::nullopt, "ipv4:128.0.0.1:5123"}).loopback());
  Caller named{core::ParseIdentity("worker-4").value(), "ipv4:10.0.0.7:5123"};
  EXPECT_EQ(named.Name(), "worker-4");
}

class AuthenticatorTest : public ::testing::Test {
 protected:
  std::string WriteFile(const std::string& name, const std::string& text) {
    const std::filesystem::path p = std::filesystem::temp_directory_path() /
                                    ("ps-auth-test-" + std::to_string(::getpid()) + "-" + name);
    std::ofstream(p) << text;
    files_.push_back(p);
    return p.string();
  }
  void TearDown() override {
    for (const auto& p : files_) std::filesystem::remove(p);
  }
  std::vector<std::filesystem::path> files_;
};

TEST_F(AuthenticatorTest, WithoutCredentialsCallsAreAnonymous) {
  ServerOptions o;
  auto a = Authenticator::Create(o);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE((*a)->required());
}

TEST_F(AuthenticatorTest, ATokenFileRequiresIdentitiesAndGivesPeersTheirToken) {
  ServerOptions o;
  o.tokens_file = WriteFile("tokens", std::string("shard-1 ") + kTokenA + "\nworker-0 " + kTokenB + "\n");
  auto a = Authenticator::Create(o);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE((*a)->required());
  EXPECT_EQ((*a)->PeerCredentials(1).token, kTokenA);
  EXPECT_TRUE((*a)->PeerCredentials(0).token.empty());
}

TEST_F(AuthenticatorTest, VerifyNamesWhatIsMissingOrWrong) {
  ServerOptions o;
  o.tokens_file = WriteFile("tokens", std::string("worker-0 ") + kTokenA + "\n");
  auto a = Authenticator::Create(o);
  ASSERT_TRUE(a.ok()) << a.status();
  const std::string bearer = std::string("Bearer ") + kTokenA;
  absl::StatusOr<core::Identity> id = (*a)->Verify({std::nullopt, bearer});
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->Name(), "worker-0");

  const auto refused = [&](Authenticator::Presented p) {
    absl::StatusOr<core::Identity> r = (*a)->Verify(p);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated) << r.status();
    return std::string(r.status().message());
  };
  EXPECT_THAT(refused({}), HasSubstr("credentials required"));
  EXPECT_THAT(refused({std::nullopt, std::string_view(kTokenA)}), HasSubstr("'Bearer TOKEN'"));
  EXPECT_THAT(refused({std::nullopt, std::string_view("Bearer ") }), HasSubstr("unknown token"));
  const std::string other = std::string("Bearer ") + kTokenB;
  EXPECT_THAT(refused({std::nullopt, other}), HasSubstr("unknown token"));
  // Without --tls-ca a certificate's name is not looked at.
  EXPECT_THAT(refused({std::string_view("worker-1"), std::nullopt}),
              HasSubstr("credentials required"));
}

TEST_F(AuthenticatorTest, BadFilesAreRefusedNamingTheFlag) {
  ServerOptions empty;
  empty.tokens_file = WriteFile("empty-tokens", "# nobody\n");
  EXPECT_THAT(std::string(Authenticator::Create(empty).status().message()),
              HasSubstr("lists no identity"));

  ServerOptions bad;
  bad.tokens_file = WriteFile("bad-tokens", "worker-0 tiny\n");
  EXPECT_THAT(std::string(Authenticator::Create(bad).status().message()),
              HasSubstr("line 1: a token must have"));

  ServerOptions missing;
  missing.tls_cert = "/nonexistent/ps-server/cert.pem";
  missing.tls_key = "/nonexistent/ps-server/key.pem";
  const absl::Status st = Authenticator::Create(missing).status();
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(std::string(st.message()), HasSubstr("--tls-cert"));
}

TEST(RateLimiterTest, BucketsRefillAtTheRateAndAreKeptPerClient) {
  core::ManualClock clock;
  RateLimiter limiter(10.0, 3, &clock);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(limiter.Allow("worker-0")) << i;
  EXPECT_FALSE(limiter.Allow("worker-0"));
  EXPECT_TRUE(limiter.Allow("worker-1"));  // its own bucket
  clock.Advance(std::chrono::milliseconds(100));  // one request's worth at 10/s
  EXPECT_TRUE(limiter.Allow("worker-0"));
  EXPECT_FALSE(limiter.Allow("worker-0"));
  clock.Advance(std::chrono::seconds(60));  // refills only up to the burst
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(limiter.Allow("worker-0")) << i;
  EXPECT_FALSE(limiter.Allow("worker-0"));
}

TEST(RateLimiterTest, ZeroRateAllowsEverything) {
  core::ManualClock clock;
  RateLimiter limiter(0.0, 0, &clock);
  for (int i = 0; i < 10000; ++i) ASSERT_TRUE(limiter.Allow("x"));
}

}  // namespace
}  // namespace ps::server
