// Fuzz target for the authentication texts of crypto/auth_proof.h and the shard's checks that
// take them (server/auth.cc): ParseChallengeHeader and ParseProofHeader (what any caller
// puts in its `authorization` metadata, read before anything is authenticated),
// ParseChallengeAnswer and StaleInstance (what a client reads from the status message of
// whatever listens on a shard's port), ParseIdentity and TokenKey, and
// Authenticator::Verify and AnswerChallenge of three shards (cluster secret; token file
// only; secret and token file over TLS with a CA, where bearer tokens and certificate names
// count too).
//
// Input: byte 0 picks how the text is made (mod 6: 0 the rest as it is, 1 a challenge
// header, 2 a call's proof header, 3 a challenge answer, 4 a stale refusal, 5 a bearer
// header), byte 1 holds choices for the built forms, byte 2 the shard they are built for
// (bits 0-1) and the certificate name presented with them (bits 2-4); the rest is split at
// NUL bytes into parts (a key, a nonce or instance, a proof or tail, a separator, a common
// name), see Build(). The built forms put fuzzed parts into well-formed headers and can
// carry the right proofs, which no mutation would find: the shards' instance nonces are
// drawn at start.
//
// Every text goes to every parser and to every shard. The parsers must refuse with
// UNAUTHENTICATED and a short printable message, or give fields of the fixed sizes that
// written back (ChallengeHeader, ProofHeader, ChallengeAnswer) give the text with its runs
// of blanks made single (the formats are otherwise canonical: lower-case hex, canonical
// identities). Verify must accept exactly what an independent oracle accepts: a proof equal
// to CallProof made with the token the key names for that shard (the secret's for an
// identity key, else the token file's whose TokenKey it is), for its own instance, or, over
// TLS, a bearer token of the token file or derived from the secret; a stale proof is
// charged to "stale proofs" with a message StaleInstance reads back. AnswerChallenge must
// answer exactly the challenges whose key the oracle resolves, with an answer that parses,
// names the shard and its nonce, carries ServerProof of that token (no call proof), and
// whose call proof Verify then takes as the key's identity.
// Seeds: tests/fuzz/corpus/auth_header/, written by make_corpus.py (AUTH_HEADER).
#include <openssl/sha.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/credentials.h"
#include "core/status.h"
#include "crypto/auth_proof.h"
#include "crypto/cluster_secret.h"
#include "server/auth_internal.h"
#include "server/options.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

namespace core = ps::core;
namespace crypto = ps::crypto;
using core::Identity;
using ps::server::Authenticator;
using Kind = Identity::Kind;

// The shards' fixed secret (64 hex digits in the secret file) and tokens. kOtherSecret
// makes tokens in the derived form that this secret did not derive.
constexpr std::string_view kSecretHex =
    "0f1e2d3c4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff0";
const std::string kOtherSecret(crypto::kSecretBytes, '\x01');
constexpr std::string_view kTokenA = "ps-fuzz-token-aaaaaaaaaaaaaaaa";
constexpr std::string_view kTokenB = "ps-fuzz-token-bbbbbbbbbbbbbbbb";
constexpr std::string_view kUnknownToken = "ps-fuzz-token-nobody-knows-it";
// Every shard is shard 1 of 2 with 2 workers.
constexpr Identity kSelf{Kind::kShard, 1};
// A refusal's message is quoted in logs and sent back: bounded and printable.
constexpr size_t kMaxMessageBytes = 512;

// One shard, and what the oracle knows of its configuration.
struct Shard {
  std::unique_ptr<Authenticator> auth;
  std::string secret;                                   // raw; empty: none
  std::vector<std::pair<Identity, std::string>> table;  // its token file
  bool tls = false;                                     // bearer tokens taken
  bool ca = false;                                      // certificate names read
};

using core::AsAbsl;

std::string Hex(std::string_view raw) { return absl::BytesToHexString(AsAbsl(raw)); }

