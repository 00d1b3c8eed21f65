// Pieces of the 3lc codec (3lc.cc, docs/codecs.md "3lc") that tests reach directly: the
// byte constants of the format and the digit packing. Its digit kernel is
// TernaryDigits in kernels_internal.h.
//
// Thread safety: everything here is pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "codecs/hd_internal.h"

namespace ps::codecs::internal {

// The byte constants (k3lcZeroGroup, k3lcRunBase, ...) and the arithmetic of groups and
// zero runs are in hd_internal.h, shared with the CUDA encoder.

// The byte of five digits (each 0, 1 or 2) at d[0..4]: sum of d[j] * 3^j. Reads 8
// bytes at d (the last 3 are ignored), so d must have 3 readable bytes of slack.
inline uint8_t Pack3lcGroup(const uint8_t* d) {
  uint64_t v;
  std::memcpy(&v, d, sizeof(v));  // little-endian host (core/fp32_bytes.h asserts it)
  return Pack3lcDigits(v);
}

}  // namespace ps::codecs::internal
