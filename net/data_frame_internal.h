// What the parts of the data frame format (net/data_frame.h) share: the types' flag bits,
// the refusal text, the header check and store that every encoder ends with, and the
// writer and reader of meta fields. The header and the receiver's checks are in
// data_frame_header.cc, the connection's handshake frames in data_frame_handshake.cc, the
// push's and pull's frames in data_frame.cc. Internal to net/.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "net/data_frame.h"
#include "net/little_endian_internal.h"

namespace ps::net::internal {

// Flag bits, per type.
inline constexpr uint8_t kPushLoss = 0x01;
inline constexpr uint8_t kPushLr = 0x02;
inline constexpr uint8_t kPullHeld = 0x01;
inline constexpr uint8_t kSliceLoss = 0x01;
inline constexpr uint8_t kSliceFirstLoss = 0x02;
inline constexpr uint8_t kSliceQueued = 0x04;

// "0x07".
std::string Hex8(uint8_t v);
// "PUSH", or "type 0x07" for a value FrameType does not name.
std::string TypeText(FrameType type);
// INVALID_ARGUMENT "data frame PUSH: <what>".
absl::Status FrameError(FrameType type, std::string_view what);

// The checks EncodeHeader and ParseHeader share, with the same messages.
absl::Status ValidateHeader(const FrameHeader& h);
// The 16 bytes of `h` at p.
void StoreHeader(const FrameHeader& h, char* p);

// A PULL's body: count slice ids (u32), then, when held, count held versions (u64).
inline uint64_t PullBodyBytes(uint64_t count, bool held) { return count * (held ? 4 + 8 : 4); }

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
      return Error(
          absl::StrCat(core::AsAbsl(what), " of ", len, " bytes is over the limit of ", max));
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
        absl::StrCat("data frame ", TypeText(type_), " meta: ", core::AsAbsl(message)));
  }

 private:
  absl::Status Need(size_t n, std::string_view what) const {
    if (bytes_.size() - pos_ >= n) return absl::OkStatus();
    return Error(absl::StrCat("ends inside ", core::AsAbsl(what), " at byte ", pos_, " (needs ",
                              n, ", has ", bytes_.size() - pos_, ")"));
  }

  FrameType type_;
  std::string_view bytes_;
  size_t pos_ = 0;
};

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

}  // namespace ps::net::internal
