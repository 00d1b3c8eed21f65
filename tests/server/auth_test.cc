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
#include "crypto/auth_proof.h"
#include "crypto/cluster_secret.h"
#include "server/auth_internal.h"
#include "server/options.h"

namespace ps::server {
namespace {

using ::testing::AllOf;
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
  const auto refused = [&](Authenticator::Presented p) {
    absl::StatusOr<core::Identity> r = (*a)->Verify(p);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated) << r.status();
    return std::string(r.status().message());
  };
  EXPECT_THAT(refused({}), HasSubstr("credentials required"));
  EXPECT_THAT(refused({std::nullopt, std::string_view(kTokenA)}),
              HasSubstr("'PS-Proof-v1 KEY INSTANCE PROOF'"));
  // A bearer token on a plaintext port: refused, whoever's it is, naming the fixes (finding
  // 4 of issue 45: a token sent in plaintext goes to whoever listens on the port).
  const std::string bearer = std::string("Bearer ") + kTokenA;
  EXPECT_THAT(refused({std::nullopt, bearer}),
              AllOf(HasSubstr("bearer tokens are refused on a plaintext port"),
                    HasSubstr("PS-Proof-v1"), HasSubstr("--tls-cert")));
  // Without --tls-ca a certificate's name is not looked at.
  EXPECT_THAT(refused({std::string_view("worker-1"), std::nullopt}),
              HasSubstr("credentials required"));
}

TEST_F(AuthenticatorTest, OverTlsABearerTokenIsTaken) {
  ServerOptions o;
  o.tokens_file = WriteFile("tokens", std::string("worker-0 ") + kTokenA + "\n");
  // Create reads the PEM files only; the port's handshake is not under test here.
  o.tls_cert = WriteFile("cert.pem", "certificate");
  o.tls_key = WriteFile("key.pem", "key");
  auto a = Authenticator::Create(o);
  ASSERT_TRUE(a.ok()) << a.status();
  const std::string bearer = std::string("Bearer ") + kTokenA;
  absl::StatusOr<core::Identity> id = (*a)->Verify({std::nullopt, bearer});
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->Name(), "worker-0");
  const std::string other = std::string("Bearer ") + kTokenB;
  EXPECT_THAT(std::string((*a)->Verify({std::nullopt, other}).status().message()),
              HasSubstr("unknown token"));
}

// The shard's half of the challenge: it answers with a proof only the token's holders can
// make, and takes a call's proof only when made with that token for this very process.
class ChallengeTest : public AuthenticatorTest {
 protected:
  void SetUp() override {
    options_.secret_file = WriteFile("secret", std::string(64, '4') + "\n");
    std::filesystem::permissions(options_.secret_file, std::filesystem::perms::owner_read |
                                                           std::filesystem::perms::owner_write);
    secret_ = *crypto::ReadSecretFile(options_.secret_file);
    options_.num_workers = 2;
    options_.num_shards = 2;
    options_.shard_id = 1;
    options_.tokens_file = WriteFile("tokens", std::string("admin ") + kTokenA + "\n");
    auto a = Authenticator::Create(options_);
    ASSERT_TRUE(a.ok()) << a.status();
    auth_ = *std::move(a);
  }

  // What an honest client does: the challenge, checking the answer; then its call header.
  std::string Prove(const Authenticator& auth, const std::string& token) {
    const std::string key = crypto::TokenKey(token);
    const std::string nonce = *crypto::NewNonce();
    absl::StatusOr<std::string> answer = auth.AnswerChallenge(crypto::ChallengeHeader(key, nonce));
    EXPECT_TRUE(answer.ok()) << answer.status();
    std::optional<crypto::ChallengeReply> r = crypto::ParseChallengeAnswer(answer.value_or(""));
    EXPECT_TRUE(r.has_value()) << answer.value_or("");
    if (!r.has_value()) return "";
    EXPECT_EQ(r->server.Name(), "shard-1");
    EXPECT_TRUE(crypto::SameProof(
        r->proof, crypto::ServerProof(token, key, "shard-1", nonce, r->server_nonce)));
    server_nonce_ = r->server_nonce;
    return crypto::ProofHeader(key, r->server_nonce,
                             crypto::CallProof(token, key, "shard-1", r->server_nonce));
  }
  std::string Refused(const std::string& header, std::string* charge_to = nullptr) {
    absl::StatusOr<core::Identity> r = auth_->Verify({std::nullopt, header}, charge_to);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated) << header;
    return std::string(r.status().message());
  }

  ServerOptions options_;
  std::string secret_;
  std::unique_ptr<Authenticator> auth_;
  std::string server_nonce_;
};

