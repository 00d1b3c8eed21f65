// Kernels of codecs/kernels_internal.h: each portable loop first, then its AVX2 twin,
// which must give the same bits (the tests run both). Floating-point expressions are
// written out in the same order in both (no fused multiply-add: -std=c++20 turns
// contraction off, and the intrinsics use separate multiplies and adds).
#include "codecs/kernels_internal.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>

#include "core/simd.h"

#ifdef PS_HAVE_X86_SIMD
#include <immintrin.h>
#endif

namespace ps::codecs::internal {
namespace {

std::atomic<bool> force_portable{false};

// ---- portable kernels ----

uint32_t MaxAbsBitsPortable(const float* x, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::bit_cast<uint32_t>(x[i]) & 0x7fffffffu);
  return m;
}

uint32_t MaxAbsDiffBitsPortable(const float* x, const float* y, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::bit_cast<uint32_t>(x[i] - y[i]) & 0x7fffffffu);
  return m;
}

double SumAbsTail(const float* x, size_t begin, size_t n, double acc[8]) {
  for (size_t i = begin; i < n; ++i) acc[i % 8] += std::fabs(double{x[i]});
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

void TernaryDigitsPortable(const float* x, size_t n, float half, uint8_t* digits) {
  for (size_t i = 0; i < n; ++i) {
    digits[i] = TernaryDigit(x[i], half);
  }
}

void PackSignBitsTail(const float* x, size_t begin, size_t n, unsigned char* bits) {
  // begin is a multiple of 8.
  for (size_t i = begin; i < n; i += 8) {
    unsigned byte = 0;
    for (size_t b = 0; b < 8 && i + b < n; ++b) byte |= NegativeBit(x[i + b]) << b;
    bits[i / 8] = static_cast<unsigned char>(byte);
  }
}

void UnpackSignBitsTail(const unsigned char* bits, size_t begin, size_t n, float pos, float neg,
                        float* out) {
  for (size_t i = begin; i < n; ++i) out[i] = ((bits[i / 8] >> (i % 8)) & 1) ? neg : pos;
}

int8_t QuantizeOne(float x, float inv, uint32_t seed, uint32_t index) {
  const float y = x * inv;
  const float z = std::floor(y + RoundingUniform(seed, index));
  return static_cast<int8_t>(std::clamp(z, -127.0f, 127.0f));
}

// The 2-bit code table: kUnitTernary[byte][j] = {0, 1, -1, 0}[code j of byte].
struct UnitTernaryTable {
  float v[256][4];
  constexpr UnitTernaryTable() : v() {
    for (int b = 0; b < 256; ++b) {
      for (int j = 0; j < 4; ++j) {
        const int code = (b >> (2 * j)) & 3;
        v[b][j] = code == 1 ? 1.0f : code == 2 ? -1.0f : 0.0f;
      }
    }
  }
};
constexpr UnitTernaryTable kUnitTernary;

#ifdef PS_HAVE_X86_SIMD

// ---- AVX2 kernels ----

PS_TARGET_AVX2 uint32_t MaxAbsBitsAvx2(const float* x, size_t n) {
  const __m256i mask = _mm256_set1_epi32(0x7fffffff);
  __m256i m0 = _mm256_setzero_si256();
  __m256i m1 = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    m0 = _mm256_max_epu32(
        m0, _mm256_and_si256(mask, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i))));
    m1 = _mm256_max_epu32(
        m1, _mm256_and_si256(mask, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 8))));
  }
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_max_epu32(m0, m1));
  uint32_t m = MaxAbsBitsPortable(x + i, n - i);
  for (uint32_t lane : lanes) m = std::max(m, lane);
  return m;
}

PS_TARGET_AVX2 uint32_t MaxAbsDiffBitsAvx2(const float* x, const float* y, size_t n) {
  const __m256i mask = _mm256_set1_epi32(0x7fffffff);
  __m256i m0 = _mm256_setzero_si256();
  __m256i m1 = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i));
    const __m256 d1 = _mm256_sub_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8));
    m0 = _mm256_max_epu32(m0, _mm256_and_si256(mask, _mm256_castps_si256(d0)));
    m1 = _mm256_max_epu32(m1, _mm256_and_si256(mask, _mm256_castps_si256(d1)));
  }
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_max_epu32(m0, m1));
  uint32_t m = MaxAbsDiffBitsPortable(x + i, y + i, n - i);
  for (uint32_t lane : lanes) m = std::max(m, lane);
  return m;
}

