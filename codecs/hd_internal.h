// The per-value and per-word arithmetic of the codecs that the CPU code and the CUDA
// encoders (codecs/cuda, docs/gpu.md "Encoding on the device") share: one PS_HD
// definition of each rounding, hash and bit packing, so a kernel writes the bytes the
// CPU codec writes and the CPU tests check the definition the kernels run.
//
// Included by nvcc's C++17 passes, so this header uses no abseil, no C++20 library
// (bit casts are __builtin_bit_cast, which g++ and nvcc evaluate in constant
// expressions) and no library calls that device code lacks.
//
// Thread safety: everything here is pure.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/hd.h"

namespace ps::codecs::internal {

PS_HD constexpr uint32_t FloatBits(float f) { return __builtin_bit_cast(uint32_t, f); }
PS_HD constexpr float FloatFromBits(uint32_t bits) { return __builtin_bit_cast(float, bits); }

// The magnitude bits of a float: for finite values their integer order is the order of
// |x|; >= 0x7f800000 means Inf or NaN.
PS_HD constexpr uint32_t AbsBits(float f) { return FloatBits(f) & 0x7fffffffu; }

// ---- fp16 (half_internal.h) ----

inline constexpr uint16_t kHalfMaxBits = 0x7bff;  // 65504, the largest finite half
inline constexpr float kHalfMax = 65504.0f;

// The half nearest to f (ties to even); finite f beyond +-65504 gives +-65504.
PS_HD constexpr uint16_t FloatToHalf(float f) {
  const uint32_t bits = FloatBits(f);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);  // Inf
  // Everything above 65504 saturates; (65504, 65520) would round to 65504 anyway.
  if (abs > FloatBits(kHalfMax)) return static_cast<uint16_t>(sign | kHalfMaxBits);
  const uint32_t exp = abs >> 23;
  const uint32_t mant = abs & 0x7fffffu;
  if (exp >= 113) {
    // Normal half: rebias the exponent (127 -> 15), keep 10 of 23 mantissa bits and
    // round on the 13 dropped ones. A carry out of the mantissa correctly bumps the
    // exponent; it cannot reach Inf because abs <= 65504.
    uint32_t h = ((exp - 112) << 10) | (mant >> 13);
    const uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  // Subnormal half (or zero): the value is m * 2^-24 with m in [0, 1024]. An fp32
  // with exponent field exp is (mant | 2^23) * 2^(exp - 150), so
  // m = (mant | 2^23) >> (126 - exp), rounded. fp32 subnormals (exp == 0) are below
  // 2^-126 and round to zero, as does anything shifted by 25 or more.
  if (exp < 102) return sign;
  const uint32_t full = mant | 0x800000u;
  const uint32_t shift = 126 - exp;  // 14..24
  uint32_t m = full >> shift;
  const uint32_t rest = full & ((1u << shift) - 1);
  const uint32_t half_way = 1u << (shift - 1);
  if (rest > half_way || (rest == half_way && (m & 1u))) ++m;  // m == 1024 is 0x0400
  return static_cast<uint16_t>(sign | m);
}

// The exact fp32 value of a half (subnormals included; Inf and NaN map to Inf and
// NaN with the payload shifted into place).
PS_HD constexpr float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits = 0;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal: m * 2^-24. Move the leading one to bit 10 (the implicit bit of a
    // normal) and lower the exponent by the same amount; every half subnormal is a
    // normal fp32.
    uint32_t shift = 0;  // 1..10
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      ++shift;
    }
    bits = sign | ((113 - shift) << 23) | ((mant & 0x3ffu) << 13);
  }
  return FloatFromBits(bits);
}

// ---- bf16 ----

// Round to nearest even on the 16 bits dropped; a finite value that would round up to
// Inf saturates to +-0x1.fep127 (0x7f7f). The rounding cannot carry out of the sign bit
// for finite input (the largest finite fp32 rounds to 0x7f80'0000, Inf, caught below).
PS_HD constexpr uint16_t FloatToBf16(float value) {
  const uint32_t bits = FloatBits(value);
  const uint32_t rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
  auto out = static_cast<uint16_t>(rounded >> 16);
  if ((out & 0x7fffu) == 0x7f80u) out = static_cast<uint16_t>((out & 0x8000u) | 0x7f7fu);
  return out;
}

PS_HD constexpr float Bf16ToFloat(uint16_t value) { return FloatFromBits(uint32_t{value} << 16); }

// ---- random streams ----

// A 64-bit mix (splitmix64's finalizer) for deriving per-(seed, worker, round, slice)
// random streams and sampled positions.
PS_HD constexpr uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The uniform integer in [0, bound) for 64 random bits (multiply-high; bias at most
// bound / 2^64).
PS_HD inline uint64_t BoundedRandom(uint64_t random, uint64_t bound) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(random, bound);
#else
  __extension__ using U128 = unsigned __int128;
  return static_cast<uint64_t>((static_cast<U128>(random) * bound) >> 64);
#endif
}

// A uniform number in [0, 1) with 24 random bits for value `index` of the stream
// `seed` (a 32-bit mix of StreamSeed()): lowbias32 (Wellons) of index * golden + seed.
// Exact in float (a 24-bit integer times a power of two), so no rounding mode matters.
PS_HD constexpr float RoundingUniform(uint32_t seed, uint32_t index) {
  uint32_t h = index * 0x9e3779b9u + seed;
  h ^= h >> 16;
  h *= 0x7feb352du;
  h ^= h >> 15;
  h *= 0x846ca68bu;
  h ^= h >> 16;
  return static_cast<float>(h >> 8) * 0x1p-24f;
}

