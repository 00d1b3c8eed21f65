#include "net/data_frame.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/client_text.h"
#include "core/status.h"
#include "net/little_endian_internal.h"

namespace ps::net {
namespace {

using core::AsAbsl;
using internal::LoadLe;
using internal::StoreLe;

constexpr char kHelloMagic[4] = {'P', 'S', 'D', '1'};

// Flag bits, per type.
constexpr uint8_t kPushLoss = 0x01;
constexpr uint8_t kPullHeld = 0x01;
constexpr uint8_t kSliceLoss = 0x01;
constexpr uint8_t kSliceFirstLoss = 0x02;
constexpr uint8_t kSliceQueued = 0x04;

// Meta sizes, from the field lists in data_frame.h. A variable meta's "fixed" part
// includes its strings' length fields.
// A HELLO's magic and version (its 52 bytes are this version's): the header lets any
// HELLO this long through, so that a worker of another version learns which one this
// shard speaks rather than "bad length".
constexpr size_t kHelloPrefixBytes = 4 + 4;
constexpr size_t kChallengeMetaBytes = 4 + core::kNonceBytes + core::kProofBytes;
constexpr size_t kProofMetaBytes = core::kProofBytes;
constexpr size_t kAdmitMetaBytes = 4 * 4;
constexpr size_t kPushFixedBytes = 8 + 8 + 4 + 1;
constexpr size_t kStatusFixedBytes = 1 + 1 + 2;
constexpr size_t kPullMetaBytes = 8 + 8 + 8 + 4;
constexpr size_t kSliceFixedBytes = 4 + 8 + 8 + 8 + 1;
constexpr size_t kLossBytes = 4;

static_assert(kFrameHeaderBytes == 1 + 1 + 2 + 4 + 8);
static_assert(kMaxMetaBytes <= std::numeric_limits<uint16_t>::max(), "M is two bytes");
static_assert(kMaxFrameCodecBytes <= 0xff && kMaxRefusalNameBytes <= 0xff,
              "codec and refusal name have a one-byte length");
static_assert(kMaxStatusMessageBytes <= 0xffff, "a message has a two-byte length");
static_assert(kChallengeMetaBytes <= kMaxMetaBytes &&
              kPushFixedBytes + kLossBytes + kMaxFrameCodecBytes <= kMaxMetaBytes &&
              kStatusFixedBytes + kMaxRefusalNameBytes + kMaxStatusMessageBytes <= kMaxMetaBytes &&
              kSliceFixedBytes + 2 * kLossBytes + kMaxFrameCodecBytes <= kMaxMetaBytes,
              "every meta fits in kMaxMetaBytes");

// What the header check needs to know of a type.
struct TypeInfo {
  uint8_t flags = 0;        // the bits the type defines
  bool body = false;        // may have a body
  bool connection = false;  // a connection frame: tag 0; else a push's or pull's: tag != 0
};

std::optional<TypeInfo> InfoOf(FrameType type) {
  switch (type) {
    case FrameType::kHello:
    case FrameType::kChallenge:
    case FrameType::kProof:
    case FrameType::kAdmit:
    case FrameType::kGoaway:
      return TypeInfo{.connection = true};
    case FrameType::kPush:
      return TypeInfo{.flags = kPushLoss, .body = true};
    case FrameType::kPull:
      return TypeInfo{.flags = kPullHeld, .body = true};
    case FrameType::kSlice:
      return TypeInfo{.flags = kSliceLoss | kSliceFirstLoss | kSliceQueued, .body = true};
    case FrameType::kAnswer:
    case FrameType::kPullEnd:
    case FrameType::kCancel:
      return TypeInfo{};
  }
  return std::nullopt;
}

// The least and most meta bytes of a `type` frame with `flags` (known bits only).
std::pair<size_t, size_t> MetaBoundsOf(FrameType type, uint8_t flags) {
  switch (type) {
    case FrameType::kHello:
      return {kHelloPrefixBytes, kMaxMetaBytes};
    case FrameType::kChallenge:
      return {kChallengeMetaBytes, kChallengeMetaBytes};
    case FrameType::kProof:
      return {kProofMetaBytes, kProofMetaBytes};
    case FrameType::kAdmit:
      return {kAdmitMetaBytes, kAdmitMetaBytes};
    case FrameType::kPush: {
      const size_t fixed = kPushFixedBytes + ((flags & kPushLoss) != 0 ? kLossBytes : 0);
      return {fixed, fixed + kMaxFrameCodecBytes};
    }
    case FrameType::kAnswer:
    case FrameType::kPullEnd:
    case FrameType::kGoaway:
      return {kStatusFixedBytes,
              kStatusFixedBytes + kMaxRefusalNameBytes + kMaxStatusMessageBytes};
    case FrameType::kPull:
      return {kPullMetaBytes, kPullMetaBytes};
    case FrameType::kSlice: {
      const size_t fixed = kSliceFixedBytes + ((flags & kSliceLoss) != 0 ? kLossBytes : 0) +
                           ((flags & kSliceFirstLoss) != 0 ? kLossBytes : 0);
      return {fixed, fixed + kMaxFrameCodecBytes};
    }
    case FrameType::kCancel:
      return {0, 0};
  }
  return {0, 0};
}

std::string Hex8(uint8_t v) { return absl::StrCat("0x", absl::Hex(v, absl::kZeroPad2)); }

// "PUSH", or "type 0x07" for a value FrameType does not name.
std::string TypeText(FrameType type) {
  if (InfoOf(type).has_value()) return std::string(FrameTypeName(type));
  return absl::StrCat("type ", Hex8(static_cast<uint8_t>(type)));
}

absl::Status FrameError(FrameType type, std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("data frame ", TypeText(type), ": ", AsAbsl(what)));
}

// The checks EncodeHeader and ParseHeader share, with the same messages.
absl::Status ValidateHeader(const FrameHeader& h) {
  const std::optional<TypeInfo> info = InfoOf(h.type);
  if (!info.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data frame: unknown type ", Hex8(static_cast<uint8_t>(h.type))));
  }
  if ((h.flags & ~info->flags) != 0) {
    return FrameError(h.type, absl::StrCat("flags ", Hex8(h.flags), " set bits this type does not ",
                                           "define (it has ", Hex8(info->flags), ")"));
  }
  const auto [min, max] = MetaBoundsOf(h.type, h.flags);
  if (h.meta_bytes < min || h.meta_bytes > max) {
    return FrameError(h.type, min == max ? absl::StrCat("meta length ", h.meta_bytes,
                                                        ", where this type's meta has ", min,
                                                        " bytes")
                                         : absl::StrCat("meta length ", h.meta_bytes,
                                                        " is outside [", min, ", ", max,
                                                        "] for this type and its flags"));
  }
  if (!info->body && h.body_bytes != 0) {
    return FrameError(h.type,
                      absl::StrCat("body length ", h.body_bytes, ", where this type has no body"));
  }
  if (info->connection && h.tag != 0) {
    return FrameError(h.type, absl::StrCat("tag ", h.tag, " on a connection frame (must be 0)"));
  }
  if (!info->connection && h.tag == 0) {
    return FrameError(h.type, "tag 0 (a push's or pull's frame has a tag other than 0)");
  }
  return absl::OkStatus();
}

void StoreHeader(const FrameHeader& h, char* p) {
  StoreLe(static_cast<uint8_t>(h.type), 1, p);
  StoreLe(h.flags, 1, p + 1);
  StoreLe(h.meta_bytes, 2, p + 2);
  StoreLe(h.body_bytes, 4, p + 4);
  StoreLe(h.tag, 8, p + 8);
}

// Appends meta fields. The Append* functions check the fields' bounds (CheckCodec,
// CheckStatusMeta) before anything is written, so writing cannot fail.
class MetaWriter {
 public:
  explicit MetaWriter(std::string* out) : out_(out) {}
  void Int(uint64_t v, size_t bytes) {
    const size_t at = out_->size();
    out_->resize(at + bytes);
    StoreLe(v, bytes, out_->data() + at);
  }
  void F32(float v) { Int(std::bit_cast<uint32_t>(v), 4); }
  void Bytes(std::string_view b) { out_->append(b.data(), b.size()); }
  // A string after its length in `length_bytes` bytes.
  void Str(std::string_view s, size_t length_bytes) {
    Int(s.size(), length_bytes);
    Bytes(s);
  }