bool IsLowerHex(std::string_view s, size_t digits) {
  if (s.size() != digits) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// A key as the formats define it: a canonical identity or 64 lower-case hex digits.
bool IsKey(std::string_view key) {
  const std::optional<Identity> id = crypto::KeyIdentity(key);
  return (id.has_value() && id->Name() == key) || IsLowerHex(key, 64);
}

// `text` with its runs of blanks made single and none at either end.
std::string SingleBlanks(std::string_view text) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    const size_t start = text.find_first_not_of(' ', i);
    if (start == std::string_view::npos) break;
    const size_t end = std::min(text.find(' ', start), text.size());
    if (!out.empty()) out.push_back(' ');
    out.append(text.substr(start, end - start));
    i = end;
  }
  return out;
}

void CheckMessage(std::string_view message, const char* what) {
  PS_FUZZ_CHECK(!message.empty() && message.size() <= kMaxMessageBytes, what);
  for (char c : message) {
    PS_FUZZ_CHECK(c >= 0x20 && c < 0x7f, what);
  }
}

// A status message as a std::string_view.
std::string_view Message(const absl::Status& status) {
  return std::string_view(status.message().data(), status.message().size());
}

void CheckRefusal(const absl::Status& status, const char* what) {
  PS_FUZZ_CHECK(status.code() == absl::StatusCode::kUnauthenticated, what);
  CheckMessage(Message(status), what);
}

// The value of an accepted parse; nullptr, after checking the refusal, for a refused one.
template <typename T>
const T* Accepted(const absl::StatusOr<T>& parsed, const char* what) {
  if (parsed.ok()) return &*parsed;
  CheckRefusal(parsed.status(), what);
  return nullptr;
}

