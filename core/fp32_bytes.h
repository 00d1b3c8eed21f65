// Little-endian fp32 <-> bytes, the raw value format of the wire (initial values,
// pulls, the fp32 codec). Decoding checks the size and that every value is finite.
#pragma once

#include <bit>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace ps::core {

// Appends values as little-endian fp32 to *out.
void AppendFp32(std::span<const float> values, std::string* out);
// The same in a new immutable string, to be shared (a published slice).
std::shared_ptr<const std::string> SharedFp32(std::span<const float> values);

// Copies bytes into out; refuses a size other than 4 * out.size() and any NaN or Inf
// (out is then unspecified). `what` names the payload in the error message.
absl::Status ParseFp32(std::string_view bytes, std::span<float> out, std::string_view what);

// 1 when x is Inf or NaN (every exponent bit set), else 0: a branch-free test that
// vectorizes, for kernels that OR it over a block and check once.
inline uint32_t NonFiniteBit(float x) {
  return static_cast<uint32_t>((std::bit_cast<uint32_t>(x) & 0x7f800000u) == 0x7f800000u);
}

// Index of the first NaN or Inf, or -1.
ptrdiff_t FindNonFinite(std::span<const float> values);

// Copies out.size() little-endian fp32 from `bytes` (any alignment) into out and finds the
// first NaN or Inf among them in the same pass: its index, or -1 (every value is copied
// either way). The two must not overlap. One read of the bytes where a copy and then a
// check of the copy would read them twice.
ptrdiff_t CopyFindNonFinite(const void* bytes, std::span<float> out);
// The other way: stores `values` as little-endian fp32 at `bytes` (any alignment; a
// payload after its format byte) and finds the first NaN or Inf in the same pass, as
// CopyFindNonFinite.
ptrdiff_t StoreFindNonFinite(std::span<const float> values, void* bytes);

// acc[i] = acc[i] + change[i], each a plain fp32 addition: the one way a shard and its
// workers apply a compressed pull's change, so both hold the same bits
// (docs/data_path.md). Sizes must match; acc and change must not overlap.
void AddInto(std::span<float> acc, std::span<const float> change);

// out[i] = a[i] - b[i], each a plain fp32 subtraction (a shard's change since what its
// workers hold). Sizes must match; out overlaps neither.
void Subtract(std::span<const float> a, std::span<const float> b, std::span<float> out);

// change[i] = base[i] + change[i], AddInto's addition, in the same pass as the finiteness
// check: whether every sum is finite. The two must not overlap; sizes must match.
bool AddFinite(std::span<const float> base, std::span<float> change);

// held[i] = held[i] + change[i], AddInto's addition, each sum also written to copy[i],
// in one pass with the finiteness check (a block of values added in place, then copied
// while it is in the first-level cache): whether every sum is finite (every sum is
// written either way). The three must not overlap; sizes must match. A worker applies a
// pulled change to what it holds and writes the result to the caller's buffer so.
bool AddFiniteKeep(std::span<float> held, std::span<const float> change, std::span<float> copy);
// The same with the change as held.size() little-endian fp32 at `change`, at any
// alignment (a payload's bytes, read where they lie).
bool AddFiniteKeepBytes(std::span<float> held, const void* change, std::span<float> copy);

}  // namespace ps::core
