// int8: 8-bit quantization with one max-norm scale per bucket and stochastic rounding
// (the max-norm variant of QSGD used for all-reduce-compatible compression;
// docs/codecs.md "int8").
//
// Wire: version, numel (varint), one fp32 scale per bucket of `bucket` values (the last
// bucket may be shorter), then numel int8 values in two's complement, each in
// [-127, 127]. Decode: x = q * scale of its bucket.
// Encode: scale = max|x| / 127 over the bucket, q = floor(x / scale + u) with u uniform
// in [0, 1) per value (unbiased: E[q * scale] = x), clamped to [-127, 127]. A bucket
// whose scale would be below FLT_MIN (max|x| < 127 * 2^-126) is sent as scale 0.
#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "codecs/bucketed_internal.h"
#include "codecs/codec.h"
#include "codecs/codec_internal.h"
#include "codecs/kernels_internal.h"
#include "codecs/wire_internal.h"
#include "core/fp32_bytes.h"
#include "core/status.h"

namespace ps::codecs {
namespace {

constexpr char kInt8Name[] = "int8";
// The largest scale whose 127 multiple is finite.
const float kMaxScale = std::nextafter(FLT_MAX / 127.0f, 0.0f);

class Int8Codec final : public internal::BucketedCodec {
 public:
  Int8Codec(size_t bucket, uint64_t seed)
      : BucketedCodec(PayloadFormat::kInt8,
                      internal::StageString(kInt8Name, {{"bucket", absl::StrCat(bucket)}}), bucket,
                      seed) {}

  absl::Status Encode(std::span<const float> values, const EncodeContext& ctx,
                      std::string* out) override {
    const size_t n = values.size();
    std::string bytes;
    const size_t scales_at = StartPayload(n, n, &bytes);
    auto* q = reinterpret_cast<int8_t*>(bytes.data() + scales_at + 4 * Buckets(n));
    const uint32_t seed = RoundingSeedFor(ctx);
    for (size_t b = 0; b < Buckets(n); ++b) {
      const size_t begin = Begin(b);
      const size_t len = End(b, n) - begin;
      PS_ASSIGN_OR_RETURN(const float max, BucketMaxAbs(values, b));
      float scale = std::min(max / 127.0f, kMaxScale);
      if (scale < FLT_MIN) {
        scale = 0;
        std::fill(q + begin, q + begin + len, int8_t{0});
      } else {
        internal::QuantizeInt8(values.data() + begin, len, 1.0f / scale, seed,
                               static_cast<uint32_t>(begin), q + begin);
      }
      SetScale(&bytes, scales_at, b, scale);
    }
    *out = std::move(bytes);
    return absl::OkStatus();
  }

  absl::Status Decode(std::string_view bytes, std::span<float> out) const override {
    const size_t n = out.size();
    std::string_view scales;
    const int8_t* q = nullptr;
    PS_RETURN_IF_ERROR(Parse(bytes, n, &scales, &q));
    for (size_t b = 0; b < Buckets(n); ++b) {
      internal::DequantizeInt8(q + Begin(b), End(b, n) - Begin(b), internal::ScaleAt(scales, b),
                               out.data() + Begin(b));
    }
    return absl::OkStatus();
  }

  // One pass: the values dequantized a block at a time into a buffer in the first-level
  // cache, then added to what is held, copied to out and checked (core::AddFiniteKeep).
  // The payload (a byte a value) is gathered from its pieces first.
  absl::Status DecodeAddPieces(std::span<const std::string_view> pieces,
                               std::span<float> held, std::span<float> out) const override {
    if (held.size() != out.size()) return Codec::DecodeAddPieces(pieces, held, out);
    const size_t n = out.size();
    std::string_view scales;
    const int8_t* q = nullptr;
    PS_RETURN_IF_ERROR(Parse(internal::Gathered(pieces), n, &scales, &q));
    // Whole blocks whatever the bucket size (AddFiniteKeep vectorizes blocks of 1024).
    constexpr size_t kBlock = 1024;
    alignas(64) float values[kBlock];
    bool finite = true;
    for (size_t at = 0; at < n; at += kBlock) {
      const size_t end = std::min(at + kBlock, n);
      for (size_t i = at; i < end;) {
        const size_t b = i / BucketSize();
        const size_t stop = std::min(End(b, n), end);
        internal::DequantizeInt8(q + i, stop - i, internal::ScaleAt(scales, b), values + (i - at));
        i = stop;
      }
      finite &= core::AddFiniteKeep(held.subspan(at, end - at),
                                    std::span<const float>(values, end - at),
                                    out.subspan(at, end - at));
    }
    return finite ? absl::OkStatus() : internal::NonFiniteSum(held);
  }

  size_t MaxEncodedBytes(size_t numel) const override { return HeaderBytes(numel) + numel; }

 private:
  // Decode's checks of a payload for n values: its scales and its n values, each in
  // [-127, 127].
  absl::Status Parse(std::string_view bytes, size_t n, std::string_view* scales,
                     const int8_t** q) const {
    internal::WireReader r(spec(), bytes);
    PS_RETURN_IF_ERROR(ReadHeader(&r, n, kMaxScale, "scale", scales));
    std::string_view values;
    PS_RETURN_IF_ERROR(r.Bytes(n, &values, "the values"));
    PS_RETURN_IF_ERROR(r.Finish("the values"));
    *q = reinterpret_cast<const int8_t*>(values.data());
    if (internal::HasInt8Minimum(*q, n)) {
      const size_t i = static_cast<size_t>(std::find(*q, *q + n, int8_t{-128}) - *q);
      return r.Error(absl::StrCat("value ", i, " is -128, outside [-127, 127]"));
    }
    return absl::OkStatus();
  }
};

}  // namespace

namespace internal {
absl::StatusOr<std::unique_ptr<Codec>> MakeInt8Codec(Stages stages, const CodecOptions& options) {
  return MakeBucketOnly<Int8Codec>(stages, options);
}
}  // namespace internal

}  // namespace ps::codecs
