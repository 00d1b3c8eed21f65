// Fuzz target for Codec::Decode, the parser of gradient bytes from workers.
//
// Input layout: byte 0 picks the codec (index into CodecNames(), modulo their
// count), bytes 1-2 the declared element count (little-endian, so at most 65535),
// the rest is the payload handed to Decode(). Decode must not crash; when it
// accepts, every value must be finite, the payload must fit MaxEncodedBytes, and
// re-encoding must give the payload back (fp32 and fp16 have exactly one encoding
// per value).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "codecs/codec.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

struct Target {
  std::unique_ptr<ps::codecs::Codec> codec;
  bool canonical;  // one encoding per value: Encode(Decode(b)) == b
};

std::vector<Target> MakeTargets() {
  std::vector<Target> targets;
  for (const std::string& name : ps::codecs::CodecNames()) {
    auto codec = ps::codecs::MakeCodec(name);
    PS_FUZZ_CHECK(codec.ok(), "MakeCodec refused a name from CodecNames()");
    const bool canonical = name == "fp32" || name == "fp16";
    targets.push_back({std::move(codec).value(), canonical});
  }
  return targets;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<Target> targets = MakeTargets();
  if (size < 3) return 0;
  const Target& target = targets[data[0] % targets.size()];
  const size_t numel = static_cast<size_t>(data[1]) | (static_cast<size_t>(data[2]) << 8);
  const std::string_view payload(reinterpret_cast<const char*>(data + 3), size - 3);

  // Poisoned with NaN: a decoder that accepts without writing every value fails below.
  std::vector<float> out(numel, std::numeric_limits<float>::quiet_NaN());
  const absl::Status status = target.codec->Decode(payload, out);
  if (!status.ok()) {
    PS_FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument,
                  "Decode failed with a code other than INVALID_ARGUMENT");
    PS_FUZZ_CHECK(!status.message().empty(), "Decode error without a message");
    return 0;
  }
  for (float v : out) PS_FUZZ_CHECK(std::isfinite(v), "Decode accepted a non-finite value");
  PS_FUZZ_CHECK(payload.size() <= target.codec->MaxEncodedBytes(numel),
                "Decode accepted more bytes than MaxEncodedBytes");

  std::string again;
  PS_FUZZ_CHECK(target.codec->Encode(out, &again).ok(), "Encode refused decoded values");
  PS_FUZZ_CHECK(again.size() <= target.codec->MaxEncodedBytes(numel),
                "Encode wrote more than MaxEncodedBytes");
  if (target.canonical) PS_FUZZ_CHECK(again == payload, "re-encoding changed the bytes");
  return 0;
}
