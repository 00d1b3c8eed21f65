// Mutual authentication by challenge and response (docs/protocol.md, "Authentication";
// docs/operations.md, "Securing"). A client never sends its token: it proves it holds the
// token to one running shard process, after that process proved it holds the token too.
//
//   1. Each ps-server process draws a random 32-byte instance nonce S at start.
//   2. Challenge: the client calls /ps.v1.AuthService/Challenge with only the metadata
//        authorization: PS-Challenge-v1 KEY C
//      where KEY names its token (TokenKey: the identity of a token derived from a
//      cluster secret, else the hex SHA-256 of the token) and C is a fresh random
//      32-byte nonce (hex). The shard answers from the metadata alone, in the status
//      message (UNAUTHENTICATED, "ps-auth-challenge-v1 SERVER S PROOF"), with
//        PROOF = HMAC-SHA256(token, "ps-server challenge v1" | KEY | SERVER | C | S),
//      SERVER being its own identity (shard-N). The client checks PROOF in constant time
//      and refuses to go on with a process that cannot make it: only a holder of the
//      token (the secret or the token file) can.
//   3. Calls: every call then carries
//        authorization: PS-Proof-v1 KEY INSTANCE CALLPROOF
//      with CALLPROOF = HMAC-SHA256(token, "ps-server call v1" | KEY | SERVER | S) and
//      INSTANCE the first 8 bytes of S (hex), which only that process accepts. After the
//      shard restarts (a new S) the old proof is refused as stale (StaleMessage), and
//      the client runs the challenge again.
//
// The two HMACs are domain-separated, so no challenge answer (which anybody may ask
// for, with any C) is ever a call proof. Grpc-free; every function is thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "core/credentials.h"

namespace ps::crypto {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kProofBytes = 32;  // HMAC-SHA256
inline constexpr size_t kInstanceBytes = 8;

// The gRPC method the port's auth processor answers itself (it has no handler).
inline constexpr std::string_view kChallengeMethod = "/ps.v1.AuthService/Challenge";
// Authorization schemes and the prefixes of the status messages that answer them.
inline constexpr std::string_view kChallengeScheme = "PS-Challenge-v1";
inline constexpr std::string_view kProofScheme = "PS-Proof-v1";
inline constexpr std::string_view kChallengeAnswerPrefix = "ps-auth-challenge-v1";
inline constexpr std::string_view kStalePrefix = "ps-auth-stale-v1";

// A fresh random nonce (kNonceBytes raw bytes).
absl::StatusOr<std::string> NewNonce();
// The name a client gives its token by: "worker-3" for a token derived from a cluster
// secret (crypto/cluster_secret.h: "worker-3.<64 hex digits>"), else the token's SHA-256
// in hex (a --tokens token, which the shard looks up by that digest).
std::string TokenKey(std::string_view token);
// The identity `key` names, when it names one ("worker-3"); nullopt for a digest.
std::optional<core::Identity> KeyIdentity(std::string_view key);

// The shard's answer to a challenge (raw kProofBytes).
std::string ServerProof(std::string_view token, std::string_view key, std::string_view server,
                        std::string_view client_nonce, std::string_view server_nonce);
// A client's proof on every call to the process whose nonce is `server_nonce`.
std::string CallProof(std::string_view token, std::string_view key, std::string_view server,
                      std::string_view server_nonce);
// The data plane's handshake (docs/data-plane.md, "Binding a connection to a session";
// the frames are net/data_frame.h). The Join answer hands out a data session: a public
// id and a random secret. The key of a connection's proofs binds the secret to the
// worker's token, so a reader of a plaintext Join answer cannot open a data connection:
//   K = HMAC-SHA256(token, "ps-data key v1" | KEY | SERVER | session | secret)
// (with mTLS only or --insecure there is no token, and K is the secret itself). On a
// connection, the worker sends a nonce C, the shard a nonce S and its proof, then the
// worker its own:
//   shard:  HMAC-SHA256(K, "ps-data server v1" | SERVER | session | C | S)
//   worker: HMAC-SHA256(K, "ps-data client v1" | SERVER | session | C | S)
// Each field is followed by a NUL, as in the challenge's proofs; `session` enters as its
// decimal digits, `secret` and the nonces (kNonceBytes each) are of fixed length and
// come last. The labels differ from each other and from the challenge's, so no answer of
// one exchange is ever a proof in another: a shard's proof is not the worker's, and
// nothing the control plane answers opens a data connection.
std::string DataKey(std::string_view token, std::string_view key, std::string_view server,
                    uint64_t data_session, std::string_view data_secret);
// The UDP path's datagram key (net::DatagramKey, AES-256-GMAC) for the same session,
// bound to the token the same way from the session's UDP secret, under its own label:
//   HMAC-SHA256(token, "ps-udp key v1" | KEY | SERVER | session | udp_secret)
// so a reader of a plaintext Join answer cannot forge a worker's datagrams either.
std::string UdpKey(std::string_view token, std::string_view key, std::string_view server,
                   uint64_t data_session, std::string_view udp_secret);
// The keys both sides of a data session use: DataKey and UdpKey of the token the worker
// proved at its join, named as it names it (TokenKey); without a token (client
// certificates only, --insecure) the session's secret itself.
std::string BoundDataKey(std::string_view token, std::string_view server, uint64_t data_session,
                         std::string_view data_secret);
std::string BoundUdpKey(std::string_view token, std::string_view server, uint64_t data_session,
                        std::string_view udp_secret);
std::string DataServerProof(std::string_view k, std::string_view server, uint64_t data_session,
                            std::string_view client_nonce, std::string_view server_nonce);
std::string DataClientProof(std::string_view k, std::string_view server, uint64_t data_session,
                            std::string_view client_nonce, std::string_view server_nonce);

// Equality of two proofs whose time does not depend on where they differ.
bool SameProof(std::string_view a, std::string_view b);
// The INSTANCE that stands for `server_nonce` in call headers (hex).
std::string InstanceId(std::string_view server_nonce);

// "PS-Challenge-v1 KEY C" and back. Parsing refuses anything but the scheme, a key
// (identity or 64 hex digits) and a nonce of 64 hex digits.
std::string ChallengeHeader(std::string_view key, std::string_view client_nonce);
struct ChallengeRequest {
  std::string key;
  std::string client_nonce;  // raw
};
absl::StatusOr<ChallengeRequest> ParseChallengeHeader(std::string_view value);

// "ps-auth-challenge-v1 SERVER S PROOF" and back (nullopt unless it has that form).
std::string ChallengeAnswer(const core::Identity& server, std::string_view server_nonce,
                            std::string_view proof);
struct ChallengeReply {
  core::Identity server;
  std::string server_nonce;  // raw
  std::string proof;         // raw
};
std::optional<ChallengeReply> ParseChallengeAnswer(std::string_view message);

// "PS-Proof-v1 KEY INSTANCE CALLPROOF" and back.
std::string ProofHeader(std::string_view key, std::string_view server_nonce,
                        std::string_view call_proof);
struct PresentedProof {
  std::string key;
  std::string instance;  // hex, as sent
  std::string proof;     // raw
};
absl::StatusOr<PresentedProof> ParseProofHeader(std::string_view value);

// The refusal of a proof made for another instance of `server` ("ps-auth-stale-v1
// INSTANCE: ..."), and the instance such a message names (nullopt for any other text).
std::string StaleMessage(std::string_view instance, const core::Identity& server);
std::optional<std::string> StaleInstance(std::string_view message);

}  // namespace ps::crypto