 private:
  std::string* out_;
};

// A cursor over one meta. Every read fails rather than read past the end, with
// "data frame PUSH meta: ends inside codec at byte 21 (needs 4, has 2)".
class MetaReader {
 public:
  MetaReader(FrameType type, std::string_view bytes) : type_(type), bytes_(bytes) {}

  template <typename T>
  absl::Status Int(T* v, std::string_view what) {
    PS_RETURN_IF_ERROR(Need(sizeof(T), what));
    *v = static_cast<T>(LoadLe(bytes_.data() + pos_, sizeof(T)));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }
  absl::Status F32(std::optional<float>* v, std::string_view what) {
    uint32_t bits = 0;
    PS_RETURN_IF_ERROR(Int(&bits, what));
    *v = std::bit_cast<float>(bits);
    return absl::OkStatus();
  }
  template <size_t N>
  absl::Status Fixed(std::array<char, N>* v, std::string_view what) {
    PS_RETURN_IF_ERROR(Need(N, what));
    std::memcpy(v->data(), bytes_.data() + pos_, N);
    pos_ += N;
    return absl::OkStatus();
  }
  // A string after its length in `length_bytes` bytes; a length above `max` is refused
  // before the bytes are looked at.
  absl::Status Str(size_t length_bytes, size_t max, std::string_view* v, std::string_view what) {
    PS_RETURN_IF_ERROR(Need(length_bytes, what));
    const uint64_t len = LoadLe(bytes_.data() + pos_, length_bytes);
    pos_ += length_bytes;
    if (len > max) {
      return Error(absl::StrCat(AsAbsl(what), " of ", len, " bytes is over the limit of ", max));
    }
    PS_RETURN_IF_ERROR(Need(len, what));
    *v = bytes_.substr(pos_, len);
    pos_ += len;
    return absl::OkStatus();
  }
  // OK when every byte was read.
  absl::Status Finish() const {
    if (pos_ == bytes_.size()) return absl::OkStatus();
    return Error(absl::StrCat(bytes_.size() - pos_, " trailing bytes after the last field"));
  }
  absl::Status Error(std::string_view message) const {
    return absl::InvalidArgumentError(
        absl::StrCat("data frame ", TypeText(type_), " meta: ", AsAbsl(message)));
  }

