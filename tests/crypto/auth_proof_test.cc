// The proofs of the challenge (crypto/auth_proof.h): what each side derives, what the
// other accepts, and the wire forms. The shard's side (server/auth_internal.h) is in
// tests/server/auth_test.cc, the whole exchange over gRPC in
// tests/integration/hostile_auth_test.cc.
#include "crypto/auth_proof.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "core/status.h"
#include "crypto/cluster_secret.h"

namespace ps::crypto {
namespace {

using ::testing::HasSubstr;
using core::AsAbsl;
using core::Identity;

const Identity kWorker0{Identity::Kind::kWorker, 0};
const Identity kShard0{Identity::Kind::kShard, 0};

TEST(AuthProofTest, KeysNameDerivedTokensByIdentityAndOthersByDigest) {
  const std::string secret = *NewSecret();
  EXPECT_EQ(TokenKey(DeriveToken(secret, kWorker0)), "worker-0");
  EXPECT_EQ(TokenKey(DeriveToken(secret, Identity{Identity::Kind::kAdmin, 0})), "admin");
  // A --tokens token: its SHA-256 (of "abc..." here), never the token.
  const std::string listed(64, 'a');
  const std::string key = TokenKey(listed);
  EXPECT_EQ(key.size(), 64u);
  EXPECT_EQ(key.find(listed), std::string::npos);
  EXPECT_FALSE(KeyIdentity(key).has_value());
  // Looks like an identity but is no derived token: a digest too.
  EXPECT_EQ(TokenKey("worker-0.short").size(), 64u);
  EXPECT_EQ(TokenKey("nobody." + std::string(64, '0')).size(), 64u);
  EXPECT_EQ(KeyIdentity("shard-2"), (Identity{Identity::Kind::kShard, 2}));
}

TEST(AuthProofTest, AServerProofVerifiesOnlyForItsTokenKeyServerAndNonces) {
  const std::string token = DeriveToken(*NewSecret(), kWorker0);
  const std::string key = TokenKey(token);
  const std::string c = *NewNonce(), s = *NewNonce();
  ASSERT_EQ(c.size(), kNonceBytes);
  const std::string proof = ServerProof(token, key, "shard-0", c, s);
  ASSERT_EQ(proof.size(), kProofBytes);
  EXPECT_TRUE(SameProof(proof, ServerProof(token, key, "shard-0", c, s)));
  // Another token (a squatter's guess), key, server, client nonce or server nonce.
  const std::string other = DeriveToken(*NewSecret(), kWorker0);
  EXPECT_FALSE(SameProof(proof, ServerProof(other, key, "shard-0", c, s)));
  EXPECT_FALSE(SameProof(proof, ServerProof(token, "worker-1", "shard-0", c, s)));
  EXPECT_FALSE(SameProof(proof, ServerProof(token, key, "shard-1", c, s)));
  EXPECT_FALSE(SameProof(proof, ServerProof(token, key, "shard-0", *NewNonce(), s)));
  EXPECT_FALSE(SameProof(proof, ServerProof(token, key, "shard-0", c, *NewNonce())));
  // Truncated or extended.
  EXPECT_FALSE(SameProof(proof, proof.substr(0, kProofBytes - 1)));
  EXPECT_FALSE(SameProof(proof, proof + "x"));
  EXPECT_FALSE(SameProof(proof, ""));
}

TEST(AuthProofTest, CallProofsAreBoundToTheServerProcessAndNeverAChallengeAnswer) {
  const std::string token(40, 't');
  const std::string key = TokenKey(token);
  const std::string s = *NewNonce();
  const std::string proof = CallProof(token, key, "shard-0", s);
  EXPECT_TRUE(SameProof(proof, CallProof(token, key, "shard-0", s)));
  // A restarted shard (a new nonce), another shard, another key.
  EXPECT_FALSE(SameProof(proof, CallProof(token, key, "shard-0", *NewNonce())));
  EXPECT_FALSE(SameProof(proof, CallProof(token, key, "shard-1", s)));
  EXPECT_FALSE(SameProof(proof, CallProof(token, "worker-0", "shard-0", s)));
  // Domain separation: whatever client nonce a caller asks a challenge for, the shard's
  // answer is not a call proof (here: an empty one, the nearest to the call string).
  EXPECT_FALSE(SameProof(proof, ServerProof(token, key, "shard-0", "", s)));
  EXPECT_FALSE(SameProof(proof, ServerProof(token, key, "shard-0", s, "")));
}

TEST(AuthProofTest, ChallengeHeaderRoundTripsAndRefusesAnythingElse) {
  const std::string nonce = *NewNonce();
  absl::StatusOr<ChallengeRequest> req = ParseChallengeHeader(ChallengeHeader("worker-3", nonce));
  ASSERT_TRUE(req.ok()) << req.status();
  EXPECT_EQ(req->key, "worker-3");
  EXPECT_EQ(req->client_nonce, nonce);
  const std::string hex(64, 'a');
  for (const std::string& bad : std::vector<std::string>{
           "", "PS-Challenge-v1", "PS-Challenge-v1 worker-3", "Bearer worker-3 " + hex,
        "PS-Challenge-v1 nobody " + hex, "PS-Challenge-v1 worker-3 " + hex.substr(1),
        "PS-Challenge-v1 worker-3 " + std::string(64, 'A'),  // lower-case hex only
        "PS-Challenge-v1 worker-3 " + hex + " extra",
        "PS-Challenge-v1 " + hex.substr(2) + " " + hex}) {
    absl::StatusOr<ChallengeRequest> r = ParseChallengeHeader(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
  }
}

TEST(AuthProofTest, ChallengeAnswerRoundTripsAndRefusesAnythingElse) {
  const std::string s = *NewNonce(), proof(kProofBytes, '\x7f');
  const std::string text = ChallengeAnswer(kShard0, s, proof);
  EXPECT_THAT(text, ::testing::StartsWith("ps-auth-challenge-v1 shard-0 "));
  std::optional<ChallengeReply> r = ParseChallengeAnswer(text);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->server, kShard0);
  EXPECT_EQ(r->server_nonce, s);
  EXPECT_EQ(r->proof, proof);
  EXPECT_FALSE(ParseChallengeAnswer("").has_value());
  EXPECT_FALSE(ParseChallengeAnswer("credentials required").has_value());
  EXPECT_FALSE(ParseChallengeAnswer(text.substr(0, text.size() - 1)).has_value());
  EXPECT_FALSE(ParseChallengeAnswer(text + " more").has_value());
  std::string renamed = text;
  renamed.replace(renamed.find("shard-0"), 7, "root-00");
  EXPECT_FALSE(ParseChallengeAnswer(renamed).has_value());
}

TEST(AuthProofTest, ProofHeaderRoundTripsAndNamesTheInstance) {
  const std::string s = *NewNonce(), proof(kProofBytes, '\x01');
  const std::string header = ProofHeader("admin", s, proof);
  absl::StatusOr<PresentedProof> p = ParseProofHeader(header);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->key, "admin");
  EXPECT_EQ(p->instance, InstanceId(s));
  EXPECT_EQ(p->instance.size(), 2 * kInstanceBytes);
  EXPECT_EQ(p->proof, proof);
  for (const std::string& bad : std::vector<std::string>{
           "Bearer x", header.substr(0, header.size() - 2), header + " x", "PS-Proof-v1 admin"}) {
    absl::StatusOr<PresentedProof> r = ParseProofHeader(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("PS-Proof-v1 KEY INSTANCE PROOF"));
  }
}

TEST(AuthProofTest, StaleMessagesNameTheInstanceTheProofWasFor) {
  const std::string instance = InstanceId(*NewNonce());
  const std::string message = StaleMessage(instance, kShard0);
  EXPECT_THAT(message, HasSubstr("shard-0"));
  EXPECT_EQ(StaleInstance(message), instance);
  // As the shard's processor sends it, with its suffix.
  EXPECT_EQ(StaleInstance(message + " (refused from the call's metadata, its body unread)"),
            instance);
  EXPECT_FALSE(StaleInstance("unknown token").has_value());
  EXPECT_FALSE(StaleInstance("ps-auth-stale-v1 zz: x").has_value());
  EXPECT_FALSE(StaleInstance("x " + message).has_value());
}

// Bytes a, a + 1, ... (raw nonces and secrets that a test can write down).
std::string Counting(int first, size_t n) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>(first + static_cast<int>(i));
  return out;
}

