#include "core/fp32_bytes.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/simd.h"

namespace ps::core {

static_assert(std::endian::native == std::endian::little,
              "the wire format is little-endian; big-endian hosts need byte swaps here");

void AppendFp32(std::span<const float> values, std::string* out) {
  if (values.empty()) return;  // memcpy from a null data() is undefined even for 0 bytes
  // append, not resize + memcpy: resize would zero-fill the bytes first, a whole extra
  // pass over every fp32 payload (ps-bench e2e, docs/bench.md).
  out->append(reinterpret_cast<const char*>(values.data()), values.size_bytes());
}

std::shared_ptr<const std::string> SharedFp32(std::span<const float> values) {
  auto s = std::make_shared<std::string>();
  AppendFp32(values, s.get());
  return s;
}

namespace {

constexpr size_t kFiniteBlock = 1024;

// Whether any of the kFiniteBlock values at x is Inf or NaN: a branch-free OR over a
// fixed count, which GCC vectorizes even at -O2 (no epilogue), in an AVX2 clone too.
PS_VECTOR_CLONES bool BlockHasNonFinite(const float* x) {
  uint32_t bad = 0;
  for (size_t i = 0; i < kFiniteBlock; ++i) {
    bad |= NonFiniteBit(x[i]);
  }
  return bad != 0;
}

// change[i] = base[i] + change[i] over kFiniteBlock values and whether every sum is
// finite, the check a branch-free OR as in BlockHasNonFinite. The fixed count and the
// restrict pointers (no overlap to test at run time) are what GCC's cheap cost model at
// -O2 asks before it vectorizes.
PS_VECTOR_CLONES bool AddBlockFiniteInPlace(const float* __restrict base, float* __restrict change) {
  uint32_t bad = 0;
  for (size_t i = 0; i < kFiniteBlock; ++i) {
    change[i] = base[i] + change[i];
    bad |= NonFiniteBit(change[i]);
  }
  return bad == 0;
}

// held[i] = held[i] + change[i] over kFiniteBlock values and whether every sum is
// finite; `change` is little-endian fp32 at any alignment (a payload's bytes, or
// floats). The same addition as AddInto's (fp32 addition commutes exactly).
// AccumulateFinite: n <= kFiniteBlock values, the whole block's loop where it can.
PS_VECTOR_CLONES bool AccumulateBlockFinite(float* __restrict held,
                                            const unsigned char* __restrict change) {
  uint32_t bad = 0;
  for (size_t i = 0; i < kFiniteBlock; ++i) {
    float c;
    std::memcpy(&c, change + sizeof(float) * i, sizeof(float));
    held[i] = held[i] + c;
    bad |= NonFiniteBit(held[i]);
  }
  return bad == 0;
}
bool AccumulateFinite(float* held, const unsigned char* change, size_t n) {
  if (n == kFiniteBlock) return AccumulateBlockFinite(held, change);
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    float c;
    std::memcpy(&c, change + sizeof(float) * i, sizeof(float));
    held[i] = held[i] + c;
    bad |= NonFiniteBit(held[i]);
  }
  return bad == 0;
}

// AddFiniteKeep over n values: a block is added in place, then copied from the
// first-level cache while it is there.
bool AccumulateKept(float* held, const unsigned char* change, float* copy, size_t n) {
  bool finite = true;
  for (size_t b = 0; b < n; b += kFiniteBlock) {
    const size_t count = std::min(kFiniteBlock, n - b);
    finite &= AccumulateFinite(held + b, change + sizeof(float) * b, count);
    std::memcpy(copy + b, held + b, count * sizeof(float));
  }
  return finite;
}

// The kFiniteBlock little-endian fp32 at `in` copied to `out` (either at any alignment,
// not overlapping); whether every one is finite, the check a branch-free OR as in
// BlockHasNonFinite.
PS_VECTOR_CLONES bool CopyBlockFinite(const unsigned char* __restrict in,
                                      unsigned char* __restrict out) {
  uint32_t bad = 0;
  for (size_t i = 0; i < kFiniteBlock; ++i) {
    float v;
    std::memcpy(&v, in + sizeof(float) * i, sizeof(float));
    std::memcpy(out + sizeof(float) * i, &v, sizeof(float));
    bad |= NonFiniteBit(v);
  }
  return bad == 0;
}

// Index of the first NaN or Inf among the little-endian fp32 [begin, end) at `bytes`, or -1
// (floats read as their bytes, so one search serves floats and payloads alike).
ptrdiff_t FirstNonFiniteBytes(const unsigned char* bytes, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) {
    float v;
    std::memcpy(&v, bytes + sizeof(float) * i, sizeof(float));
    if (!std::isfinite(v)) return static_cast<ptrdiff_t>(i);
  }
  return -1;
}

