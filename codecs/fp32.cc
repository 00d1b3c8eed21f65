// fp32: the identity codec. Wire: version byte, then numel little-endian fp32
// (core/fp32_bytes.h; the host is little-endian, which that file asserts).
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "codecs/codec.h"
#include "codecs/codec_internal.h"
#include "core/fp32_bytes.h"
#include "core/status.h"

namespace ps::codecs {
namespace {

constexpr char kSpec[] = "fp32";

class Fp32Codec final : public Codec {
 public:
  std::string_view spec() const override { return kSpec; }

  absl::Status Encode(std::span<const float> values, const EncodeContext& /*ctx*/,
                      std::string* out) override {
    PS_RETURN_IF_ERROR(internal::CheckEncodable(kSpec, values));
    out->clear();
    out->reserve(MaxEncodedBytes(values.size()));
    out->push_back(static_cast<char>(kFormatVersion));
    if (!values.empty()) core::AppendFp32(values, out);  // same null-data() caveat
    return absl::OkStatus();
  }

  absl::Status Decode(std::string_view bytes, std::span<float> out) const override {
    PS_RETURN_IF_ERROR(internal::CheckDensePayload(spec(), bytes, sizeof(float), out.size()));
    // An empty slice may have a null data(); memcpy must not see it, even for 0 bytes.
    if (!out.empty()) std::memcpy(out.data(), bytes.data() + 1, out.size_bytes());
    return CheckFinite(out);
  }

  // The values straight from the pieces into out: one pass, no gather. A payload of
  // the wrong size or version takes Decode's path, for its exact message.
  absl::Status DecodePieces(std::span<const std::string_view> pieces,
                            std::span<float> out) const override {
    size_t total = 0;
    for (std::string_view p : pieces) total += p.size();
    if (total != 1 + out.size_bytes() || out.empty()) return Codec::DecodePieces(pieces, out);
    auto* dst = reinterpret_cast<char*>(out.data());
    bool versioned = false;
    for (std::string_view p : pieces) {
      if (p.empty()) continue;
      if (!versioned) {
        if (static_cast<unsigned char>(p[0]) != kFormatVersion) {
          return Codec::DecodePieces(pieces, out);
        }
        p.remove_prefix(1);
        versioned = true;
      }
      std::memcpy(dst, p.data(), p.size());
      dst += p.size();
    }
    return CheckFinite(out);
  }

  size_t MaxEncodedBytes(size_t numel) const override { return 1 + sizeof(float) * numel; }

 private:
  static absl::Status CheckFinite(std::span<const float> out) {
    if (const ptrdiff_t i = core::FindNonFinite(out); i >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(kSpec, ": value ", i, " is not finite (", out[i], ")"));
    }
    return absl::OkStatus();
  }
};

}  // namespace

namespace internal {
absl::StatusOr<std::unique_ptr<Codec>> MakeFp32Codec(Stages stages, const CodecOptions& /*options*/) {
  PS_RETURN_IF_ERROR(SingleStage(stages, {}).status());
  return std::unique_ptr<Codec>(std::make_unique<Fp32Codec>());
}
}  // namespace internal

}  // namespace ps::codecs
