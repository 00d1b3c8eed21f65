// bf16: bfloat16 cast (the upper 16 bits of an fp32). Wire: version byte, then numel
// little-endian bf16 values. Encoding rounds to nearest even; a finite value that
// would round up to Inf (above 0x1.fefffep127) saturates to the largest finite bf16,
// +-0x1.fep127 (FloatToBf16 in hd_internal.h). bf16 keeps fp32's exponent range, so no gradient underflows or
// overflows the way fp16's can; it keeps 8 significant bits instead of 11.
#include <cstdint>
#include <memory>

#include "absl/strings/str_cat.h"
#include "codecs/codec.h"
#include "codecs/codec_internal.h"
#include "core/fp32_bytes.h"
#include "core/status.h"

namespace ps::codecs {
namespace {

constexpr char kBf16Spec[] = "bf16";

// The floats of out.size() little-endian bf16 words.
void Widen(const unsigned char* words, std::span<float> out) {
  for (size_t i = 0; i < out.size(); ++i) out[i] = internal::Bf16ToFloat(internal::Load16(words, i));
}

class Bf16Codec final : public Codec {
 public:
  Bf16Codec() : Codec(PayloadFormat::kBf16) {}

  std::string_view spec() const override { return kBf16Spec; }

  absl::Status Encode(std::span<const float> values, const EncodeContext& /*ctx*/,
                      std::string* out) override {
    PS_RETURN_IF_ERROR(internal::CheckEncodable(kBf16Spec, values));
    out->resize(MaxEncodedBytes(values.size()));
    (*out)[0] = static_cast<char>(FormatByte(format()));
    auto* dst = reinterpret_cast<unsigned char*>(out->data() + 1);
    for (size_t i = 0; i < values.size(); ++i) {
      const uint16_t h = internal::FloatToBf16(values[i]);
      dst[2 * i] = static_cast<unsigned char>(h & 0xffu);
      dst[2 * i + 1] = static_cast<unsigned char>(h >> 8);
    }
    return absl::OkStatus();
  }

  absl::Status Decode(std::string_view bytes, std::span<float> out) const override {
    PS_RETURN_IF_ERROR(internal::CheckDensePayload(*this, bytes, 2, out.size()));
    const auto* src = reinterpret_cast<const unsigned char*>(bytes.data() + 1);
    Widen(src, out);
    // A bf16 is Inf or NaN exactly when its float is.
    return internal::CheckDecoded16(kBf16Spec, src, out);
  }

  // One pass: each block of the pieces widened in the first-level cache, then added to
  // what is held, copied to out and checked.
  absl::Status DecodeAddPieces(std::span<const std::string_view> pieces,
                               std::span<float> held, std::span<float> out) const override {
    return internal::DecodeAddWidened16(*this, &Widen, pieces, held, out);
  }

  size_t MaxEncodedBytes(size_t numel) const override { return 1 + 2 * numel; }
};

}  // namespace

namespace internal {
absl::StatusOr<std::unique_ptr<Codec>> MakeBf16Codec(Stages stages, const CodecOptions& /*options*/) {
  PS_RETURN_IF_ERROR(SingleStage(stages, {}).status());
  return std::unique_ptr<Codec>(std::make_unique<Bf16Codec>());
}
}  // namespace internal

}  // namespace ps::codecs