// Lanes 0-3 and 4-7 of the eight partial sums live in two registers.
PS_TARGET_AVX2 double SumAbsAvx2(const float* x, size_t n) {
  const __m256d sign = _mm256_set1_pd(-0.0);
  __m256d lo = _mm256_setzero_pd();
  __m256d hi = _mm256_setzero_pd();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    lo = _mm256_add_pd(lo, _mm256_andnot_pd(sign, _mm256_cvtps_pd(_mm_loadu_ps(x + i))));
    hi = _mm256_add_pd(hi, _mm256_andnot_pd(sign, _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4))));
  }
  double acc[8];
  _mm256_storeu_pd(acc, lo);
  _mm256_storeu_pd(acc + 4, hi);
  return SumAbsTail(x, i, n, acc);
}

PS_TARGET_AVX2 void PackSignBitsAvx2(const float* x, size_t n, unsigned char* bits) {
  const __m256 zero = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    uint32_t word = 0;
    for (int k = 0; k < 4; ++k) {
      const __m256 lt = _mm256_cmp_ps(_mm256_loadu_ps(x + i + 8 * k), zero, _CMP_LT_OQ);
      word |= static_cast<uint32_t>(_mm256_movemask_ps(lt)) << (8 * k);
    }
    std::memcpy(bits + i / 8, &word, 4);  // little-endian host
  }
  PackSignBitsTail(x, i, n, bits);
}

PS_TARGET_AVX2 void UnpackSignBitsAvx2(const unsigned char* bits, size_t n, float pos, float neg,
                                       float* out) {
  const __m256i select = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256 vpos = _mm256_set1_ps(pos);
  const __m256 vneg = _mm256_set1_ps(neg);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i b = _mm256_set1_epi32(bits[i / 8]);
    const __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(b, select), select);
    _mm256_storeu_ps(out + i, _mm256_blendv_ps(vpos, vneg, _mm256_castsi256_ps(set)));
  }
  UnpackSignBitsTail(bits, i, n, pos, neg, out);
}

// Eight RoundingUniform() values for indices first .. first + 7: the first multiply
// of the hash is folded into a scalar start plus constant lane offsets (mod 2^32).
PS_TARGET_AVX2 inline __m256 UniformAvx2(__m256i seed, uint32_t first) {
  constexpr uint32_t kGolden = 0x9e3779b9u;
  const __m256i lanes = _mm256_setr_epi32(0, static_cast<int>(kGolden), static_cast<int>(2 * kGolden),
                                          static_cast<int>(3 * kGolden), static_cast<int>(4 * kGolden),
                                          static_cast<int>(5 * kGolden), static_cast<int>(6 * kGolden),
                                          static_cast<int>(7 * kGolden));
  __m256i h = _mm256_add_epi32(
      _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(first * kGolden)), lanes), seed);
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(0x7feb352d));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 15));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(0x846ca68bu)));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(h, 8)), _mm256_set1_ps(0x1p-24f));
}

// Four vectors of eight int32 (in [-128, 127], or [0, 255] unsigned) to 32 bytes in
// order: packing interleaves 128-bit lanes, which the final permute undoes.
PS_TARGET_AVX2 inline __m256i PackBytes(__m256i a, __m256i b, __m256i c, __m256i d,
                                        bool is_signed) {
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i ab = _mm256_packs_epi32(a, b);
  const __m256i cd = _mm256_packs_epi32(c, d);
  const __m256i bytes = is_signed ? _mm256_packs_epi16(ab, cd) : _mm256_packus_epi16(ab, cd);
  return _mm256_permutevar8x32_epi32(bytes, order);
}

// 32 values per step: two compares give masks of -1, their negated sum is the digit.
PS_TARGET_AVX2 void TernaryDigitsAvx2(const float* x, size_t n, float half, uint8_t* digits) {
  const __m256 hi = _mm256_set1_ps(half);
  const __m256 lo = _mm256_set1_ps(-half);
  const __m256i zero = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i q[4];
    for (int k = 0; k < 4; ++k) {
      const __m256 v = _mm256_loadu_ps(x + i + 8 * k);
      const __m256i ge = _mm256_castps_si256(_mm256_cmp_ps(v, hi, _CMP_GE_OQ));
      const __m256i gt = _mm256_castps_si256(_mm256_cmp_ps(v, lo, _CMP_GT_OQ));
      q[k] = _mm256_sub_epi32(zero, _mm256_add_epi32(ge, gt));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(digits + i), PackBytes(q[0], q[1], q[2], q[3], false));
  }
  TernaryDigitsPortable(x + i, n - i, half, digits + i);
}