TEST_F(ChallengeTest, DerivedAndListedTokensProveTheirIdentity) {
  using Kind = core::Identity::Kind;
  for (const auto& [token, name] : std::vector<std::pair<std::string, std::string>>{
           {crypto::DeriveToken(secret_, {Kind::kWorker, 1}), "worker-1"},
           {crypto::DeriveToken(secret_, {Kind::kShard, 0}), "shard-0"},
           // Beyond --workers: derived per call, not made at start.
           {crypto::DeriveToken(secret_, {Kind::kWorker, 7}), "worker-7"},
           {kTokenA, "admin"}}) {
    absl::StatusOr<core::Identity> id = auth_->Verify({std::nullopt, Prove(*auth_, token)});
    ASSERT_TRUE(id.ok()) << name << ": " << id.status();
    EXPECT_EQ(id->Name(), name);
  }
}

// The keys of a data session are bound to the token the worker proved on its Join
// (docs/data-plane.md, "The key"): Verify names it by its key, TokenNamed gives it back.
// At a shard with both a secret and a token file, a worker proving its token file's token
// gets that token, not the one the secret derives for it.
TEST_F(ChallengeTest, TheTokenACallProvedIsNamedByItsKey) {
  using Kind = core::Identity::Kind;
  ServerOptions both = options_;
  both.tokens_file = WriteFile("worker-tokens", std::string("worker-0 ") + kTokenB + "\n");
  auto a = Authenticator::Create(both);
  ASSERT_TRUE(a.ok()) << a.status();
  auth_ = *std::move(a);
  const std::string derived0 = crypto::DeriveToken(secret_, {Kind::kWorker, 0});
  for (const std::string& token : {derived0, std::string(kTokenB)}) {
    std::string key = "left over";
    absl::StatusOr<core::Identity> id = auth_->Verify({std::nullopt, Prove(*auth_, token)}, nullptr, &key);
    ASSERT_TRUE(id.ok()) << id.status();
    EXPECT_EQ(id->Name(), "worker-0");
    EXPECT_EQ(key, crypto::TokenKey(token));
    EXPECT_EQ(auth_->TokenNamed(key), token);
  }
  EXPECT_EQ(auth_->TokenNamed(crypto::TokenKey(kTokenB)), kTokenB) << "not worker-0's derived token";
  EXPECT_EQ(auth_->TokenNamed("worker-1"), crypto::DeriveToken(secret_, {Kind::kWorker, 1}));
  EXPECT_EQ(auth_->TokenNamed(""), "");
  EXPECT_EQ(auth_->TokenNamed(crypto::TokenKey(kTokenA)), "") << "listed nowhere here";

  // A refused call proved nothing.
  std::string key = "left over";
  EXPECT_FALSE(auth_->Verify({std::nullopt, std::string("PS-Proof-v1 x")}, nullptr, &key).ok());
  EXPECT_EQ(key, "");
}

TEST_F(AuthenticatorTest, ABearerTokenIsNamedByItsKeyAndACertificateByNone) {
  ServerOptions o;
  o.tokens_file = WriteFile("tokens", std::string("worker-0 ") + kTokenA + "\n");
  o.tls_cert = WriteFile("cert.pem", "certificate");
  o.tls_key = WriteFile("key.pem", "key");
  o.tls_ca = WriteFile("ca.pem", "ca");
  auto a = Authenticator::Create(o);
  ASSERT_TRUE(a.ok()) << a.status();
  std::string key;
  ASSERT_TRUE((*a)->Verify({std::nullopt, std::string("Bearer ") + kTokenA}, nullptr, &key).ok());
  EXPECT_EQ(key, crypto::TokenKey(kTokenA));
  EXPECT_EQ((*a)->TokenNamed(key), kTokenA);
  ASSERT_TRUE((*a)->Verify({std::string_view("worker-0"), std::nullopt}, nullptr, &key).ok());
  EXPECT_EQ(key, "") << "a certificate alone proves no token";
  key = "left over";
  EXPECT_FALSE(
      (*a)->Verify({std::string_view("worker-1"), std::string("Bearer ") + kTokenA}, nullptr, &key)
          .ok());
  EXPECT_EQ(key, "") << "certificate and token disagree: refused, nothing proved";
}

