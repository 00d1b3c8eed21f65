#include "server/memory_estimate.h"

#include "core/resource_limits.h"

namespace ps::server {

uint64_t EstimateShardBytes(const core::LayoutSummary& layout, uint32_t num_workers,
                            size_t rule_state_rows, bool checkpoints, size_t published_copies,
                            uint64_t second_moment_elems) {
  // Per element: parameters, velocity, a published version (published_copies: more),
  // the aggregate being made, one row per worker for the open round's pushes, and the
  // rule's state; checkpoints keep a copy of velocity and state. Per owned slice: its
  // state object and, per worker, the round's bookkeeping. Per slice of the whole layout: its tables here.
  // Counts are at most 2^20 slices, 2^40 elements and 2^32 workers: no overflow in
  // 64 bits except in the element term, which saturates.
  constexpr uint64_t kLayoutBytesPerSlice = 64;
  constexpr uint64_t kSliceStateBytes = 1024;
  constexpr uint64_t kPerWorkerSliceBytes = 128;
  const uint64_t copies =
      4 + uint64_t{num_workers} + 2 * rule_state_rows + (checkpoints ? 2 : 0) + published_copies;
  const uint64_t elem_bytes = layout.max_owned_elems * sizeof(float);
  const uint64_t element_term =
      elem_bytes > UINT64_MAX / copies ? UINT64_MAX / 2 : elem_bytes * copies;
  // At most 2^40 elements x 8 bytes: no overflow.
  const uint64_t moment_term = second_moment_elems * sizeof(float) * (checkpoints ? 2 : 1);
  const uint64_t slice_term =
      layout.max_owned_slices * (kSliceStateBytes + uint64_t{num_workers} * kPerWorkerSliceBytes) +
      layout.num_slices * kLayoutBytesPerSlice + moment_term;
  return element_term > UINT64_MAX / 2 - slice_term ? UINT64_MAX / 2 : element_term + slice_term;
}

uint64_t EffectiveMaxShardBytes(const ServerOptions& options) {
  if (options.max_shard_bytes != 0) return options.max_shard_bytes;
  // Half the memory this process may use: its cgroup's limit, else the machine's.
  return core::ProcessResourceLimits().memory_bytes / 2;
}

}  // namespace ps::server
