// 3lc's token writer (Put3lcTokens in 3lc_internal.h): the digits of a block's groups
// to the payload's tokens, a chunk of eight groups at a time, without a branch per group
// (a branch per group mispredicts on mixes of zero and non-zero groups, which Gaussian
// data at s = 1 is full of). Two forms write the same bytes, and the tests run both
// (SetPortableKernelsForTesting): plain code, each group's byte by one multiply
// (Pack3lcDigits), and with AVX2 the chunk's eight bytes by byte multiplies and adds in
// vector registers (docs/codecs.md "3lc").
//
// Thread safety: pure functions.
#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "codecs/3lc_internal.h"
#include "codecs/kernels_internal.h"
#include "core/simd.h"

#ifdef PS_HAVE_X86_SIMD
#include <immintrin.h>
#endif

namespace ps::codecs::internal {
namespace {

// The byte that ends a run of 1..13 zero groups (ZeroRunToken): 121 for one, 243 + r - 2
// above.
constexpr auto kRunToken = [] {
  std::array<uint8_t, k3lcMaxRun> token{};  // token[0] = 0: no run
  for (int r = 1; r < k3lcMaxRun; ++r) token[r] = ZeroRunToken(r);
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
    std::memset(w, ZeroRunToken(k3lcMaxRun), full);
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

// The tokens of a chunk of eight groups with the group bytes `bytes`, not all zero
// groups, after `*pending` zero groups: the run before its first non-zero group (its
// 14s first), then the rest of its tokens as one shuffle of its group bytes and the
// short-run tokens, chosen by the pattern of its non-zero groups (kChunkShuffles);
// *pending becomes the zero groups after its last non-zero one. Stores up to 16 bytes
// past what it returns.
__attribute__((always_inline)) inline unsigned char* PutChunk(uint64_t bytes, size_t* pending,
                                                              unsigned char* w) {
  const uint32_t nonzero = NonZeroGroups(bytes);
  const auto first = static_cast<unsigned>(std::countr_zero(nonzero));  // < 8: not all zero
  w = PutZeroRun(*pending + first, w);
  const unsigned mask = nonzero >> first;
  // Built in registers: two 8-byte stores read back as 16 bytes would stall.
  const auto in = reinterpret_cast<Bytes16>(Words2{bytes >> (8 * first), kShortRunTokens});
  Bytes16 control;
  std::memcpy(&control, kChunkShuffles.control[mask], sizeof(control));
  const Bytes16 out = Shuffle(in, control);
  std::memcpy(w, &out, sizeof(out));
  *pending = static_cast<size_t>(std::countl_zero(static_cast<uint8_t>(nonzero)));
  return w + kChunkShuffles.size[mask];
}

// The groups after the last whole chunk, one at a time.
unsigned char* PutTail(const uint8_t* d, size_t groups, size_t* pending, unsigned char* w) {
  for (size_t g = 0; g < groups; ++g, d += k3lcGroup) {
    const uint8_t b = Pack3lcDigits(Load64(d));
    if (b == k3lcZeroGroup) {
      ++*pending;
      continue;
    }
    w = PutZeroRun(*pending, w);
    *w++ = b;
    *pending = 0;
  }
  return w;
}

// Plain code: a chunk of forty digits 1 (eight zero groups) only extends the run;
// otherwise its eight bytes, one multiply each.
PS_VECTOR_CLONES unsigned char* PutTokensPortable(const uint8_t* d, size_t groups, size_t* run,
                                                  unsigned char* w) {
  size_t pending = *run;
  size_t g = 0;
  for (; g + 8 <= groups; g += 8, d += 8 * k3lcGroup) {
    const uint64_t diff = (Load64(d) ^ kOnes) | (Load64(d + 8) ^ kOnes) |
                          (Load64(d + 16) ^ kOnes) | (Load64(d + 24) ^ kOnes) |
                          (Load64(d + 32) ^ kOnes);
    if (diff == 0) {
      pending += 8;
      continue;
    }
    uint64_t bytes = 0;
    for (size_t l = 0; l < 8; ++l) {
      bytes |= uint64_t{Pack3lcDigits(Load64(d + k3lcGroup * l))} << (8 * l);
    }
    w = PutChunk(bytes, &pending, w);
  }
  w = PutTail(d, groups - g, &pending, w);
  *run = pending;
  return w;
}

#ifdef PS_HAVE_X86_SIMD

// 16 bytes at lo and 16 at hi as one register.
PS_TARGET_AVX2 inline __m256i Load2x128(const uint8_t* lo, const uint8_t* hi) {
  return _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi)), 1);
}

