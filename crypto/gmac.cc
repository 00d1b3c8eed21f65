#include "crypto/gmac.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define PS_GMAC_X86 1
#endif

namespace ps::crypto {
namespace {

struct EvpCipherCtxDeleter {
  void operator()(EVP_CIPHER_CTX* ctx) const { EVP_CIPHER_CTX_free(ctx); }
};
using EvpCipherCtxPtr = std::unique_ptr<EVP_CIPHER_CTX, EvpCipherCtxDeleter>;

// Blocks of 16 bytes that one GHASH step takes: each multiplied by its own power of H,
// the products summed unreduced, one reduction per step.
constexpr size_t kStepBlocks = 32;

#ifdef PS_GMAC_X86

// The field arithmetic works in POLYVAL's representation (RFC 8452, appendix A): a GHASH
// block byte-reversed is a POLYVAL element, H becomes mulX(reversed H), and
//   GHASH_H(X_1..X_n) = reverse(POLYVAL_H'(reverse(X_1)..reverse(X_n))),
// so the carry-less multiplies need no bit reflection. dot(a, b) = a * b * x^-128 mod
// P, P = x^128 + x^127 + x^126 + x^121 + 1.
#define PS_GMAC_SSE __attribute__((target("pclmul,aes,sse4.1,ssse3")))
#define PS_GMAC_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,vpclmulqdq,pclmul,aes,sse4.1,ssse3")))

PS_GMAC_SSE inline __m128i Reverse(__m128i x) {
  return _mm_shuffle_epi8(x, _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}

// (hi * x^128 + lo) * x^-128 mod P, in two Montgomery steps of 64 bits: the low half L0
// of lo is cancelled by adding L0 * P, which leaves L0 * (x^64 + x^63 + x^62 + x^57)
// after the shift: the swap of lo's halves plus L0 times 0xc2 << 56.
PS_GMAC_SSE inline __m128i Reduce(__m128i lo, __m128i hi) {
  const __m128i c = _mm_set_epi64x(static_cast<long long>(0xC200000000000000ull), 0);
  lo = _mm_xor_si128(_mm_shuffle_epi32(lo, 0x4e), _mm_clmulepi64_si128(lo, c, 0x10));
  lo = _mm_xor_si128(_mm_shuffle_epi32(lo, 0x4e), _mm_clmulepi64_si128(lo, c, 0x10));
  return _mm_xor_si128(hi, lo);
}

PS_GMAC_SSE __m128i Dot(__m128i a, __m128i b) {
  __m128i lo = _mm_clmulepi64_si128(a, b, 0x00);
  __m128i hi = _mm_clmulepi64_si128(a, b, 0x11);
  const __m128i mid =
      _mm_xor_si128(_mm_clmulepi64_si128(a, b, 0x01), _mm_clmulepi64_si128(a, b, 0x10));
  lo = _mm_xor_si128(lo, _mm_slli_si128(mid, 8));
  hi = _mm_xor_si128(hi, _mm_srli_si128(mid, 8));
  return Reduce(lo, hi);
}

// x * (the polynomial x) in POLYVAL's field: a shift, and P's low terms where x^127 was set.
PS_GMAC_SSE __m128i MulX(__m128i v) {
  uint64_t q[2];
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), v);
  const uint64_t top = q[1] >> 63;
  q[1] = (q[1] << 1) | (q[0] >> 63);
  q[0] <<= 1;
  q[0] ^= top;                            // + 1
  q[1] ^= (0 - top) & 0xC200000000000000;  // + x^127 + x^126 + x^121
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
}

// AES-256's key schedule with AES-NI (FIPS 197, 5.2): 15 round keys.
PS_GMAC_SSE __m128i ExpandA(__m128i a, __m128i assist) {
  assist = _mm_shuffle_epi32(assist, 0xff);
  a = _mm_xor_si128(a, _mm_slli_si128(a, 4));
  a = _mm_xor_si128(a, _mm_slli_si128(a, 8));
  return _mm_xor_si128(a, assist);
}
PS_GMAC_SSE __m128i ExpandB(__m128i a, __m128i b) {
  const __m128i assist = _mm_shuffle_epi32(_mm_aeskeygenassist_si128(a, 0), 0xaa);
  b = _mm_xor_si128(b, _mm_slli_si128(b, 4));
  b = _mm_xor_si128(b, _mm_slli_si128(b, 8));
  return _mm_xor_si128(b, assist);
}
#define PS_GMAC_ROUND(i, rcon)                                         \
  a = ExpandA(a, _mm_aeskeygenassist_si128(b, rcon));                  \
  rk[i] = a;                                                           \
  if ((i) + 1 < 15) {                                                  \
    b = ExpandB(a, b);                                                 \
    rk[(i) + 1] = b;                                                   \
  }
PS_GMAC_SSE void ExpandKey(const uint8_t* key, __m128i* rk) {
  __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(key));
  __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(key + 16));
  rk[0] = a;
  rk[1] = b;
  PS_GMAC_ROUND(2, 0x01)
  PS_GMAC_ROUND(4, 0x02)
  PS_GMAC_ROUND(6, 0x04)
  PS_GMAC_ROUND(8, 0x08)
  PS_GMAC_ROUND(10, 0x10)
  PS_GMAC_ROUND(12, 0x20)
  PS_GMAC_ROUND(14, 0x40)
}
#undef PS_GMAC_ROUND