std::string WriteFile(const std::filesystem::path& dir, const std::string& name,
                      const std::string& text) {
  const std::filesystem::path p = dir / name;
  std::ofstream(p) << text;
  std::filesystem::permissions(
      p, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  return p.string();
}

std::string TokenLines(const std::vector<std::pair<Identity, std::string>>& table) {
  std::string text;
  for (const auto& [id, token] : table) absl::StrAppend(&text, id.Name(), " ", token, "\n");
  return text;
}

struct Resolved {
  std::string token;
  Identity identity;
};

// The token a key names on `s`: the secret's for an identity key, else the token file's
// whose TokenKey it is.
std::optional<Resolved> Resolve(const Shard& s, std::string_view key) {
  if (!s.secret.empty()) {
    if (std::optional<Identity> id = crypto::KeyIdentity(key)) {
      return Resolved{crypto::DeriveToken(s.secret, *id), *id};
    }
  }
  for (const auto& [id, token] : s.table) {
    if (crypto::TokenKey(token) == key) return Resolved{token, id};
  }
  return std::nullopt;
}

// The identity a bearer token stands for on `s` (over TLS): the token file's, else the
// identity whose derived token it is exactly.
std::optional<Identity> BearerIdentity(const Shard& s, std::string_view token) {
  for (const auto& [id, t] : s.table) {
    if (t == token) return id;
  }
  if (s.secret.empty()) return std::nullopt;
  const size_t dot = token.find('.');
  if (dot == std::string_view::npos) return std::nullopt;
  absl::StatusOr<Identity> id = core::ParseIdentity(token.substr(0, dot));
  if (!id.ok() || crypto::DeriveToken(s.secret, *id) != token) return std::nullopt;
  return *id;
}

// The header an honest client sends to `s` after its challenge, with `token`.
std::string HonestProofHeader(const Shard& s, const std::string& key, std::string_view token) {
  const std::string& nonce = s.auth->instance_nonce();
  return crypto::ProofHeader(key, nonce, crypto::CallProof(token, key, kSelf.Name(), nonce));
}

void CheckAnswer(const Shard& s, std::string_view text);

// The three shards, made once from files in a fresh temporary directory (removed again).
std::vector<Shard>& Shards() {
  static std::vector<Shard>* shards = [] {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "ps-auth-header-fuzz-XXXXXX").string();
    PS_FUZZ_CHECK(::mkdtemp(tmpl.data()) != nullptr, "cannot make a temporary directory");
    const std::filesystem::path dir = tmpl;
    const std::string secret = absl::HexStringToBytes(AsAbsl(kSecretHex));
    auto* out = new std::vector<Shard>(3);
    (*out)[0].secret = secret;  // the default: a cluster secret on a plaintext port
    (*out)[0].table = {{{Kind::kAdmin, 0}, std::string(kTokenA)},
                       {{Kind::kWorker, 9}, std::string(kTokenB)},
                       // Shadowed by the secret's token of worker-0 (made at start).
                       {{Kind::kWorker, 0}, crypto::DeriveToken(kOtherSecret, {Kind::kWorker, 0})}};
    (*out)[1].table = {{{Kind::kAdmin, 0}, std::string(kTokenA)},  // --tokens only
                       {{Kind::kWorker, 1}, std::string(kTokenB)},
                       {{Kind::kShard, 0}, crypto::DeriveToken(kOtherSecret, {Kind::kShard, 0})}};
    (*out)[2].secret = secret;  // secret and token file over TLS, certificates from a CA
    (*out)[2].table = {{{Kind::kAdmin, 0}, std::string(kTokenA)}};
    (*out)[2].tls = (*out)[2].ca = true;
    for (size_t i = 0; i < out->size(); ++i) {
      Shard& s = (*out)[i];
      ps::server::ServerOptions o;
      o.shard_id = static_cast<int>(kSelf.index);
      o.num_shards = 2;
      o.num_workers = 2;
      const std::string n = std::to_string(i);
      if (!s.secret.empty()) o.secret_file = WriteFile(dir, "secret" + n, Hex(s.secret) + "\n");
      o.tokens_file = WriteFile(dir, "tokens" + n, TokenLines(s.table));
      if (s.tls) {
        // Create reads the PEM files only; no handshake happens here.
        o.tls_cert = WriteFile(dir, "cert" + n, "certificate");
        o.tls_key = WriteFile(dir, "key" + n, "key");
        o.tls_ca = WriteFile(dir, "ca" + n, "ca");
      }
      absl::StatusOr<std::unique_ptr<Authenticator>> a = Authenticator::Create(o);
      PS_FUZZ_CHECK(a.ok(), "Authenticator::Create refused the target's configuration");
      s.auth = *std::move(a);
      PS_FUZZ_CHECK(s.auth->self() == kSelf, "the shard is not shard-1");
    }
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    // The oracle is not vacuous: every token of every token file, and two derived ones,
    // go through the challenge and the call, which succeed exactly for the token the
    // key names (not for a token file's token that the secret's shadows).
    for (const Shard& s : *out) {
      std::vector<std::string> tokens = {crypto::DeriveToken(secret, {Kind::kWorker, 1}),
                                         crypto::DeriveToken(secret, {Kind::kWorker, 7})};
      for (const auto& [id, token] : s.table) tokens.push_back(token);
      for (const std::string& token : tokens) {
        const std::string key = crypto::TokenKey(token);
        const std::string challenge =
            crypto::ChallengeHeader(key, std::string(crypto::kNonceBytes, 'n'));
        const std::optional<Resolved> r = Resolve(s, key);
        PS_FUZZ_CHECK(s.auth->AnswerChallenge(challenge).ok() == r.has_value(),
                      "a challenge was answered for an unknown token or refused for a known one");
        CheckAnswer(s, challenge);
        const bool taken = s.auth->Verify({std::nullopt, HonestProofHeader(s, key, token)}).ok();
        PS_FUZZ_CHECK(taken == (r.has_value() && r->token == token),
                      "an honest proof was refused, or a shadowed token's taken");
      }
    }
    return out;
  }();
  return *shards;
}

// --- the parsers, on any text ---

// What both header parsers must do: refuse as CheckRefusal says, or give a key, fields of
// the fixed sizes (`sizes_ok`), and what `write` makes of them is the text with single
// blanks, which parses again to the same (what `write` makes of it is the same again).
template <typename T, typename Write, typename SizesOk>
void CheckHeader(std::string_view text, absl::StatusOr<T> (*parse)(std::string_view), Write write,
                 SizesOk sizes_ok) {
  const absl::StatusOr<T> parsed = parse(text);
  const T* h = Accepted(parsed, "a header parser refused without UNAUTHENTICATED and a message");
  if (h == nullptr) return;
  PS_FUZZ_CHECK(IsKey(h->key), "a header parser accepted a key that is none");
  PS_FUZZ_CHECK(sizes_ok(*h), "a header parser gave a field of another size or form");
  const std::string again = write(*h);
  PS_FUZZ_CHECK(again == SingleBlanks(text), "a parsed header is not written back as read");
  const absl::StatusOr<T> reparsed = parse(again);
  PS_FUZZ_CHECK(reparsed.ok() && write(*reparsed) == again,
                "a written header does not parse to the same fields");
}

