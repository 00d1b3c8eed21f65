// Pieces of the 3lc codec (docs/codecs.md "3lc") shared by its encoder (3lc.cc) and
// decoder (3lc_decode.cc) or reached by tests directly: the group size, the digit
// packing and the decoder. Its digit kernel is TernaryDigits in kernels_internal.h.
//
// Thread safety: everything here is pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

#include "absl/status/status.h"
#include "codecs/hd_internal.h"

namespace ps::codecs::internal {

// The byte constants (k3lcZeroGroup, k3lcRunBase, ...) and the arithmetic of groups and
// zero runs are in hd_internal.h, shared with the CUDA encoder.

// The codec's name, in its spec and its errors.
inline constexpr char k3lcName[] = "3lc";

// Values per group: one byte holds five base-3 digits.
inline constexpr size_t k3lcGroup = 5;

// The byte of five digits (each 0, 1 or 2) at d[0..4]: sum of d[j] * 3^j. Reads 8
// bytes at d (the last 3 are ignored), so d must have 3 readable bytes of slack.
inline uint8_t Pack3lcGroup(const uint8_t* d) {
  uint64_t v;
  std::memcpy(&v, d, sizeof(v));  // little-endian host (core/fp32_bytes.h asserts it)
  return Pack3lcDigits(v);
}

// Decodes a 3lc payload of out.size() values into out, refusing any payload the
// encoder would not write (InvalidArgument naming the byte).
absl::Status Decode3lc(std::string_view bytes, std::span<float> out);

// The same payload decoded and added to what is held (held[k] + t * scale at each k, the
// product and then the addition a plain decode and AddInto would do), the sums kept in
// held and written to out, in one pass. *finite: whether every sum is finite; out holds
// the sums either way. After a refusal held and out are unspecified.
absl::Status Decode3lcAdd(std::string_view bytes, float* held, std::span<float> out,
                          bool* finite);

// Refuses exactly what Decode3lc would refuse for n values, with its message, writing
// nothing: the walk over the tokens without their values.
absl::Status Check3lc(std::string_view bytes, size_t n);

}  // namespace ps::codecs::internal