 private:
  absl::Status Need(size_t n, std::string_view what) const {
    if (bytes_.size() - pos_ >= n) return absl::OkStatus();
    return Error(absl::StrCat("ends inside ", AsAbsl(what), " at byte ", pos_, " (needs ", n,
                              ", has ", bytes_.size() - pos_, ")"));
  }

  FrameType type_;
  std::string_view bytes_;
  size_t pos_ = 0;
};

// Field checks of the encoders. The parsers check the same lengths as they read them
// (MetaReader::Str) and a status's code and text with CheckStatusMeta after.

absl::Status CheckCodec(FrameType type, std::string_view codec) {
  if (codec.size() <= kMaxFrameCodecBytes) return absl::OkStatus();
  return FrameError(type, absl::StrCat("codec of ", codec.size(), " bytes is over the limit of ",
                                       kMaxFrameCodecBytes));
}

absl::Status CheckStatusMeta(FrameType type, const StatusMeta& meta) {
  const int code = static_cast<int>(meta.code);
  if (code < 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return FrameError(type, absl::StrCat("status code ", code, " is not a canonical code (0-16)"));
  }
  if (meta.refusal_name.size() > kMaxRefusalNameBytes) {
    return FrameError(type, absl::StrCat("refusal name of ", meta.refusal_name.size(),
                                         " bytes is over the limit of ", kMaxRefusalNameBytes));
  }
  // The names of core::RefusalName, the `reason` label of ps_refusals_total: snake case.
  for (size_t i = 0; i < meta.refusal_name.size(); ++i) {
    const char c = meta.refusal_name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) {
      return FrameError(type, absl::StrCat("refusal name byte ", i, " (",
                                           Hex8(static_cast<uint8_t>(c)),
                                           ") is not in [a-z0-9_]"));
    }
  }
  if (meta.message.size() > kMaxStatusMessageBytes) {
    return FrameError(type, absl::StrCat("message of ", meta.message.size(),
                                         " bytes is over the limit of ", kMaxStatusMessageBytes));
  }
  // Shown to users as it is: it must be text.
  if (!core::IsUtf8(meta.message)) return FrameError(type, "message is not valid UTF-8");
  return absl::OkStatus();
}