std::string HexOf(std::string_view raw) { return absl::BytesToHexString(AsAbsl(raw)); }

// The data plane's key and proofs, byte for byte as docs/data-plane.md defines them.
// Python: k = hmac.new(b"token-A", b"ps-data key v1\0worker-3\0shard-1\01234567890123\0"
//   + bytes(range(32)) + b"\0", sha256).digest(); the proofs HMAC under k of
//   b"ps-data server v1\0shard-1\01234567890123\0" + C + b"\0" + S + b"\0" (and "client"),
//   C = bytes(range(32, 64)), S = bytes(range(64, 96)).
TEST(AuthProofTest, DataKeyAndProofsMatchTheirDefinition) {
  const std::string secret = Counting(0, 32), c = Counting(32, 32), s = Counting(64, 32);
  const std::string k = DataKey("token-A", "worker-3", "shard-1", 1234567890123, secret);
  EXPECT_EQ(HexOf(k), "179e853dc538504415ef8b2e729dcf8ccb59ecff53e85768779320eba4dbd9cf");
  EXPECT_EQ(HexOf(DataServerProof(k, "shard-1", 1234567890123, c, s)),
            "90c7e7b1a7c633082c06b5361c8f92f5a8a1e1bd4a1a60d95dba837e73a9061e");
  EXPECT_EQ(HexOf(DataClientProof(k, "shard-1", 1234567890123, c, s)),
            "6931817064ad46c1d2ad07ab62d74dd4b3b22ee1952e5c88a8af34ef085c33f5");
}

