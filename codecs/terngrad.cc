// terngrad: ternary stochastic quantization, 2 bits per value plus one scale per bucket
// (Wen et al., "TernGrad", NeurIPS 2017; docs/codecs.md "terngrad").
//
// Wire: version, numel (varint), one fp32 scale per bucket of `bucket` values (the last
// may be shorter), then ceil(numel / 4) bytes of 2-bit codes, value i in bits
// 2 (i % 4) and 2 (i % 4) + 1 of byte i / 4: 0 -> 0, 1 -> +scale, 2 -> -scale; code 3
// is refused and the padding codes of the last byte are 0.
// Encode: scale s = max|x| over the bucket; value i becomes sign(x) * s with probability
// |x| / s and 0 otherwise (unbiased). A bucket with s < FLT_MIN is sent as zeros.
#include <algorithm>
#include <bit>
#include <cfloat>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codecs/bucketed_internal.h"
#include "codecs/codec.h"
#include "codecs/codec_internal.h"
#include "codecs/kernels_internal.h"
#include "codecs/wire_internal.h"
#include "core/status.h"

namespace ps::codecs {
namespace {

constexpr char kTerngradName[] = "terngrad";

class TerngradCodec final : public internal::BucketedCodec {
 public:
  TerngradCodec(size_t bucket, uint64_t seed)
      : BucketedCodec(PayloadFormat::kTernGrad,
                      internal::StageString(kTerngradName, {{"bucket", absl::StrCat(bucket)}}),
                      bucket, seed) {}

  absl::Status Encode(std::span<const float> values, const EncodeContext& ctx,
                      std::string* out) override {
    const size_t n = values.size();
    std::string bytes;
    const size_t scales_at = StartPayload(n, (n + 3) / 4, &bytes);
    // Codes of the whole slice, zero up to a multiple of 4 for PackCodes2.
    codes_.assign((n + 3) / 4 * 4, 0);
    const uint32_t seed = RoundingSeedFor(ctx);
    for (size_t b = 0; b < Buckets(n); ++b) {
      const size_t begin = Begin(b);
      const size_t len = End(b, n) - begin;
      PS_ASSIGN_OR_RETURN(float scale, BucketMaxAbs(values, b));
      if (scale < FLT_MIN) {
        scale = 0;  // codes stay 0
      } else {
        internal::TernarizeStochastic(values.data() + begin, len, 1.0f / scale, seed,
                                      static_cast<uint32_t>(begin), codes_.data() + begin);
      }
      SetScale(&bytes, scales_at, b, scale);
    }
    internal::PackCodes2(
        codes_.data(), n,
        reinterpret_cast<unsigned char*>(bytes.data() + scales_at + 4 * Buckets(n)));
    *out = std::move(bytes);
    return absl::OkStatus();
  }

  absl::Status Decode(std::string_view bytes, std::span<float> out) const override {
    const size_t n = out.size();
    internal::WireReader r(spec(), bytes);
    std::string_view scales;
    PS_RETURN_IF_ERROR(ReadHeader(&r, n, FLT_MAX, "scale", &scales));
    std::string_view codes;
    PS_RETURN_IF_ERROR(r.Bytes((n + 3) / 4, &codes, "the codes"));
    PS_RETURN_IF_ERROR(r.Finish("the codes"));
    const auto* packed = reinterpret_cast<const unsigned char*>(codes.data());
    if (const ptrdiff_t i = internal::FindCode3(packed, n); i >= 0) {
      return r.Error(
          absl::StrCat("value ", i, " has code 3 (codes are 0, 1 = +scale, 2 = -scale)"));
    }
    if (n % 4 != 0 && (packed[n / 4] >> (2 * (n % 4))) != 0) {
      return r.Error("padding codes after the last value are not zero");
    }
    for (size_t b = 0; b < Buckets(n); ++b) {
      internal::UnpackTernary2(packed, Begin(b), End(b, n), internal::ScaleAt(scales, b),
                               out.data());
    }
    return absl::OkStatus();
  }

  size_t MaxEncodedBytes(size_t numel) const override {
    return HeaderBytes(numel) + (numel + 3) / 4;
  }

 private:
  std::vector<uint8_t> codes_;  // Encode's scratch (one instance encodes from one thread)
};

}  // namespace

namespace internal {
absl::StatusOr<std::unique_ptr<Codec>> MakeTerngradCodec(Stages stages,
                                                         const CodecOptions& options) {
  return MakeBucketOnly<TerngradCodec>(stages, options);
}
}  // namespace internal

}  // namespace ps::codecs
