// Helpers the codec tests share: making and running codecs with gtest checks, hex
// dumps of payloads and Gaussian test data.
#pragma once

#include <cstdint>
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

// The codec `spec` makes (a test failure, and nullptr, if it refuses).
inline std::unique_ptr<Codec> MakeOk(std::string_view spec, uint64_t seed = 0) {
  auto codec = MakeCodec(spec, CodecOptions{seed});
  EXPECT_TRUE(codec.ok()) << codec.status();
  return codec.ok() ? *std::move(codec) : nullptr;
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

}  // namespace ps::codecs::testing
