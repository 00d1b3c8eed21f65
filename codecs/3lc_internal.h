// Pieces of the 3lc codec (3lc.cc, docs/codecs.md "3lc") that tests reach directly: the
// byte constants of the format and the digit packing. Its digit kernel is
// TernaryDigits in kernels_internal.h.
//
// Thread safety: everything here is pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ps::codecs::internal {

// A byte below 243 holds five base-3 digits, value 5g + j of the slice in digit j
// (weight 3^j), each digit t + 1 for t in {-1, 0, 1}. All five zero: 1 + 3 + 9 + 27 + 81.
inline constexpr uint8_t k3lcZeroGroup = 121;
// Bytes 243..255: a run of 2..14 all-zero groups (243 + r - 2).
inline constexpr uint8_t k3lcRunBase = 243;
inline constexpr int k3lcMinRun = 2;
inline constexpr int k3lcMaxRun = 14;

// The byte of five digits (each 0, 1 or 2) at d[0..4]: sum of d[j] * 3^j. Reads 8
// bytes at d (the last 3 are ignored), so d must have 3 readable bytes of slack.
// One multiply: d[j] * 3^j lands in byte 4 of the product; no lower byte sum exceeds
// 242, so nothing carries into it.
inline uint8_t Pack3lcGroup(const uint8_t* d) {
  uint64_t v;
  std::memcpy(&v, d, sizeof(v));  // little-endian host (core/fp32_bytes.h asserts it)
  v &= 0xff'ffff'ffffull;
  constexpr uint64_t kWeights = (1ull << 32) | (3ull << 24) | (9ull << 16) | (27ull << 8) | 81ull;
  return static_cast<uint8_t>((v * kWeights) >> 32);
}

}  // namespace ps::codecs::internal