// The UDP datagrams' key, byte for byte. Python: hmac.new(b"token-A", b"ps-udp key
// v1\0worker-3\0shard-1\01234567890123\0" + bytes(range(32)) + b"\0", sha256).digest().
// Its own label: never the TCP handshake's key for the same inputs.
TEST(AuthProofTest, UdpKeyMatchesItsDefinitionAndIsBoundToEveryInput) {
  const std::string secret = Counting(0, 32);
  const std::string k = UdpKey("token-A", "worker-3", "shard-1", 1234567890123, secret);
  EXPECT_EQ(HexOf(k), "ad7917b58f1e6477128d693778fad56a3327af32b659ba3ec08920d9ff15aa00");
  EXPECT_FALSE(SameProof(k, DataKey("token-A", "worker-3", "shard-1", 1234567890123, secret)));
  for (const std::string& other :
       {UdpKey("token-B", "worker-3", "shard-1", 1234567890123, secret),
        UdpKey("token-A", "worker-2", "shard-1", 1234567890123, secret),
        UdpKey("token-A", "worker-3", "shard-0", 1234567890123, secret),
        UdpKey("token-A", "worker-3", "shard-1", 1234567890124, secret),
        UdpKey("token-A", "worker-3", "shard-1", 1234567890123, Counting(1, 32))}) {
    EXPECT_FALSE(SameProof(k, other));
  }
}

TEST(AuthProofTest, DataProofsAreBoundToEveryInput) {
  const std::string token = DeriveToken(*NewSecret(), kWorker0);
  const std::string key = TokenKey(token);
  const std::string secret = *NewNonce(), c = *NewNonce(), s = *NewNonce();
  const std::string k = DataKey(token, key, "shard-0", 7, secret);
  ASSERT_EQ(k.size(), kProofBytes);
  // The key: another token (a reader of the Join answer without it), key, server,
  // session or secret.
  for (const std::string& other :
       {DataKey(DeriveToken(*NewSecret(), kWorker0), key, "shard-0", 7, secret),
        DataKey(token, "worker-1", "shard-0", 7, secret),
        DataKey(token, key, "shard-1", 7, secret), DataKey(token, key, "shard-0", 8, secret),
        DataKey(token, key, "shard-0", 7, *NewNonce())}) {
    EXPECT_FALSE(SameProof(k, other));
  }
  const std::string proof = DataServerProof(k, "shard-0", 7, c, s);
  EXPECT_TRUE(SameProof(proof, DataServerProof(k, "shard-0", 7, c, s)));
  for (const std::string& other :
       {DataServerProof(secret, "shard-0", 7, c, s), DataServerProof(k, "shard-1", 7, c, s),
        DataServerProof(k, "shard-0", 70, c, s), DataServerProof(k, "shard-0", 7, s, c),
        DataServerProof(k, "shard-0", 7, *NewNonce(), s),
        DataServerProof(k, "shard-0", 7, c, *NewNonce())}) {
    EXPECT_FALSE(SameProof(proof, other));
  }
  const std::string client = DataClientProof(k, "shard-0", 7, c, s);
  EXPECT_TRUE(SameProof(client, DataClientProof(k, "shard-0", 7, c, s)));
  EXPECT_FALSE(SameProof(client, DataClientProof(k, "shard-0", 7, s, c)));
  EXPECT_FALSE(SameProof(client, DataClientProof(k, "shard-0", 8, c, s)));
}

// No answer of one exchange is a proof in another: the shard's data proof is not the
// worker's (a worker cannot echo the CHALLENGE back as its PROOF), and nothing the
// control plane's challenge gives out (anybody may ask, with any nonce) is a data key or
// proof, nor the other way round, even for the same secret, names and nonces.
TEST(AuthProofTest, DataProofsAreDomainSeparated) {
  const std::string token = DeriveToken(*NewSecret(), kWorker0);
  const std::string key = TokenKey(token);
  const std::string c = *NewNonce(), s = *NewNonce();
  // Every HMAC below under one key (the token, standing in for K too): the labels alone
  // must tell them apart.
  const std::vector<std::string> all = {
      DataKey(token, key, "shard-0", 7, s),
      DataServerProof(token, "shard-0", 7, c, s),
      DataClientProof(token, "shard-0", 7, c, s),
      ServerProof(token, key, "shard-0", c, s),
      CallProof(token, key, "shard-0", s),
      // The data plane's field lists shifted onto the control plane's: the session's
      // digits where a key or nonce goes.
      ServerProof(token, "shard-0", "7", c, s),
      CallProof(token, "shard-0", "7", s),
  };
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(all[i].size(), kProofBytes) << i;
    for (size_t j = i + 1; j < all.size(); ++j) {
      EXPECT_FALSE(SameProof(all[i], all[j])) << i << " " << j;
    }
  }
}

}  // namespace
}  // namespace ps::crypto