TEST_F(ChallengeTest, WrongTruncatedAndForeignProofsAreRefused) {
  using Kind = core::Identity::Kind;
  const std::string w1 = crypto::DeriveToken(secret_, {Kind::kWorker, 1});
  const std::string header = Prove(*auth_, w1);
  ASSERT_TRUE(auth_->Verify({std::nullopt, header}).ok());
  const std::string s = server_nonce_;
  // Worker 1's token under worker 0's name.
  EXPECT_THAT(
      Refused(crypto::ProofHeader("worker-0", s, crypto::CallProof(w1, "worker-0", "shard-1", s))),
      HasSubstr("wrong proof"));
  // A token of another secret, in the derived form (a squatter's make-up).
  const std::string forged = crypto::DeriveToken(std::string(crypto::kSecretBytes, '\x01'),
                                               {Kind::kWorker, 1});
  EXPECT_THAT(
      Refused(crypto::ProofHeader("worker-1", s, crypto::CallProof(forged, "worker-1", "shard-1", s))),
      HasSubstr("wrong proof"));
  // Made for shard 0, or for another nonce under this process's instance id.
  EXPECT_THAT(
      Refused(crypto::ProofHeader("worker-1", s, crypto::CallProof(w1, "worker-1", "shard-0", s))),
      HasSubstr("wrong proof"));
  std::string other_nonce = *crypto::NewNonce();
  other_nonce.replace(0, crypto::kInstanceBytes, s.substr(0, crypto::kInstanceBytes));
  EXPECT_THAT(Refused(crypto::ProofHeader("worker-1", s,
                                        crypto::CallProof(w1, "worker-1", "shard-1", other_nonce))),
              HasSubstr("wrong proof"));
  // Truncated, malformed, unknown keys.
  EXPECT_THAT(Refused(header.substr(0, header.size() - 2)), HasSubstr("must be 'PS-Proof-v1"));
  const std::string unknown = crypto::TokenKey(kTokenB);
  EXPECT_THAT(
      Refused(crypto::ProofHeader(unknown, s, crypto::CallProof(kTokenB, unknown, "shard-1", s))),
      HasSubstr("unknown token"));
  // A challenge for an unknown token, or a malformed one, gets no answer.
  absl::StatusOr<std::string> answer =
      auth_->AnswerChallenge(crypto::ChallengeHeader(unknown, *crypto::NewNonce()));
  EXPECT_THAT(std::string(answer.status().message()), HasSubstr("unknown token"));
  EXPECT_THAT(std::string(auth_->AnswerChallenge(header).status().message()),
              HasSubstr("PS-Challenge-v1 KEY NONCE"));
  EXPECT_FALSE(auth_->AnswerChallenge(std::nullopt).ok());
}

TEST_F(ChallengeTest, AProofForAnEarlierProcessIsStale) {
  using Kind = core::Identity::Kind;
  const std::string w1 = crypto::DeriveToken(secret_, {Kind::kWorker, 1});
  const std::string header = Prove(*auth_, w1);
  // The shard restarts: same secret, a new instance nonce.
  auto restarted = Authenticator::Create(options_);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  EXPECT_NE((*restarted)->instance_nonce(), auth_->instance_nonce());
  std::string charge_to;
  absl::StatusOr<core::Identity> r = (*restarted)->Verify({std::nullopt, header}, &charge_to);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(crypto::StaleInstance(std::string(r.status().message())),
            crypto::InstanceId(server_nonce_));
  EXPECT_EQ(charge_to, kStaleProofClient);
  // A fresh challenge makes a proof the new process takes.
  EXPECT_TRUE((*restarted)->Verify({std::nullopt, Prove(**restarted, w1)}).ok());
  // Strangers' refusals are charged to the anonymous client.
  EXPECT_THAT(Refused("PS-Proof-v1 nonsense", &charge_to), HasSubstr("must be"));
  EXPECT_EQ(charge_to, kAnonymousClient);
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
