// 3lc's decoder (the format and the encoder: 3lc.cc; docs/codecs.md "3lc"). A long
// slice goes through FastDecode: one 8-byte row of digits stored per token, no branch
// on the token's kind, the format's rules (canonical runs, a non-zero digit exactly when the
// scale is not 0) checked afterwards by a vectorized scan of the token bytes; a payload
// the scan calls non-canonical, the tail of a slice and every short slice go through
// the general loop, which names the offending byte.
//
// Thread safety: pure functions.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codecs/3lc_internal.h"
#include "codecs/codec.h"
#include "codecs/codec_internal.h"
#include "codecs/compressed.h"
#include "codecs/wire_internal.h"
#include "core/fp32_bytes.h"
#include "core/scratch.h"
#include "core/simd.h"
#include "core/status.h"

namespace ps::codecs::internal {

namespace {

constexpr size_t kGroup = k3lcGroup;
constexpr int kPow3[kGroup + 1] = {1, 3, 9, 27, 81, 243};

// Slices at least this long decode through FastDecode.
constexpr size_t kFastDecodeMin = 4096;

// Groups a token covers: one for a group token, its run for a run token.
constexpr std::array<uint8_t, 256> kAdvance = [] {
  std::array<uint8_t, 256> advance{};
  for (int b = 0; b < 256; ++b) {
    advance[b] = static_cast<uint8_t>(b >= k3lcRunBase ? b - k3lcRunBase + k3lcMinRun : 1);
  }
  return advance;
}();

// 1 for a zero group or a run token, else 0; 1 for a zero token that is not a run of
// 14 (the greedy encoder never writes a zero token after one), else 0.
inline uint8_t ZeroToken(uint8_t b) {
  return static_cast<uint8_t>((b >= k3lcRunBase) | (b == k3lcZeroGroup));
}
inline uint8_t ShortZeroToken(uint8_t b) {
  return static_cast<uint8_t>(ZeroToken(b) & (b != ZeroRunToken(k3lcMaxRun)));
}
// ScanTokens over kScanBlock tokens at p, each after the byte before it (p[-1] is a
// token too): a fixed count of byte operations, which GCC vectorizes at -O2.
constexpr size_t kScanBlock = 64;
PS_VECTOR_CLONES void ScanTokenBlock(const unsigned char* p, uint8_t* bad_io, uint8_t* nonzero_io) {
  uint8_t bad = 0;
  uint8_t nonzero = 0;
  const unsigned char* const before = p - 1;  // before[k] = p[k - 1], without k - 1 wrapping
  for (size_t k = 0; k < kScanBlock; ++k) {
    bad |= ZeroToken(p[k]) & ShortZeroToken(before[k]);
    nonzero |= ZeroToken(p[k]) ^ 1;
  }
  *bad_io |= bad;
  *nonzero_io |= nonzero;
}

absl::Status NonCanonical(size_t offset, unsigned char b) {
  return absl::InvalidArgumentError(
      absl::StrCat(k3lcName, ": byte ", offset, " (", b,
                   ") continues a zero run the encoder would have written as one byte"));
}

// The digits (t + 1: 0, 1 or 2) of each token byte as 8 bytes, little-endian: a group
// token's five digits and then three 1s (t = 0); a run token's eight 1s.
constexpr auto kDigitBytes = [] {
  std::array<uint64_t, 256> bytes{};
  for (int b = 0; b < 256; ++b) {
    uint64_t v = 0;
    for (size_t j = 0; j < 8; ++j) {
      const uint64_t digit = b < k3lcRunBase && j < kGroup ? uint64_t(b / kPow3[j] % 3) : 1;
      v |= digit << (8 * j);
    }
    bytes[b] = v;
  }
  return bytes;
}();

// What a decoding does with the values: writes them (Decode3lc), adds them to what is
// held (Decode3lcAdd), nothing, only checking the payload (Check3lc), or writes their
// digits, a byte each (Mean3lc).
enum class Sink { kWrite, kAdd, kCheck, kDigits };

// The values of the first `count` of a group token's digits (kDigitBytes: digit j in
// byte j) at out[at]; with kAdd, held[at + j] plus each; nothing with kCheck.
template <Sink kSink>
void Put(uint64_t digits, float scale, size_t count, const float* held, float* out, size_t at) {
  if constexpr (kSink == Sink::kCheck || kSink == Sink::kDigits) return;
  for (size_t j = 0; j < count; ++j) {
    const float value = Value3lcDigit(static_cast<uint8_t>(digits >> (8 * j)), scale);
    if constexpr (kSink == Sink::kAdd) {
      out[at + j] = held[at + j] + value;
    } else {
      out[at + j] = value;
    }
  }
}

// FastDecode's token flags: whether the last token was a zero group or a run shorter
// than 14 (the next may not be a zero token then), whether any token was a group with
// a non-zero digit, and whether a zero token followed such a short one.
struct Flags {
  bool short_zero = false;
  bool nonzero = false;
  bool bad = false;
};

// The flags of the `count` tokens at p, after those *flags describes.
void ScanTokens(const unsigned char* p, size_t count, Flags* flags) {
  if (count == 0) return;
  uint8_t bad = static_cast<uint8_t>(flags->bad | (ZeroToken(p[0]) & flags->short_zero));
  uint8_t nonzero = static_cast<uint8_t>(flags->nonzero | (ZeroToken(p[0]) ^ 1));
  size_t k = 1;
  for (; k + kScanBlock <= count; k += kScanBlock) ScanTokenBlock(p + k, &bad, &nonzero);
  for (; k < count; ++k) {
    bad |= ZeroToken(p[k]) & ShortZeroToken(p[k - 1]);
    nonzero |= ZeroToken(p[k]) ^ 1;
  }
  *flags = Flags{.short_zero = ShortZeroToken(p[count - 1]) != 0,
                 .nonzero = nonzero != 0,
                 .bad = bad != 0};
}

// FastDecode's loop from token *i and group *g, while g <= stop and g < end: each
// token's 8 digit bytes (kDigitBytes) stored at digits + 5 (g - first), `digits`
// holding the digits from group `first` on and filled with 1s (zeros) beforehand, so a
// run's groups after its first keep theirs; g advanced by the token's groups
// (kAdvance). The flags of the tokens it took are found after it, in a pass over their
// bytes that vectorizes (ScanTokens), so the loop does no more per token than its load,
// its store and its advance.
void DigitTokens(const unsigned char* p, size_t size, size_t stop, size_t end, uint8_t* digits,
                 size_t first, size_t* i_io, size_t* g_io, Flags* flags) {
  const size_t from = *i_io;
  size_t i = from;
  size_t g = *g_io;
  const size_t g_end = std::min(stop + 1, end);  // g <= stop && g < end
  for (; i < size && g < g_end; ++i) {
    const size_t b = p[i];
    std::memcpy(digits + kGroup * (g - first), &kDigitBytes[b], sizeof(uint64_t));
    g += kAdvance[b];
  }
  ScanTokens(p + from, i - from, flags);
  *i_io = i;
  *g_io = g;
}

// DigitTokens without the stores, for a check: each token only advances g.
void WalkTokens(const unsigned char* p, size_t size, size_t stop, size_t* i_io, size_t* g_io,
                Flags* flags) {
  const size_t from = *i_io;
  size_t i = from;
  size_t g = *g_io;
  for (; i < size && g <= stop; ++i) g += kAdvance[p[i]];
  ScanTokens(p + from, i - from, flags);
  *i_io = i;
  *g_io = g;
}

// Blocks of values the digit loops take at a fixed count, which GCC vectorizes at -O2.
constexpr size_t kDigitBlock = 256;

// out[k] = (digit_k - 1) x scale: the product the general loop makes (Put).
PS_VECTOR_CLONES void WriteDigitBlock(const uint8_t* __restrict digits, float scale,
                                      float* __restrict out) {
  for (size_t k = 0; k < kDigitBlock; ++k) out[k] = Value3lcDigit(digits[k], scale);
}
// held[k] = held[k] + (digit_k - 1) x scale (Add3lcDigits).
PS_VECTOR_CLONES void AddDigitBlockInPlace(const uint8_t* __restrict digits, float scale,
                                           float* __restrict held) {
  for (size_t k = 0; k < kDigitBlock; ++k) held[k] = held[k] + Value3lcDigit(digits[k], scale);
}
// held[k] = out[k] = held[k] + (digit_k - 1) x scale (Put's product, then its
// addition); whether every sum is finite.
PS_VECTOR_CLONES bool AddDigitBlock(const uint8_t* __restrict digits, float scale,
                                    float* __restrict held, float* __restrict out) {
  uint32_t bad = 0;
  for (size_t k = 0; k < kDigitBlock; ++k) {
    const float sum = held[k] + Value3lcDigit(digits[k], scale);
    held[k] = sum;
    out[k] = sum;
    bad |= core::NonFiniteBit(sum);
  }
  return bad == 0;
}

// The values of `count` digits with kWrite (to out) or kAdd (to held and out): whole
// blocks, then the rest one by one with the same arithmetic. kAdd: whether every sum
// is finite.
template <Sink kSink>
bool PutDigits(const uint8_t* digits, size_t count, float scale, float* held, float* out) {
  uint32_t bad = 0;
  size_t k = 0;
  for (; k + kDigitBlock <= count; k += kDigitBlock) {
    if constexpr (kSink == Sink::kAdd) {
      bad |= AddDigitBlock(digits + k, scale, held + k, out + k) ? 0 : 1;
    } else {
      WriteDigitBlock(digits + k, scale, out + k);
    }
  }
  for (; k < count; ++k) {
    const float value = Value3lcDigit(digits[k], scale);
    if constexpr (kSink == Sink::kAdd) {
      held[k] = held[k] + value;
      out[k] = held[k];
      bad |= core::NonFiniteBit(held[k]);
    } else {
      out[k] = value;
    }
  }
  return bad == 0;
}

constexpr size_t kDigitGroups = 1024;  // 5120 values: twenty whole digit blocks

// FastDecode's stores (kWrite, kAdd): the tokens' digits into a buffer of kDigitGroups
// groups in the first-level cache, then its values (PutDigits) before the next.
template <Sink kSink>
void FillTokens(const unsigned char* p, size_t size, float scale, size_t n, size_t stop,
                float* held, float* o, size_t* i_io, size_t* g_io, Flags* flags,
                bool* finite_out) {
  // A buffer's last token starts before kDigitGroups and may run 13 groups past it; its
  // store writes 8 digits.
  alignas(64) uint8_t digits[kGroup * (kDigitGroups + k3lcMaxRun) + 8];
  size_t i = *i_io;
  size_t g = *g_io;
  bool finite = true;
  while (i < size && g <= stop) {
    const size_t first = g;
    std::memset(digits, 1, sizeof(digits));
    DigitTokens(p, size, stop, first + kDigitGroups, digits, first, &i, &g, flags);
    const size_t begin = kGroup * first;
    const size_t count = std::min(kGroup * g, n) - begin;
    // held is null but for kAdd: no offset is applied to it then.
    float* const held_at = kSink == Sink::kAdd ? held + begin : nullptr;
    finite &= PutDigits<kSink>(digits, count, scale, held_at, o + begin);
  }
  if constexpr (kSink == Sink::kAdd) *finite_out = finite;
  *i_io = i;
  *g_io = g;
}

// Decodes the tokens of a long slice without data-dependent branches (group and run
// tokens alternate unpredictably), a buffer of kDigitGroups groups at a time in the
// first-level cache: the buffer is filled with the digit of a zero (1), each token
// stores its digits as 8 bytes (kDigitBytes: a group's five and three of zeros; a run's
// first eight of zeros, the rest of its run's already there) and advances g by its groups, and then the
// buffer's values are written (kWrite: (digit - 1) x scale, the general loop's product)
// or added to what is held and written to out (kAdd, with the finite check:
// *finite_out) in one vectorized pass before the next buffer. out is written once,
// sequentially, and held read and written once; the scattered stores stay in the cache
// and move a byte per value, not a float. It stops 14 groups before the end and leaves
// *i, *g and the flags for the general loop, which finishes the slice; on a
// non-canonical token it undoes nothing and leaves *i = 0, so the general loop reports
// the exact error. With kCheck the tokens are only walked (WalkTokens).
template <Sink kSink>
void FastDecode(const unsigned char* p, size_t size, float scale, size_t n, float* held,
                float* o, uint8_t* digits_out, size_t* i_out, size_t* g_out,
                bool* short_zero_out, bool* nonzero_out, bool* finite_out) {
  size_t i = 0;
  size_t g = 0;
  Flags flags{.short_zero = *short_zero_out};
  // A run covers at most 14 groups; 8 floats from group g fit while 5 g + 8 <= n.
  const size_t stop = n >= kGroup * k3lcMaxRun + 8 ? (n - 8) / kGroup - k3lcMaxRun : 0;
  if constexpr (kSink == Sink::kCheck) {
    WalkTokens(p, size, stop, &i, &g, &flags);
  } else if constexpr (kSink == Sink::kDigits) {
    // Straight into the caller's row: filled with zeros' digit, then a token's 8 bytes
    // each, which end within the row up to `stop`.
    std::memset(digits_out, 1, n);
    DigitTokens(p, size, stop, stop + 1, digits_out, 0, &i, &g, &flags);
  } else {
    FillTokens<kSink>(p, size, scale, n, stop, held, o, &i, &g, &flags, finite_out);
  }
  if (flags.bad) return;  // the general loop starts over and names the token
  *i_out = i;
  *g_out = g;
  *short_zero_out = flags.short_zero;
  *nonzero_out = flags.nonzero;
}

// Decode, or with kAdd the decoded value plus what is held at each index, kept there
// and written to out: held[k] = out[k] = held[k] + (t * scale), the same product and then
// AddInto's addition (zeros too: held + 0 turns a -0 into +0, as the addition after a
// plain decode does). *finite: whether every sum is, checked by FastDecode as it adds,
// then by a scan of what the general loop wrote (at most 78 values of a long slice; all
// of a short one), which is then copied to held.
// With kCheck nothing is written (o and held unused): the same refusals, for a payload
// a shard keeps encoded until its round closes.
template <Sink kSink>
absl::Status DecodeInto(std::string_view bytes, size_t n, float* held, float* o, bool* finite,
                        uint8_t* digits_out = nullptr, float* scale_out = nullptr) {
  WireReader r(k3lcName, bytes);
  PS_RETURN_IF_ERROR(r.Format(PayloadFormat::kThreeLc));
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

  size_t g = 0;
  // A zero group or a run shorter than 14 was the last token: the greedy encoder
  // never follows it with another zero token.
  bool short_zero = false;
  bool nonzero = false;
  size_t i = 0;
  bool fast_finite = true;  // the sums FastDecode wrote (Sink::kAdd), the first 5 g values
  if (n >= kFastDecodeMin) {
    FastDecode<kSink>(p, body.size(), scale, n, held, o, digits_out, &i, &g, &short_zero,
                      &nonzero, &fast_finite);
  }
  const size_t fast_values = std::min(kGroup * g, n);
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
      const size_t count = std::min(kGroup, n - kGroup * g);
      if constexpr (kSink == Sink::kDigits) {
        for (size_t j = 0; j < count; ++j) {
          digits_out[kGroup * g + j] = static_cast<uint8_t>(kDigitBytes[b] >> (8 * j));
        }
      }
      if (g < full_groups) {
        Put<kSink>(kDigitBytes[b], scale, kGroup, held, o, kGroup * g);
      } else {
        // The last, partial group: its padding digits must be zeros (digit 1).
        const size_t rem = n - kGroup * g;
        if (b / kPow3[rem] != (kPow3[kGroup - rem] - 1) / 2) {
          return r.Error(absl::StrCat("byte ", body_start + i, " (", b,
                                      ") of the last group has non-zero padding digits (",
                                      rem, " values in the group)"));
        }
        Put<kSink>(kDigitBytes[b], scale, count, held, o, kGroup * g);
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
      const size_t end = std::min(first + kGroup * run, n);
      if constexpr (kSink == Sink::kAdd) {
        for (size_t k = first; k < end; ++k) o[k] = held[k] + 0.0f;
      } else if constexpr (kSink == Sink::kWrite) {
        std::fill(o + first, o + end, 0.0f);
      } else if constexpr (kSink == Sink::kDigits) {
        std::fill(digits_out + first, digits_out + end, uint8_t{1});
      }
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
  if constexpr (kSink == Sink::kDigits) *scale_out = scale;
  if constexpr (kSink == Sink::kAdd) {
    const std::span<const float> rest(o + fast_values, n - fast_values);
    *finite = fast_finite && core::FindNonFinite(rest) < 0;
    if (!rest.empty()) std::memcpy(held + fast_values, rest.data(), rest.size_bytes());
  }
  return absl::OkStatus();
}

}  // namespace

void Add3lcDigits(const uint8_t* digits, size_t n, float scale, float* held) {
  size_t k = 0;
  for (; k + kDigitBlock <= n; k += kDigitBlock) AddDigitBlockInPlace(digits + k, scale, held + k);
  for (; k < n; ++k) held[k] = held[k] + Value3lcDigit(digits[k], scale);
}

absl::Status Decode3lc(std::string_view bytes, std::span<float> out) {
  return DecodeInto<Sink::kWrite>(bytes, out.size(), nullptr, out.data(), nullptr);
}

absl::Status Decode3lcAdd(std::string_view bytes, float* held, std::span<float> out,
                          bool* finite) {
  return DecodeInto<Sink::kAdd>(bytes, out.size(), held, out.data(), finite);
}

absl::Status Check3lc(std::string_view bytes, size_t n) {
  return DecodeInto<Sink::kCheck>(bytes, n, nullptr, nullptr, nullptr);
}

absl::Status Decode3lcDigits(std::string_view bytes, std::span<uint8_t> digits, float* scale) {
  return DecodeInto<Sink::kDigits>(bytes, digits.size(), nullptr, nullptr, nullptr,
                                   digits.data(), scale);
}

namespace {

// out[c] = (v_0 + v_1 + ... + v_{k-1}) / k for kDigitBlock coordinates, v_j =
// Value3lcDigit(rows[j][c], scales[j]): AverageTile's sums in its order (x_0 + x_1 first;
// one input alone is its value), then its product by 1 / k where k is a power of two
// and its division otherwise.
PS_VECTOR_CLONES void MeanDigitBlock(const uint8_t* const* rows, const float* scales, size_t k,
                                     size_t at, float* __restrict out) {
  alignas(32) float acc[kDigitBlock];
  const uint8_t* __restrict r0 = rows[0] + at;
  const float s0 = scales[0];
  if (k == 1) {
    for (size_t c = 0; c < kDigitBlock; ++c) acc[c] = Value3lcDigit(r0[c], s0);
  } else {
    const uint8_t* __restrict r1 = rows[1] + at;
    const float s1 = scales[1];
    for (size_t c = 0; c < kDigitBlock; ++c) {
      acc[c] = Value3lcDigit(r0[c], s0) + Value3lcDigit(r1[c], s1);
    }
  }
  for (size_t j = 2; j < k; ++j) {
    const uint8_t* __restrict r = rows[j] + at;
    const float s = scales[j];
    for (size_t c = 0; c < kDigitBlock; ++c) acc[c] += Value3lcDigit(r[c], s);
  }
  const float divisor = static_cast<float>(k);
  if ((k & (k - 1)) == 0) {
    const float reciprocal = 1.0f / divisor;
    for (size_t c = 0; c < kDigitBlock; ++c) out[at + c] = acc[c] * reciprocal;
  } else {
    for (size_t c = 0; c < kDigitBlock; ++c) out[at + c] = acc[c] / divisor;
  }
}

}  // namespace

}  // namespace ps::codecs::internal

namespace ps::codecs {

absl::Status Mean3lc(std::span<const std::string_view> payloads, std::span<float> out,
                     const ValueSamples& samples) {
  const size_t n = out.size();
  const size_t k = payloads.size();
  if (k == 0) return absl::InvalidArgumentError("3lc mean of no payloads");
  if (samples.count != 0 &&
      (samples.rows.size() != k || (samples.count - 1) * samples.stride >= n)) {
    return absl::InvalidArgumentError(absl::StrCat("3lc mean: ", samples.rows.size(),
                                                   " sample rows of ", samples.count,
                                                   " values every ", samples.stride, " for ",
                                                   k, " payloads of ", n));
  }
  struct DigitRowsTag;
  const std::span<uint8_t> digits = core::ThreadScratch<uint8_t, DigitRowsTag>(k * n);
  std::vector<const uint8_t*> rows(k);
  std::vector<float> scales(k);
  for (size_t j = 0; j < k; ++j) {
    rows[j] = digits.data() + j * n;
    if (absl::Status st =
            internal::Decode3lcDigits(payloads[j], digits.subspan(j * n, n), &scales[j]);
        !st.ok()) {
      return absl::Status(st.code(), absl::StrCat("payload ", j, ": ", st.message()));
    }
  }
  size_t c = 0;
  for (; c + internal::kDigitBlock <= n; c += internal::kDigitBlock) {
    internal::MeanDigitBlock(rows.data(), scales.data(), k, c, out.data());
  }
  // The rest one by one, with the same arithmetic.
  for (; c < n; ++c) {
    float acc = internal::Value3lcDigit(rows[0][c], scales[0]);
    if (k >= 2) acc = acc + internal::Value3lcDigit(rows[1][c], scales[1]);
    for (size_t j = 2; j < k; ++j) acc += internal::Value3lcDigit(rows[j][c], scales[j]);
    out[c] = (k & (k - 1)) == 0 ? acc * (1.0f / static_cast<float>(k))
                                : acc / static_cast<float>(k);
  }
  for (size_t j = 0; j < k; ++j) {
    for (size_t t = 0; t < samples.count; ++t) {
      samples.rows[j][t] = internal::Value3lcDigit(rows[j][t * samples.stride], scales[j]);
    }
  }
  return absl::OkStatus();
}

}  // namespace ps::codecs