// Appends header and meta (written by `write_meta`), or nothing and the header's refusal.
template <typename WriteMeta>
absl::Status AppendFrame(FrameType type, uint8_t flags, uint64_t tag, size_t body_bytes,
                         std::string* out, WriteMeta&& write_meta) {
  if (body_bytes > std::numeric_limits<uint32_t>::max()) {
    return FrameError(type, absl::StrCat("body of ", body_bytes,
                                         " bytes does not fit the 4-byte body length"));
  }
  const size_t start = out->size();
  out->resize(start + kFrameHeaderBytes);
  MetaWriter writer(out);
  write_meta(writer);
  // The callers' field checks bound the meta; saturated rather than wrapped all the same,
  // so that ValidateHeader, which allows at most kMaxMetaBytes, sees any overflow.
  const size_t meta_bytes = std::min<size_t>(out->size() - start - kFrameHeaderBytes,
                                             std::numeric_limits<uint16_t>::max());
  const FrameHeader header{type, flags, static_cast<uint16_t>(meta_bytes),
                           static_cast<uint32_t>(body_bytes), tag};
  absl::Status valid = ValidateHeader(header);
  if (!valid.ok()) {
    out->resize(start);
    return valid;
  }
  StoreHeader(header, out->data() + start);
  return absl::OkStatus();
}

absl::Status AppendStatus(FrameType type, uint64_t tag, const StatusMeta& meta,
                          std::string* out) {
  PS_RETURN_IF_ERROR(CheckStatusMeta(type, meta));
  return AppendFrame(type, 0, tag, 0, out, [&](MetaWriter& w) {
    w.Int(static_cast<uint8_t>(meta.code), 1);
    w.Str(meta.refusal_name, 1);
    w.Str(meta.message, 2);
  });
}

std::string_view StateText(ConnectionState state) {
  switch (state) {
    case ConnectionState::kShardAwaitsHello:
      return "the shard awaits HELLO";
    case ConnectionState::kShardAwaitsProof:
      return "the shard awaits PROOF";
    case ConnectionState::kShardAdmitted:
      return "the shard admitted the connection (PUSH, PULL, CANCEL, GOAWAY)";
    case ConnectionState::kWorkerAwaitsChallenge:
      return "the worker awaits CHALLENGE";
    case ConnectionState::kWorkerAwaitsAdmit:
      return "the worker awaits ADMIT";
    case ConnectionState::kWorkerAdmitted:
      return "the worker was admitted (ANSWER, SLICE, PULL_END, GOAWAY)";
  }
  return "an unknown state";
}

bool Allowed(ConnectionState state, FrameType type) {
  switch (state) {
    case ConnectionState::kShardAwaitsHello:
      return type == FrameType::kHello;
    case ConnectionState::kShardAwaitsProof:
      return type == FrameType::kProof;
    case ConnectionState::kShardAdmitted:
      return type == FrameType::kPush || type == FrameType::kPull || type == FrameType::kCancel ||
             type == FrameType::kGoaway;
    case ConnectionState::kWorkerAwaitsChallenge:
      return type == FrameType::kChallenge || type == FrameType::kGoaway;
    case ConnectionState::kWorkerAwaitsAdmit:
      return type == FrameType::kAdmit || type == FrameType::kGoaway;
    case ConnectionState::kWorkerAdmitted:
      return type == FrameType::kAnswer || type == FrameType::kSlice ||
             type == FrameType::kPullEnd || type == FrameType::kGoaway;
  }
  return false;
}