PS_GMAC_SSE __m128i Encrypt(const __m128i* rk, __m128i block) {
  block = _mm_xor_si128(block, rk[0]);
  for (int i = 1; i < 14; ++i) block = _mm_aesenc_si128(block, rk[i]);
  return _mm_aesenclast_si128(block, rk[14]);
}

bool CpuHasFastPath() {
  __builtin_cpu_init();
  // __builtin_cpu_supports includes the OS check (XCR0 saves the ZMM state); the
  // carry-less multiply and AES bits come from CPUID, which every compiler names alike.
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512vl")) {
    return false;
  }
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  if ((ecx & bit_AES) == 0 || (ecx & bit_PCLMUL) == 0) return false;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  return (ecx & bit_VPCLMULQDQ) != 0;
}

#endif  // PS_GMAC_X86

}  // namespace

struct Gmac::Keys {
  std::array<uint8_t, kGmacKeyBytes> key{};
#ifdef PS_GMAC_X86
  __m128i round_keys[15];
  // descending[i] = H^(kStepBlocks - i) for i < kStepBlocks, then four zeros: the powers
  // for blocks b..b+3 of a step of r blocks start at descending[kStepBlocks - r + b], and
  // a short last group reads zeros past H^1.
  alignas(64) __m128i descending[kStepBlocks + 4];
#endif
};

void Gmac::KeysDeleter::operator()(Keys* keys) const {
  OPENSSL_cleanse(keys, sizeof(Keys));
  delete keys;
}

