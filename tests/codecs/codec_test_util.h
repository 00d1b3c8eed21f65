// Helpers the codec tests share: making and running codecs with gtest checks, hex
// dumps of payloads and Gaussian test data.
#pragma once

#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "codecs/codec.h"
#include "gtest/gtest.h"

namespace ps::codecs::testing {

// "01 09 c7": each byte as two lowercase hex digits, separated by spaces.
inline std::string Hex(std::string_view bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    if (!out.empty()) out += ' ';
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

// n draws of N(0, 1) from mt19937(seed).
inline std::vector<float> Gaussian(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// Values a worker or shard holds for a slice: N(0, 100) draws with exact zeros and -0
// mixed in (held + 0 turns -0 into +0: a fused addition must add even where the change is
// zero).
inline std::vector<float> HeldValues(size_t n, uint32_t seed) {
  std::vector<float> held = Gaussian(n, seed);
  for (size_t i = 0; i < n; ++i) {
    held[i] *= 10.0f;
    if (i % 7 == 3) held[i] = -0.0f;
    if (i % 11 == 5) held[i] = 0.0f;
  }
  return held;
}

// The codec `spec` makes (a test failure, and nullptr, if it refuses).
inline std::unique_ptr<Codec> MakeOk(std::string_view spec, const CodecOptions& options) {
  auto codec = MakeCodec(spec, options);
  EXPECT_TRUE(codec.ok()) << spec << ": " << codec.status();
  return codec.ok() ? *std::move(codec) : nullptr;
}
inline std::unique_ptr<Codec> MakeOk(std::string_view spec, uint64_t seed = 0) {
  return MakeOk(spec, CodecOptions{.seed = seed});
}

// The encoding of values in round `round` (a test failure if Encode refuses).
inline std::string EncodeOk(Codec& codec, const std::vector<float>& values, uint64_t round = 0) {
  std::string bytes;
  EncodeContext ctx;
  ctx.round = round;
  const absl::Status s = codec.Encode(values, ctx, &bytes);
  EXPECT_TRUE(s.ok()) << s;
  return bytes;
}

// The message of Decode's refusal of bytes for n values (a test failure unless it
// refuses with INVALID_ARGUMENT).
inline std::string DecodeError(const Codec& codec, std::string_view bytes, size_t n) {
  std::vector<float> out(n);
  const absl::Status s = codec.Decode(bytes, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  return std::string(s.message());
}

// Checks that Decode refuses bytes for n values with INVALID_ARGUMENT and message `msg`.
inline void ExpectRefused(const Codec& codec, std::string_view bytes, size_t n,
                          std::string_view msg) {
  std::vector<float> out(n);
  const absl::Status s = codec.Decode(bytes, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << Hex(bytes);
  EXPECT_EQ(std::string(s.message()), msg) << Hex(bytes);
  // Check refuses the same, with the same message (a shard that keeps pushes encoded
  // refuses them at arrival by it).
  const absl::Status checked = codec.Check(bytes, n);
  EXPECT_EQ(checked.code(), absl::StatusCode::kInvalidArgument) << Hex(bytes);
  EXPECT_EQ(std::string(checked.message()), msg) << "Check, " << Hex(bytes);
}

// A sign payload encoded on the device against the CPU's (docs/gpu.md): the scale comes
// from a double sum in another order, so equal or one float ulp apart; the rest equal.
inline void ExpectSameSignPayload(const std::string& device, const std::string& cpu, size_t n) {
  ASSERT_EQ(device.size(), cpu.size());
  const size_t scale_at = 1 + (cpu.size() - 1 - 4 - (n + 7) / 8);
  EXPECT_EQ(device.substr(0, scale_at), cpu.substr(0, scale_at));
  EXPECT_EQ(device.substr(scale_at + 4), cpu.substr(scale_at + 4)) << "sign bits differ";
  float a = 0, b = 0;
  std::memcpy(&a, device.data() + scale_at, 4);
  std::memcpy(&b, cpu.data() + scale_at, 4);
  EXPECT_LE(std::abs(static_cast<int64_t>(std::bit_cast<uint32_t>(a)) - std::bit_cast<uint32_t>(b)), 1)
      << a << " vs " << b;
}

}  // namespace ps::codecs::testing