// A PULL's body: count slice ids (u32), then, when held, count held versions (u64).
uint64_t PullBodyBytes(uint64_t count, bool held) { return count * (held ? 4 + 8 : 4); }

}  // namespace

std::string_view FrameTypeName(FrameType type) {
  switch (type) {
    case FrameType::kHello:
      return "HELLO";
    case FrameType::kChallenge:
      return "CHALLENGE";
    case FrameType::kProof:
      return "PROOF";
    case FrameType::kAdmit:
      return "ADMIT";
    case FrameType::kPush:
      return "PUSH";
    case FrameType::kAnswer:
      return "ANSWER";
    case FrameType::kPull:
      return "PULL";
    case FrameType::kSlice:
      return "SLICE";
    case FrameType::kPullEnd:
      return "PULL_END";
    case FrameType::kCancel:
      return "CANCEL";
    case FrameType::kGoaway:
      return "GOAWAY";
  }
  return "unknown";
}

absl::Status EncodeHeader(const FrameHeader& header, std::string* out) {
  PS_RETURN_IF_ERROR(ValidateHeader(header));
  const size_t at = out->size();
  out->resize(at + kFrameHeaderBytes);
  StoreHeader(header, out->data() + at);
  return absl::OkStatus();
}

absl::StatusOr<FrameHeader> ParseHeader(std::span<const char, kFrameHeaderBytes> bytes) {
  const char* p = bytes.data();
  FrameHeader h;
  h.type = static_cast<FrameType>(LoadLe(p, 1));
  h.flags = static_cast<uint8_t>(LoadLe(p + 1, 1));
  h.meta_bytes = static_cast<uint16_t>(LoadLe(p + 2, 2));
  h.body_bytes = static_cast<uint32_t>(LoadLe(p + 4, 4));
  h.tag = LoadLe(p + 8, 8);
  PS_RETURN_IF_ERROR(ValidateHeader(h));
  return h;
}

absl::Status CheckHeader(const FrameHeader& header, ConnectionState state,
                         const FrameLimits& limits) {
  if (!Allowed(state, header.type)) {
    return FrameError(header.type,
                      absl::StrCat("not allowed while ", AsAbsl(StateText(state))));
  }
  if (header.body_bytes > limits.max_body_bytes) {
    // A well-formed claim over the receiver's bound: RESOURCE_EXHAUSTED, as gRPC answers a
    // message over its limit (the shard refuses it as over_limit).
    return absl::ResourceExhaustedError(
        absl::StrCat("data frame ", TypeText(header.type), ": body length ", header.body_bytes,
                     " is over the limit of ", limits.max_body_bytes, " bytes"));
  }
  // Computed in 64 bits: 12 bytes times a count near 2^32 must not wrap.
  if (header.type == FrameType::kPull &&
      header.body_bytes > PullBodyBytes(limits.max_pull_slices, true)) {
    return FrameError(header.type,
                      absl::StrCat("body length ", header.body_bytes, " is more than the ",
                                   limits.max_pull_slices, " slices a pull may name need (",
                                   PullBodyBytes(limits.max_pull_slices, true), " bytes)"));
  }
  return absl::OkStatus();
}

absl::Status AppendHello(const HelloMeta& meta, std::string* out) {
  return AppendFrame(FrameType::kHello, 0, 0, 0, out, [&](MetaWriter& w) {
    w.Bytes(std::string_view(kHelloMagic, sizeof(kHelloMagic)));
    w.Int(kDataPlaneVersion, 4);
    w.Int(meta.data_session, 8);
    w.Int(meta.worker_id, 4);
    w.Bytes(std::string_view(meta.client_nonce.data(), meta.client_nonce.size()));
  });
}

