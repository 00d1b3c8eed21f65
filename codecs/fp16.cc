// fp16: IEEE binary16 cast. Wire: version byte, then numel little-endian halves.
// Encoding rounds to nearest even and saturates at +-65504 (half_internal.h).
#include <memory>

#include "absl/strings/str_cat.h"
#include "codecs/codec.h"
#include "codecs/codec_internal.h"
#include "codecs/half_internal.h"
#include "core/fp32_bytes.h"
#include "core/status.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define PS_CODECS_HAVE_F16C_PATH 1
#endif

namespace ps::codecs {
namespace internal {

void FloatsToHalvesPortable(std::span<const float> values, unsigned char* out) {
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t h = FloatToHalf(values[i]);
    out[2 * i] = static_cast<unsigned char>(h & 0xffu);
    out[2 * i + 1] = static_cast<unsigned char>(h >> 8);
  }
}

void HalvesToFloatsPortable(const unsigned char* in, std::span<float> out) {
  for (size_t i = 0; i < out.size(); ++i) out[i] = HalfToFloat(Load16(in, i));
}

#ifdef PS_CODECS_HAVE_F16C_PATH

// Eight values per instruction. Clamping to +-65504 first gives the saturation of
// FloatToHalf (the hardware would round >= 65520 to Inf); below that bound both
// round to nearest even. The immediate selects that rounding regardless of MXCSR.
// The byte stores assume a little-endian host, which x86 is.
__attribute__((target("f16c"))) void FloatsToHalvesF16c(std::span<const float> values,
                                                        unsigned char* out) {
  const __m256 hi = _mm256_set1_ps(kHalfMax);
  const __m256 lo = _mm256_set1_ps(-kHalfMax);
  size_t i = 0;
  for (; i + 8 <= values.size(); i += 8) {
    __m256 v = _mm256_loadu_ps(values.data() + i);
    v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
    const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), h);
  }
  FloatsToHalvesPortable(values.subspan(i), out + 2 * i);
}

// Half -> float is exact; the hardware ignores MXCSR.DAZ for half inputs. NaN
// payloads may differ (signalling NaNs come out quiet), which does not matter: the
// decoder refuses every NaN.
__attribute__((target("f16c"))) void HalvesToFloatsF16c(const unsigned char* in,
                                                        std::span<float> out) {
  size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i));
    _mm256_storeu_ps(out.data() + i, _mm256_cvtph_ps(h));
  }
  HalvesToFloatsPortable(in + 2 * i, out.subspan(i));
}

bool HaveF16c() {
  static const bool have = [] {
    // __builtin_cpu_supports("avx") includes the OS check (XCR0 saves YMM state);
    // clang does not know "f16c", so read its CPUID bit directly.
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx")) return false;
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
    return (ecx & bit_F16C) != 0;
  }();
  return have;
}

#else

void FloatsToHalvesF16c(std::span<const float> values, unsigned char* out) {
  FloatsToHalvesPortable(values, out);
}
void HalvesToFloatsF16c(const unsigned char* in, std::span<float> out) {
  HalvesToFloatsPortable(in, out);
}
bool HaveF16c() { return false; }

#endif

void FloatsToHalves(std::span<const float> values, unsigned char* out) {
  if (HaveF16c()) {
    FloatsToHalvesF16c(values, out);
  } else {
    FloatsToHalvesPortable(values, out);
  }
}

void HalvesToFloats(const unsigned char* in, std::span<float> out) {
  if (HaveF16c()) {
    HalvesToFloatsF16c(in, out);
  } else {
    HalvesToFloatsPortable(in, out);
  }
}

}  // namespace internal

namespace {

constexpr char kFp16Spec[] = "fp16";

class Fp16Codec final : public Codec {
 public:
  Fp16Codec() : Codec(PayloadFormat::kFp16) {}

  std::string_view spec() const override { return kFp16Spec; }

  absl::Status Encode(std::span<const float> values, const EncodeContext& /*ctx*/,
                      std::string* out) override {
    PS_RETURN_IF_ERROR(internal::CheckEncodable(kFp16Spec, values));
    out->resize(MaxEncodedBytes(values.size()));
    (*out)[0] = static_cast<char>(FormatByte(format()));
    internal::FloatsToHalves(values, reinterpret_cast<unsigned char*>(out->data() + 1));
    return absl::OkStatus();
  }

  absl::Status Decode(std::string_view bytes, std::span<float> out) const override {
    PS_RETURN_IF_ERROR(internal::CheckDensePayload(*this, bytes, 2, out.size()));
    const auto* halves = reinterpret_cast<const unsigned char*>(bytes.data() + 1);
    // Convert first, then scan the floats: both passes vectorize, and a half is
    // Inf or NaN exactly when its float is.
    internal::HalvesToFloats(halves, out);
    return internal::CheckDecoded16(kFp16Spec, halves, out);
  }

  // One pass: each block of the pieces widened in the first-level cache, then added to
  // what is held, copied to out and checked.
  absl::Status DecodeAddPieces(std::span<const std::string_view> pieces,
                               std::span<float> held, std::span<float> out) const override {
    return internal::DecodeAddWidened16(*this, &internal::HalvesToFloats, pieces, held, out);
  }

  size_t MaxEncodedBytes(size_t numel) const override { return 1 + 2 * numel; }
};

}  // namespace

namespace internal {
absl::StatusOr<std::unique_ptr<Codec>> MakeFp16Codec(Stages stages, const CodecOptions& /*options*/) {
  PS_RETURN_IF_ERROR(SingleStage(stages, {}).status());
  return std::unique_ptr<Codec>(std::make_unique<Fp16Codec>());
}
}  // namespace internal

}  // namespace ps::codecs