// ---- sign ----

// The sign bit a sign payload sends for x: 1 for x < 0, so -0 (and NaN) give 0.
PS_HD constexpr uint32_t NegativeBit(float x) { return x < 0 ? 1u : 0u; }

// ---- terngrad ----

// TernGrad's stochastic ternary code of x for inv = 1 / max|x| of its bucket: 0 unless
// u < |x| * inv (u = RoundingUniform(seed, index)), then 1 for x > 0 and 2 for x < 0.
// One multiply and one compare: no contraction can change it.
PS_HD constexpr uint8_t TernaryCode(float x, float inv, uint32_t seed, uint32_t index) {
  const float a = FloatFromBits(AbsBits(x)) * inv;
  if (!(RoundingUniform(seed, index) < a)) return 0;
  return x < 0 ? 2 : 1;
}

// The byte of four 2-bit codes c0..c3 (each < 4), given as the bytes of the
// little-endian word c0 | c1 << 8 | c2 << 16 | c3 << 24; code j lands in bits 2j, 2j + 1.
// Times 0x01041040 puts c_j at bit 24 + 2j; the other products land below bit 24
// without carrying into it, or above bit 31.
PS_HD constexpr uint8_t PackCodes4(uint32_t four_codes) {
  return static_cast<uint8_t>((four_codes * 0x01041040u) >> 24);
}

// ---- 3lc (3lc_internal.h) ----

// The base-3 digit t + 1 of x for half = M / 2: 2 when x >= half, 0 when x <= -half,
// else 1.
PS_HD constexpr uint8_t TernaryDigit(float x, float half) {
  return static_cast<uint8_t>(static_cast<int>(x >= half) + static_cast<int>(x > -half));
}

// The 3lc byte of five digits (each 0, 1 or 2) given as the low five bytes of the
// little-endian word `digits` (the bytes above are ignored): sum of d_j * 3^j. One
// multiply: d_j * 3^j lands in byte 4 of the product; no lower byte sum exceeds 242, so
// nothing carries into it.
PS_HD constexpr uint8_t Pack3lcDigits(uint64_t digits) {
  constexpr uint64_t kWeights = (1ull << 32) | (3ull << 24) | (9ull << 16) | (27ull << 8) | 81ull;
  return static_cast<uint8_t>(((digits & 0xff'ffff'ffffull) * kWeights) >> 32);
}

// A byte below 243 holds five base-3 digits; all five zero: 1 + 3 + 9 + 27 + 81.
inline constexpr uint8_t k3lcZeroGroup = 121;
// Bytes 243..255: a run of 2..14 all-zero groups (243 + r - 2).
inline constexpr uint8_t k3lcRunBase = 243;
inline constexpr int k3lcMinRun = 2;
inline constexpr int k3lcMaxRun = 14;

// The greedy tokens of a run of r zero groups: a 255 (14 groups) for each full 14,
// then one token for the remainder: 121 for one group, 243 + rem - 2 for 2..13.
PS_HD constexpr uint8_t ZeroRunToken(uint64_t rem) {
  return rem == 1 ? k3lcZeroGroup : static_cast<uint8_t>(k3lcRunBase + rem - k3lcMinRun);
}
PS_HD constexpr uint64_t ZeroRunTokenCount(uint64_t r) {
  return r / k3lcMaxRun + (r % k3lcMaxRun != 0 ? 1 : 0);
}
// Writes the ZeroRunTokenCount(r) tokens of a run of r zero groups at w.
PS_HD inline void WriteZeroRun(uint64_t r, unsigned char* w) {
  for (uint64_t j = 0; j < r / k3lcMaxRun; ++j) *w++ = ZeroRunToken(k3lcMaxRun);
  if (r % k3lcMaxRun != 0) *w = ZeroRunToken(r % k3lcMaxRun);
}

// ---- top-k ----

// One step of a radix select for the k-th largest key: `hist` counts the candidate
// keys by the next digit (bins values, bin b holding digit b). Returns the digit of the
// k-th largest (1 <= k <= the candidates), walking down from the top bin, and adds to
// *above the candidates in higher bins; the k-th largest is then the
// (k - those)-th largest inside the returned bin.
PS_HD inline uint32_t SelectBin(const uint32_t* hist, uint32_t bins, uint64_t k, uint64_t* above) {
  uint64_t seen = 0;
  uint32_t bin = bins - 1;
  for (; bin > 0; --bin) {
    if (seen + hist[bin] >= k) break;
    seen += hist[bin];
  }
  *above += seen;
  return bin;
}

// Where a coordinate goes in a top-k selection's output (sorted by index) when it keeps
// every key > T and the first `need` keys == T in index order: `greater` and `equal`
// say how its key compares with T, `greater_before` and `equal_before` count the
// coordinates before it of each kind. The slot, or -1 when it is not kept.
PS_HD constexpr int64_t TopkSlot(bool greater, bool equal, uint64_t greater_before,
                                 uint64_t equal_before, uint64_t need) {
  if (!greater && !(equal && equal_before < need)) return -1;
  return static_cast<int64_t>(greater_before + (equal_before < need ? equal_before : need));
}

}  // namespace ps::codecs::internal