absl::StatusOr<HelloMeta> ParseHelloMeta(std::string_view meta) {
  MetaReader r(FrameType::kHello, meta);
  std::array<char, sizeof(kHelloMagic)> magic{};
  PS_RETURN_IF_ERROR(r.Fixed(&magic, "magic"));
  if (std::memcmp(magic.data(), kHelloMagic, sizeof(kHelloMagic)) != 0) {
    return r.Error("bad magic (not PSD1)");
  }
  uint32_t version = 0;
  PS_RETURN_IF_ERROR(r.Int(&version, "version"));
  if (version != kDataPlaneVersion) {
    return r.Error(absl::StrCat("version ", version, "; this shard speaks version ",
                                kDataPlaneVersion));
  }
  HelloMeta m;
  PS_RETURN_IF_ERROR(r.Int(&m.data_session, "data session"));
  PS_RETURN_IF_ERROR(r.Int(&m.worker_id, "worker id"));
  PS_RETURN_IF_ERROR(r.Fixed(&m.client_nonce, "client nonce"));
  PS_RETURN_IF_ERROR(r.Finish());
  return m;
}

absl::Status AppendChallenge(const ChallengeMeta& meta, std::string* out) {
  return AppendFrame(FrameType::kChallenge, 0, 0, 0, out, [&](MetaWriter& w) {
    w.Int(meta.shard_index, 4);
    w.Bytes(std::string_view(meta.server_nonce.data(), meta.server_nonce.size()));
    w.Bytes(std::string_view(meta.proof.data(), meta.proof.size()));
  });
}

absl::StatusOr<ChallengeMeta> ParseChallengeMeta(std::string_view meta) {
  MetaReader r(FrameType::kChallenge, meta);
  ChallengeMeta m;
  PS_RETURN_IF_ERROR(r.Int(&m.shard_index, "shard index"));
  PS_RETURN_IF_ERROR(r.Fixed(&m.server_nonce, "server nonce"));
  PS_RETURN_IF_ERROR(r.Fixed(&m.proof, "proof"));
  PS_RETURN_IF_ERROR(r.Finish());
  return m;
}

absl::Status AppendProof(const ProofMeta& meta, std::string* out) {
  return AppendFrame(FrameType::kProof, 0, 0, 0, out, [&](MetaWriter& w) {
    w.Bytes(std::string_view(meta.proof.data(), meta.proof.size()));
  });
}

absl::StatusOr<ProofMeta> ParseProofMeta(std::string_view meta) {
  MetaReader r(FrameType::kProof, meta);
  ProofMeta m;
  PS_RETURN_IF_ERROR(r.Fixed(&m.proof, "proof"));
  PS_RETURN_IF_ERROR(r.Finish());
  return m;
}

absl::Status AppendAdmit(const AdmitMeta& meta, std::string* out) {
  return AppendFrame(FrameType::kAdmit, 0, 0, 0, out, [&](MetaWriter& w) {
    w.Int(meta.max_body_bytes, 4);
    w.Int(meta.max_unanswered_pushes, 4);
    w.Int(meta.max_pull_slices, 4);
    w.Int(meta.idle_timeout_ms, 4);
  });
}

absl::StatusOr<AdmitMeta> ParseAdmitMeta(std::string_view meta) {
  MetaReader r(FrameType::kAdmit, meta);
  AdmitMeta m;
  PS_RETURN_IF_ERROR(r.Int(&m.max_body_bytes, "largest body"));
  PS_RETURN_IF_ERROR(r.Int(&m.max_unanswered_pushes, "unanswered pushes"));
  PS_RETURN_IF_ERROR(r.Int(&m.max_pull_slices, "slices per pull"));
  PS_RETURN_IF_ERROR(r.Int(&m.idle_timeout_ms, "idle timeout"));
  PS_RETURN_IF_ERROR(r.Finish());
  return m;
}

absl::Status AppendPush(uint64_t tag, const PushMeta& meta, size_t body_bytes, std::string* out) {
  PS_RETURN_IF_ERROR(CheckCodec(FrameType::kPush, meta.codec));
  const uint8_t flags = meta.loss.has_value() ? kPushLoss : 0;
  return AppendFrame(FrameType::kPush, flags, tag, body_bytes, out, [&](MetaWriter& w) {
    w.Int(meta.layout_hash, 8);
    w.Int(meta.round, 8);
    w.Int(meta.slice_id, 4);
    if (meta.loss.has_value()) w.F32(*meta.loss);
    w.Str(meta.codec, 1);
  });
}

