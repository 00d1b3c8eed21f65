// 3lc: 3-value quantization with a sparsity multiplier, base-3^5 packing and zero-run
// bytes (Lim, Andersen, Kaminsky, "3LC", SysML 2019; docs/codecs.md "3lc").
//
// Wire: version, numel (varint), scale M (fp32), then one byte per group of five
// values (5g .. 5g + 4): 0..242 holds the five digits t + 1 in base 3 (value 5g + j
// has weight 3^j), 243..255 stands for a run of 2..14 all-zero groups (byte 121).
// Encoding: M = max|x| * s, t = round(x / M) in {-1, 0, 1} (half away from zero,
// computed as x >= M / 2 and x <= -M / 2); decoding: x = t * M. Error feedback is the
// worker library's job.
//
// level=cat (CAT, docs/adaptive.md): per encoding, s is chosen among five multipliers
// from 1 to the spec's s by CAT's objective; the payload is the fixed-s one, so the
// decoder needs nothing more.
#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codecs/3lc_internal.h"
#include "codecs/codec.h"
#include "codecs/codec_internal.h"
#include "codecs/kernels_internal.h"
#include "codecs/wire_internal.h"
#include "core/fp32_bytes.h"
#include "core/simd.h"
#include "core/status.h"

namespace ps::codecs {

namespace {

using internal::k3lcMaxRun;
using internal::k3lcMinRun;
using internal::k3lcRunBase;
using internal::k3lcZeroGroup;
using internal::k3lcName;

// Values per group.
constexpr size_t kGroup = internal::k3lcGroup;

// Groups packed per block: the digits of one block stay in L1.
constexpr size_t kBlockGroups = 512;
constexpr size_t kBlockValues = kBlockGroups * kGroup;

// M = max|x| * s, rounded once to fp32; s < 2 keeps M / 2 <= max|x|, so the largest
// value always becomes +-1. Clamped so a value near FLT_MAX keeps M finite.
float ScaleOf(double max_abs, double s) {
  return static_cast<float>(std::min(max_abs * s, double{FLT_MAX}));
}
// M / 2 is exact for normal M; the floor keeps zeros at 0 when M / 2 underflows.
float HalfOf(float scale) { return std::max(0.5f * scale, FLT_TRUE_MIN); }

// EncodeChange's block of n <= kBlockValues values: the change c = x[i] - held[i]
// (core::Subtract's fp32 subtraction), its digit (TernaryDigit at `half`) into
// digits[i], and held[i] + Value3lcDigit(digit, scale) into held[i] (Add3lcDigits) and,
// kCopy, into copy[i], in one pass that never stores the change; a whole block at a
// fixed count, which GCC vectorizes at -O2.
template <bool kCopy>
[[gnu::always_inline]] inline void ChangeDigitsOf(const float* __restrict x,
                                                  float* __restrict held, size_t n, float half,
                                                  float scale, uint8_t* __restrict digits,
                                                  float* __restrict copy) {
  for (size_t i = 0; i < n; ++i) {
    const uint8_t d = internal::TernaryDigit(x[i] - held[i], half);
    digits[i] = d;
    const float sum = held[i] + internal::Value3lcDigit(d, scale);
    held[i] = sum;
    if constexpr (kCopy) copy[i] = sum;
  }
}
PS_VECTOR_CLONES void WholeChangeDigits(const float* x, float* held, float half, float scale,
                                        uint8_t* digits) {
  ChangeDigitsOf<false>(x, held, kBlockValues, half, scale, digits, nullptr);
}
PS_VECTOR_CLONES void WholeChangeDigitsCopy(const float* x, float* held, float half, float scale,
                                            uint8_t* digits, float* copy) {
  ChangeDigitsOf<true>(x, held, kBlockValues, half, scale, digits, copy);
}
void ChangeDigits(const float* x, float* held, size_t n, float half, float scale,
                  uint8_t* digits, float* copy) {
  if (n == kBlockValues) {
    if (copy == nullptr) return WholeChangeDigits(x, held, half, scale, digits);
    return WholeChangeDigitsCopy(x, held, half, scale, digits, copy);
  }
  if (copy == nullptr) return ChangeDigitsOf<false>(x, held, n, half, scale, digits, nullptr);
  ChangeDigitsOf<true>(x, held, n, half, scale, digits, copy);
}

// Bytes of the tokens of a run of `groups` zero groups (Put3lcZeroRun).
size_t RunBytes(size_t groups) {
  return groups / k3lcMaxRun + (groups % k3lcMaxRun != 0 ? 1 : 0);
}

class ThreeLcCodec final : public Codec {
 public:
  // `cat`: choose s per encoding (level=cat) with this fixed cost in bytes when the
  // context gives none.
  ThreeLcCodec(double s, bool cat, double overhead)
      : Codec(PayloadFormat::kThreeLc),
        s_(s),
        cat_(cat),
        overhead_(overhead),
        spec_(cat ? internal::StageString(k3lcName,
                                          {{"s", internal::FormatNumber(s)},
                                           {"level", "cat"},
                                           {"overhead", internal::FormatNumber(overhead)}})
                  : internal::StageString(k3lcName, {{"s", internal::FormatNumber(s)}})) {
  }