void CheckChallengeHeader(std::string_view text) {
  CheckHeader(
      text, &crypto::ParseChallengeHeader,
      [](const crypto::ChallengeRequest& r) { return crypto::ChallengeHeader(r.key, r.client_nonce); },
      [](const crypto::ChallengeRequest& r) { return r.client_nonce.size() == crypto::kNonceBytes; });
}

void CheckProofHeader(std::string_view text) {
  CheckHeader(
      text, &crypto::ParseProofHeader,
      [](const crypto::PresentedProof& p) {
        return crypto::ProofHeader(p.key, absl::HexStringToBytes(p.instance), p.proof);
      },
      [](const crypto::PresentedProof& p) {
        return IsLowerHex(p.instance, 2 * crypto::kInstanceBytes) &&
               p.proof.size() == crypto::kProofBytes;
      });
}

void CheckChallengeAnswer(std::string_view text) {
  std::optional<crypto::ChallengeReply> r = crypto::ParseChallengeAnswer(text);
  if (!r.has_value()) return;
  PS_FUZZ_CHECK(r->server_nonce.size() == crypto::kNonceBytes && r->proof.size() == crypto::kProofBytes,
                "a challenge answer with fields of another size");
  PS_FUZZ_CHECK(crypto::ChallengeAnswer(r->server, r->server_nonce, r->proof) == SingleBlanks(text),
                "a challenge answer is not written back as read");
}

void CheckStaleInstance(std::string_view text) {
  std::optional<std::string> instance = crypto::StaleInstance(text);
  if (!instance.has_value()) return;
  PS_FUZZ_CHECK(IsLowerHex(*instance, 2 * crypto::kInstanceBytes),
                "a stale instance of another form");
  const std::string head = absl::StrCat(AsAbsl(crypto::kStalePrefix), " ", *instance);
  PS_FUZZ_CHECK(text.starts_with(head) && (text.size() == head.size() || text[head.size()] == ':'),
                "StaleInstance read an instance the message does not start with");
  PS_FUZZ_CHECK(crypto::StaleInstance(crypto::StaleMessage(*instance, kSelf)) == instance,
                "StaleInstance does not read back StaleMessage");
}

void CheckIdentityAndKey(std::string_view text) {
  absl::StatusOr<Identity> id = core::ParseIdentity(text);
  PS_FUZZ_CHECK(crypto::KeyIdentity(text).has_value() == id.ok(),
                "KeyIdentity disagrees with ParseIdentity");
  if (id.ok()) PS_FUZZ_CHECK(id->Name() == text, "ParseIdentity accepted a name it does not write");
  if (text.size() > 4096) return;  // a token: 16 to 4096 characters
  const std::string key = crypto::TokenKey(text);
  PS_FUZZ_CHECK(IsKey(key), "TokenKey made a key the shard cannot parse");
  if (crypto::KeyIdentity(key).has_value()) {
    PS_FUZZ_CHECK(text.size() == key.size() + 65 && text.starts_with(key) &&
                      text[key.size()] == '.' && IsLowerHex(text.substr(key.size() + 1), 64),
                  "TokenKey named an identity for a token not in the derived form");
  } else {
    unsigned char md[SHA256_DIGEST_LENGTH];
    SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), md);
    PS_FUZZ_CHECK(key == Hex(std::string_view(reinterpret_cast<const char*>(md), sizeof(md))),
                  "TokenKey is neither the identity nor the SHA-256");
  }
  PS_FUZZ_CHECK(
      crypto::ParseChallengeHeader(crypto::ChallengeHeader(key, std::string(32, '\x5a'))).ok(),
      "the shard refuses the challenge header of a key TokenKey made");
}

// --- the shard's checks ---

