// The bitmaps of AggregationContext::masks (docs/aggregators.md, "Masks"), read the
// same way by the CPU rules and the CUDA kernels (aggregators/cuda/apply_kernel.h): bit
// c (byte c / 8, bit c % 8, least significant first) is set when coordinate c is
// present. No abseil, no CUDA runtime.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/hd.h"

namespace ps::aggregators::internal {

// Whether coordinate c is present in `mask` (not null).
PS_HD inline bool Present(const uint8_t* mask, size_t c) { return ((mask[c / 8] >> (c % 8)) & 1u) != 0; }

}  // namespace ps::aggregators::internal