  std::string_view spec() const override { return spec_; }

  // CAT (docs/adaptive.md): of the multipliers s_j = 1 + (s - 1) j / 4, the one that
  // maximizes the descent per byte of the push, kept / (fixed + bytes) (CatCandidates).
  // Ties: the smaller s.
  double ChooseMultiplier(std::span<const float> x, double max_abs, double fixed) const {
    double best = -1;
    double chosen = s_;
    for (const internal::ThreeLcCandidate& c : internal::ThreeLcCatCandidates(x, max_abs, s_)) {
      const double score = std::max(c.kept, 0.0) / (fixed + c.bytes);
      if (score > best) {
        best = score;
        chosen = c.multiplier;
      }
    }
    return chosen;
  }

  absl::Status Encode(std::span<const float> values, const EncodeContext& ctx,
                      std::string* out) override {
    return EncodeAdding(values, ctx, out, nullptr);
  }

  // Two passes and no stored change: the scale from the largest |x - held| (each
  // difference the fp32 subtraction, not kept), then per block one pass that makes each
  // value's change again, its digit, and adds its decoded value (t x M, what Decode3lc
  // makes) to held (AddInto's addition) and writes it to copy_to too (ChangeDigits), and
  // then the block's tokens.
  // level=cat reads the whole change to choose s, so it is stored first, in a per-thread
  // scratch; so is a change that is not finite, for CheckEncodable's message.
  absl::Status EncodeChange(std::span<const float> x, std::span<float> held,
                            const EncodeContext& ctx, std::string* out,
                            std::span<float> copy_to) override {
    PS_RETURN_IF_ERROR(CheckCopyTo(held, copy_to));
    if (cat_ || x.size() != held.size()) {
      PS_ASSIGN_OR_RETURN(const std::span<float> change, ChangeScratch(x, held));
      PS_RETURN_IF_ERROR(EncodeAdding(change, ctx, out, held.data()));
      if (!copy_to.empty()) std::memcpy(copy_to.data(), held.data(), held.size_bytes());
      return absl::OkStatus();
    }
    const uint32_t max_bits = internal::MaxAbsDiffBits(x.data(), held.data(), x.size());
    if (max_bits >= 0x7f800000u) {
      PS_ASSIGN_OR_RETURN(const std::span<float> change, ChangeScratch(x, held));
      return internal::CheckEncodable(spec_, change);
    }
    const float scale = ScaleOf(std::bit_cast<float>(max_bits), s_);
    const float half = HalfOf(scale);
    EncodeBlocks(x.size(), scale, [&](size_t start, size_t len, uint8_t* digits) {
      ChangeDigits(x.data() + start, held.data() + start, len, half, scale, digits,
                   copy_to.empty() ? nullptr : copy_to.data() + start);
    }, out);
    return absl::OkStatus();
  }

  // Each block's quantized values subtracted from v while its digits are in the
  // first-level cache: v[i] + (t_i x -M) is v[i] - t_i x M, bit for bit (negation is
  // exact, and x - y is x + (-y)).
  absl::Status EncodeResidual(std::span<float> v, const EncodeContext& ctx,
                              std::string* out) override {
    return EncodeAdding(v, ctx, out, v.data(), -1.0f);
  }

  absl::Status Decode(std::string_view bytes, std::span<float> out) const override {
    return internal::Decode3lc(bytes, out);
  }

  // The change decoded, added to what is held and copied to out in one pass
  // (Decode3lcAdd); the payload is small (a byte per five values at most), so pieces are
  // gathered first.
  absl::Status DecodeAddPieces(std::span<const std::string_view> pieces,
                               std::span<float> held, std::span<float> out) const override {
    if (held.size() != out.size()) return Codec::DecodeAddPieces(pieces, held, out);
    bool finite = true;
    PS_RETURN_IF_ERROR(
        internal::Decode3lcAdd(internal::Gathered(pieces), held.data(), out, &finite));
    return finite ? absl::OkStatus() : internal::NonFiniteSum(out);
  }