void CheckAnswer(const Shard& s, std::string_view text) {
  absl::StatusOr<std::string> answer = s.auth->AnswerChallenge(text);
  absl::StatusOr<crypto::ChallengeRequest> req = crypto::ParseChallengeHeader(text);
  const std::optional<Resolved> r = req.ok() ? Resolve(s, req->key) : std::nullopt;
  PS_FUZZ_CHECK(
      answer.ok() == r.has_value(),
      "AnswerChallenge answered a key the oracle does not resolve, or refused one it does");
  if (!answer.ok()) {
    CheckRefusal(answer.status(), "AnswerChallenge refused without UNAUTHENTICATED and a message");
    return;
  }
  std::optional<crypto::ChallengeReply> reply = crypto::ParseChallengeAnswer(*answer);
  PS_FUZZ_CHECK(reply.has_value(), "the shard's answer does not parse");
  CheckChallengeAnswer(*answer);
  PS_FUZZ_CHECK(reply->server == kSelf && reply->server_nonce == s.auth->instance_nonce(),
                "the answer names another shard or nonce");
  PS_FUZZ_CHECK(
      crypto::SameProof(reply->proof, crypto::ServerProof(r->token, req->key, kSelf.Name(),
                                                      req->client_nonce, reply->server_nonce)),
      "the answer does not verify for the token the key names");
  PS_FUZZ_CHECK(
      !crypto::SameProof(reply->proof, crypto::ServerProof(r->token + "x", req->key, kSelf.Name(),
                                                       req->client_nonce, reply->server_nonce)),
      "the answer verifies for another token");
  PS_FUZZ_CHECK(!crypto::SameProof(reply->proof, crypto::CallProof(r->token, req->key, kSelf.Name(),
                                                               reply->server_nonce)),
                "a challenge answer is a call proof");
  // The client's next step: the call proof for the nonce it was given is the key's identity.
  absl::StatusOr<Identity> id = s.auth->Verify(
      {std::nullopt, crypto::ProofHeader(req->key, reply->server_nonce,
                                       crypto::CallProof(r->token, req->key, reply->server.Name(),
                                                       reply->server_nonce))});
  PS_FUZZ_CHECK(id.ok() && *id == r->identity, "the proof after an answered challenge was refused");
}

void CheckVerify(const Shard& s, std::optional<std::string_view> common_name,
                 std::string_view text) {
  std::string charge_to;
  absl::StatusOr<Identity> got = s.auth->Verify({common_name, text}, &charge_to);

  // The oracle.
  std::optional<Identity> want;
  bool stale = false;
  std::optional<crypto::PresentedProof> proof;
  bool cert_ok = true;
  std::optional<Identity> from_cert;
  if (s.ca && common_name.has_value()) {
    absl::StatusOr<Identity> id = core::ParseIdentity(*common_name);
    cert_ok = id.ok();
    if (id.ok()) from_cert = *id;
  }
  std::optional<Identity> from_token;
  if (cert_ok) {
    if (text.starts_with("Bearer ")) {
      if (s.tls) from_token = BearerIdentity(s, text.substr(7));
    } else if (absl::StatusOr<crypto::PresentedProof> p = crypto::ParseProofHeader(text); p.ok()) {
      proof = *p;
      if (std::optional<Resolved> r = Resolve(s, p->key)) {
        const std::string& nonce = s.auth->instance_nonce();
        if (p->instance != crypto::InstanceId(nonce)) {
          stale = true;
        } else if (p->proof == crypto::CallProof(r->token, p->key, kSelf.Name(), nonce)) {
          from_token = r->identity;
        }
      }
    }
    if (from_token.has_value()) {
      if (!from_cert.has_value() || *from_cert == *from_token) want = from_token;
    }
  }
  // A certificate alone does not count here: a text is always presented.

  PS_FUZZ_CHECK(got.ok() == want.has_value(), got.ok() ? "Verify accepted what the oracle refuses"
                                                       : "Verify refused what the oracle accepts");
  if (got.ok()) {
    PS_FUZZ_CHECK(*got == *want, "Verify accepted as another identity");
    return;
  }
  CheckRefusal(got.status(), "Verify refused without UNAUTHENTICATED and a message");
  if (stale) {
    PS_FUZZ_CHECK(charge_to == ps::server::kStaleProofClient, "a stale proof charged elsewhere");
    PS_FUZZ_CHECK(crypto::StaleInstance(Message(got.status())) == proof->instance,
                  "a stale refusal does not name the proof's instance");
  } else {
    PS_FUZZ_CHECK(charge_to == ps::server::kAnonymousClient, "a refusal charged to another client");
    PS_FUZZ_CHECK(!crypto::StaleInstance(Message(got.status())).has_value(),
                  "a refusal that is not stale reads as stale");
  }
}

