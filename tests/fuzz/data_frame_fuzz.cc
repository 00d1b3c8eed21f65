// Fuzz target for the frames of the TCP data plane (net/data_frame.h): the input is what
// one side of a connection receives, read as that side's connection code will read it.
//
// Byte 0: bits 0-2 (mod 6) the ConnectionState the bytes arrive in, bits 3-7 the most
// slices a PULL may name (0-31); the largest body is kMaxBody. The rest: frames, one after
// the other. Each frame goes through ParseHeader, CheckHeader in the current state, the
// meta's parser, and for a PULL CheckPullBody and ParsePullBody; the state moves on after
// a HELLO, PROOF, CHALLENGE or ADMIT, and a GOAWAY ends the input, as would the first
// refusal or bytes that end inside a frame (a connection waits for more).
//
// Aborts when a refusal is not INVALID_ARGUMENT with a message of printable ASCII of at
// most 512 bytes; when a header, meta or PULL body is accepted but re-encoding what
// parsed (EncodeHeader, the Append* functions) fails or does not give back the input's
// bytes exactly (the format has one encoding per frame); when an accepted frame breaks a
// bound (a type the state does not allow, a body over the limit, a codec, name or message
// over its bound, a name outside [a-z0-9_], a message that is not UTF-8, a PULL whose
// count or body disagree). Each meta and PULL body is parsed from a heap copy of exactly
// its declared size, so that under ASan a parser reading past it is caught even where
// the input goes on.
// Seeds: tests/fuzz/corpus/data_frame/ (DATA_FRAME in make_corpus.py).
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "core/client_text.h"
#include "net/data_frame.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using ps::net::ConnectionState;
using ps::net::FrameHeader;
using ps::net::FrameType;

constexpr uint64_t kMaxBody = 1 << 16;

// A heap copy of exactly `bytes`: reading one byte past it is a heap overflow.
class Exact {
 public:
  explicit Exact(std::string_view bytes) : data_(new char[bytes.size()]), size_(bytes.size()) {
    if (size_ > 0) std::memcpy(data_.get(), bytes.data(), size_);
  }
  std::string_view view() const { return std::string_view(data_.get(), size_); }

 private:
  std::unique_ptr<char[]> data_;
  size_t size_;
};

// Checks a refusal; 0, the size OneFrame returns for a frame that ends the input. Only
// CheckHeader's body over the limit is RESOURCE_EXHAUSTED (`over_limit`).
size_t Refused(const absl::Status& s, bool over_limit = false) {
  PS_FUZZ_CHECK(s.code() == absl::StatusCode::kInvalidArgument ||
                    (over_limit && s.code() == absl::StatusCode::kResourceExhausted),
                "a refusal with a code other than INVALID_ARGUMENT (or RESOURCE_EXHAUSTED for a "
                "body over the limit)");
  const std::string_view m(s.message().data(), s.message().size());
  PS_FUZZ_CHECK(!m.empty() && m.size() <= 512, "a refusal's message is empty or over 512 bytes");
  for (char c : m) {
    PS_FUZZ_CHECK(c >= 0x20 && c < 0x7f, "a refusal's message is not printable ASCII");
  }
  return 0;
}

// Re-encoding must succeed and give back `input` (the frame's header and meta, and a
// PULL's body) exactly.
void CheckReencoded(const absl::Status& s, const std::string& again, std::string_view input) {
  PS_FUZZ_CHECK(s.ok(), "an Append* function refused the fields of a parsed frame");
  PS_FUZZ_CHECK(again == input, "re-encoding a parsed frame changed its bytes");
}

bool IsName(std::string_view name) {
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return name.size() <= ps::net::kMaxRefusalNameBytes;
}

ConnectionState After(ConnectionState state, FrameType type) {
  if (state == ConnectionState::kShardAwaitsHello && type == FrameType::kHello) {
    return ConnectionState::kShardAwaitsProof;
  }
  if (state == ConnectionState::kShardAwaitsProof && type == FrameType::kProof) {
    return ConnectionState::kShardAdmitted;
  }
  if (state == ConnectionState::kWorkerAwaitsChallenge && type == FrameType::kChallenge) {
    return ConnectionState::kWorkerAwaitsAdmit;
  }
  if (state == ConnectionState::kWorkerAwaitsAdmit && type == FrameType::kAdmit) {
    return ConnectionState::kWorkerAdmitted;
  }
  return state;
}

