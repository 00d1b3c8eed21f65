// qsgd: s-level stochastic quantization against each bucket's L2 norm, levels
// Elias-gamma coded (Alistarh et al., "QSGD", NeurIPS 2017; docs/codecs.md "qsgd").
//
// Wire: version, numel (varint), one fp32 norm per bucket of `bucket` values (the last
// may be shorter), then a bit stream (LSB first) with, per value, the Elias gamma code
// of level + 1 (a lone 1 bit for level 0) followed, for level > 0, by a sign bit
// (1 = negative); the last byte is padded with zero bits.
// Encode: with norm ||x||_2 of the bucket, level = floor(|x| / norm * s + u), u uniform
// in [0, 1) per value (unbiased), at most s. Decode: x = sign * norm * level / s.
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
#include "core/status.h"

namespace ps::codecs {
namespace {

constexpr char kName[] = "qsgd";
constexpr int64_t kMaxLevels = int64_t{1} << 16;

// Bits of the Elias gamma code of v >= 1.
int GammaBits(uint64_t v) { return 2 * (63 - std::countl_zero(v)) + 1; }

class QsgdCodec final : public internal::BucketedCodec {
 public:
  QsgdCodec(uint32_t levels, size_t bucket, uint64_t seed)
      : BucketedCodec(internal::StageString(kName, {{"s", absl::StrCat(levels)},
                                                    {"bucket", absl::StrCat(bucket)}}),
                      bucket, seed),
        levels_(levels) {}

  absl::Status Encode(std::span<const float> values, const EncodeContext& ctx,
                      std::string* out) override {
    const size_t n = values.size();
    std::string bytes;
    const size_t scales_at = StartPayload(n, 0, &bytes);
    const uint32_t seed = RoundingSeedFor(ctx);
    internal::BitWriter bits(&bytes);
    for (size_t b = 0; b < Buckets(n); ++b) {
      double squares = 0;
      for (size_t i = Begin(b); i < End(b, n); ++i) squares += double{values[i]} * values[i];
      // Finite floats' squares sum to a finite double: only Inf or NaN makes it otherwise.
      if (!std::isfinite(squares)) return internal::CheckEncodable(spec(), values);
      // Clamped so that huge values keep a finite norm; levels are clamped to s below.
      const auto norm = static_cast<float>(std::min(std::sqrt(squares), double{FLT_MAX}));
      SetScale(&bytes, scales_at, b, norm);
      const double per_norm = norm > 0 ? levels_ / double{norm} : 0.0;
      for (size_t i = Begin(b); i < End(b, n); ++i) {
        const double r = std::fabs(double{values[i]}) * per_norm;
        const double u = internal::RoundingUniform(seed, static_cast<uint32_t>(i));
        const auto level =
            static_cast<uint32_t>(std::min(std::floor(r + u), static_cast<double>(levels_)));
        PutGamma(&bits, uint64_t{level} + 1);
        if (level > 0) bits.Put(values[i] < 0 ? 1 : 0, 1);
      }
    }
    bits.Finish();
    *out = std::move(bytes);
    return absl::OkStatus();
  }

  absl::Status Decode(std::string_view bytes, std::span<float> out) const override {
    const size_t n = out.size();
    internal::WireReader r(spec(), bytes);
    std::string_view norms;
    PS_RETURN_IF_ERROR(ReadHeader(&r, n, FLT_MAX, "norm", &norms));
    std::string_view stream;
    PS_RETURN_IF_ERROR(r.Bytes(r.remaining(), &stream, "the levels"));
    internal::BitReader bits(stream);
    const int max_zeros = GammaBits(uint64_t{levels_} + 1) / 2;
    for (size_t b = 0; b < Buckets(n); ++b) {
      const double norm = internal::ScaleAt(norms, b);
      for (size_t i = Begin(b); i < End(b, n); ++i) {
        const uint64_t code = bits.GetEliasGamma(max_zeros);
        if (code == 0) {
          return r.Error(absl::StrCat(bits.ok() ? "level code too long at value "
                                                : "payload ends inside the level of value ",
                                      i));
        }
        const uint64_t level = code - 1;
        if (level > levels_) {
          return r.Error(absl::StrCat("value ", i, " has level ", level, ", above s = ", levels_));
        }
        if (level == 0) {
          out[i] = 0.0f;
          continue;
        }
        const bool negative = bits.Get(1) != 0;
        if (!bits.ok()) return r.Error(absl::StrCat("payload ends inside the sign of value ", i));
        if (norm == 0) {
          return r.Error(absl::StrCat("value ", i, " has level ", level, " in a bucket of norm 0"));
        }
        // |x| <= norm: finite.
        const auto magnitude = static_cast<float>(norm * static_cast<double>(level) / levels_);
        out[i] = negative ? -magnitude : magnitude;
      }
    }
    if (bits.bytes_touched() < stream.size()) {
      return r.Error(absl::StrCat(stream.size() - bits.bytes_touched(),
                                  " trailing bytes after the levels"));
    }
    if (!bits.PaddingIsZero()) return r.Error("padding bits after the last level are not zero");
    return absl::OkStatus();
  }

  // Every value at the longest code (level s) with its sign.
  size_t MaxEncodedBytes(size_t numel) const override {
    const size_t bits_per_value = static_cast<size_t>(GammaBits(uint64_t{levels_} + 1)) + 1;
    return HeaderBytes(numel) + (numel * bits_per_value + 7) / 8;
  }

 private:
  // Elias gamma of v >= 1 as one Put: floor(log2 v) zero bits, then v's bits from the
  // most significant down (so the reader, taking bits LSB first, sees the zeros first).
  static void PutGamma(internal::BitWriter* bits, uint64_t v) {
    if (v == 1) return bits->Put(1, 1);
    const int top = 63 - std::countl_zero(v);
    uint64_t reversed = 0;
    for (int k = 0; k <= top; ++k) reversed |= ((v >> (top - k)) & 1) << k;
    bits->Put(reversed << top, 2 * top + 1);
  }

  uint32_t levels_;
};

}  // namespace

namespace internal {
absl::StatusOr<std::unique_ptr<Codec>> MakeQsgdCodec(Stages stages, const CodecOptions& options) {
  PS_ASSIGN_OR_RETURN(core::StageArgs args, SingleStage(stages, {"s", "bucket"}));
  PS_ASSIGN_OR_RETURN(const int64_t levels, args.Int("s", 16, 1, kMaxLevels));
  PS_ASSIGN_OR_RETURN(const size_t bucket, BucketArg(args));
  return std::unique_ptr<Codec>(
      std::make_unique<QsgdCodec>(static_cast<uint32_t>(levels), bucket, options.seed));
}
}  // namespace internal

}  // namespace ps::codecs
