// qsgd: s-level stochastic quantization against each bucket's L2 norm, levels
// Elias-gamma coded (Alistarh et al., "QSGD", NeurIPS 2017; docs/codecs.md "qsgd").
//
// Wire: version, numel (varint), one fp32 norm per bucket of `bucket` values (the last
// may be shorter), then a bit stream (LSB first) with, per value, the Elias gamma code
// of level + 1 (a lone 1 bit for level 0) followed, for level > 0, by a sign bit
// (1 = negative); the last byte is padded with zero bits.
// Encode: with norm ||x||_2 of the bucket, level = floor(|x| / norm * s + u), u uniform
// in [0, 1) per value (unbiased), at most s. Decode: x = sign * norm * level / s.
//
// level=cat (CAT, docs/adaptive.md): per encoding, s is chosen among min, 2 min, 4 min,
// ... and the spec's s by CAT's objective for unbiased compressors, the largest
// 1 / (b(s) (fixed cost + bytes(s))) with QSGD's variance factor b(s) = 1 + min(k / s^2,
// sqrt(k) / s) for buckets of k values and bytes(s) the payload's expected size. The
// chosen s goes on the wire as a varint between the norms and the bit stream (the spec
// says level=cat, so a fixed-s payload is never read as one).
#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
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

constexpr char kQsgdName[] = "qsgd";
constexpr int64_t kMaxLevels = int64_t{1} << 16;

// Bits of the Elias gamma code of v >= 1.
int GammaBits(uint64_t v) { return 2 * (63 - std::countl_zero(v)) + 1; }

// CAT's level=cat: the smallest s tried and the fixed cost used without a measured one.
struct QsgdCat {
  uint32_t min_levels = 1;
  double overhead = 16384;
};

// Values sampled (evenly spaced) to estimate a candidate s's payload bits.
constexpr size_t kCatSampleValues = 4096;

class QsgdCodec final : public internal::BucketedCodec {
 public:
  QsgdCodec(uint32_t levels, size_t bucket, uint64_t seed, std::optional<QsgdCat> cat)
      : BucketedCodec(PayloadFormat::kQsgd, SpecOf(levels, bucket, cat), bucket, seed),
        levels_(levels),
        cat_(cat) {}