// --- building texts ---

struct Parts {
  std::vector<std::string_view> p;
  std::string_view operator[](size_t i) const { return i < p.size() ? p[i] : std::string_view(); }
};

Parts Split(std::string_view data) {
  Parts parts;
  size_t start = 0;
  while (parts.p.size() < 5) {
    const size_t nul = data.find('\0', start);
    parts.p.push_back(data.substr(start, nul == std::string_view::npos ? nul : nul - start));
    if (nul == std::string_view::npos) break;
    start = nul + 1;
  }
  return parts;
}

// `part` cut or padded with zeros to `n` bytes.
std::string Fit(std::string_view part, size_t n) {
  std::string out(part.substr(0, n));
  out.resize(n, '\0');
  return out;
}

// `raw` with `mask` XORed in cyclically.
std::string Xor(std::string raw, std::string_view mask) {
  if (!mask.empty()) {
    for (size_t i = 0; i < raw.size(); ++i)
      raw[i] = static_cast<char>(raw[i] ^ mask[i % mask.size()]);
  }
  return raw;
}

// The key of choice `c` (flags bits 0-2).
std::string ChosenKey(unsigned c, const Parts& parts) {
  switch (c) {
    case 0:
      return "worker-1";  // derived, made at start (a worker of the token file on shard 1)
    case 1:
      return "shard-0";  // derived; on shard 1 a token-file token in the derived form
    case 2:
      return "worker-7";  // derived per call (beyond --workers)
    case 3:
      return crypto::TokenKey(kTokenA);
    case 4:
      return crypto::TokenKey(kTokenB);
    case 5:
      return "worker-0";  // derived; shadows the token file's derived-form token
    case 6:
      return crypto::TokenKey(kUnknownToken);
    default:
      return std::string(parts[0]);
  }
}

