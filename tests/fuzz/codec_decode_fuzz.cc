// Fuzz target for Codec::Decode, the parser of gradient bytes from workers.
//
// Input layout: byte 0 picks the codec spec (index into ExampleSpecs(), the list the
// generic codec tests use, modulo its size, so every codec and composition there is
// fuzzed), bytes 1-2 the declared element count (little-endian, so at most 65535), the
// rest is the payload handed to Decode(). Decode must not crash and must refuse with
// INVALID_ARGUMENT and a message, and Codec::Check must say what Decode says; when it
// accepts, every value must be written and finite, the payload must fit
// MaxEncodedBytes, re-encoding the values (with a fresh encoder, so worker-side state
// never carries between inputs) must succeed, fit MaxEncodedBytes and decode again,
// and for fp32 and fp16, which have exactly one encoding per value, give the payload
// back. Seeds: codec_seeds.cc.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "codecs/codec.h"
#include "tests/codecs/example_specs.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

struct Target {
  std::string spec;
  std::unique_ptr<ps::codecs::Codec> decoder;
  bool canonical;  // one encoding per value: Encode(Decode(b)) == b
};

std::vector<Target> MakeTargets() {
  std::vector<Target> targets;
  for (const ps::codecs::testing::ExampleSpec& e : ps::codecs::testing::ExampleSpecs()) {
    auto codec = ps::codecs::MakeCodec(e.spec);
    PS_FUZZ_CHECK(codec.ok(), "MakeCodec refused a spec from ExampleSpecs()");
    const std::string_view canonical_spec = (*codec)->spec();
    const bool canonical = canonical_spec == "fp32" || canonical_spec == "fp16";
    targets.push_back({e.spec, std::move(codec).value(), canonical});
  }
  PS_FUZZ_CHECK(!targets.empty(), "ExampleSpecs() is empty");
  return targets;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<Target> targets = MakeTargets();
  if (size < 3) return 0;
  const Target& target = targets[data[0] % targets.size()];
  const ps::codecs::Codec& decoder = *target.decoder;
  const size_t numel = static_cast<size_t>(data[1]) | (static_cast<size_t>(data[2]) << 8);
  const std::string_view payload(reinterpret_cast<const char*>(data + 3), size - 3);

  // Poisoned with NaN: a decoder that accepts without writing every value fails below.
  std::vector<float> out(numel, std::numeric_limits<float>::quiet_NaN());
  const absl::Status status = decoder.Decode(payload, out);
  // Check (what a shard that keeps pushes encoded refuses them by) agrees with Decode,
  // message and all.
  PS_FUZZ_CHECK(decoder.Check(payload, numel) == status, "Check and Decode disagree");
  if (!status.ok()) {
    PS_FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument,
                  "Decode failed with a code other than INVALID_ARGUMENT");
    PS_FUZZ_CHECK(!status.message().empty(), "Decode error without a message");
    return 0;
  }
  for (float v : out) PS_FUZZ_CHECK(std::isfinite(v), "Decode accepted a non-finite value");
  PS_FUZZ_CHECK(payload.size() <= decoder.MaxEncodedBytes(numel),
                "Decode accepted more bytes than MaxEncodedBytes");

  auto encoder = ps::codecs::MakeCodec(target.spec);
  PS_FUZZ_CHECK(encoder.ok(), "MakeCodec refused a spec it accepted before");
  std::string again;
  PS_FUZZ_CHECK((*encoder)->Encode(out, &again).ok(), "Encode refused decoded values");
  PS_FUZZ_CHECK(again.size() <= decoder.MaxEncodedBytes(numel),
                "Encode wrote more than MaxEncodedBytes");
  std::vector<float> round_trip(numel);
  PS_FUZZ_CHECK(decoder.Decode(again, round_trip).ok(), "Decode refused what Encode wrote");
  if (target.canonical) PS_FUZZ_CHECK(again == payload, "re-encoding changed the bytes");
  return 0;
}