  // The tokens walked, not decoded (Check3lc): a shard keeps 3lc pushes encoded until
  // their round closes.
  absl::Status Check(std::string_view payload, size_t numel) const override {
    return internal::Check3lc(payload, numel);
  }
  bool checks_without_decoding() const override { return true; }
  SharedStructure shared_structure() const override { return SharedStructure::kTernaryDigits; }

  // Header plus one byte per group (no runs).
  size_t MaxEncodedBytes(size_t numel) const override {
    return 1 + internal::VarintSize(numel) + sizeof(float) + (numel + kGroup - 1) / kGroup;
  }

 private:
  // Encode; with `held`, also held[i] = held[i] + t_i x (sign x M) for each value, block
  // by block, after the block's digits are made (EncodeChange: sign 1; EncodeResidual:
  // held is the values, sign -1). Nothing is written on a refusal.
  absl::Status EncodeAdding(std::span<const float> values, const EncodeContext& ctx,
                            std::string* out, float* held, float sign = 1.0f) {
    const size_t n = values.size();
    const uint32_t max_bits = internal::MaxAbsBits(values.data(), n);
    if (max_bits >= 0x7f800000u) return internal::CheckEncodable(spec_, values);
    const double max_abs = std::bit_cast<float>(max_bits);
    const double s =
        cat_ ? ChooseMultiplier(values, max_abs,
                                ctx.fixed_cost_bytes >= 0 ? ctx.fixed_cost_bytes : overhead_)
             : s_;
    const float scale = ScaleOf(max_abs, s);
    const float half = HalfOf(scale);
    EncodeBlocks(n, scale, [&](size_t start, size_t len, uint8_t* digits) {
      internal::TernaryDigits(values.data() + start, len, half, digits);
      if (held != nullptr) internal::Add3lcDigits(digits, len, sign * scale, held + start);
    }, out);
    return absl::OkStatus();
  }

  // The payload of n values at `scale`, a block of at most kBlockValues at a time:
  // digits_of(start, len, digits) makes the block's digits (and what it adds to what
  // is held), then they become tokens.
  template <typename DigitsOf>
  void EncodeBlocks(size_t n, float scale, const DigitsOf& digits_of, std::string* out) {
    // Tokens go to a scratch buffer kept between calls (its size is only known at the
    // end, and sizing *out to the bound first would zero-fill it every call).
    const size_t groups_total = (n + kGroup - 1) / kGroup;
    // +PutGroups' slack
    if (scratch_.size() < groups_total + 16) scratch_.resize(groups_total + 16);
    unsigned char* const begin = scratch_.data();
    unsigned char* w = begin;

    // Digits of one block plus the slack Put3lcTokens reads past the last group.
    alignas(32) uint8_t digits[kBlockValues + 8];
    size_t run = 0;
    for (size_t start = 0; start < n; start += kBlockValues) {
      const size_t len = std::min(kBlockValues, n - start);
      digits_of(start, len, digits);
      const size_t groups = (len + kGroup - 1) / kGroup;
      // Padding digits of the last group are zeros (digit 1).
      std::memset(digits + len, 1, groups * kGroup + 8 - len);
      w = internal::Put3lcTokens(digits, groups, &run, w);
    }
    w = internal::Put3lcZeroRun(run, w);

    out->clear();
    out->reserve(MaxEncodedBytes(n));
    out->push_back(static_cast<char>(FormatByte(format())));
    internal::PutVarint(out, n);
    internal::PutF32(out, scale);
    out->append(reinterpret_cast<const char*>(begin), static_cast<size_t>(w - begin));
  }