// n little-endian fp32 copied from `in` to `out` and checked in the same pass, a block at
// a time: the first NaN or Inf's index, or -1 (every value is copied either way).
ptrdiff_t CopyFindNonFiniteBytes(const unsigned char* in, unsigned char* out, size_t n) {
  size_t b = 0;
  for (; b + kFiniteBlock <= n; b += kFiniteBlock) {
    if (!CopyBlockFinite(in + sizeof(float) * b, out + sizeof(float) * b)) {
      // The index is found in the block's copy.
      const size_t next = b + kFiniteBlock;
      std::memcpy(out + sizeof(float) * next, in + sizeof(float) * next, sizeof(float) * (n - next));
      return FirstNonFiniteBytes(out, b, next);
    }
  }
  std::memcpy(out + sizeof(float) * b, in + sizeof(float) * b, sizeof(float) * (n - b));
  return FirstNonFiniteBytes(out, b, n);
}

// acc[i] += change[i] and out[i] = a[i] - b[i] over kFiniteBlock values: a fixed count and
// restrict pointers, which GCC vectorizes at -O2 where the plain loops over spans stayed
// scalar (a run-time overlap check is beyond its cheap cost model).
PS_VECTOR_CLONES void AddBlock(float* __restrict acc, const float* __restrict change) {
  for (size_t i = 0; i < kFiniteBlock; ++i) acc[i] = acc[i] + change[i];
}
PS_VECTOR_CLONES void SubtractBlock(const float* __restrict a, const float* __restrict b,
                                    float* __restrict out) {
  for (size_t i = 0; i < kFiniteBlock; ++i) out[i] = a[i] - b[i];
}

// AddFinite of n values, a block at a time: change = base + change.
bool AddAllFinite(const float* base, float* change, size_t n) {
  bool finite = true;
  size_t b = 0;
  for (; b + kFiniteBlock <= n; b += kFiniteBlock) {
    finite &= AddBlockFiniteInPlace(base + b, change + b);
  }
  uint32_t bad = 0;
  for (; b < n; ++b) {
    change[b] = base[b] + change[b];
    bad |= NonFiniteBit(change[b]);
  }
  return finite && bad == 0;
}

}  // namespace

ptrdiff_t FindNonFinite(std::span<const float> values) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
  const size_t n = values.size();
  size_t b = 0;
  for (; b + kFiniteBlock <= n; b += kFiniteBlock) {
    if (BlockHasNonFinite(values.data() + b)) {
      return FirstNonFiniteBytes(bytes, b, b + kFiniteBlock);
    }
  }
  return FirstNonFiniteBytes(bytes, b, n);
}

ptrdiff_t CopyFindNonFinite(const void* bytes, std::span<float> out) {
  if (out.empty()) return -1;  // memcpy with a null pointer is undefined even for 0 bytes
  return CopyFindNonFiniteBytes(static_cast<const unsigned char*>(bytes),
                                reinterpret_cast<unsigned char*>(out.data()), out.size());
}

ptrdiff_t StoreFindNonFinite(std::span<const float> values, void* bytes) {
  if (values.empty()) return -1;
  return CopyFindNonFiniteBytes(reinterpret_cast<const unsigned char*>(values.data()),
                                static_cast<unsigned char*>(bytes), values.size());
}

void AddInto(std::span<float> acc, std::span<const float> change) {
  const size_t n = acc.size();
  size_t b = 0;
  for (; b + kFiniteBlock <= n; b += kFiniteBlock) AddBlock(acc.data() + b, change.data() + b);
  for (; b < n; ++b) acc[b] = acc[b] + change[b];
}

void Subtract(std::span<const float> a, std::span<const float> b, std::span<float> out) {
  const size_t n = out.size();
  size_t at = 0;
  for (; at + kFiniteBlock <= n; at += kFiniteBlock) {
    SubtractBlock(a.data() + at, b.data() + at, out.data() + at);
  }
  for (; at < n; ++at) out[at] = a[at] - b[at];
}

bool AddFinite(std::span<const float> base, std::span<float> change) {
  return AddAllFinite(base.data(), change.data(), change.size());
}

bool AddFiniteKeep(std::span<float> held, std::span<const float> change, std::span<float> copy) {
  return AccumulateKept(held.data(), reinterpret_cast<const unsigned char*>(change.data()),
                        copy.data(), held.size());
}

bool AddFiniteKeepBytes(std::span<float> held, const void* change, std::span<float> copy) {
  return AccumulateKept(held.data(), static_cast<const unsigned char*>(change), copy.data(),
                        held.size());
}

absl::Status ParseFp32(std::string_view bytes, std::span<float> out, std::string_view what) {
  if (bytes.size() != out.size_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": expected ", out.size_bytes(),
                                                   " bytes (", out.size(), " fp32), got ",
                                                   bytes.size()));
  }
  if (ptrdiff_t i = CopyFindNonFinite(bytes.data(), out); i >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(what), ": value ", i, " is not finite (", out[i], ")"));
  }
  return absl::OkStatus();
}

}  // namespace ps::core