absl::StatusOr<PushMeta> ParsePushMeta(uint8_t flags, std::string_view meta) {
  MetaReader r(FrameType::kPush, meta);
  PushMeta m;
  PS_RETURN_IF_ERROR(r.Int(&m.layout_hash, "layout hash"));
  PS_RETURN_IF_ERROR(r.Int(&m.round, "round"));
  PS_RETURN_IF_ERROR(r.Int(&m.slice_id, "slice id"));
  if ((flags & kPushLoss) != 0) PS_RETURN_IF_ERROR(r.F32(&m.loss, "loss"));
  PS_RETURN_IF_ERROR(r.Str(1, kMaxFrameCodecBytes, &m.codec, "codec"));
  PS_RETURN_IF_ERROR(r.Finish());
  return m;
}

absl::Status AppendAnswer(uint64_t tag, const StatusMeta& meta, std::string* out) {
  return AppendStatus(FrameType::kAnswer, tag, meta, out);
}

absl::Status AppendPullEnd(uint64_t tag, const StatusMeta& meta, std::string* out) {
  return AppendStatus(FrameType::kPullEnd, tag, meta, out);
}

absl::Status AppendGoaway(const StatusMeta& meta, std::string* out) {
  return AppendStatus(FrameType::kGoaway, 0, meta, out);
}

absl::StatusOr<StatusMeta> ParseStatusMeta(FrameType type, std::string_view meta) {
  MetaReader r(type, meta);
  StatusMeta m;
  uint8_t code = 0;
  PS_RETURN_IF_ERROR(r.Int(&code, "status code"));
  m.code = static_cast<absl::StatusCode>(code);
  PS_RETURN_IF_ERROR(r.Str(1, kMaxRefusalNameBytes, &m.refusal_name, "refusal name"));
  PS_RETURN_IF_ERROR(r.Str(2, kMaxStatusMessageBytes, &m.message, "message"));
  PS_RETURN_IF_ERROR(r.Finish());
  PS_RETURN_IF_ERROR(CheckStatusMeta(type, m));
  return m;
}

absl::Status AppendPull(uint64_t tag, const PullMeta& meta, std::span<const uint32_t> slice_ids,
                        std::span<const uint64_t> held_versions, std::string* out) {
  if (meta.count != slice_ids.size()) {
    return FrameError(FrameType::kPull, absl::StrCat("count ", meta.count, " for ",
                                                     slice_ids.size(), " slice ids"));
  }
  if (held_versions.size() != (meta.held ? slice_ids.size() : 0)) {
    return FrameError(FrameType::kPull,
                      absl::StrCat(held_versions.size(), " held versions for ", slice_ids.size(),
                                   " slice ids with the held flag ", meta.held ? "set" : "clear"));
  }
  if (meta.held && meta.count == 0) {
    return FrameError(FrameType::kPull, "held flag on a pull of no slices");
  }
  const uint8_t flags = meta.held ? kPullHeld : 0;
  PS_RETURN_IF_ERROR(AppendFrame(FrameType::kPull, flags, tag,
                                 PullBodyBytes(slice_ids.size(), meta.held), out,
                                 [&](MetaWriter& w) {
                                   w.Int(meta.layout_hash, 8);
                                   w.Int(meta.min_version, 8);
                                   w.Int(meta.held_epoch, 8);
                                   w.Int(meta.count, 4);
                                 }));
  out->reserve(out->size() + PullBodyBytes(slice_ids.size(), meta.held));
  MetaWriter w(out);
  for (uint32_t id : slice_ids) w.Int(id, 4);
  for (uint64_t v : held_versions) w.Int(v, 8);
  return absl::OkStatus();
}

absl::StatusOr<PullMeta> ParsePullMeta(uint8_t flags, std::string_view meta) {
  MetaReader r(FrameType::kPull, meta);
  PullMeta m;
  PS_RETURN_IF_ERROR(r.Int(&m.layout_hash, "layout hash"));
  PS_RETURN_IF_ERROR(r.Int(&m.min_version, "min version"));
  PS_RETURN_IF_ERROR(r.Int(&m.held_epoch, "held epoch"));
  PS_RETURN_IF_ERROR(r.Int(&m.count, "count"));
  PS_RETURN_IF_ERROR(r.Finish());
  m.held = (flags & kPullHeld) != 0;
  if (m.held && m.count == 0) return r.Error("held flag on a pull of no slices");
  return m;
}

