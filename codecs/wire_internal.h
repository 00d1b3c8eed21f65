// Byte- and bit-level reading and writing for codec payloads. Writers append to a
// std::string; readers are bounds-checked cursors over untrusted bytes that return an
// INVALID_ARGUMENT status naming the codec and what was missing instead of reading
// past the end. All multi-byte values are little-endian; bits are packed LSB first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "codecs/codec.h"

namespace ps::codecs::internal {

// ---- writing ----

inline void PutU8(std::string* out, uint8_t v) { out->push_back(static_cast<char>(v)); }
void PutU16(std::string* out, uint16_t v);
void PutU32(std::string* out, uint32_t v);
void PutU64(std::string* out, uint64_t v);
void PutF32(std::string* out, float v);
// LEB128: 7 bits per byte, low groups first, high bit set on every byte but the last.
void PutVarint(std::string* out, uint64_t v);
inline size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

// Appends bits LSB first into bytes appended to *out; Finish() pads the last byte
// with zero bits. The string must not be touched by others between Put and Finish.
class BitWriter {
 public:
  explicit BitWriter(std::string* out) : out_(out) {}
  // Appends the low `count` bits of `bits` (count <= 57).
  void Put(uint64_t bits, int count) {
    acc_ |= (count == 64 ? bits : (bits & ((uint64_t{1} << count) - 1))) << filled_;
    filled_ += count;
    while (filled_ >= 8) {
      out_->push_back(static_cast<char>(acc_ & 0xff));
      acc_ >>= 8;
      filled_ -= 8;
    }
  }
  // Elias gamma code of v >= 1: floor(log2 v) zero bits, then v's bits from the top.
  // Written LSB-first order as a bit stream, so the reader sees the zeros first.
  void PutEliasGamma(uint64_t v);
  void Finish() {
    if (filled_ > 0) out_->push_back(static_cast<char>(acc_ & 0xff));
    acc_ = 0;
    filled_ = 0;
  }

 private:
  std::string* out_;
  uint64_t acc_ = 0;
  int filled_ = 0;
};

// ---- reading ----

// A cursor over a payload. Every getter fails (and stays failed) rather than read
// past the end; errors read "<codec>: payload ends inside <what> at byte <offset>".
class WireReader {
 public:
  WireReader(std::string_view codec, std::string_view bytes) : codec_(codec), bytes_(bytes) {}

  absl::Status U8(uint8_t* v, std::string_view what);
  absl::Status U16(uint16_t* v, std::string_view what);
  absl::Status U32(uint32_t* v, std::string_view what);
  absl::Status U64(uint64_t* v, std::string_view what);
  // Any bit pattern is returned; the caller decides about non-finite values.
  absl::Status F32(float* v, std::string_view what);
  // Refuses encodings longer than 10 bytes, overflow beyond 64 bits, and
  // non-minimal encodings (a trailing 0x00 group), so every value has one encoding.
  absl::Status Varint(uint64_t* v, std::string_view what);
  // The next `n` bytes as a view into the payload.
  absl::Status Bytes(size_t n, std::string_view* v, std::string_view what);
  // The value count (varint "numel") every self-describing payload carries after its
  // format byte: refuses a count other than the slice's, "payload is for 9 values, the
  // slice has 10".
  absl::Status Numel(size_t expected);
  // The format byte (codecs/codec.h, PayloadFormat): refuses anything but `expected`,
  // naming the format the payload is in.
  absl::Status Format(PayloadFormat expected);
  // OK when every byte was consumed, else "<codec>: N trailing bytes after <what>".
  absl::Status Finish(std::string_view what) const;

  size_t offset() const { return pos_; }
  size_t remaining() const { return bytes_.size() - pos_; }
  std::string_view codec() const { return codec_; }
  // INVALID_ARGUMENT "<codec>: <message>".
  absl::Status Error(std::string_view message) const;

 private:
  absl::Status Short(std::string_view what, size_t need) const;

  std::string_view codec_;
  std::string_view bytes_;
  size_t pos_ = 0;
};

// Reads `count` fp32 scales (one per bucket of a quantizing codec) as a view: each
// finite, not negative (-0 included) and at most max_scale, so that decoded values
// stay finite. "<codec>: <what> 3 is negative (-1)".
absl::Status ReadScales(WireReader* r, size_t count, float max_scale, std::string_view what,
                        std::string_view* scales);
// Scale i of a view from ReadScales.
inline float ScaleAt(std::string_view scales, size_t i) {
  float v;
  std::memcpy(&v, scales.data() + 4 * i, sizeof(v));  // little-endian host
  return v;
}

// Reads bits LSB first from a byte range; reading past the end yields an error (the
// caller checks ok() after a batch of reads: reads past the end return 0 bits).
class BitReader {
 public:
  explicit BitReader(std::string_view bytes) : bytes_(bytes) {}
  // The next `count` bits (count <= 57).
  uint64_t Get(int count) {
    while (filled_ < count) {
      uint64_t byte = 0;
      if (pos_ < bytes_.size()) {
        byte = static_cast<unsigned char>(bytes_[pos_]);
      } else {
        overrun_ = true;
      }
      ++pos_;
      acc_ |= byte << filled_;
      filled_ += 8;
    }
    const uint64_t v = acc_ & ((uint64_t{1} << count) - 1);
    acc_ >>= count;
    filled_ -= count;
    return v;
  }
  // Elias gamma; returns 0 (never a valid value) on an overrun or a prefix longer
  // than `max_bits` zero bits.
  uint64_t GetEliasGamma(int max_bits = 63);
  bool ok() const { return !overrun_; }
  // Bits consumed so far, and whether the unread bits of the last byte are zero.
  size_t bits_read() const { return pos_ * 8 - static_cast<size_t>(filled_); }
  bool PaddingIsZero() const { return acc_ == 0; }
  size_t bytes_touched() const { return pos_; }

 private:
  std::string_view bytes_;
  size_t pos_ = 0;
  uint64_t acc_ = 0;
  int filled_ = 0;
  bool overrun_ = false;
};

}  // namespace ps::codecs::internal
