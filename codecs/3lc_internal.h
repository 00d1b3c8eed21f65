// Pieces of the 3lc codec (docs/codecs.md "3lc") shared by its encoder (3lc.cc) and
// decoder (3lc_decode.cc) or reached by tests directly: the group size, the token writer
// (3lc_tokens.cc) and the decoder. Its digit kernel is TernaryDigits in kernels_internal.h.
//
// Thread safety: everything here is pure.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "absl/status/status.h"
#include "codecs/hd_internal.h"

namespace ps::codecs::internal {

// The byte constants (k3lcZeroGroup, k3lcRunBase, ...) and the arithmetic of groups and
// zero runs are in hd_internal.h, shared with the CUDA encoder.

// The codec's name, in its spec and its errors.
inline constexpr char k3lcName[] = "3lc";

// Values per group: one byte holds five base-3 digits (Pack3lcDigits in hd_internal.h).
inline constexpr size_t k3lcGroup = 5;

// Appends to w the tokens of `groups` groups whose digits (t + 1: 0, 1 or 2; five a
// group) are at `digits`, after `*run` zero groups pending from before; leaves the zero
// groups after the last non-zero one in *run, for the next call or Put3lcZeroRun. Reads
// up to 8 bytes past the last group's digits and stores up to 16 bytes past what it
// returns (the caller keeps that slack).
unsigned char* Put3lcTokens(const uint8_t* digits, size_t groups, size_t* run, unsigned char* w);
// Appends the tokens of `run` zero groups: a 255 for each 14, then 121 for one more or
// 243 + r - 2 for r = 2..13; stores one byte more than it returns when run % 14 is 0.
unsigned char* Put3lcZeroRun(size_t run, unsigned char* w);

// The value of a digit (t + 1: 0, 1 or 2) at scale M: t x M as a float, the product
// every decoding makes.
inline float Value3lcDigit(uint8_t digit, float scale) {
  return static_cast<float>(int{digit} - 1) * scale;
}
// held[i] = held[i] + Value3lcDigit(digits[i], scale) for n digits (the bits of a decode
// and then AddInto's addition): the encoder's own change to what it holds.
void Add3lcDigits(const uint8_t* digits, size_t n, float scale, float* held);

// 3lc(s, level=cat)'s candidates for a push x with max|x| = max_abs: multipliers
// 1 + (s - 1) j / 4, j = 0..4, each with the energy its payload keeps, |x|^2 -
// |x - Q(x)|^2 (CAT's a(.) up to the constant |x|^2), and its payload's exact size in
// bytes. x must be finite.
inline constexpr size_t kThreeLcCatLevels = 5;
struct ThreeLcCandidate {
  double multiplier = 0;
  double kept = 0;
  double bytes = 0;
};
std::array<ThreeLcCandidate, kThreeLcCatLevels> ThreeLcCatCandidates(std::span<const float> x,
                                                                     double max_abs, double s);

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

// Decodes a payload of digits.size() values into its digits (t + 1: 0, 1 or 2), a
// byte per value, and its scale M, refusing what Decode3lc refuses.
absl::Status Decode3lcDigits(std::string_view bytes, std::span<uint8_t> digits, float* scale);

}  // namespace ps::codecs::internal
