#include "codecs/bucketed_internal.h"

#include <bit>
#include <cstring>

#include "codecs/kernels_internal.h"
#include "core/status.h"

namespace ps::codecs::internal {

size_t BucketedCodec::StartPayload(size_t numel, size_t body_bytes, std::string* bytes) const {
  bytes->clear();
  bytes->reserve(MaxEncodedBytes(numel));
  PutU8(bytes, FormatByte(format()));
  PutVarint(bytes, numel);
  const size_t scales_at = bytes->size();
  bytes->resize(scales_at + 4 * Buckets(numel) + body_bytes);
  return scales_at;
}

void BucketedCodec::SetScale(std::string* bytes, size_t scales_at, size_t b, float scale) {
  std::memcpy(bytes->data() + scales_at + 4 * b, &scale, 4);  // little-endian host
}

absl::StatusOr<float> BucketedCodec::BucketMaxAbs(std::span<const float> values, size_t b) const {
  const size_t begin = Begin(b);
  const uint32_t bits = MaxAbsBits(values.data() + begin, End(b, values.size()) - begin);
  if (bits >= 0x7f800000u) return CheckEncodable(spec(), values);  // Inf or NaN
  return std::bit_cast<float>(bits);
}

absl::Status BucketedCodec::ReadHeader(WireReader* r, size_t numel, float max_scale,
                                       std::string_view what, std::string_view* scales) const {
  PS_RETURN_IF_ERROR(r->Format(format()));
  PS_RETURN_IF_ERROR(r->Numel(numel));
  return ReadScales(r, Buckets(numel), max_scale, what, scales);
}

}  // namespace ps::codecs::internal