  absl::Status Encode(std::span<const float> values, const EncodeContext& ctx,
                      std::string* out) override {
    const size_t n = values.size();
    norms_.resize(Buckets(n));
    for (size_t b = 0; b < Buckets(n); ++b) {
      double squares = 0;
      for (size_t i = Begin(b); i < End(b, n); ++i) squares += double{values[i]} * values[i];
      // Finite floats' squares sum to a finite double: only Inf or NaN makes it otherwise.
      if (!std::isfinite(squares)) return internal::CheckEncodable(spec(), values);
      // Clamped so that huge values keep a finite norm; levels are clamped to s below.
      norms_[b] = static_cast<float>(std::min(std::sqrt(squares), double{FLT_MAX}));
    }
    const uint32_t levels =
        cat_.has_value() ? ChooseLevels(values, ctx.fixed_cost_bytes >= 0 ? ctx.fixed_cost_bytes
                                                                          : cat_->overhead)
                         : levels_;
    std::string bytes;
    const size_t scales_at = StartPayload(n, 0, &bytes);
    for (size_t b = 0; b < Buckets(n); ++b) SetScale(&bytes, scales_at, b, norms_[b]);
    if (cat_.has_value()) internal::PutVarint(&bytes, levels);
    const uint32_t seed = RoundingSeedFor(ctx);
    internal::BitWriter bits(&bytes);
    for (size_t b = 0; b < Buckets(n); ++b) {
      const double per_norm = norms_[b] > 0 ? levels / double{norms_[b]} : 0.0;
      for (size_t i = Begin(b); i < End(b, n); ++i) {
        const double r = std::fabs(double{values[i]}) * per_norm;
        const double u = internal::RoundingUniform(seed, static_cast<uint32_t>(i));
        const auto level =
            static_cast<uint32_t>(std::min(std::floor(r + u), static_cast<double>(levels)));
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
    uint32_t levels = levels_;
    if (cat_.has_value()) {
      uint64_t chosen = 0;
      PS_RETURN_IF_ERROR(r.Varint(&chosen, "s"));
      if (chosen < cat_->min_levels || chosen > levels_) {
        return r.Error(absl::StrCat("s = ", chosen, " is outside [", cat_->min_levels, ", ",
                                    levels_, "]"));
      }
      levels = static_cast<uint32_t>(chosen);
    }
    std::string_view stream;
    PS_RETURN_IF_ERROR(r.Bytes(r.remaining(), &stream, "the levels"));
    internal::BitReader bits(stream);
    const int max_zeros = GammaBits(uint64_t{levels} + 1) / 2;
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
        if (level > levels) {
          return r.Error(absl::StrCat("value ", i, " has level ", level, ", above s = ", levels));
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
        const auto magnitude = static_cast<float>(norm * static_cast<double>(level) / levels);
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
    return HeaderBytes(numel) + (cat_.has_value() ? internal::VarintSize(levels_) : 0) +
           (numel * bits_per_value + 7) / 8;
  }

 private:
  // The candidate levels of level=cat: min, 2 min, 4 min, ... below s, then s.
  std::vector<uint32_t> Candidates() const {
    std::vector<uint32_t> out;
    if (!cat_.has_value()) return {levels_};
    for (uint64_t l = cat_->min_levels; l < levels_; l *= 2)
      out.push_back(static_cast<uint32_t>(l));
    out.push_back(levels_);
    return out;
  }

  // Expected payload bytes at `levels` (norms_ set for `values`): the frame, the varint
  // and the expected bits of the levels and signs, from every value of a short slice
  // or an evenly spaced sample of a long one.
  double ExpectedBytes(std::span<const float> values, uint32_t levels) const {
    const size_t n = values.size();
    const size_t stride = std::max<size_t>(1, n / kCatSampleValues);
    double bits = 0;
    size_t sampled = 0;
    for (size_t i = 0; i < n; i += stride, ++sampled) {
      const float norm = norms_[i / BucketSize()];
      const double r = norm > 0 ? std::fabs(double{values[i]}) * levels / double{norm} : 0.0;
      const double low = std::min(std::floor(r), static_cast<double>(levels));
      const double frac = low < levels ? r - low : 0.0;
      auto bits_at = [](double level) {
        const auto l = static_cast<uint64_t>(level);
        return GammaBits(l + 1) + (l > 0 ? 1 : 0);
      };
      bits += (1 - frac) * bits_at(low) + (frac > 0 ? frac * bits_at(low + 1) : 0.0);
    }
    const double all_bits = sampled > 0 ? bits * static_cast<double>(n) / sampled : 0.0;
    return static_cast<double>(HeaderBytes(n) + internal::VarintSize(levels)) + all_bits / 8;
  }

  // CAT's choice among Candidates() for `values` (norms_ set) at `fixed` bytes of fixed
  // cost: the largest 1 / (b(s) (fixed + bytes(s))), ties to the smaller s.
  uint32_t ChooseLevels(std::span<const float> values, double fixed) const {
    const double k =
        static_cast<double>(std::min(BucketSize(), std::max<size_t>(values.size(), 1)));
    double best = -1;
    uint32_t chosen = levels_;
    for (uint32_t s : Candidates()) {
      const auto d = static_cast<double>(s);
      const double variance = 1 + std::min(k / (d * d), std::sqrt(k) / d);
      const double score = 1 / (variance * (fixed + ExpectedBytes(values, s)));
      if (score > best) {
        best = score;
        chosen = s;
      }
    }
    return chosen;
  }

  static std::string SpecOf(uint32_t levels, size_t bucket, const std::optional<QsgdCat>& cat) {
    if (!cat.has_value()) {
      return internal::StageString(kQsgdName,
                                   {{"s", absl::StrCat(levels)}, {"bucket", absl::StrCat(bucket)}});
    }
    return internal::StageString(kQsgdName, {{"s", absl::StrCat(levels)},
                                         {"bucket", absl::StrCat(bucket)},
                                         {"level", "cat"},
                                         {"min", absl::StrCat(cat->min_levels)},
                                         {"overhead", internal::FormatNumber(cat->overhead)}});
  }

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
  std::optional<QsgdCat> cat_;
  std::vector<float> norms_;  // Encode's per-bucket norms, kept between calls
};

}  // namespace

namespace internal {
absl::StatusOr<std::unique_ptr<Codec>> MakeQsgdCodec(Stages stages, const CodecOptions& options) {
  PS_ASSIGN_OR_RETURN(core::StageArgs args,
                      SingleStage(stages, {"s", "bucket", "level", "min", "overhead"}));
  PS_ASSIGN_OR_RETURN(const int64_t levels, args.Int("s", 16, 1, kMaxLevels));
  PS_ASSIGN_OR_RETURN(const size_t bucket, BucketArg(args));
  PS_ASSIGN_OR_RETURN(const size_t level, args.Choice("level", {"fixed", "cat"}, 0));
  std::optional<QsgdCat> cat;
  if (level == 1) {
    PS_ASSIGN_OR_RETURN(const int64_t min_levels, args.Int("min", 1, 1, kMaxLevels));
    if (min_levels > levels) {
      return absl::InvalidArgumentError(absl::StrCat(
          kQsgdName, ": level=cat needs min <= s (the most levels a payload uses), got min=",
          min_levels, " and s=", levels));
    }
    PS_ASSIGN_OR_RETURN(const double overhead, args.Double("overhead", 16384, -1));
    cat = QsgdCat{.min_levels = static_cast<uint32_t>(min_levels), .overhead = overhead};
  } else if (args.Has("min") || args.Has("overhead")) {
    return absl::InvalidArgumentError(absl::StrCat(
        kQsgdName, ": min and overhead are arguments of level=cat (s is fixed otherwise)"));
  }
  return std::unique_ptr<Codec>(
      std::make_unique<QsgdCodec>(static_cast<uint32_t>(levels), bucket, options.seed, cat));
}
}  // namespace internal

}  // namespace ps::codecs