  double s_;
  bool cat_ = false;
  double overhead_ = 0;
  std::string spec_;
  std::vector<unsigned char> scratch_;  // Encode's tokens (one instance encodes from one thread)
};

}  // namespace

namespace internal {

// Only a value with |x| >= M_j / 2 is kept by candidate j (it keeps |x|^2 - (|x| - M_j)^2;
// every other value is zeroed and keeps nothing) and makes its group a byte of its own
// (the others are zero groups, in runs). M_0 / 2 is the least of the halves, so the
// digits at M_0 / 2 (TernaryDigits, vectorized) find the values at or above it (on
// Gaussian data a few per hundred); each is counted once, by how many candidates keep it,
// and each group once, by the most candidates that keep one of its values.
std::array<ThreeLcCandidate, kThreeLcCatLevels> ThreeLcCatCandidates(std::span<const float> x,
                                                                     double max_abs, double s) {
  std::array<ThreeLcCandidate, kThreeLcCatLevels> out{};
  std::array<float, kThreeLcCatLevels> scale{}, half{};
  // Per candidate: the group after its last non-zero group so far.
  std::array<size_t, kThreeLcCatLevels> next{};
  for (size_t j = 0; j < kThreeLcCatLevels; ++j) {
    out[j].multiplier = 1 + (s - 1) * static_cast<double>(j) / (kThreeLcCatLevels - 1);
    scale[j] = ScaleOf(max_abs, out[j].multiplier);
    half[j] = HalfOf(scale[j]);
  }
  // Per value kept by some candidate, the number of candidates that keep it (the halves
  // grow with j, so candidates 0..c-1 do): its |x| and a count summed by c.
  std::array<double, kThreeLcCatLevels + 1> sum_by_c{};
  std::array<double, kThreeLcCatLevels + 1> count_by_c{};
  // The group being read and the most candidates that keep one of its values; a group
  // is a byte of its own for those candidates, and a zero group for the others.
  size_t group = 0;
  size_t group_c = 0;
  auto end_group = [&] {
    for (size_t j = 0; j < group_c; ++j) {
      out[j].bytes += static_cast<double>(1 + RunBytes(group - next[j]));
      next[j] = group + 1;
    }
  };
  auto take = [&](size_t i) {
    const float a = std::abs(x[i]);
    size_t c = 0;
    for (size_t j = 0; j < kThreeLcCatLevels; ++j) c += a >= half[j] ? 1 : 0;
    sum_by_c[c] += a;
    count_by_c[c] += 1;
    const size_t g = i / kGroup;
    if (g != group) {
      end_group();
      group = g;
      group_c = 0;
    }
    group_c = std::max(group_c, c);
  };
  // The values at or above half[0], found by TernaryDigits (digit 1: below it) a block at
  // a time and a word of eight digits at a time.
  const size_t n = x.size();
  alignas(32) uint8_t digits[kBlockValues + 8];
  for (size_t start = 0; start < n; start += kBlockValues) {
    const size_t len = std::min(kBlockValues, n - start);
    internal::TernaryDigits(x.data() + start, len, half[0], digits);
    std::memset(digits + len, 1, 8);
    for (size_t k = 0; k < len; k += 8) {
      uint64_t word;
      std::memcpy(&word, digits + k, sizeof(word));
      word ^= 0x0101'0101'0101'0101ull;  // a byte not 0: a digit 0 or 2
      while (word != 0) {
        take(start + k + static_cast<size_t>(std::countr_zero(word)) / 8);
        word &= ~(uint64_t{0xff} << (std::countr_zero(word) / 8 * 8));
      }
    }
  }
  end_group();
  // Candidate j keeps |x|^2 - (|x| - M_j)^2 = 2 |x| M_j - M_j^2 of each value kept by
  // more than j candidates.
  double sum = 0;
  double count = 0;
  for (size_t c = kThreeLcCatLevels; c >= 1; --c) {
    sum += sum_by_c[c];
    count += count_by_c[c];
    const double m = scale[c - 1];
    out[c - 1].kept = 2 * m * sum - m * m * count;
  }
  const size_t groups = (n + kGroup - 1) / kGroup;
  const double header = static_cast<double>(1 + VarintSize(n) + sizeof(float));
  for (size_t j = 0; j < kThreeLcCatLevels; ++j) {
    out[j].bytes += header + static_cast<double>(RunBytes(groups - next[j]));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Codec>> Make3lcCodec(Stages stages,
                                                    const CodecOptions& /*options*/) {
  PS_ASSIGN_OR_RETURN(core::StageArgs args, SingleStage(stages, {"s", "level", "overhead"}));
  PS_ASSIGN_OR_RETURN(const double s,
                      args.Double("s", 1.0, -std::numeric_limits<double>::infinity()));
  if (!(s >= 1.0 && s < 2.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(k3lcName, ": s must lie in [1, 2), got ", FormatNumber(s)));
  }
  PS_ASSIGN_OR_RETURN(const size_t level, args.Choice("level", {"fixed", "cat"}, 0));
  const bool cat = level == 1;
  if (!cat && args.Has("overhead")) {
    return absl::InvalidArgumentError(absl::StrCat(
        k3lcName, ": overhead is an argument of level=cat (s is fixed otherwise)"));
  }
  PS_ASSIGN_OR_RETURN(const double overhead, args.Double("overhead", 16384, -1));
  return std::unique_ptr<Codec>(std::make_unique<ThreeLcCodec>(s, cat, overhead));
}
}  // namespace internal

}  // namespace ps::codecs