// Parses the meta (and a PULL's body) of the frame at the start of `rest`, whose header
// `h` passed; re-encodes it. Returns the frame's size, or 0 when it was refused or its
// bytes end early.
size_t OneFrame(const FrameHeader& h, std::string_view rest, const ps::net::FrameLimits& limits) {
  const size_t head = ps::net::kFrameHeaderBytes + h.meta_bytes;
  if (rest.size() < head) return 0;
  const Exact meta(rest.substr(ps::net::kFrameHeaderBytes, h.meta_bytes));
  const std::string_view input = rest.substr(0, head);
  std::string again;
  switch (h.type) {
    case FrameType::kHello: {
      auto m = ps::net::ParseHelloMeta(meta.view());
      if (!m.ok()) return Refused(m.status());
      CheckReencoded(ps::net::AppendHello(*m, &again), again, input);
      break;
    }
    case FrameType::kChallenge: {
      auto m = ps::net::ParseChallengeMeta(meta.view());
      if (!m.ok()) return Refused(m.status());
      CheckReencoded(ps::net::AppendChallenge(*m, &again), again, input);
      break;
    }
    case FrameType::kProof: {
      auto m = ps::net::ParseProofMeta(meta.view());
      if (!m.ok()) return Refused(m.status());
      CheckReencoded(ps::net::AppendProof(*m, &again), again, input);
      break;
    }
    case FrameType::kAdmit: {
      auto m = ps::net::ParseAdmitMeta(meta.view());
      if (!m.ok()) return Refused(m.status());
      CheckReencoded(ps::net::AppendAdmit(*m, &again), again, input);
      break;
    }
    case FrameType::kPush: {
      auto m = ps::net::ParsePushMeta(h.flags, meta.view());
      if (!m.ok()) return Refused(m.status());
      PS_FUZZ_CHECK(m->codec.size() <= ps::net::kMaxFrameCodecBytes, "accepted a long codec");
      CheckReencoded(ps::net::AppendPush(h.tag, *m, h.body_bytes, &again), again, input);
      break;
    }
    case FrameType::kPushes: {
      auto m = ps::net::ParsePushesMeta(h, meta.view());
      if (!m.ok()) return Refused(m.status());
      PS_FUZZ_CHECK(m->codec.size() <= ps::net::kMaxFrameCodecBytes, "accepted a long codec");
      PS_FUZZ_CHECK(m->count >= 2 && m->count <= ps::net::kMaxPushesPerFrame,
                    "accepted a PUSHES of too few or too many pushes");
      uint64_t sum = 0;
      for (uint32_t i = 0; i < m->count; ++i) {
        PS_FUZZ_CHECK(m->entries[i].tag != 0, "accepted a push of tag 0");
        sum += m->entries[i].body_bytes;
      }
      PS_FUZZ_CHECK(sum == h.body_bytes && m->entries[0].tag == h.tag,
                    "a PUSHES's pushes disagree with its header");
      CheckReencoded(ps::net::AppendPushes(*m, &again), again, input);
      break;
    }
    case FrameType::kAnswer:
    case FrameType::kPullEnd:
    case FrameType::kGoaway: {
      auto m = ps::net::ParseStatusMeta(h.type, meta.view());
      if (!m.ok()) return Refused(m.status());
      PS_FUZZ_CHECK(static_cast<int>(m->code) >= 0 && static_cast<int>(m->code) <= 16,
                    "accepted a status code outside 0-16");
      PS_FUZZ_CHECK(IsName(m->refusal_name), "accepted a refusal name outside [a-z0-9_]{0,64}");
      PS_FUZZ_CHECK(m->message.size() <= ps::net::kMaxStatusMessageBytes &&
                        ps::core::IsUtf8(m->message),
                    "accepted a long or non-UTF-8 message");
      const absl::Status s = h.type == FrameType::kAnswer ? ps::net::AppendAnswer(h.tag, *m, &again)
                             : h.type == FrameType::kPullEnd
                                 ? ps::net::AppendPullEnd(h.tag, *m, &again)
                                 : ps::net::AppendGoaway(*m, &again);
      CheckReencoded(s, again, input);
      break;
    }
    case FrameType::kPull: {
      auto m = ps::net::ParsePullMeta(h.flags, meta.view());
      if (!m.ok()) return Refused(m.status());
      const absl::Status checked = ps::net::CheckPullBody(h, *m, limits);
      if (!checked.ok()) return Refused(checked);
      PS_FUZZ_CHECK(m->count <= limits.max_pull_slices, "accepted a pull of too many slices");
      if (rest.size() - head < h.body_bytes) return 0;
      const Exact body(rest.substr(head, h.body_bytes));
      auto b = ps::net::ParsePullBody(*m, body.view());
      PS_FUZZ_CHECK(b.ok(), "ParsePullBody refused a body CheckPullBody accepted");
      PS_FUZZ_CHECK(b->slice_ids.size() == m->count &&
                        b->held_versions.size() == (m->held ? m->count : 0),
                    "a pull body's lists disagree with its meta");
      CheckReencoded(ps::net::AppendPull(h.tag, *m, b->slice_ids, b->held_versions, &again), again,
                     rest.substr(0, head + h.body_bytes));
      return head + h.body_bytes;
    }
    case FrameType::kSlice: {
      auto m = ps::net::ParseSliceMeta(h.flags, meta.view());
      if (!m.ok()) return Refused(m.status());
      PS_FUZZ_CHECK(m->codec.size() <= ps::net::kMaxFrameCodecBytes, "accepted a long codec");
      CheckReencoded(ps::net::AppendSlice(h.tag, *m, h.body_bytes, &again), again, input);
      break;
    }
    case FrameType::kSlices: {
      auto m = ps::net::ParseSlicesMeta(h, meta.view());
      if (!m.ok()) return Refused(m.status());
      PS_FUZZ_CHECK(m->codec.size() <= ps::net::kMaxFrameCodecBytes, "accepted a long codec");
      PS_FUZZ_CHECK(m->count >= 2 && m->count <= ps::net::kMaxSlicesPerFrame,
                    "accepted a SLICES of too few or too many slices");
      uint64_t sum = 0;
      for (uint32_t i = 0; i < m->count; ++i) sum += m->entries[i].body_bytes;
      PS_FUZZ_CHECK(sum == h.body_bytes, "a SLICES's slices disagree with its header");
      CheckReencoded(ps::net::AppendSlices(h.tag, *m, &again), again, input);
      break;
    }
    case FrameType::kCancel:
      CheckReencoded(ps::net::AppendCancel(h.tag, &again), again, input);
      break;
  }
  // A PUSH's, PUSHES's, SLICE's or SLICES's body is the codec's business: skipped, as the connection would
  // read it into its target.
  if (rest.size() - head < h.body_bytes) return 0;
  return head + h.body_bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  auto state = static_cast<ConnectionState>((data[0] & 7) % 6);
  const ps::net::FrameLimits limits{.max_body_bytes = kMaxBody,
                                    .max_pull_slices = static_cast<uint64_t>(data[0] >> 3)};
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  while (rest.size() >= ps::net::kFrameHeaderBytes) {
    std::array<char, ps::net::kFrameHeaderBytes> bytes;
    std::memcpy(bytes.data(), rest.data(), bytes.size());
    auto h = ps::net::ParseHeader(bytes);
    if (!h.ok()) {
      Refused(h.status());
      return 0;
    }
    PS_FUZZ_CHECK(h->meta_bytes <= ps::net::kMaxMetaBytes, "accepted a meta over 1 KiB");
    std::string again;
    CheckReencoded(ps::net::EncodeHeader(*h, &again), again,
                   rest.substr(0, ps::net::kFrameHeaderBytes));

    const absl::Status allowed = ps::net::CheckHeader(*h, state, limits);
    if (!allowed.ok()) {
      Refused(allowed, h->body_bytes > limits.max_body_bytes);
      return 0;
    }
    PS_FUZZ_CHECK(h->body_bytes <= limits.max_body_bytes, "accepted a body over the limit");

    const size_t used = OneFrame(*h, rest, limits);
    if (used == 0) return 0;
    if (h->type == FrameType::kGoaway) return 0;  // the sender closes
    state = After(state, h->type);
    rest.remove_prefix(used);
  }
  return 0;
}
