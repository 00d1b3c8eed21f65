// 3lc: 3-value quantization with a sparsity multiplier, base-3^5 packing and zero-run
// bytes (Lim, Andersen, Kaminsky, "3LC", SysML 2019; docs/codecs.md "3lc").
//
// Wire: version, numel (varint), scale M (fp32), then one byte per group of five
// values (5g .. 5g + 4): 0..242 holds the five digits t + 1 in base 3 (value 5g + j
// has weight 3^j), 243..255 stands for a run of 2..14 all-zero groups (byte 121).
// Encoding: M = max|x| * s, t = round(x / M) in {-1, 0, 1} (half away from zero,
// computed as x >= M / 2 and x <= -M / 2); decoding: x = t * M. Error feedback is the
// worker library's job.
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
#include "core/status.h"

namespace ps::codecs {

namespace {

using internal::k3lcMaxRun;
using internal::k3lcMinRun;
using internal::k3lcRunBase;
using internal::k3lcZeroGroup;

constexpr char kName[] = "3lc";

// Values per group and 3^j.
constexpr size_t kGroup = 5;
constexpr int kPow3[kGroup + 1] = {1, 3, 9, 27, 81, 243};

// t = digit - 1 of every byte 0..242, value j at [j]. 243 x 5 floats (4.9 KB).
constexpr auto kDigitTable = [] {
  std::array<std::array<float, kGroup>, 243> table{};
  for (int b = 0; b < 243; ++b) {
    for (size_t j = 0; j < kGroup; ++j) table[b][j] = static_cast<float>(b / kPow3[j] % 3 - 1);
  }
  return table;
}();

// Groups packed per block: the digits of one block stay in L1.
constexpr size_t kBlockGroups = 512;

// The byte that ends a run of 1..13 zero groups: 121 for one, 243 + r - 2 above.
constexpr auto kRunToken = [] {
  std::array<uint8_t, k3lcMaxRun> token{};  // token[0] = 0: no run
  token[1] = k3lcZeroGroup;
  for (int r = k3lcMinRun; r < k3lcMaxRun; ++r) token[r] = static_cast<uint8_t>(k3lcRunBase + r - k3lcMinRun);
  return token;
}();

// Writes the tokens of one group byte `b` after `*run` pending zero groups, without
// branches (zero and non-zero groups alternate unpredictably in gradients). Emitting a
// 255 whenever 14 zero groups are pending, and the remainder before the next non-zero
// group, is the greedy encoding: runs of 14 first, then one byte for 2..13 or a 121
// for a single zero group. Always stores two bytes at w (the caller leaves a byte of
// slack) and returns how far w advances.
inline size_t PutGroup(uint8_t b, size_t* run, unsigned char* w) {
  // Masks and arithmetic rather than conditionals, which GCC turns into branches.
  const size_t prev = *run;  // 0..13; kRunToken[0] is 0
  const size_t zero = size_t{b == k3lcZeroGroup};
  const size_t pending = prev + zero;
  const size_t full = size_t{pending == static_cast<size_t>(k3lcMaxRun)};
  const size_t had_run = size_t{prev != 0};
  // Zero group: 255 (kept only when the run is full). Otherwise the pending run's
  // token, or b itself when nothing is pending.
  const size_t first = kRunToken[prev] | (b & (had_run - 1)) | (0xff & (0 - zero));
  w[0] = static_cast<unsigned char>(first);
  w[1] = b;
  *run = pending & (0 - (zero & (full ^ 1)));
  return (zero & full) + (zero ^ 1) * (1 + had_run);
}

inline uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

constexpr uint64_t kOnes = 0x0101'0101'0101'0101ull;

// Whether some byte of v is `b` (the exact SWAR zero-byte test on v ^ b...b).
inline bool HasByte(uint64_t v, uint8_t b) {
  const uint64_t x = v ^ (kOnes * b);
  return ((x - kOnes) & ~x & (kOnes << 7)) != 0;
}

// The tokens of eight group bytes (little-endian in `bytes`) after `*run` (< 14)
// pending zero groups. Each non-zero group l is preceded by the zero groups since the
// previous non-zero one: `gap` is found from the position of that group's bit rather
// than by counting, so the groups do not wait on each other; only w's advance is a
// chain. The pending run enters as a marker bit below the chunk's bits (position
// 15 - run), so a group with no non-zero group before it sees a gap of l + run.
inline unsigned char* PutChunk(uint64_t bytes, size_t* run, unsigned char* w) {
  // Bit l of `nonzero`: byte l is not 121 (SWAR: high bit of each byte of x != 0).
  const uint64_t x = bytes ^ (kOnes * k3lcZeroGroup);
  const uint64_t high = (((x & (kOnes * 0x7f)) + kOnes * 0x7f) | x) & (kOnes << 7);
  const auto nonzero = static_cast<uint32_t>((high * 0x0002'0408'1020'4081ull) >> 56);
  const uint32_t marks = (nonzero << 16) | (1u << (15 - *run));
  for (uint32_t l = 0; l < 8; ++l) {
    const uint32_t nz = (nonzero >> l) & 1;
    const uint32_t below = marks & ((1u << (16 + l)) - 1);  // never 0: the marker
    const uint32_t gap = 16 + l - (32 - static_cast<uint32_t>(std::countl_zero(below)));
    const uint32_t full = gap >= static_cast<uint32_t>(k3lcMaxRun);
    const uint32_t rem = gap - k3lcMaxRun * full;  // < 14 (gap <= 13 + 7)
    *w = k3lcRunBase + k3lcMaxRun - k3lcMinRun;
    w += nz & full;
    *w = kRunToken[rem];
    w += nz & (rem != 0);
    *w = static_cast<unsigned char>(bytes >> (8 * l));
    w += nz;
  }
  // Zero groups after the last non-zero one (run + 8 when there is none).
  const uint32_t pending = 23 - (31 - static_cast<uint32_t>(std::countl_zero(marks)));
  const uint32_t full = pending >= static_cast<uint32_t>(k3lcMaxRun);
  *w = k3lcRunBase + k3lcMaxRun - k3lcMinRun;
  w += full;
  *run = pending - k3lcMaxRun * full;
  return w;
}

// Appends the tokens of `groups` groups whose digits are at d (with 8 readable bytes
// after the last group), eight groups at a time. Two shortcuts keep sparse and dense
// stretches cheaper still: eight all-zero groups (40 digits 1) only extend the run,
// and eight non-zero groups with no run pending are copied as they are.
unsigned char* PutGroups(const uint8_t* d, size_t groups, size_t* run, unsigned char* w) {
  size_t g = 0;
  for (; g + 8 <= groups; g += 8, d += 8 * kGroup) {
    const uint64_t diff = (Load64(d) ^ kOnes) | (Load64(d + 8) ^ kOnes) |
                          (Load64(d + 16) ^ kOnes) | (Load64(d + 24) ^ kOnes) |
                          (Load64(d + 32) ^ kOnes);
    if (diff == 0) {
      // At most 13 + 8 pending: one 255 when 14 or more.
      const size_t pending = *run + 8;
      const size_t full = size_t{pending >= static_cast<size_t>(k3lcMaxRun)};
      *w = static_cast<unsigned char>(k3lcRunBase + k3lcMaxRun - k3lcMinRun);
      w += full;
      *run = pending - k3lcMaxRun * full;
      continue;
    }
    uint64_t bytes = 0;
    for (size_t l = 0; l < 8; ++l) {
      bytes |= uint64_t{internal::Pack3lcGroup(d + kGroup * l)} << (8 * l);
    }
    if (*run == 0 && !HasByte(bytes, k3lcZeroGroup)) {
      std::memcpy(w, &bytes, sizeof(bytes));
      w += sizeof(bytes);
      continue;
    }
    w = PutChunk(bytes, run, w);
  }
  for (; g < groups; ++g, d += kGroup) w += PutGroup(internal::Pack3lcGroup(d), run, w);
  return w;
}

// Ends the encoding: the token of the zero groups still pending (fewer than 14).
unsigned char* FlushRun(unsigned char* w, size_t run) {
  if (run > 0) *w++ = kRunToken[run];
  return w;
}

// Slices at least this long decode through a per-call table of scaled groups.
constexpr size_t kFastDecodeMin = 4096;

class ThreeLcCodec final : public Codec {
 public:
  explicit ThreeLcCodec(double s)
      : s_(s), spec_(internal::StageString(kName, {{"s", internal::FormatNumber(s)}})) {}

  std::string_view spec() const override { return spec_; }

  absl::Status Encode(std::span<const float> values, const EncodeContext& /*ctx*/,
                      std::string* out) override {
    const size_t n = values.size();
    const uint32_t max_bits = internal::MaxAbsBits(values.data(), n);
    if (max_bits >= 0x7f800000u) return internal::CheckEncodable(spec_, values);
    // M = max|x| * s, rounded once to fp32; s < 2 keeps M / 2 <= max|x|, so the
    // largest value always becomes +-1. Clamped so a value near FLT_MAX keeps M finite.
    const double max_abs = std::bit_cast<float>(max_bits);
    const auto scale = static_cast<float>(std::min(max_abs * s_, double{FLT_MAX}));
    // M / 2 is exact for normal M; the floor keeps zeros at 0 when M / 2 underflows.
    const float half = std::max(0.5f * scale, FLT_TRUE_MIN);

    // Tokens go to a scratch buffer kept between calls (its size is only known at the
    // end, and sizing *out to the bound first would zero-fill it every call).
    const size_t groups_total = (n + kGroup - 1) / kGroup;
    if (scratch_.size() < groups_total + 2) scratch_.resize(groups_total + 2);  // +PutGroup's slack
    unsigned char* const begin = scratch_.data();
    unsigned char* w = begin;

    // Digits of one block plus the slack Pack3lcGroup reads past the last group.
    alignas(32) uint8_t digits[kBlockGroups * kGroup + 8];
    size_t run = 0;
    for (size_t start = 0; start < n; start += kBlockGroups * kGroup) {
      const size_t len = std::min(kBlockGroups * kGroup, n - start);
      internal::TernaryDigits(values.data() + start, len, half, digits);
      const size_t groups = (len + kGroup - 1) / kGroup;
      // Padding digits of the last group are zeros (digit 1).
      std::memset(digits + len, 1, groups * kGroup + 8 - len);
      w = PutGroups(digits, groups, &run, w);
    }
    w = FlushRun(w, run);

    out->clear();
    out->reserve(MaxEncodedBytes(n));
    out->push_back(static_cast<char>(kFormatVersion));
    internal::PutVarint(out, n);
    internal::PutF32(out, scale);
    out->append(reinterpret_cast<const char*>(begin), static_cast<size_t>(w - begin));
    return absl::OkStatus();
  }

  absl::Status Decode(std::string_view bytes, std::span<float> out) const override {
    const size_t n = out.size();
    internal::WireReader r(kName, bytes);
    PS_RETURN_IF_ERROR(r.Version(kFormatVersion));
    PS_RETURN_IF_ERROR(r.Numel(n));
    float scale = 0;
    PS_RETURN_IF_ERROR(r.F32(&scale, "scale"));
    if (!std::isfinite(scale)) return r.Error(absl::StrCat("scale ", scale, " is not finite"));
    if (std::signbit(scale)) return r.Error(absl::StrCat("scale ", scale, " is negative"));

    const size_t groups = (n + kGroup - 1) / kGroup;
    const size_t full_groups = n / kGroup;
    const size_t body_start = r.offset();
    std::string_view body;
    PS_RETURN_IF_ERROR(r.Bytes(r.remaining(), &body, "groups"));
    const auto* p = reinterpret_cast<const unsigned char*>(body.data());
    float* const o = out.data();

    size_t g = 0;
    // A zero group or a run shorter than 14 was the last token: the greedy encoder
    // never follows it with another zero token.
    bool short_zero = false;
    bool nonzero = false;
    size_t i = 0;
    if (n >= kFastDecodeMin) FastDecode(p, body.size(), scale, n, o, &i, &g, &short_zero, &nonzero);
    for (; i < body.size(); ++i) {
      const unsigned char b = p[i];
      if (g == groups) {
        return r.Error(absl::StrCat(body.size() - i, " trailing bytes after the last of ",
                                    groups, " groups (", n, " values)"));
      }
      if (b < k3lcRunBase) {
        const bool zero = b == k3lcZeroGroup;
        if (zero && short_zero) return NonCanonical(body_start + i, b);
        short_zero = zero;
        nonzero |= !zero;
        const std::array<float, kGroup>& t = kDigitTable[b];
        if (g < full_groups) {
          float* dst = o + kGroup * g;
          for (size_t j = 0; j < kGroup; ++j) dst[j] = t[j] * scale;
        } else {
          // The last, partial group: its padding digits must be zeros (digit 1).
          const size_t rem = n - kGroup * g;
          if (b / kPow3[rem] != (kPow3[kGroup - rem] - 1) / 2) {
            return r.Error(absl::StrCat("byte ", body_start + i, " (", b,
                                        ") of the last group has non-zero padding digits (",
                                        rem, " values in the group)"));
          }
          for (size_t j = 0; j < rem; ++j) o[kGroup * g + j] = t[j] * scale;
        }
        ++g;
      } else {
        const size_t run = size_t{b} - k3lcRunBase + k3lcMinRun;
        if (short_zero) return NonCanonical(body_start + i, b);
        if (run > groups - g) {
          return r.Error(absl::StrCat("byte ", body_start + i, " is a run of ", run,
                                      " zero groups from group ", g, ", past the ", groups,
                                      " groups of ", n, " values"));
        }
        const size_t first = kGroup * g;
        std::fill(o + first, o + std::min(first + kGroup * run, n), 0.0f);
        g += run;
        short_zero = run < static_cast<size_t>(k3lcMaxRun);
      }
    }
    if (g != groups) {
      return r.Error(absl::StrCat("payload ends after ", g, " of ", groups, " groups (", n,
                                  " values)"));
    }
    // The encoder writes scale 0 exactly when every digit is zero.
    if (nonzero && scale == 0) return r.Error("scale 0 with non-zero digits");
    if (!nonzero && scale != 0) {
      return r.Error(absl::StrCat("scale ", scale, " with every digit zero (the encoder writes 0)"));
    }
    return absl::OkStatus();
  }

  // Header plus one byte per group (no runs).
  size_t MaxEncodedBytes(size_t numel) const override {
    return 1 + internal::VarintSize(numel) + sizeof(float) + (numel + kGroup - 1) / kGroup;
  }

 private:
  // Decodes the tokens of a long slice without data-dependent branches (group and run
  // tokens alternate unpredictably): out is zeroed first, each group token stores its
  // row of a per-call table of the 243 groups times the scale (the same products as
  // the general loop) as 8 floats, the last 3 zero, and run tokens store a zero row and
  // advance g by the run. It stops 14 groups before the end and leaves *i, *g and the
  // flags for the general loop, which finishes the slice; on a non-canonical token it
  // undoes nothing and leaves *i = 0, so the general loop reports the exact error.
  static void FastDecode(const unsigned char* p, size_t size, float scale, size_t n, float* o,
                         size_t* i_out, size_t* g_out, bool* short_zero_out, bool* nonzero_out) {
    alignas(32) float scaled[256][8] = {};  // rows 243..255 (run tokens) stay zero
    for (size_t b = 0; b < 243; ++b) {
      for (size_t j = 0; j < kGroup; ++j) scaled[b][j] = kDigitTable[b][j] * scale;
    }
    std::memset(o, 0, n * sizeof(float));
    size_t i = 0;
    size_t g = 0;
    size_t short_zero = *short_zero_out;
    size_t nonzero = 0;
    size_t bad = 0;
    // A run covers at most 14 groups; 8 floats from group g fit while 5 g + 8 <= n.
    const size_t stop = n >= kGroup * k3lcMaxRun + 8 ? (n - 8) / kGroup - k3lcMaxRun : 0;
    for (; i < size && g <= stop; ++i) {
      const size_t b = p[i];
      const size_t is_run = b >= k3lcRunBase;
      const size_t is_zero_group = b == k3lcZeroGroup;
      const size_t run = is_run * (b - k3lcRunBase + k3lcMinRun);
      bad |= (is_run | is_zero_group) & short_zero;
      short_zero = is_zero_group | (is_run & (run < static_cast<size_t>(k3lcMaxRun)));
      nonzero |= (is_run | is_zero_group) ^ 1;
      std::memcpy(o + kGroup * g, scaled[b], 8 * sizeof(float));
      g += run + (is_run ^ 1);
    }
    if (bad) return;  // the general loop starts over and names the token
    *i_out = i;
    *g_out = g;
    *short_zero_out = short_zero != 0;
    *nonzero_out = nonzero != 0;
  }

  static absl::Status NonCanonical(size_t offset, unsigned char b) {
    return absl::InvalidArgumentError(
        absl::StrCat(kName, ": byte ", offset, " (", b,
                     ") continues a zero run the encoder would have written as one byte"));
  }

  double s_;
  std::string spec_;
  std::vector<unsigned char> scratch_;  // Encode's tokens (one instance encodes from one thread)
};

}  // namespace

namespace internal {
absl::StatusOr<std::unique_ptr<Codec>> Make3lcCodec(Stages stages, const CodecOptions& /*options*/) {
  PS_ASSIGN_OR_RETURN(core::StageArgs args, SingleStage(stages, {"s"}));
  PS_ASSIGN_OR_RETURN(const double s, args.Double("s", 1.0, -std::numeric_limits<double>::infinity()));
  if (!(s >= 1.0 && s < 2.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kName, ": s must lie in [1, 2), got ", FormatNumber(s)));
  }
  return std::unique_ptr<Codec>(std::make_unique<ThreeLcCodec>(s));
}
}  // namespace internal

}  // namespace ps::codecs