PS_TARGET_AVX2 void QuantizeInt8Avx2(const float* x, size_t n, float inv, uint32_t seed,
                                     uint32_t first, int8_t* q) {
  const __m256i vseed = _mm256_set1_epi32(static_cast<int>(seed));
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256 lo = _mm256_set1_ps(-127.0f);
  const __m256 hi = _mm256_set1_ps(127.0f);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i v[4];
    for (int k = 0; k < 4; ++k) {
      const size_t at = i + 8 * static_cast<size_t>(k);
      const __m256 y = _mm256_mul_ps(_mm256_loadu_ps(x + at), vinv);
      const __m256 z = _mm256_floor_ps(_mm256_add_ps(y, UniformAvx2(vseed, first + static_cast<uint32_t>(at))));
      v[k] = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(z, lo), hi));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), PackBytes(v[0], v[1], v[2], v[3], true));
  }
  for (; i < n; ++i) q[i] = QuantizeOne(x[i], inv, seed, first + static_cast<uint32_t>(i));
}

PS_TARGET_AVX2 void DequantizeInt8Avx2(const int8_t* q, size_t n, float scale, float* out) {
  const __m256 vscale = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    int64_t eight;
    std::memcpy(&eight, q + i, 8);
    const __m256i w = _mm256_cvtepi8_epi32(_mm_cvtsi64_si128(eight));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtepi32_ps(w), vscale));
  }
  for (; i < n; ++i) out[i] = static_cast<float>(q[i]) * scale;
}

PS_TARGET_AVX2 bool HasInt8MinimumAvx2(const int8_t* q, size_t n) {
  const __m256i minimum = _mm256_set1_epi8(-128);
  __m256i any = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    any = _mm256_or_si256(
        any, _mm256_cmpeq_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i)), minimum));
  }
  if (!_mm256_testz_si256(any, any)) return true;
  for (; i < n; ++i) {
    if (q[i] == -128) return true;
  }
  return false;
}

PS_TARGET_AVX2 void TernarizeStochasticAvx2(const float* x, size_t n, float inv, uint32_t seed,
                                            uint32_t first, uint8_t* code) {
  const __m256i vseed = _mm256_set1_epi32(static_cast<int>(seed));
  const __m256i one = _mm256_set1_epi32(1);
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 zero = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i v[4];
    for (int k = 0; k < 4; ++k) {
      const size_t at = i + 8 * static_cast<size_t>(k);
      const __m256 xv = _mm256_loadu_ps(x + at);
      const __m256 a = _mm256_mul_ps(_mm256_and_ps(xv, abs_mask), vinv);
      const __m256i keep = _mm256_castps_si256(_mm256_cmp_ps(UniformAvx2(vseed, first + static_cast<uint32_t>(at)), a, _CMP_LT_OQ));
      const __m256i neg = _mm256_castps_si256(_mm256_cmp_ps(xv, zero, _CMP_LT_OQ));
      v[k] = _mm256_and_si256(keep, _mm256_add_epi32(one, _mm256_and_si256(neg, one)));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(code + i), PackBytes(v[0], v[1], v[2], v[3], false));
  }
  for (; i < n; ++i) code[i] = TernaryCode(x[i], inv, seed, first + static_cast<uint32_t>(i));
}

PS_TARGET_AVX2 void UnpackTernary2Avx2(const unsigned char* packed, size_t begin, size_t end,
                                       float scale, float* out) {
  const __m256 vscale = _mm256_set1_ps(scale);
  size_t i = begin;
  for (; i < end && i % 4 != 0; ++i) out[i] = kUnitTernary.v[packed[i / 4]][i % 4] * scale;
  for (; i + 8 <= end; i += 8) {
    const __m256 unit = _mm256_loadu2_m128(kUnitTernary.v[packed[i / 4 + 1]], kUnitTernary.v[packed[i / 4]]);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(unit, vscale));
  }
  for (; i < end; ++i) out[i] = kUnitTernary.v[packed[i / 4]][i % 4] * scale;
}

#endif  // PS_HAVE_X86_SIMD

}  // namespace

bool SetPortableKernelsForTesting(bool portable) {
  force_portable.store(portable, std::memory_order_relaxed);
  return core::CpuHasAvx2();
}

