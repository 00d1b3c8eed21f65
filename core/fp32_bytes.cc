#include "core/fp32_bytes.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ps::core {

static_assert(std::endian::native == std::endian::little,
              "the wire format is little-endian; big-endian hosts need byte swaps here");

void AppendFp32(std::span<const float> values, std::string* out) {
  if (values.empty()) return;  // memcpy from a null data() is undefined even for 0 bytes
  const size_t old = out->size();
  out->resize(old + values.size_bytes());
  std::memcpy(out->data() + old, values.data(), values.size_bytes());
}

ptrdiff_t FindNonFinite(std::span<const float> values) {
  // Branch-free scan over blocks so the common all-finite case vectorizes.
  constexpr size_t kBlock = 1024;
  for (size_t b = 0; b < values.size(); b += kBlock) {
    const size_t e = std::min(values.size(), b + kBlock);
    uint32_t bad = 0;
    for (size_t i = b; i < e; ++i) {
      const uint32_t bits = std::bit_cast<uint32_t>(values[i]);
      bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
    }
    if (bad) {
      for (size_t i = b; i < e; ++i) {
        if (!std::isfinite(values[i])) return static_cast<ptrdiff_t>(i);
      }
    }
  }
  return -1;
}

absl::Status ParseFp32(std::string_view bytes, std::span<float> out, std::string_view what) {
  if (bytes.size() != out.size_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": expected ", out.size_bytes(),
                                                   " bytes (", out.size(), " fp32), got ",
                                                   bytes.size()));
  }
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  if (ptrdiff_t i = FindNonFinite(out); i >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(what), ": value ", i, " is not finite (", out[i], ")"));
  }
  return absl::OkStatus();
}

}  // namespace ps::core