absl::Status CheckPullBody(const FrameHeader& header, const PullMeta& meta,
                           const FrameLimits& limits) {
  if (meta.count > limits.max_pull_slices) {
    return FrameError(FrameType::kPull,
                      absl::StrCat("count ", meta.count, " is over the ", limits.max_pull_slices,
                                   " slices a pull may name"));
  }
  const uint64_t need = PullBodyBytes(meta.count, meta.held);
  if (header.body_bytes != need) {
    return FrameError(FrameType::kPull,
                      absl::StrCat("body length ", header.body_bytes, ", where ", meta.count,
                                   " slice ids", meta.held ? " and held versions" : "", " need ",
                                   need, " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<PullBody> ParsePullBody(const PullMeta& meta, std::string_view body) {
  const uint64_t need = PullBodyBytes(meta.count, meta.held);
  if (body.size() != need) {
    return FrameError(FrameType::kPull,
                      absl::StrCat("body of ", body.size(), " bytes, where ", meta.count,
                                   " slice ids", meta.held ? " and held versions" : "", " need ",
                                   need, " bytes"));
  }
  // Sized by the body's length, checked above: no allocation beyond the input's size.
  PullBody out;
  out.slice_ids.resize(meta.count);
  for (size_t i = 0; i < meta.count; ++i) {
    out.slice_ids[i] = static_cast<uint32_t>(LoadLe(body.data() + 4 * i, 4));
  }
  if (meta.held) {
    const char* held = body.data() + 4 * size_t{meta.count};
    out.held_versions.resize(meta.count);
    for (size_t i = 0; i < meta.count; ++i) out.held_versions[i] = LoadLe(held + 8 * i, 8);
  }
  return out;
}

absl::Status AppendSlice(uint64_t tag, const SliceMeta& meta, size_t body_bytes,
                         std::string* out) {
  PS_RETURN_IF_ERROR(CheckCodec(FrameType::kSlice, meta.codec));
  const uint8_t flags = (meta.loss.has_value() ? kSliceLoss : 0) |
                        (meta.first_loss.has_value() ? kSliceFirstLoss : 0) |
                        (meta.queued ? kSliceQueued : 0);
  return AppendFrame(FrameType::kSlice, flags, tag, body_bytes, out, [&](MetaWriter& w) {
    w.Int(meta.slice_id, 4);
    w.Int(meta.version, 8);
    w.Int(meta.base_version, 8);
    w.Int(meta.epoch, 8);
    if (meta.loss.has_value()) w.F32(*meta.loss);
    if (meta.first_loss.has_value()) w.F32(*meta.first_loss);
    w.Str(meta.codec, 1);
  });
}

absl::StatusOr<SliceMeta> ParseSliceMeta(uint8_t flags, std::string_view meta) {
  MetaReader r(FrameType::kSlice, meta);
  SliceMeta m;
  PS_RETURN_IF_ERROR(r.Int(&m.slice_id, "slice id"));
  PS_RETURN_IF_ERROR(r.Int(&m.version, "version"));
  PS_RETURN_IF_ERROR(r.Int(&m.base_version, "base version"));
  PS_RETURN_IF_ERROR(r.Int(&m.epoch, "epoch"));
  if ((flags & kSliceLoss) != 0) PS_RETURN_IF_ERROR(r.F32(&m.loss, "loss"));
  if ((flags & kSliceFirstLoss) != 0) PS_RETURN_IF_ERROR(r.F32(&m.first_loss, "first loss"));
  PS_RETURN_IF_ERROR(r.Str(1, kMaxFrameCodecBytes, &m.codec, "codec"));
  PS_RETURN_IF_ERROR(r.Finish());
  m.queued = (flags & kSliceQueued) != 0;
  return m;
}

absl::Status AppendCancel(uint64_t tag, std::string* out) {
  return AppendFrame(FrameType::kCancel, 0, tag, 0, out, [](MetaWriter&) {});
}

}  // namespace ps::net