bool UseAvx2Kernels() {
  return core::CpuHasAvx2() && !force_portable.load(std::memory_order_relaxed);
}

#ifdef PS_HAVE_X86_SIMD
#define PS_DISPATCH_AVX2(call) \
  if (UseAvx2Kernels()) return call
#else
#define PS_DISPATCH_AVX2(call)
#endif

uint32_t MaxAbsBits(const float* x, size_t n) {
  PS_DISPATCH_AVX2(MaxAbsBitsAvx2(x, n));
  return MaxAbsBitsPortable(x, n);
}

uint32_t MaxAbsDiffBits(const float* x, const float* y, size_t n) {
  PS_DISPATCH_AVX2(MaxAbsDiffBitsAvx2(x, y, n));
  return MaxAbsDiffBitsPortable(x, y, n);
}

void TernaryDigits(const float* x, size_t n, float half, uint8_t* digits) {
  PS_DISPATCH_AVX2(TernaryDigitsAvx2(x, n, half, digits));
  TernaryDigitsPortable(x, n, half, digits);
}

double SumAbs(const float* x, size_t n) {
  PS_DISPATCH_AVX2(SumAbsAvx2(x, n));
  double acc[8] = {};
  return SumAbsTail(x, 0, n, acc);
}

void PackSignBits(const float* x, size_t n, unsigned char* bits) {
  PS_DISPATCH_AVX2(PackSignBitsAvx2(x, n, bits));
  PackSignBitsTail(x, 0, n, bits);
}

void UnpackSignBits(const unsigned char* bits, size_t n, float pos, float neg, float* out) {
  PS_DISPATCH_AVX2(UnpackSignBitsAvx2(bits, n, pos, neg, out));
  UnpackSignBitsTail(bits, 0, n, pos, neg, out);
}

void QuantizeInt8(const float* x, size_t n, float inv, uint32_t seed, uint32_t first, int8_t* q) {
  PS_DISPATCH_AVX2(QuantizeInt8Avx2(x, n, inv, seed, first, q));
  for (size_t i = 0; i < n; ++i) q[i] = QuantizeOne(x[i], inv, seed, first + static_cast<uint32_t>(i));
}

void DequantizeInt8(const int8_t* q, size_t n, float scale, float* out) {
  PS_DISPATCH_AVX2(DequantizeInt8Avx2(q, n, scale, out));
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(q[i]) * scale;
}

bool HasInt8Minimum(const int8_t* q, size_t n) {
  PS_DISPATCH_AVX2(HasInt8MinimumAvx2(q, n));
  return std::find(q, q + n, int8_t{-128}) != q + n;
}

void TernarizeStochastic(const float* x, size_t n, float inv, uint32_t seed, uint32_t first,
                         uint8_t* code) {
  PS_DISPATCH_AVX2(TernarizeStochasticAvx2(x, n, inv, seed, first, code));
  for (size_t i = 0; i < n; ++i) code[i] = TernaryCode(x[i], inv, seed, first + static_cast<uint32_t>(i));
}

void PackCodes2(const uint8_t* codes, size_t n, unsigned char* packed) {
  for (size_t g = 0; 4 * g < n; ++g) {
    uint32_t w;
    std::memcpy(&w, codes + 4 * g, 4);  // little-endian host
    packed[g] = PackCodes4(w);
  }
}

void UnpackTernary2(const unsigned char* packed, size_t begin, size_t end, float scale, float* out) {
  PS_DISPATCH_AVX2(UnpackTernary2Avx2(packed, begin, end, scale, out));
  for (size_t i = begin; i < end; ++i) out[i] = kUnitTernary.v[packed[i / 4]][i % 4] * scale;
}

ptrdiff_t FindCode3(const unsigned char* packed, size_t n) {
  const size_t bytes = (n + 3) / 4;
  size_t b = 0;
  for (; b + 8 <= bytes; b += 8) {
    uint64_t w;
    std::memcpy(&w, packed + b, 8);
    if ((w & (w >> 1) & 0x5555555555555555ull) != 0) break;
  }
  for (; b < bytes; ++b) {
    const unsigned v = packed[b];
    for (size_t j = 0; j < 4 && 4 * b + j < n; ++j) {
      if (((v >> (2 * j)) & 3) == 3) return static_cast<ptrdiff_t>(4 * b + j);
    }
  }
  return -1;
}

#undef PS_DISPATCH_AVX2

}  // namespace ps::codecs::internal
