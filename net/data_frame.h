// The frames of the TCP data plane (docs/data-plane.md, "3. The TCP data plane"): one
// connection per (worker, shard) carries the handshake, then pushes, pulls and their
// answers, each as a frame. This file is the format alone, without sockets: what the
// connection code on either side writes, and its checks of what it reads.
//
// A frame is a 16-byte header, M bytes of meta and B bytes of body. Header, all integers
// little-endian like the UDP datagram's (net/udp_frame.h):
//
//   off size field
//   0   1   type (FrameType)
//   1   1   flags, per type (below); bits a type does not define must be 0
//   2   2   M, the meta's length: the type's fixed size, or within the bounds its
//           fields and flags allow; never above kMaxMetaBytes
//   4   4   B, the body's length: 0 but for PUSH, PULL and SLICE
//   8   8   tag: the push's or pull's id, chosen by the worker, never 0; 0 on the
//           connection frames (HELLO, CHALLENGE, PROOF, ADMIT, GOAWAY)
//
// Metas, in field order (u8/u16/u32/u64 little-endian integers, f32 IEEE-754 bits as a
// u32; str8/str16: a u8/u16 length, then that many bytes):
//
//   HELLO     0x01 worker -> shard: magic "PSD1", u32 version (kDataPlaneVersion), u64 data
//                  session id, u32 worker id, 32-byte client nonce C (52; the header
//                  allows 8 to kMaxMetaBytes, so that a HELLO of another version is read
//                  as far as its version and refused naming it)
//   CHALLENGE 0x02 shard -> worker: u32 shard index N, 32-byte server nonce S, 32-byte
//                  crypto::DataServerProof                                           (68)
//   PROOF     0x03 worker -> shard: 32-byte crypto::DataClientProof                  (32)
//   ADMIT     0x04 shard -> worker: u32 largest body, u32 unanswered pushes, u32 slices
//                  per pull, u32 idle timeout (ms)                                 (16)
//   PUSH      0x10 worker -> shard: u64 layout hash, u64 round, u32 slice id, [f32 loss,
//                  flag 0x01], [f32 learning rate, flag 0x02], str8 codec (at most
//                  kMaxFrameCodecBytes). Body: the codec's payload.
//   PUSHES    0x12 worker -> shard: several pushes of one round under one codec, their
//                  bodies back to back: u64 layout hash, u64 round, str8 codec, u8 count
//                  (2 to kMaxPushesPerFrame), then per push u64 tag (the first is the
//                  header's; none 0), u32 slice id, u32 body length, [f32 loss, flag
//                  0x01], [f32 learning rate, flag 0x02]; the body lengths add up to B.
//                  Each push is answered by an ANSWER of its own tag, as a PUSH is.
//   ANSWER    0x11 shard -> worker: u8 status code (0-16, absl::StatusCode), str8
//                  refusal name ([a-z0-9_], at most kMaxRefusalNameBytes; empty: none),
//                  str16 message (UTF-8, at most kMaxStatusMessageBytes)
//   PULL      0x20 worker -> shard: u64 layout hash, u64 min version, u64 held epoch,
//                  u32 count; flag 0x01: held versions follow. Body: count u32 slice ids,
//                  then, with the flag, count u64 held versions              (28)
//   SLICE     0x21 shard -> worker: u32 slice id, u64 version, u64 base version, u64
//                  epoch, [f32 loss, flag 0x01], [f32 first loss, flag 0x02], str8 codec
//                  (empty: dense values); flag 0x04: queued. Body: the values.
//   SLICES    0x24 shard -> worker: several slices of one pull under one codec, their
//                  bodies back to back: str8 codec, u8 count (2 to kMaxSlicesPerFrame),
//                  then per slice u32 slice id, u64 version, u64 base version, u64 epoch,
//                  u8 flags (SLICE's: 0x01 loss, 0x02 first loss, 0x04 queued), [f32
//                  loss], [f32 first loss], u32 body length; the body lengths add up to B.
//                  The header's tag is the pull's, as a SLICE's; it defines no flags.
//   PULL_END  0x22 shard -> worker: as ANSWER
//   CANCEL    0x23 worker -> shard: nothing                                        (0)
//   GOAWAY    0x30 either way: as ANSWER; the sender then closes
//
// A frame has one encoding: every parser refuses what its encoder would not write (unknown
// flag bits, trailing or missing bytes, a held-versions flag on a pull of no slices), so
// re-encoding what parsed gives back the input (the data_frame fuzz target checks this).
// Refusals are INVALID_ARGUMENT (a body over the limit: RESOURCE_EXHAUSTED, CheckHeader)
// with a message naming the frame, the field and the bound;
// they quote numbers and type names, never the peer's bytes. Every check reads at most the
// bytes it is given, once.
//
// What a receiver checks, in order: ParseHeader (the header alone is a valid frame
// header), CheckHeader (the connection's state allows the type, B within its limits: a
// header claiming 2^32 - 1 bytes is refused after its 16 bytes), then the meta's parser,
// and for a PULL, CheckPullBody before reading the body and ParsePullBody after.
//
// Ownership: parsed metas' string views borrow the meta bytes they were parsed from.
// Thread safety: the functions are pure.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "crypto/auth_proof.h"
#include "net/slice_fields.h"

