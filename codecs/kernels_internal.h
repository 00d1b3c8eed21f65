// The hot loops of the dense quantizing codecs (sign, int8, terngrad, qsgd, 3lc),
// shared so each exists once. Every kernel has an AVX2 version (intrinsics, or a
// PS_VECTOR_CLONES clone of plain code) and a portable twin that gives identical bits;
// the tests compare both paths (SetPortableKernelsForTesting).
//
// Stochastic rounding draws one uniform number per value from a counter-based hash of
// (stream seed, value index): the result is a function of (seed, worker, round, slice,
// index) only, independent of the kernel path and of how the slice is split into
// buckets, so encodings are reproducible.
//
// Thread safety: everything here is pure, except SetPortableKernelsForTesting, which
// tests call between encodings.
#pragma once

#include <cstddef>
#include <cstdint>

#include "codecs/hd_internal.h"

namespace ps::codecs::internal {

// Forces the portable kernels (tests compare both paths); false restores AVX2 where
// the CPU has it. Returns whether the AVX2 path exists on this CPU.
bool SetPortableKernelsForTesting(bool portable);
// Whether the AVX2 kernels run now (the CPU has them and tests did not turn them off).
bool UseAvx2Kernels();

// Bits of the largest |x| (for finite values the integer order of the bits is the
// order of the values; a result >= 0x7f800000 means some value is Inf or NaN).
uint32_t MaxAbsBits(const float* x, size_t n);
// MaxAbsBits of the n differences x[i] - y[i] (each the fp32 subtraction), without
// storing them.
uint32_t MaxAbsDiffBits(const float* x, const float* y, size_t n);

// ---- 3lc ----

// The base-3 digit (t + 1) of each value: 2 when x >= half, 0 when x <= -half, else
// 1. Requires finite values and half > 0.
void TernaryDigits(const float* x, size_t n, float half, uint8_t* digits);

// ---- sign ----

// Sum of |x| in double, in a fixed order (eight interleaved partial sums, then their
// sum), so the result does not depend on the kernel path.
double SumAbs(const float* x, size_t n);
// bits[i / 8] bit i % 8 = (x[i] < 0) (so -0 gives 0), for ceil(n / 8) bytes; the
// padding bits of the last byte are 0.
void PackSignBits(const float* x, size_t n, unsigned char* bits);
// out[i] = bit i ? neg : pos.
void UnpackSignBits(const unsigned char* bits, size_t n, float pos, float neg, float* out);

// ---- stochastic rounding ----

// RoundingUniform(seed, index), the uniform number of value `index`, is in
// hd_internal.h (the CUDA encoders share it).

// int8: q[i] = clamp(floor(x[i] * inv + u_i), -127, 127), u_i =
// RoundingUniform(seed, first + i). inv = 127 / max|x| over the bucket.
void QuantizeInt8(const float* x, size_t n, float inv, uint32_t seed, uint32_t first, int8_t* q);
// out[i] = q[i] * scale.
void DequantizeInt8(const int8_t* q, size_t n, float scale, float* out);
// Whether some q[i] is -128 (outside the symmetric range the encoder writes).
bool HasInt8Minimum(const int8_t* q, size_t n);

// Ternary stochastic rounding (TernGrad): code[i] = 0 unless u_i < |x[i]| * inv, then
// 1 for x[i] > 0 and 2 for x[i] < 0. inv = 1 / max|x| over the bucket.
void TernarizeStochastic(const float* x, size_t n, float inv, uint32_t seed, uint32_t first,
                         uint8_t* code);
// Packs 2-bit codes four to a byte, value i in bits 2 (i % 4) .. of byte i / 4; the
// padding of the last byte is 0. Reads codes[0 .. 4 * ceil(n / 4)), so codes must hold
// n rounded up to a multiple of 4, zero past n.
void PackCodes2(const uint8_t* codes, size_t n, unsigned char* packed);
// out[i] = {0, scale, -scale}[code i] for i in [begin, end), codes 0..2 (code 3 is
// checked before).
void UnpackTernary2(const unsigned char* packed, size_t begin, size_t end, float scale, float* out);
// Index of the first 2-bit code 3 in packed codes of n values, or -1.
ptrdiff_t FindCode3(const unsigned char* packed, size_t n);

}  // namespace ps::codecs::internal