#ifdef PS_GMAC_X86
namespace {

// One step: s, then `blocks` (1..kStepBlocks) blocks at p, each multiplied by its power
// of H (the first, with s added, by H^blocks; the last by H), summed and reduced once.
PS_GMAC_AVX512 __m128i Step(const __m128i* descending, __m128i s, const uint8_t* p,
                            size_t blocks) {
  // The masked forms of the broadcast and the extracts: GCC 12's unmasked ones start
  // from a self-initialised register that -Wuninitialized reports.
  const __m512i reverse = _mm512_maskz_broadcast_i32x4(
      0xffff, _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  const __m128i* powers = descending + (kStepBlocks - blocks);
  __m512i lo = _mm512_setzero_si512();
  __m512i hi = lo;
  __m512i mid = lo;
  for (size_t b = 0; b < blocks; b += 4) {
    const size_t in_group = std::min<size_t>(4, blocks - b);
    __m512i x = in_group == 4
                    ? _mm512_loadu_si512(p + 16 * b)
                    : _mm512_maskz_loadu_epi64(static_cast<__mmask8>((1u << (2 * in_group)) - 1),
                                               p + 16 * b);
    x = _mm512_shuffle_epi8(x, reverse);
    if (b == 0) x = _mm512_xor_si512(x, _mm512_zextsi128_si512(s));
    const __m512i h = _mm512_loadu_si512(powers + b);
    lo = _mm512_xor_si512(lo, _mm512_clmulepi64_epi128(x, h, 0x00));
    hi = _mm512_xor_si512(hi, _mm512_clmulepi64_epi128(x, h, 0x11));
    mid = _mm512_ternarylogic_epi64(mid, _mm512_clmulepi64_epi128(x, h, 0x01),
                                    _mm512_clmulepi64_epi128(x, h, 0x10), 0x96);
  }
  lo = _mm512_xor_si512(lo, _mm512_bslli_epi128(mid, 8));
  hi = _mm512_xor_si512(hi, _mm512_bsrli_epi128(mid, 8));
  const __m256i lo2 =
      _mm256_xor_si256(_mm512_maskz_extracti64x4_epi64(0xf, lo, 0), _mm512_maskz_extracti64x4_epi64(0xf, lo, 1));
  const __m256i hi2 =
      _mm256_xor_si256(_mm512_maskz_extracti64x4_epi64(0xf, hi, 0), _mm512_maskz_extracti64x4_epi64(0xf, hi, 1));
  return Reduce(_mm_xor_si128(_mm256_castsi256_si128(lo2), _mm256_extracti128_si256(lo2, 1)),
                _mm_xor_si128(_mm256_castsi256_si128(hi2), _mm256_extracti128_si256(hi2, 1)));
}

PS_GMAC_AVX512 __m128i HashBlocks(const __m128i* descending, __m128i s, const uint8_t* p,
                                  size_t blocks) {
  for (size_t b = 0; b < blocks; b += kStepBlocks) {
    s = Step(descending, s, p + 16 * b, std::min(kStepBlocks, blocks - b));
  }
  return s;
}

PS_GMAC_AVX512 void FastTag(const __m128i* round_keys, const __m128i* descending,
                            std::span<const uint8_t, kGmacNonceBytes> nonce,
                            std::span<const std::string_view> pieces, GmacTag* out) {
  __m128i s = _mm_setzero_si128();
  uint8_t partial[16];
  size_t held = 0;  // bytes in `partial`: a block that pieces share
  uint64_t total = 0;
  for (std::string_view piece : pieces) {
    if (piece.empty()) continue;  // its data() may be null, which memcpy must not get
    const auto* p = reinterpret_cast<const uint8_t*>(piece.data());
    size_t n = piece.size();
    total += n;
    if (held > 0) {
      const size_t take = std::min(16 - held, n);
      std::memcpy(partial + held, p, take);
      held += take;
      p += take;
      n -= take;
      if (held < 16) continue;
      s = Step(descending, s, partial, 1);
      held = 0;
    }
    const size_t blocks = n / 16;
    s = HashBlocks(descending, s, p, blocks);
    held = n - 16 * blocks;
    if (held > 0) std::memcpy(partial, p + 16 * blocks, held);
  }
  if (held > 0) {
    std::memset(partial + held, 0, 16 - held);
    s = Step(descending, s, partial, 1);
  }
  uint8_t lengths[16] = {};
  const uint64_t bits = total * 8;
  for (int i = 0; i < 8; ++i) lengths[7 - i] = static_cast<uint8_t>(bits >> (8 * i));
  s = Step(descending, s, lengths, 1);
  uint8_t j0[16] = {};
  std::memcpy(j0, nonce.data(), kGmacNonceBytes);
  j0[15] = 1;
  const __m128i mask =
      Encrypt(round_keys, _mm_loadu_si128(reinterpret_cast<const __m128i*>(j0)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out->data()), _mm_xor_si128(Reverse(s), mask));
}

PS_GMAC_SSE void SetUpFastPath(const uint8_t* key, __m128i* round_keys, __m128i* descending) {
  ExpandKey(key, round_keys);
  const __m128i h = MulX(Reverse(Encrypt(round_keys, _mm_setzero_si128())));
  __m128i power = h;  // H^1
  for (size_t k = 1; k <= kStepBlocks; ++k) {
    descending[kStepBlocks - k] = power;
    power = Dot(power, h);
  }
  for (size_t i = kStepBlocks; i < kStepBlocks + 4; ++i) descending[i] = _mm_setzero_si128();
}

}  // namespace
#endif  // PS_GMAC_X86

bool Gmac::FastPath() {
#ifdef PS_GMAC_X86
  static const bool fast = CpuHasFastPath();
  return fast;
#else
  return false;
#endif
}

Gmac::Gmac(std::unique_ptr<Keys, KeysDeleter> keys) : keys_(std::move(keys)) {}
Gmac::Gmac(Gmac&&) noexcept = default;
Gmac& Gmac::operator=(Gmac&&) noexcept = default;
Gmac::~Gmac() = default;

absl::StatusOr<Gmac> Gmac::FromKey(std::string_view key) {
  if (key.size() != kGmacKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("GMAC key must have ", kGmacKeyBytes, " bytes, got ", key.size()));
  }
  std::unique_ptr<Keys, KeysDeleter> keys(new Keys);
  std::memcpy(keys->key.data(), key.data(), key.size());
#ifdef PS_GMAC_X86
  if (FastPath()) SetUpFastPath(keys->key.data(), keys->round_keys, keys->descending);
#endif
  return Gmac(std::move(keys));
}

bool Gmac::Tag(std::span<const uint8_t, kGmacNonceBytes> nonce,
               std::span<const std::string_view> pieces, GmacTag* out) const {
#ifdef PS_GMAC_X86
  if (FastPath()) {
    FastTag(keys_->round_keys, keys_->descending, nonce, pieces, out);
    return true;
  }
#endif
  return TagWithOpenSsl(nonce, pieces, out);
}

bool Gmac::TagWithOpenSsl(std::span<const uint8_t, kGmacNonceBytes> nonce,
                          std::span<const std::string_view> pieces, GmacTag* out) const {
  // One context per thread, keyed per call (AES-256's schedule is a few hundred
  // nanoseconds against a datagram's microseconds).
  thread_local EvpCipherCtxPtr ctx(EVP_CIPHER_CTX_new());
  if (ctx == nullptr ||
      EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, keys_->key.data(),
                         nonce.data()) != 1) {
    return false;
  }
  for (std::string_view piece : pieces) {
    // Below 2^31 bytes per update (an int length).
    constexpr size_t kChunk = size_t{1} << 30;
    for (size_t at = 0; at < piece.size(); at += kChunk) {
      int len = 0;
      const size_t n = std::min(kChunk, piece.size() - at);
      if (EVP_EncryptUpdate(ctx.get(), nullptr, &len,
                            reinterpret_cast<const unsigned char*>(piece.data() + at),
                            static_cast<int>(n)) != 1) {
        return false;
      }
    }
  }
  unsigned char none[16];
  int len = 0;
  return EVP_EncryptFinal_ex(ctx.get(), none, &len) == 1 && len == 0 &&
         EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, kGmacTagBytes, out->data()) == 1;
}

}  // namespace ps::crypto