std::string Build(unsigned mode, uint8_t flags, const Shard& s, const Parts& parts) {
  const std::string sep = (flags & 0x80) != 0 ? std::string(parts[3]) : std::string(" ");
  const bool raw_hex = (flags & 0x08) != 0;
  const bool own_nonce = (flags & 0x40) != 0;
  const std::string& nonce = s.auth->instance_nonce();
  const unsigned proof_choice = (flags >> 4) & 3;
  switch (mode) {
    case 1: {  // PS-Challenge-v1 KEY C
      const std::string c = raw_hex ? std::string(parts[1]) : Fit(parts[1], crypto::kNonceBytes);
      return absl::StrCat(AsAbsl(crypto::kChallengeScheme), sep, ChosenKey(flags & 7, parts), sep,
                          Hex(c));
    }
    case 2: {  // PS-Proof-v1 KEY INSTANCE CALLPROOF
      const std::string key = ChosenKey(flags & 7, parts);
      const std::optional<Resolved> r = Resolve(s, key);
      const std::string token = r.has_value() ? r->token : std::string(kUnknownToken);
      const std::string instance =
          own_nonce ? crypto::InstanceId(nonce)
                    : Hex(raw_hex ? std::string(parts[1]) : Fit(parts[1], crypto::kInstanceBytes));
      std::string proof;
      switch (proof_choice) {
        case 0:
          proof = crypto::CallProof(token, key, kSelf.Name(), nonce);
          break;
        case 1:
          proof = Xor(crypto::CallProof(token, key, kSelf.Name(), nonce), parts[2]);
          break;
        case 2:
          proof = std::string(parts[2]);
          break;
        default:  // a challenge answer's proof, presented as a call proof
          proof =
              crypto::ServerProof(token, key, kSelf.Name(), Fit(parts[2], crypto::kNonceBytes), nonce);
      }
      return absl::StrCat(AsAbsl(crypto::kProofScheme), sep, key, sep, instance, sep, Hex(proof));
    }
    case 3: {  // ps-auth-challenge-v1 SERVER S PROOF, as a listener might answer
      static const char* const kServers[] = {"shard-1", "shard-0", "worker-1", "admin"};
      const std::string server = (flags & 4) != 0 ? std::string(parts[0]) : kServers[flags & 3];
      const std::string s_raw =
          own_nonce ? nonce : (raw_hex ? std::string(parts[1]) : Fit(parts[1], crypto::kNonceBytes));
      const std::string key = crypto::TokenKey(kTokenA);
      const std::string c = Fit(parts[2], crypto::kNonceBytes);
      std::string proof;
      switch (proof_choice) {
        case 0:
          proof = crypto::ServerProof(kTokenA, key, server, c, s_raw);
          break;
        case 1:
          proof = Xor(crypto::ServerProof(kTokenA, key, server, c, s_raw), parts[4]);
          break;
        case 2:
          proof = std::string(parts[2]);
          break;
        default:
          proof = crypto::CallProof(kTokenA, key, server, s_raw);
      }
      return absl::StrCat(AsAbsl(crypto::kChallengeAnswerPrefix), sep, server, sep, Hex(s_raw), sep,
                          Hex(proof));
    }
    case 4: {  // ps-auth-stale-v1 INSTANCE: ...
      const std::string instance =
          own_nonce ? crypto::InstanceId(nonce)
                    : Hex(raw_hex ? std::string(parts[1]) : Fit(parts[1], crypto::kInstanceBytes));
      const std::string tail =
          (flags & 0x20) != 0 ? std::string(parts[2]) : absl::StrCat(": ", AsAbsl(parts[2]));
      return absl::StrCat(AsAbsl(crypto::kStalePrefix), sep, instance, tail);
    }
    case 5: {  // Bearer TOKEN
      std::string token;
      const std::string secret = absl::HexStringToBytes(AsAbsl(kSecretHex));
      switch (flags & 7) {
        case 0:
          token = crypto::DeriveToken(secret, {Kind::kWorker, 1});
          break;
        case 1:
          token = crypto::DeriveToken(secret, {Kind::kShard, 0});
          break;
        case 2:
          token = crypto::DeriveToken(secret, {Kind::kWorker, 7});
          break;
        case 3:
          token = kTokenA;
          break;
        case 4:
          token = kTokenB;
          break;
        case 5:
          token = crypto::DeriveToken(kOtherSecret, {Kind::kWorker, 0});
          break;
        case 6: {  // the derived token of the identity in part 0, if it is one
          absl::StatusOr<Identity> id = core::ParseIdentity(parts[0]);
          token = id.ok() ? crypto::DeriveToken(secret, *id)
                          : absl::StrCat(AsAbsl(parts[0]), ".", Hex(nonce));
          break;
        }
        default:
          token = std::string(parts[0]);
      }
      switch (proof_choice) {
        case 1:
          token += parts[2];
          break;
        case 2:
          token.resize(token.size() - std::min(token.size(), parts[2].size()));
          break;
        case 3:
          token = Xor(std::move(token), parts[2]);
          break;
        default:
          break;
      }
      return absl::StrCat((flags & 0x80) != 0 ? absl::StrCat("Bearer", sep) : "Bearer ", token);
    }
    default:
      return "";
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<Shard>& shards = Shards();
  if (size < 3) return 0;
  const unsigned mode = data[0] % 6;
  const uint8_t flags = data[1];
  const Shard& target = shards[(data[2] & 3) % shards.size()];
  const std::string_view rest(reinterpret_cast<const char*>(data) + 3, size - 3);
  const Parts parts = Split(rest);
  const std::string text = mode == 0 ? std::string(rest) : Build(mode, flags, target, parts);

  CheckChallengeHeader(text);
  CheckProofHeader(text);
  CheckChallengeAnswer(text);
  CheckStaleInstance(text);
  CheckIdentityAndKey(text);
  if (text.starts_with("Bearer ")) CheckIdentityAndKey(std::string_view(text).substr(7));

  std::optional<std::string_view> common_name;
  switch ((data[2] >> 2) & 7) {
    case 4:
      common_name = "worker-1";
      break;
    case 5:
      common_name = "admin";
      break;
    case 6:
      common_name = "shard-01";
      break;  // not an identity
    case 7:
      common_name = parts[4];
      break;
    default:
      break;
  }
  for (const Shard& s : shards) {
    CheckAnswer(s, text);
    CheckVerify(s, std::nullopt, text);
    if (common_name.has_value()) CheckVerify(s, common_name, text);
  }
  return 0;
}
