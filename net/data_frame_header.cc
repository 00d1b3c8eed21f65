// The header of a data frame (net/data_frame.h): the types, the flag bits, meta lengths,
// bodies and tags each allows (the one check of EncodeHeader, ParseHeader and every
// encoder), the frames each connection state takes, and CheckHeader, the receiver's check
// of a parsed header against its state and limits. Every meta's bound is held to
// kMaxMetaBytes here.
#include "net/data_frame.h"

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "net/data_frame_internal.h"
#include "net/little_endian_internal.h"

namespace ps::net {
namespace internal {
namespace {

using core::AsAbsl;

// Meta sizes, from the field lists in data_frame.h. A variable meta's "fixed" part
// includes its strings' length fields.
// A HELLO's magic and version (its 52 bytes are this version's): the header lets any
// HELLO this long through, so that a worker of another version learns which one this
// shard speaks rather than "bad length".
constexpr size_t kHelloPrefixBytes = 4 + 4;
constexpr size_t kChallengeMetaBytes = 4 + crypto::kNonceBytes + crypto::kProofBytes;
constexpr size_t kProofMetaBytes = crypto::kProofBytes;
constexpr size_t kAdmitMetaBytes = 4 * 4;
constexpr size_t kPushFixedBytes = 8 + 8 + 4 + 1;
constexpr size_t kPushesFixedBytes = 8 + 8 + 1 + 1;
constexpr size_t kPushesEntryBytes = 8 + 4 + 4;
constexpr size_t kStatusFixedBytes = 1 + 1 + 2;
constexpr size_t kPullMetaBytes = 8 + 8 + 8 + 4;
constexpr size_t kSliceFixedBytes = 4 + 8 + 8 + 8 + 1;
constexpr size_t kSlicesFixedBytes = 1 + 1;
constexpr size_t kSlicesEntryBytes = 4 + 8 + 8 + 8 + 1 + 4;  // without its losses
constexpr size_t kLossBytes = 4;

static_assert(kFrameHeaderBytes == 1 + 1 + 2 + 4 + 8);
static_assert(kMaxMetaBytes <= std::numeric_limits<uint16_t>::max(), "M is two bytes");
static_assert(kMaxFrameCodecBytes <= 0xff && kMaxRefusalNameBytes <= 0xff,
              "codec and refusal name have a one-byte length");
static_assert(kMaxStatusMessageBytes <= 0xffff, "a message has a two-byte length");
static_assert(kChallengeMetaBytes <= kMaxMetaBytes &&
              kPushFixedBytes + kLossBytes + kMaxFrameCodecBytes <= kMaxMetaBytes &&
              kPushesFixedBytes + kMaxFrameCodecBytes +
                      kMaxPushesPerFrame * (kPushesEntryBytes + 2 * kLossBytes) <=
                  kMaxMetaBytes &&
              kStatusFixedBytes + kMaxRefusalNameBytes + kMaxStatusMessageBytes <= kMaxMetaBytes &&
              kSliceFixedBytes + 2 * kLossBytes + kMaxFrameCodecBytes <= kMaxMetaBytes &&
              kSlicesFixedBytes + kMaxFrameCodecBytes +
                      kMaxSlicesPerFrame * (kSlicesEntryBytes + 2 * kLossBytes) <=
                  kMaxMetaBytes,
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
    case FrameType::kPushes:
      return TypeInfo{.flags = kPushLoss | kPushLr, .body = true};
    case FrameType::kPull:
      return TypeInfo{.flags = kPullHeld, .body = true};
    case FrameType::kSlice:
      return TypeInfo{.flags = kSliceLoss | kSliceFirstLoss | kSliceQueued, .body = true};
    case FrameType::kSlices:
      return TypeInfo{.body = true};
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
      const size_t fixed = kPushFixedBytes + ((flags & kPushLoss) != 0 ? kLossBytes : 0) +
                           ((flags & kPushLr) != 0 ? kLossBytes : 0);
      return {fixed, fixed + kMaxFrameCodecBytes};
    }
    case FrameType::kPushes: {
      const size_t entry = kPushesEntryBytes + ((flags & kPushLoss) != 0 ? kLossBytes : 0) +
                           ((flags & kPushLr) != 0 ? kLossBytes : 0);
      return {kPushesFixedBytes + 2 * entry,
              kPushesFixedBytes + kMaxFrameCodecBytes + kMaxPushesPerFrame * entry};
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
    case FrameType::kSlices:
      return {kSlicesFixedBytes + 2 * kSlicesEntryBytes,
              kSlicesFixedBytes + kMaxFrameCodecBytes +
                  kMaxSlicesPerFrame * (kSlicesEntryBytes + 2 * kLossBytes)};
    case FrameType::kCancel:
      return {0, 0};
  }
  return {0, 0};
}

std::string_view StateText(ConnectionState state) {
  switch (state) {
    case ConnectionState::kShardAwaitsHello:
      return "the shard awaits HELLO";
    case ConnectionState::kShardAwaitsProof:
      return "the shard awaits PROOF";
    case ConnectionState::kShardAdmitted:
      return "the shard admitted the connection (PUSH, PUSHES, PULL, CANCEL, GOAWAY)";
    case ConnectionState::kWorkerAwaitsChallenge:
      return "the worker awaits CHALLENGE";
    case ConnectionState::kWorkerAwaitsAdmit:
      return "the worker awaits ADMIT";
    case ConnectionState::kWorkerAdmitted:
      return "the worker was admitted (ANSWER, SLICE, SLICES, PULL_END, GOAWAY)";
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
      return type == FrameType::kPush || type == FrameType::kPushes || type == FrameType::kPull ||
             type == FrameType::kCancel || type == FrameType::kGoaway;
    case ConnectionState::kWorkerAwaitsChallenge:
      return type == FrameType::kChallenge || type == FrameType::kGoaway;
    case ConnectionState::kWorkerAwaitsAdmit:
      return type == FrameType::kAdmit || type == FrameType::kGoaway;
    case ConnectionState::kWorkerAdmitted:
      return type == FrameType::kAnswer || type == FrameType::kSlice ||
             type == FrameType::kSlices || type == FrameType::kPullEnd || type == FrameType::kGoaway;
  }
  return false;
}

}  // namespace

std::string Hex8(uint8_t v) { return absl::StrCat("0x", absl::Hex(v, absl::kZeroPad2)); }

std::string TypeText(FrameType type) {
  if (InfoOf(type).has_value()) return std::string(FrameTypeName(type));
  return absl::StrCat("type ", Hex8(static_cast<uint8_t>(type)));
}

absl::Status FrameError(FrameType type, std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("data frame ", TypeText(type), ": ", AsAbsl(what)));
}

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

}  // namespace internal

namespace {

using core::AsAbsl;
using internal::Allowed;
using internal::FrameError;
using internal::LoadLe;
using internal::PullBodyBytes;
using internal::StateText;
using internal::StoreHeader;
using internal::TypeText;
using internal::ValidateHeader;

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
    case FrameType::kPushes:
      return "PUSHES";
    case FrameType::kPull:
      return "PULL";
    case FrameType::kSlice:
      return "SLICE";
    case FrameType::kPullEnd:
      return "PULL_END";
    case FrameType::kCancel:
      return "CANCEL";
    case FrameType::kSlices:
      return "SLICES";
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

}  // namespace ps::net
