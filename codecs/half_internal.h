// fp32 <-> IEEE 754 binary16 conversions for the fp16 codec (docs/codecs.md).
//
// The scalar conversions (FloatToHalf, HalfToFloat in hd_internal.h, shared with the
// CUDA encoders) are portable bit manipulation (no FP environment, no hardware half
// type). The bulk functions dispatch at run time to an F16C path on
// x86 CPUs that have it; that path gives bit-identical results for finite inputs
// (tests/codecs/fp16_test.cc checks it).
//
// Encoding rounds to nearest, ties to even, and saturates: a finite value beyond
// the fp16 range becomes +-65504, never Inf. Callers reject NaN and Inf before
// encoding; for them the result is defined (Inf -> +-Inf, NaN -> quiet NaN) on the
// portable path only.
//
// Thread safety: all functions are pure and may run concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "codecs/hd_internal.h"

namespace ps::codecs::internal {

// Bulk conversions between floats and little-endian halves (2 bytes each, no
// alignment needed). `out` / `in` hold 2 * values.size() bytes.
void FloatsToHalves(std::span<const float> values, unsigned char* out);
void HalvesToFloats(const unsigned char* in, std::span<float> out);

// The two implementations behind the bulk functions, exposed for tests. The F16C
// ones may only run when HaveF16c() is true.
void FloatsToHalvesPortable(std::span<const float> values, unsigned char* out);
void HalvesToFloatsPortable(const unsigned char* in, std::span<float> out);
void FloatsToHalvesF16c(std::span<const float> values, unsigned char* out);
void HalvesToFloatsF16c(const unsigned char* in, std::span<float> out);

// True when this CPU (and OS) runs F16C; false on other architectures.
bool HaveF16c();

}  // namespace ps::codecs::internal