// With AVX2: a chunk's forty digits as two groups to each 128-bit lane (16-byte loads
// at 0, 10, 20 and 30 digits), each group's five spread to a 64-bit word; the chunk is
// eight zero groups when every word is 1, 1, 1, 1, 1, 0, 0, 0; otherwise each word's
// digits times 1, 3, 9, 27, 81 are summed (maddubs, madd, then the word's two halves)
// and the eight sums (at most 242, each word's low byte) gathered into eight bytes.
// Reads 6 bytes past the chunk's digits.
PS_TARGET_AVX2 unsigned char* PutTokensAvx2(const uint8_t* d, size_t groups, size_t* run,
                                            unsigned char* w) {
  const __m256i spread = _mm256_setr_epi8(0, 1, 2, 3, 4, -1, -1, -1, 5, 6, 7, 8, 9, -1, -1, -1,
                                          0, 1, 2, 3, 4, -1, -1, -1, 5, 6, 7, 8, 9, -1, -1, -1);
  const __m256i zero_group = _mm256_setr_epi8(1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0,
                                              1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0);
  const __m256i weights = _mm256_setr_epi8(1, 3, 9, 27, 81, 0, 0, 0, 1, 3, 9, 27, 81, 0, 0, 0,
                                           1, 3, 9, 27, 81, 0, 0, 0, 1, 3, 9, 27, 81, 0, 0, 0);
  const __m256i ones = _mm256_set1_epi16(1);
  // Groups 0..3 (lanes: 0, 1 | 2, 3) to bytes 0..3, groups 4..7 to bytes 4..7.
  const __m256i gather_lo =
      _mm256_setr_epi8(0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,  //
                       -1, -1, 0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i gather_hi =
      _mm256_setr_epi8(-1, -1, -1, -1, 0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,  //
                       -1, -1, -1, -1, -1, -1, 0, 8, -1, -1, -1, -1, -1, -1, -1, -1);
  size_t pending = *run;
  size_t g = 0;
  for (; g + 8 <= groups; g += 8, d += 8 * k3lcGroup) {
    const __m256i lo = _mm256_shuffle_epi8(Load2x128(d, d + 10), spread);
    const __m256i hi = _mm256_shuffle_epi8(Load2x128(d + 20, d + 30), spread);
    const __m256i same = _mm256_and_si256(_mm256_cmpeq_epi8(lo, zero_group),
                                          _mm256_cmpeq_epi8(hi, zero_group));
    if (_mm256_movemask_epi8(same) == -1) {
      pending += 8;
      continue;
    }
    __m256i s_lo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, weights), ones);
    __m256i s_hi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, weights), ones);
    s_lo = _mm256_add_epi32(s_lo, _mm256_srli_epi64(s_lo, 32));
    s_hi = _mm256_add_epi32(s_hi, _mm256_srli_epi64(s_hi, 32));
    const __m256i r = _mm256_or_si256(_mm256_shuffle_epi8(s_lo, gather_lo),
                                      _mm256_shuffle_epi8(s_hi, gather_hi));
    const __m128i packed = _mm_or_si128(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    w = PutChunk(static_cast<uint64_t>(_mm_cvtsi128_si64(packed)), &pending, w);
  }
  w = PutTail(d, groups - g, &pending, w);
  *run = pending;
  return w;
}

#endif  // PS_HAVE_X86_SIMD

}  // namespace

unsigned char* Put3lcTokens(const uint8_t* digits, size_t groups, size_t* run, unsigned char* w) {
#ifdef PS_HAVE_X86_SIMD
  if (UseAvx2Kernels()) return PutTokensAvx2(digits, groups, run, w);
#endif
  return PutTokensPortable(digits, groups, run, w);
}

unsigned char* Put3lcZeroRun(size_t run, unsigned char* w) { return PutZeroRun(run, w); }

}  // namespace ps::codecs::internal
