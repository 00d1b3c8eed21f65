#include "crypto/auth_proof.h"

#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/client_text.h"
#include "core/status.h"
#include "crypto/cluster_secret.h"

namespace ps::crypto {

using core::AsAbsl;
using core::ClientText;
using core::Identity;
using core::ParseIdentity;

namespace {

constexpr std::string_view kChallengeLabel = "ps-server challenge v1";
constexpr std::string_view kCallLabel = "ps-server call v1";
constexpr std::string_view kDataKeyLabel = "ps-data key v1";
constexpr std::string_view kUdpKeyLabel = "ps-udp key v1";
constexpr std::string_view kDataServerLabel = "ps-data server v1";
constexpr std::string_view kDataClientLabel = "ps-data client v1";

bool IsHex(std::string_view s, size_t digits) {
  if (s.size() != digits) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::string Hex(std::string_view raw) { return absl::BytesToHexString(AsAbsl(raw)); }
std::string Raw(std::string_view hex) { return absl::HexStringToBytes(AsAbsl(hex)); }

// HMAC-SHA256 under `token` of the label and fields, each followed by a NUL (keys,
// identities, labels and decimal numbers hold none; nonces and secrets are of fixed
// length and come last).
std::string Mac(std::string_view token, std::string_view label,
                std::initializer_list<std::string_view> fields) {
  std::string message(label);
  message.push_back('\0');
  for (std::string_view f : fields) {
    message.append(f);
    message.push_back('\0');
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int md_len = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), md, &md_len);
  return std::string(reinterpret_cast<const char*>(md), md_len);
}

bool IsKey(std::string_view key) { return KeyIdentity(key).has_value() || IsHex(key, 64); }

std::vector<std::string_view> Fields(std::string_view value) {
  std::vector<std::string_view> out;
  for (absl::string_view f : absl::StrSplit(AsAbsl(value), ' ', absl::SkipEmpty())) {
    out.emplace_back(f.data(), f.size());
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> NewNonce() { return RandomBytes(kNonceBytes); }

std::string TokenKey(std::string_view token) {
  const size_t dot = token.find('.');
  if (dot != std::string_view::npos && IsHex(token.substr(dot + 1), 64) &&
      ParseIdentity(token.substr(0, dot)).ok()) {
    return std::string(token.substr(0, dot));
  }
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), md);
  return Hex(std::string_view(reinterpret_cast<const char*>(md), sizeof(md)));
}

std::optional<Identity> KeyIdentity(std::string_view key) {
  absl::StatusOr<Identity> id = ParseIdentity(key);
  if (!id.ok()) return std::nullopt;
  return *id;
}

std::string ServerProof(std::string_view token, std::string_view key, std::string_view server,
                        std::string_view client_nonce, std::string_view server_nonce) {
  return Mac(token, kChallengeLabel, {key, server, client_nonce, server_nonce});
}

std::string CallProof(std::string_view token, std::string_view key, std::string_view server,
                      std::string_view server_nonce) {
  return Mac(token, kCallLabel, {key, server, server_nonce});
}

std::string DataKey(std::string_view token, std::string_view key, std::string_view server,
                    uint64_t data_session, std::string_view data_secret) {
  return Mac(token, kDataKeyLabel, {key, server, absl::StrCat(data_session), data_secret});
}

std::string UdpKey(std::string_view token, std::string_view key, std::string_view server,
                   uint64_t data_session, std::string_view udp_secret) {
  return Mac(token, kUdpKeyLabel, {key, server, absl::StrCat(data_session), udp_secret});
}

std::string BoundDataKey(std::string_view token, std::string_view server, uint64_t data_session,
                         std::string_view data_secret) {
  if (token.empty()) return std::string(data_secret);
  return DataKey(token, TokenKey(token), server, data_session, data_secret);
}

std::string BoundUdpKey(std::string_view token, std::string_view server, uint64_t data_session,
                        std::string_view udp_secret) {
  if (token.empty()) return std::string(udp_secret);
  return UdpKey(token, TokenKey(token), server, data_session, udp_secret);
}

std::string DataServerProof(std::string_view k, std::string_view server, uint64_t data_session,
                            std::string_view client_nonce, std::string_view server_nonce) {
  return Mac(k, kDataServerLabel, {server, absl::StrCat(data_session), client_nonce, server_nonce});
}

std::string DataClientProof(std::string_view k, std::string_view server, uint64_t data_session,
                            std::string_view client_nonce, std::string_view server_nonce) {
  return Mac(k, kDataClientLabel, {server, absl::StrCat(data_session), client_nonce, server_nonce});
}

bool SameProof(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string InstanceId(std::string_view server_nonce) {
  return Hex(server_nonce.substr(0, kInstanceBytes));
}

std::string ChallengeHeader(std::string_view key, std::string_view client_nonce) {
  return absl::StrCat(AsAbsl(kChallengeScheme), " ", AsAbsl(key), " ", Hex(client_nonce));
}

absl::StatusOr<ChallengeRequest> ParseChallengeHeader(std::string_view value) {
  const std::vector<std::string_view> f = Fields(value);
  if (f.size() != 3 || f[0] != kChallengeScheme || !IsKey(f[1]) || !IsHex(f[2], 2 * kNonceBytes)) {
    return absl::UnauthenticatedError(absl::StrCat(
        "a challenge must carry 'authorization: ", AsAbsl(kChallengeScheme),
        " KEY NONCE' (KEY: an identity or a token's SHA-256 in hex; NONCE: 64 hex digits), not \"",
        ClientText(value, 128), "\""));
  }
  return ChallengeRequest{std::string(f[1]), Raw(f[2])};
}

std::string ChallengeAnswer(const Identity& server, std::string_view server_nonce,
                            std::string_view proof) {
  return absl::StrCat(AsAbsl(kChallengeAnswerPrefix), " ", server.Name(), " ", Hex(server_nonce),
                      " ", Hex(proof));
}

std::optional<ChallengeReply> ParseChallengeAnswer(std::string_view message) {
  const std::vector<std::string_view> f = Fields(message);
  if (f.size() != 4 || f[0] != kChallengeAnswerPrefix || !IsHex(f[2], 2 * kNonceBytes) ||
      !IsHex(f[3], 2 * kProofBytes)) {
    return std::nullopt;
  }
  std::optional<Identity> server = KeyIdentity(f[1]);
  if (!server.has_value()) return std::nullopt;
  return ChallengeReply{*server, Raw(f[2]), Raw(f[3])};
}

std::string ProofHeader(std::string_view key, std::string_view server_nonce,
                        std::string_view call_proof) {
  return absl::StrCat(AsAbsl(kProofScheme), " ", AsAbsl(key), " ", InstanceId(server_nonce), " ",
                      Hex(call_proof));
}

absl::StatusOr<PresentedProof> ParseProofHeader(std::string_view value) {
  const std::vector<std::string_view> f = Fields(value);
  if (f.size() != 4 || f[0] != kProofScheme || !IsKey(f[1]) || !IsHex(f[2], 2 * kInstanceBytes) ||
      !IsHex(f[3], 2 * kProofBytes)) {
    return absl::UnauthenticatedError(absl::StrCat(
        "the authorization metadata must be '", AsAbsl(kProofScheme),
        " KEY INSTANCE PROOF' (docs/protocol.md, \"Authentication\"), not \"",
        ClientText(value, 128), "\""));
  }
  return PresentedProof{std::string(f[1]), std::string(f[2]), Raw(f[3])};
}

std::string StaleMessage(std::string_view instance, const Identity& server) {
  return absl::StrCat(AsAbsl(kStalePrefix), " ", AsAbsl(instance), ": this proof was made for an ",
                      "earlier process of ", server.Name(),
                      " (it restarted since): run the challenge again");
}

std::optional<std::string> StaleInstance(std::string_view message) {
  if (!message.starts_with(kStalePrefix) || message.size() <= kStalePrefix.size() ||
      message[kStalePrefix.size()] != ' ') {
    return std::nullopt;
  }
  std::string_view rest = message.substr(kStalePrefix.size() + 1);
  rest = rest.substr(0, rest.find(':'));
  if (!IsHex(rest, 2 * kInstanceBytes)) return std::nullopt;
  return std::string(rest);
}

}  // namespace ps::crypto
