#include <bit>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "codecs/codec_internal.h"
#include "codecs/wire_internal.h"

namespace ps::codecs::internal {

void PutU16(std::string* out, uint16_t v) {
  for (int i = 0; i < 2; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutF32(std::string* out, float v) { PutU32(out, std::bit_cast<uint32_t>(v)); }

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void BitWriter::PutEliasGamma(uint64_t v) {
  const int n = 63 - std::countl_zero(v);  // floor(log2 v); v >= 1
  Put(0, n);
  // v's n + 1 bits from the most significant (a 1) down.
  for (int i = n; i >= 0; --i) Put((v >> i) & 1, 1);
}

uint64_t BitReader::GetEliasGamma(int max_bits) {
  int zeros = 0;
  while (Get(1) == 0) {
    if (!ok() || ++zeros > max_bits) return 0;
  }
  uint64_t v = 1;
  for (int i = 0; i < zeros; ++i) v = (v << 1) | Get(1);
  return ok() ? v : 0;
}

absl::Status WireReader::Error(std::string_view message) const {
  return absl::InvalidArgumentError(absl::StrCat(AbslView(codec_), ": ", AbslView(message)));
}

absl::Status WireReader::Short(std::string_view what, size_t need) const {
  return absl::InvalidArgumentError(absl::StrCat(AbslView(codec_), ": payload ends inside ",
                                                 AbslView(what), " at byte ", pos_, " (needs ",
                                                 need, ", has ", remaining(), ")"));
}

absl::Status WireReader::U8(uint8_t* v, std::string_view what) {
  if (remaining() < 1) return Short(what, 1);
  *v = static_cast<uint8_t>(bytes_[pos_++]);
  return absl::OkStatus();
}

#define PS_WIRE_READ_LE(Name, Type)                                           \
  absl::Status WireReader::Name(Type* v, std::string_view what) {             \
    if (remaining() < sizeof(Type)) return Short(what, sizeof(Type));         \
    Type x = 0;                                                               \
    for (size_t i = 0; i < sizeof(Type); ++i) {                               \
      x |= static_cast<Type>(static_cast<unsigned char>(bytes_[pos_ + i])) << (8 * i); \
    }                                                                         \
    pos_ += sizeof(Type);                                                     \
    *v = x;                                                                   \
    return absl::OkStatus();                                                  \
  }
PS_WIRE_READ_LE(U16, uint16_t)
PS_WIRE_READ_LE(U32, uint32_t)
PS_WIRE_READ_LE(U64, uint64_t)
#undef PS_WIRE_READ_LE

absl::Status WireReader::F32(float* v, std::string_view what) {
  uint32_t bits = 0;
  if (absl::Status s = U32(&bits, what); !s.ok()) return s;
  *v = std::bit_cast<float>(bits);
  return absl::OkStatus();
}

absl::Status WireReader::Varint(uint64_t* v, std::string_view what) {
  uint64_t x = 0;
  for (int i = 0; i < 10; ++i) {
    if (remaining() < 1) return Short(what, 1);
    const auto byte = static_cast<unsigned char>(bytes_[pos_++]);
    if (i == 9 && byte > 1) return Error(absl::StrCat("varint ", AbslView(what), " overflows 64 bits"));
    x |= static_cast<uint64_t>(byte & 0x7f) << (7 * i);
    if ((byte & 0x80) == 0) {
      if (byte == 0 && i > 0) {
        return Error(absl::StrCat("varint ", AbslView(what), " is not minimally encoded"));
      }
      *v = x;
      return absl::OkStatus();
    }
  }
  return Error(absl::StrCat("varint ", AbslView(what), " is longer than 10 bytes"));
}

absl::Status WireReader::Bytes(size_t n, std::string_view* v, std::string_view what) {
  if (remaining() < n) return Short(what, n);
  *v = bytes_.substr(pos_, n);
  pos_ += n;
  return absl::OkStatus();
}

absl::Status WireReader::Format(PayloadFormat expected) {
  if (bytes_.empty()) return Error("empty payload");
  uint8_t byte = 0;
  if (absl::Status s = U8(&byte, "the format byte"); !s.ok()) return s;
  return CheckFormat(codec_, byte, expected);
}

absl::Status WireReader::Numel(size_t expected) {
  uint64_t numel = 0;
  if (absl::Status s = Varint(&numel, "numel"); !s.ok()) return s;
  if (numel != expected) {
    return Error(absl::StrCat("payload is for ", numel, " values, the slice has ", expected));
  }
  return absl::OkStatus();
}

absl::Status WireReader::Finish(std::string_view what) const {
  if (remaining() == 0) return absl::OkStatus();
  return Error(absl::StrCat(remaining(), " trailing bytes after ", AbslView(what)));
}

absl::Status ReadScales(WireReader* r, size_t count, float max_scale, std::string_view what,
                        std::string_view* scales) {
  const absl::string_view name = AbslView(what);
  // count <= numel, the size of an existing buffer, so 4 * count cannot overflow.
  if (absl::Status s = r->Bytes(4 * count, scales, what); !s.ok()) return s;
  for (size_t i = 0; i < count; ++i) {
    const float v = ScaleAt(*scales, i);
    if (!std::isfinite(v)) return r->Error(absl::StrCat(name, " ", i, " is not finite (", v, ")"));
    if (std::signbit(v)) return r->Error(absl::StrCat(name, " ", i, " is negative (", v, ")"));
    if (v > max_scale) {
      return r->Error(absl::StrCat(name, " ", i, " is ", v, ", above ", max_scale,
                                   " (decoded values would overflow)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace ps::codecs::internal
