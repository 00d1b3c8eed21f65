// sign: one bit per value plus one scale (signSGD; with the worker's error feedback,
// EF-signSGD). Wire: version, numel (varint), scale (fp32, finite, >= 0), then
// ceil(numel / 8) bytes of sign bits, LSB first, 1 = negative; padding bits are zero.
// Decode: bit ? -scale : +scale. The scale is mean |x| (the L1 norm over numel), which
// makes scale * sign(x) the best such approximation in L2 and is what EF-signSGD uses.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codecs/codec.h"
#include "codecs/codec_internal.h"
#include "codecs/compressed.h"
#include "codecs/kernels_internal.h"
#include "codecs/wire_internal.h"
#include "core/status.h"

namespace ps::codecs {
namespace {

constexpr char kSignSpec[] = "sign";

struct SignView {
  float scale = 0;
  std::string_view bits;  // ceil(numel / 8) bytes
};

// Parses and validates a sign payload for numel values (everything but the bits' values).
absl::Status ParseSign(std::string_view bytes, size_t numel, SignView* view) {
  internal::WireReader r(kSignSpec, bytes);
  PS_RETURN_IF_ERROR(r.Format(PayloadFormat::kSign));
  PS_RETURN_IF_ERROR(r.Numel(numel));
  PS_RETURN_IF_ERROR(r.F32(&view->scale, "the scale"));
  if (!std::isfinite(view->scale) || view->scale < 0 || std::signbit(view->scale)) {
    return r.Error(absl::StrCat("scale ", view->scale, " is not a finite non-negative number"));
  }
  PS_RETURN_IF_ERROR(r.Bytes((numel + 7) / 8, &view->bits, "the sign bits"));
  PS_RETURN_IF_ERROR(r.Finish("the sign bits"));
  if (numel % 8 != 0) {
    const auto last = static_cast<unsigned char>(view->bits.back());
    if ((last >> (numel % 8)) != 0) return r.Error("padding bits after the last value are not zero");
  }
  return absl::OkStatus();
}

// The 64 sign bits starting at value 64 * w (fewer at the end, zero-padded).
uint64_t Word(std::string_view bits, size_t w) {
  uint64_t x = 0;
  const size_t begin = 8 * w;
  std::memcpy(&x, bits.data() + begin, std::min<size_t>(8, bits.size() - begin));
  return x;  // little-endian host (core/fp32_bytes.h asserts it)
}

class SignCodec final : public Codec {
 public:
  SignCodec() : Codec(PayloadFormat::kSign) {}

  std::string_view spec() const override { return kSignSpec; }

  absl::Status Encode(std::span<const float> values, const EncodeContext& /*ctx*/,
                      std::string* out) override {
    const size_t n = values.size();
    const double sum = internal::SumAbs(values.data(), n);
    // A sum of finite floats' magnitudes is finite in double: only Inf or NaN makes
    // it otherwise (one pass instead of a separate check).
    if (!std::isfinite(sum)) return internal::CheckEncodable(kSignSpec, values);
    const float scale = n == 0 ? 0.0f : static_cast<float>(sum / static_cast<double>(n));
    std::string bytes;
    bytes.reserve(MaxEncodedBytes(n));
    internal::PutU8(&bytes, FormatByte(format()));
    internal::PutVarint(&bytes, n);
    internal::PutF32(&bytes, scale);
    const size_t header = bytes.size();
    bytes.resize(header + (n + 7) / 8);
    internal::PackSignBits(values.data(), n, reinterpret_cast<unsigned char*>(bytes.data() + header));
    *out = std::move(bytes);
    return absl::OkStatus();
  }

  absl::Status Decode(std::string_view bytes, std::span<float> out) const override {
    SignView view;
    PS_RETURN_IF_ERROR(ParseSign(bytes, out.size(), &view));
    internal::UnpackSignBits(reinterpret_cast<const unsigned char*>(view.bits.data()), out.size(),
                             view.scale, -view.scale, out.data());
    return absl::OkStatus();
  }

  size_t MaxEncodedBytes(size_t numel) const override {
    return 1 + internal::VarintSize(numel) + 4 + (numel + 7) / 8;
  }

  SharedStructure shared_structure() const override { return SharedStructure::kSignBits; }
};

}  // namespace

absl::Status SignMajorityVote(std::span<const std::string_view> sign_payloads,
                              std::span<float> out) {
  const size_t d = out.size();
  std::vector<SignView> views(sign_payloads.size());
  std::vector<double> scales;
  for (size_t i = 0; i < sign_payloads.size(); ++i) {
    absl::Status st = ParseSign(sign_payloads[i], d, &views[i]);
    if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat("payload ", i, ": ", st.message()));
    scales.push_back(views[i].scale);
  }
  std::fill(out.begin(), out.end(), 0.0f);
  if (views.empty() || d == 0) return absl::OkStatus();
  // The dense rule's scale: mean |x| of a sign push is its scale exactly.
  std::sort(scales.begin(), scales.end());
  const size_t k = scales.size();
  const double median = k % 2 == 1 ? scales[k / 2] : (scales[k / 2 - 1] + scales[k / 2]) / 2;
  const auto step = static_cast<float>(median);
  // Rows with scale 0 decode to zeros and do not vote.
  std::vector<std::string_view> voters;
  for (const SignView& v : views) {
    if (v.scale > 0) voters.push_back(v.bits);
  }
  const size_t m = voters.size();
  if (m == 0) return absl::OkStatus();
  // Bit-sliced counters: plane p holds bit p of each coordinate's count of negative
  // signs, 64 coordinates per word; one ripple-carry add per voter and word.
  const int planes = std::bit_width(m);
  std::vector<uint64_t> plane(static_cast<size_t>(planes));
  const size_t words = (d + 63) / 64;
  for (size_t w = 0; w < words; ++w) {
    std::fill(plane.begin(), plane.end(), 0);
    for (std::string_view bits : voters) {
      uint64_t carry = Word(bits, w);
      for (int p = 0; p < planes && carry != 0; ++p) {
        const uint64_t t = plane[static_cast<size_t>(p)] & carry;
        plane[static_cast<size_t>(p)] ^= carry;
        carry = t;
      }
    }
    const size_t base = 64 * w;
    const size_t len = std::min<size_t>(64, d - base);
    for (size_t b = 0; b < len; ++b) {
      size_t negatives = 0;
      for (int p = 0; p < planes; ++p) negatives |= ((plane[static_cast<size_t>(p)] >> b) & 1) << p;
      // vote = (m - negatives) - negatives
      const size_t twice = 2 * negatives;
      out[base + b] = twice < m ? step : twice > m ? -step : 0.0f;
    }
  }
  return absl::OkStatus();
}

namespace internal {
absl::StatusOr<std::unique_ptr<Codec>> MakeSignCodec(Stages stages, const CodecOptions& /*options*/) {
  PS_RETURN_IF_ERROR(SingleStage(stages, {}).status());
  return std::unique_ptr<Codec>(std::make_unique<SignCodec>());
}
}  // namespace internal

}  // namespace ps::codecs
