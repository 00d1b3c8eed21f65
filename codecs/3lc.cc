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

// The byte that ends a run of 1..13 zero groups (ZeroRunToken): 121 for one, 243 + r - 2
// above.
constexpr auto kRunToken = [] {
  std::array<uint8_t, k3lcMaxRun> token{};  // token[0] = 0: no run
  for (int r = 1; r < k3lcMaxRun; ++r) token[r] = internal::ZeroRunToken(r);
  return token;
}();

inline uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

constexpr uint64_t kOnes = 0x0101'0101'0101'0101ull;

// Bit l set when byte l of the eight group bytes in `bytes` is not a zero group (121):
// SWAR, the high bit of each byte of x = bytes ^ 121...121 that is not zero, gathered
// by one multiply.
inline uint32_t NonZeroGroups(uint64_t bytes) {
  const uint64_t x = bytes ^ (kOnes * k3lcZeroGroup);
  const uint64_t high = (((x & (kOnes * 0x7f)) + kOnes * 0x7f) | x) & (kOnes << 7);
  return static_cast<uint32_t>((high * 0x0002'0408'1020'4081ull) >> 56);
}

// Writes the greedy tokens of `pending` zero groups that end before a non-zero group:
// a 255 for each 14, then 121 for one more or 243 + r - 2 for r = 2..13. Stores one
// byte more than it advances when the remainder is 0 (the caller keeps a byte of slack).
inline unsigned char* PutZeroRun(size_t pending, unsigned char* w) {
  if (pending >= static_cast<size_t>(k3lcMaxRun)) {
    const size_t full = pending / k3lcMaxRun;
    std::memset(w, internal::ZeroRunToken(k3lcMaxRun), full);
    w += full;
    pending -= full * k3lcMaxRun;
  }
  *w = kRunToken[pending];
  return w + (pending != 0);
}

// Sixteen bytes, a shuffle's source and result.
using Bytes16 = unsigned char __attribute__((vector_size(16)));
using Words2 = uint64_t __attribute__((vector_size(16)));

// out[k] = in[control[k]] (control bytes below 16). GCC lowers its shuffle by a
// variable mask to one pshufb where the target has SSSE3, as PS_VECTOR_CLONES' AVX2
// clone does; Clang, which has no such builtin, copies byte by byte.
inline Bytes16 Shuffle(Bytes16 in, Bytes16 control) {
#if defined(__clang__)
  Bytes16 out;
  for (int k = 0; k < 16; ++k) out[k] = in[control[k] & 15];
  return out;
#else
  return __builtin_shuffle(in, control);
#endif
}

// The tokens of a chunk of eight groups from its first non-zero group on, for each
// pattern of non-zero groups that starts with one (bit 0 set), as a shuffle of a
// source holding the chunk's group bytes (from that group on) in bytes 0..7 and the
// tokens of runs of 1..7 zero groups in bytes 8..14: each non-zero group's byte, after
// the token of the zero groups between it and the non-zero group before it; at most
// 8 bytes plus 7 tokens. control[mask] and size[mask], mask odd.
struct ChunkShuffles {
  alignas(16) unsigned char control[256][16];
  uint8_t size[256];
};
constexpr ChunkShuffles kChunkShuffles = [] {
  ChunkShuffles table{};
  for (unsigned mask = 1; mask < 256; mask += 2) {
    uint8_t k = 0;
    unsigned gap = 0;
    for (unsigned l = 0; l < 8; ++l) {
      if ((mask >> l & 1) == 0) {
        ++gap;
        continue;
      }
      if (gap != 0) table.control[mask][k++] = static_cast<unsigned char>(7 + gap);
      table.control[mask][k++] = static_cast<unsigned char>(l);
      gap = 0;
    }
    table.size[mask] = k;
  }
  return table;
}();
// Bytes 8..14 of the source: the tokens of runs of 1..7 zero groups.
constexpr uint64_t kShortRunTokens = [] {
  uint64_t tokens = 0;
  for (int r = 1; r <= 7; ++r) tokens |= uint64_t{kRunToken[r]} << (8 * (r - 1));
  return tokens;
}();

// Appends the tokens of `groups` groups whose digits are at d (with 8 readable bytes
// after the last group), eight groups at a time, after `*run` pending zero groups;
// leaves the zero groups after the last non-zero one in *run (any count: FlushRun
// writes them). A chunk of eight all-zero groups (40 digits 1) only extends the run.
// Any other chunk writes the run before its first non-zero group (its 14s first), then
// the rest of its tokens as one shuffle of its group bytes and the short-run tokens,
// chosen by the pattern of its non-zero groups (kChunkShuffles), without a branch per
// group: a branch per group mispredicts on mixes of zero and non-zero groups, which
// Gaussian data at s = 1 is full of. Stores up to 16 bytes past what it returns (the
// caller keeps that much slack).
PS_VECTOR_CLONES unsigned char* PutGroups(const uint8_t* d, size_t groups, size_t* run,
                                          unsigned char* w) {
  size_t pending = *run;
  size_t g = 0;
  for (; g + 8 <= groups; g += 8, d += 8 * kGroup) {
    const uint64_t diff = (Load64(d) ^ kOnes) | (Load64(d + 8) ^ kOnes) |
                          (Load64(d + 16) ^ kOnes) | (Load64(d + 24) ^ kOnes) |
                          (Load64(d + 32) ^ kOnes);
    if (diff == 0) {
      pending += 8;
      continue;
    }
    uint64_t bytes = 0;
    for (size_t l = 0; l < 8; ++l) {
      bytes |= uint64_t{internal::Pack3lcGroup(d + kGroup * l)} << (8 * l);
    }
    const uint32_t nonzero = NonZeroGroups(bytes);
    const auto first = static_cast<unsigned>(std::countr_zero(nonzero));  // < 8: diff != 0
    w = PutZeroRun(pending + first, w);
    const unsigned mask = nonzero >> first;
    // Built in registers: two 8-byte stores read back as 16 bytes would stall.
    const auto in = reinterpret_cast<Bytes16>(Words2{bytes >> (8 * first), kShortRunTokens});
    Bytes16 control;
    std::memcpy(&control, kChunkShuffles.control[mask], sizeof(control));
    const Bytes16 out = Shuffle(in, control);
    std::memcpy(w, &out, sizeof(out));
    w += kChunkShuffles.size[mask];
    pending = static_cast<size_t>(std::countl_zero(static_cast<uint8_t>(nonzero)));
  }
  for (; g < groups; ++g, d += kGroup) {
    const uint8_t b = internal::Pack3lcGroup(d);
    if (b == k3lcZeroGroup) {
      ++pending;
      continue;
    }
    w = PutZeroRun(pending, w);
    *w++ = b;
    pending = 0;
  }
  *run = pending;
  return w;
}

// Ends the encoding: the tokens of the zero groups still pending.
unsigned char* FlushRun(unsigned char* w, size_t run) { return PutZeroRun(run, w); }

// M = max|x| * s, rounded once to fp32; s < 2 keeps M / 2 <= max|x|, so the largest
// value always becomes +-1. Clamped so a value near FLT_MAX keeps M finite.
float ScaleOf(double max_abs, double s) {
  return static_cast<float>(std::min(max_abs * s, double{FLT_MAX}));
}
// M / 2 is exact for normal M; the floor keeps zeros at 0 when M / 2 underflows.
float HalfOf(float scale) { return std::max(0.5f * scale, FLT_TRUE_MIN); }

// Bytes of the tokens of a run of `groups` zero groups (PutZeroRun).
size_t RunBytes(size_t groups) {
  return groups / k3lcMaxRun + (groups % k3lcMaxRun != 0 ? 1 : 0);
}

// held[i] = held[i] + (digit_i - 1) x M for n digits: the value Decode3lc makes of each
// (t x M, t in {-1, 0, 1} as a float) and AddInto's addition, so the bits are those of a
// decode then an addition. Blocks of a fixed count, which GCC vectorizes at -O2.
constexpr size_t kAddDigitsBlock = 256;  // divides kBlockGroups * kGroup
PS_VECTOR_CLONES void AddDigitsBlock(const uint8_t* __restrict digits, float scale,
                                     float* __restrict held) {
  for (size_t i = 0; i < kAddDigitsBlock; ++i) {
    held[i] = held[i] + static_cast<float>(int{digits[i]} - 1) * scale;
  }
}
void AddDigits(const uint8_t* digits, size_t n, float scale, float* held) {
  size_t i = 0;
  for (; i + kAddDigitsBlock <= n; i += kAddDigitsBlock) {
    AddDigitsBlock(digits + i, scale, held + i);
  }
  for (; i < n; ++i) held[i] = held[i] + static_cast<float>(int{digits[i]} - 1) * scale;
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
  // maximizes the descent per byte of the push, a(s_j) / (fixed + bytes(s_j)), with
  // a = |x|^2 - |x - Q(x)|^2 (the energy the quantized push keeps; CAT's a(.) for a
  // biased compressor up to the constant |x|^2) and bytes the exact payload size, both
  // counted in one pass over the values and their groups of five. Ties: the smaller s.
  double ChooseMultiplier(std::span<const float> x, double max_abs, double fixed) const {
    constexpr int kLevels = 5;
    std::array<float, kLevels> scale{}, half{};
    std::array<double, kLevels> err{}, bytes{};
    std::array<size_t, kLevels> run{};
    std::array<double, kLevels> mult{};
    for (int j = 0; j < kLevels; ++j) {
      mult[j] = 1 + (s_ - 1) * j / (kLevels - 1);
      scale[j] = ScaleOf(max_abs, mult[j]);
      half[j] = HalfOf(scale[j]);
    }
    double energy = 0;
    const size_t n = x.size();
    for (size_t g = 0; g < n; g += kGroup) {
      float group_max = 0;
      for (size_t i = g; i < std::min(g + kGroup, n); ++i) {
        const float a = std::abs(x[i]);
        const double a2 = double{a} * a;
        energy += a2;
        group_max = std::max(group_max, a);
        for (int j = 0; j < kLevels; ++j) {
          const double d = double{a} - scale[j];
          err[j] += a >= half[j] ? d * d : a2;
        }
      }
      for (int j = 0; j < kLevels; ++j) {
        if (group_max >= half[j]) {
          bytes[j] += 1 + RunBytes(run[j]);
          run[j] = 0;
        } else {
          ++run[j];
        }
      }
    }
    const double header = 1 + internal::VarintSize(n) + sizeof(float);
    double best = -1;
    double chosen = s_;
    for (int j = 0; j < kLevels; ++j) {
      const double total = header + bytes[j] + RunBytes(run[j]);
      const double score = std::max(energy - err[j], 0.0) / (fixed + total);
      if (score > best) {
        best = score;
        chosen = mult[j];
      }
    }
    return chosen;
  }

  absl::Status Encode(std::span<const float> values, const EncodeContext& ctx,
                      std::string* out) override {
    return EncodeAdding(values, ctx, out, nullptr);
  }

  // The change into a per-thread scratch, then one pass over it that makes each block's
  // digits and tokens and adds the block's decoded values to held while the digits are in
  // the first-level cache: the values Decode3lc makes (t x M) and AddInto's addition.
  absl::Status EncodeChange(std::span<const float> x, std::span<float> held,
                            const EncodeContext& ctx, std::string* out) override {
    PS_ASSIGN_OR_RETURN(const std::span<float> change, ChangeScratch(x, held));
    return EncodeAdding(change, ctx, out, held.data());
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

  // Header plus one byte per group (no runs).
  size_t MaxEncodedBytes(size_t numel) const override {
    return 1 + internal::VarintSize(numel) + sizeof(float) + (numel + kGroup - 1) / kGroup;
  }

 private:
  // Encode; with `held`, also held[i] = held[i] + t_i x M for each value, block by block
  // (EncodeChange). Nothing is written on a refusal.
  absl::Status EncodeAdding(std::span<const float> values, const EncodeContext& ctx,
                            std::string* out, float* held) {
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

    // Tokens go to a scratch buffer kept between calls (its size is only known at the
    // end, and sizing *out to the bound first would zero-fill it every call).
    const size_t groups_total = (n + kGroup - 1) / kGroup;
    // +PutGroups' slack
    if (scratch_.size() < groups_total + 16) scratch_.resize(groups_total + 16);
    unsigned char* const begin = scratch_.data();
    unsigned char* w = begin;

    // Digits of one block plus the slack Pack3lcGroup reads past the last group.
    alignas(32) uint8_t digits[kBlockGroups * kGroup + 8];
    size_t run = 0;
    for (size_t start = 0; start < n; start += kBlockGroups * kGroup) {
      const size_t len = std::min(kBlockGroups * kGroup, n - start);
      internal::TernaryDigits(values.data() + start, len, half, digits);
      if (held != nullptr) AddDigits(digits, len, scale, held + start);
      const size_t groups = (len + kGroup - 1) / kGroup;
      // Padding digits of the last group are zeros (digit 1).
      std::memset(digits + len, 1, groups * kGroup + 8 - len);
      w = PutGroups(digits, groups, &run, w);
    }
    w = FlushRun(w, run);

    out->clear();
    out->reserve(MaxEncodedBytes(n));
    out->push_back(static_cast<char>(FormatByte(format())));
    internal::PutVarint(out, n);
    internal::PutF32(out, scale);
    out->append(reinterpret_cast<const char*>(begin), static_cast<size_t>(w - begin));
    return absl::OkStatus();
  }

  double s_;
  bool cat_ = false;
  double overhead_ = 0;
  std::string spec_;
  std::vector<unsigned char> scratch_;  // Encode's tokens (one instance encodes from one thread)
};

}  // namespace

namespace internal {
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