namespace ps::net {

inline constexpr uint32_t kDataPlaneVersion = 3;  // 2: PUSHES; 3: SLICES
inline constexpr size_t kFrameHeaderBytes = 16;
// No meta is longer (a static_assert in data_frame_header.cc holds every type's bound to
// it), so a receiver can read any meta into a fixed buffer.
inline constexpr size_t kMaxMetaBytes = 1024;
// A codec spec's bound in a frame: all its one-byte length allows. The shard's codec
// lookup refuses specs over DecoderCache::kMaxSpecBytes (128) as unknown_codec, as it does
// on the gRPC path, so a long codec costs its push, not the connection.
inline constexpr size_t kMaxFrameCodecBytes = 255;
inline constexpr size_t kMaxRefusalNameBytes = 64;
inline constexpr size_t kMaxStatusMessageBytes = 512;

enum class FrameType : uint8_t {
  kHello = 0x01,
  kChallenge = 0x02,
  kProof = 0x03,
  kAdmit = 0x04,
  kPush = 0x10,
  kAnswer = 0x11,
  kPushes = 0x12,
  kPull = 0x20,
  kSlice = 0x21,
  kPullEnd = 0x22,
  kCancel = 0x23,
  kSlices = 0x24,
  kGoaway = 0x30,
};

// "HELLO", "PULL_END", ...; "unknown" for a value not in FrameType.
std::string_view FrameTypeName(FrameType type);

struct FrameHeader {
  FrameType type = FrameType::kCancel;
  uint8_t flags = 0;
  uint16_t meta_bytes = 0;
  uint32_t body_bytes = 0;
  uint64_t tag = 0;
  bool operator==(const FrameHeader&) const = default;
};

// Appends the 16 bytes of `header` to *out. INVALID_ARGUMENT, *out unchanged, for a header
// ParseHeader would refuse.
absl::Status EncodeHeader(const FrameHeader& header, std::string* out);
// The header in `bytes`, or INVALID_ARGUMENT for: an unknown type, flag bits the type does
// not define, M outside what the type's meta can be with these flags, B != 0 on a type
// without a body, a tag of 0 on a push's or pull's frame or not 0 on a connection frame.
absl::StatusOr<FrameHeader> ParseHeader(std::span<const char, kFrameHeaderBytes> bytes);

// Where a connection is, for the frames it may receive next (docs/data-plane.md,
// "Binding a connection to a session"): the shard takes one HELLO, one PROOF, then
// PUSH, PULL, CANCEL and GOAWAY; the worker takes a CHALLENGE, an ADMIT, then ANSWER,
// SLICE, SLICES, PULL_END; GOAWAY reaches the worker at any point (unknown_session after a
// HELLO, unauthenticated after a PROOF).
enum class ConnectionState : uint8_t {
  kShardAwaitsHello,
  kShardAwaitsProof,
  kShardAdmitted,
  kWorkerAwaitsChallenge,
  kWorkerAwaitsAdmit,
  kWorkerAdmitted,
};

// What a receiver accepts in bodies.
struct FrameLimits {
  // The largest body (the shard: --max-message-bytes, told at ADMIT).
  uint64_t max_body_bytes = 0;
  // The most slices one PULL may name (the shard: Shard::MaxPullSlices()).
  uint64_t max_pull_slices = 0;
};

// From a parsed header alone, before reading or allocating more: INVALID_ARGUMENT when
// `state` does not allow the type or a PULL's B is more than limits.max_pull_slices slices
// can need; RESOURCE_EXHAUSTED when B is above limits.max_body_bytes (a claim within the
// format but over the receiver's bound, as gRPC refuses a message over its limit).
absl::Status CheckHeader(const FrameHeader& header, ConnectionState state,
                         const FrameLimits& limits);

// ---- metas ----
// Each Append* writes a frame's header and meta at the end of *out (the body, if any, is
// the caller's to send after them); INVALID_ARGUMENT and *out unchanged when a field is
// out of bounds or the frame would be refused by ParseHeader (a tag of 0 for a push).
// Each Parse*Meta takes exactly the M meta bytes and, where the meta depends on them,
// the header's flags.

using DataNonce = std::array<char, crypto::kNonceBytes>;
using DataProof = std::array<char, crypto::kProofBytes>;

struct HelloMeta {
  uint64_t data_session = 0;
  uint32_t worker_id = 0;
  DataNonce client_nonce{};
  bool operator==(const HelloMeta&) const = default;
};
absl::Status AppendHello(const HelloMeta& meta, std::string* out);
// Also refuses another magic, and another version (naming it and ours).
absl::StatusOr<HelloMeta> ParseHelloMeta(std::string_view meta);

struct ChallengeMeta {
  uint32_t shard_index = 0;
  DataNonce server_nonce{};
  DataProof proof{};
  bool operator==(const ChallengeMeta&) const = default;
};
absl::Status AppendChallenge(const ChallengeMeta& meta, std::string* out);
absl::StatusOr<ChallengeMeta> ParseChallengeMeta(std::string_view meta);

struct ProofMeta {
  DataProof proof{};
  bool operator==(const ProofMeta&) const = default;
};
absl::Status AppendProof(const ProofMeta& meta, std::string* out);
absl::StatusOr<ProofMeta> ParseProofMeta(std::string_view meta);

struct AdmitMeta {
  uint32_t max_body_bytes = 0;
  uint32_t max_unanswered_pushes = 0;
  uint32_t max_pull_slices = 0;
  uint32_t idle_timeout_ms = 0;
  bool operator==(const AdmitMeta&) const = default;
};
absl::Status AppendAdmit(const AdmitMeta& meta, std::string* out);
absl::StatusOr<AdmitMeta> ParseAdmitMeta(std::string_view meta);

// What a PUSH or SLICE (`type`) refuses of a payload's codec and length, checked where
// the payload is queued when its frame's header is made later (the sender's write
// merges frames): a codec over kMaxFrameCodecBytes, a body over 2^32 - 1 bytes.
absl::Status CheckPayload(FrameType type, std::string_view codec, uint64_t body_bytes);

struct PushMeta {
  uint64_t layout_hash = 0;
  uint64_t round = 0;
  uint32_t slice_id = 0;
  std::optional<float> loss;
  // Any bytes: the shard's codec lookup refuses what it cannot make (unknown_codec), as
  // on the gRPC path, so that a bad codec costs the push, not the connection.
  std::string_view codec;
  std::optional<float> lr;  // the learning rate the worker asks the round's step to take
};
// `body_bytes`: the payload's length (at most 2^32 - 1).
absl::Status AppendPush(uint64_t tag, const PushMeta& meta, size_t body_bytes, std::string* out);
absl::StatusOr<PushMeta> ParsePushMeta(uint8_t flags, std::string_view meta);

// PUSHES: the pushes one frame carries at most. Its meta is then 18 bytes, the codec and
// 24 bytes per push: 657 at most, within kMaxMetaBytes.
inline constexpr size_t kMaxPushesPerFrame = 16;
struct PushesEntry {
  uint64_t tag = 0;
  uint32_t slice_id = 0;
  uint32_t body_bytes = 0;
  std::optional<float> loss;
  std::optional<float> lr;
  bool operator==(const PushesEntry&) const = default;
};
struct PushesMeta {
  uint64_t layout_hash = 0;
  uint64_t round = 0;
  std::string_view codec;
  uint32_t count = 0;  // entries in use
  std::array<PushesEntry, kMaxPushesPerFrame> entries{};
  // Push i as a PUSH would carry it.
  PushMeta push(size_t i) const {
    const PushesEntry& e = entries[i];
    return PushMeta{.layout_hash = layout_hash, .round = round, .slice_id = e.slice_id,
                    .loss = e.loss, .codec = codec, .lr = e.lr};
  }
};
// A PUSHES's header and meta; its tag is the first push's. INVALID_ARGUMENT for a count
// outside [2, kMaxPushesPerFrame], a tag of 0, pushes that differ in carrying a loss or a
// learning rate, or bodies that add up to more than 2^32 - 1 bytes.
absl::Status AppendPushes(const PushesMeta& meta, std::string* out);
// Also refuses a first tag other than the header's and body lengths whose sum is not B.
absl::StatusOr<PushesMeta> ParsePushesMeta(const FrameHeader& header, std::string_view meta);

// ANSWER, PULL_END and GOAWAY: a status as the shard decided it (docs/data-plane.md,
// "Refusals on the wire"). The receiver rebuilds the refusal from the name
// (core::ParseRefusal); a name it does not know keeps code and message without a kind.
struct StatusMeta {
  absl::StatusCode code = absl::StatusCode::kOk;
  std::string_view refusal_name;  // empty: no refusal kind
  std::string_view message;
};
absl::Status AppendAnswer(uint64_t tag, const StatusMeta& meta, std::string* out);
absl::Status AppendPullEnd(uint64_t tag, const StatusMeta& meta, std::string* out);
absl::Status AppendGoaway(const StatusMeta& meta, std::string* out);
// `type`: the header's (ANSWER, PULL_END or GOAWAY), named in refusals.
absl::StatusOr<StatusMeta> ParseStatusMeta(FrameType type, std::string_view meta);

struct PullMeta {
  uint64_t layout_hash = 0;
  uint64_t min_version = 0;
  uint64_t held_epoch = 0;
  uint32_t count = 0;     // slice ids in the body
  bool held = false;      // held versions follow them
  bool operator==(const PullMeta&) const = default;
};
// A whole PULL: header, meta and body. meta.count and meta.held must describe the lists
// (INVALID_ARGUMENT otherwise): held_versions is empty (nothing held, held false) or one
// per slice id; a pull of no slices holds nothing.
absl::Status AppendPull(uint64_t tag, const PullMeta& meta, std::span<const uint32_t> slice_ids,
                        std::span<const uint64_t> held_versions, std::string* out);
// Refuses also the held flag with a count of 0 (which AppendPull does not write).
absl::StatusOr<PullMeta> ParsePullMeta(uint8_t flags, std::string_view meta);
// Before the body is read: INVALID_ARGUMENT unless meta.count is at most
// limits.max_pull_slices and B is exactly what the count needs.
absl::Status CheckPullBody(const FrameHeader& header, const PullMeta& meta,
                           const FrameLimits& limits);
struct PullBody {
  std::vector<uint32_t> slice_ids;
  std::vector<uint64_t> held_versions;  // empty, or one per slice id
};
// The B body bytes of a PULL with `meta`: INVALID_ARGUMENT when their length is not what
// the count needs (CheckPullBody refused such a header already).
absl::StatusOr<PullBody> ParsePullBody(const PullMeta& meta, std::string_view body);

// SLICE: a slice alone; its meta is the header a pull sink takes (net/slice_fields.h).
absl::Status AppendSlice(uint64_t tag, const PullHeader& meta, size_t body_bytes,
                         std::string* out);
absl::StatusOr<PullHeader> ParseSliceMeta(uint8_t flags, std::string_view meta);

// SLICES: the slices one frame carries at most (the shard's pace hands a pull's slices
// over 2 to 8 at a time). Its meta is then the codec, 2 bytes and 41 bytes per slice at
// most: 585, within kMaxMetaBytes.
inline constexpr size_t kMaxSlicesPerFrame = 8;
// The shard merges slices into a SLICES within this many body bytes (and the ADMIT's
// largest body); a worker reads bodies at least this long.
inline constexpr size_t kMaxSlicesBodyBytes = 16u << 20;
struct SlicesEntry : SliceFields {
  uint32_t body_bytes = 0;
  bool operator==(const SlicesEntry&) const = default;
};
struct SlicesMeta {
  std::string_view codec;  // empty: dense fp32 values; else the changes' codec
  uint32_t count = 0;      // entries in use
  std::array<SlicesEntry, kMaxSlicesPerFrame> entries{};
  // Slice i as a SLICE would carry it.
  PullHeader slice(size_t i) const { return PullHeader{entries[i], codec}; }
};
// A SLICES's header (tag: the pull's) and meta. INVALID_ARGUMENT for a count outside
// [2, kMaxSlicesPerFrame], a tag of 0, a codec over its bound, or bodies that add up to
// more than 2^32 - 1 bytes.
absl::Status AppendSlices(uint64_t tag, const SlicesMeta& meta, std::string* out);
// Also refuses body lengths whose sum is not B.
absl::StatusOr<SlicesMeta> ParseSlicesMeta(const FrameHeader& header, std::string_view meta);

// CANCEL has no meta: the header (its tag names the pull) is the whole frame.
absl::Status AppendCancel(uint64_t tag, std::string* out);

}  // namespace ps::net
