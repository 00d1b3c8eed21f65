// The job's slice size (docs/data-plane.md, "The job's slice size"): a worker started
// with Worker::Start(options, tensors, kJobSliceElems) adopts the size of the layout
// registered on shard 0, or, when none is, chooses one from the link to shard 0 as it
// measures it, before anything that depends on the layout is built.
//
// The measure: ProbeRequests over shard 0's control channel (the same route as the
// data: both go through WorkerOptions::shaping's relay when the link is shaped), a small
// and a large payload timed alternately, the best of each kept; the link's rate is the
// difference of their sizes over the difference of their times, so the call's fixed
// cost and the round trip cancel.
//
// Thread safety: none needed (called once, on Start's thread).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "worker_lib/transport/common.h"
#include "worker_lib/transport/shard_control.h"
#include "worker_lib/worker.h"

namespace ps::internal {

// Slices of 262,144 values (1 MiB of fp32) where the link moves at least this many
// bytes per second (1 Gbit/s) and the model gives every shard at least
// kLargeSlicesPerShard of them; core::kDefaultSliceElems (65,536) otherwise. A smaller
// model keeps the default without a measure: large slices would leave shards with one
// or two slices, or none.
inline constexpr double kLargeSliceLinkBytesPerSecond = 125e6;
inline constexpr uint32_t kLargeSliceElems = 262144;
inline constexpr uint64_t kLargeSlicesPerShard = 4;
// The probe's payloads: the large one is also the largest a shard takes (kMaxProbeBytes
// of server/service_internal.h); a shard whose --max-message-bytes refuses it would
// refuse large slices too, and the choice falls back to the default.
inline constexpr size_t kProbeSmallBytes = 4096;
inline constexpr size_t kProbeLargeBytes = size_t{1} << 20;
inline constexpr int kProbeWarmups = 3;  // large probes before the timed ones
inline constexpr int kProbeRepeats = 3;

// The choice for a link measured at `bytes_per_second` (<= 0: not measured).
uint32_t SliceElemsForLink(double bytes_per_second);

// What resolving found: the size, and how.
struct JobSliceElems {
  uint32_t slice_elems = 0;
  bool adopted = false;            // registered on shard 0 by a worker before
  double link_bytes_per_second = 0;  // measured (when chosen, not adopted; 0: no measure)
};

// Whether a model of `total_elems` values over `num_shards` shards is large enough for
// large slices.
bool LargeSlicesFit(uint64_t total_elems, uint32_t num_shards);

// Joins shard 0 through `control` for the job's slice size (JoinRequest.job_slice_elems),
// retrying an unreachable shard with `options`' join policy until `deadline`; when none
// is registered, measures the link if LargeSlicesFit(total_elems, shard count). A worker
// that does not register (WorkerOptions::may_register false: it starts from the root's
// values) waits for the root's layout instead, until `deadline` (DEADLINE_EXCEEDED, which
// says so). Errors: the join's refusal (wrong run, data plane, credentials, ...), with
// context.
absl::StatusOr<JobSliceElems> ResolveJobSliceElems(ShardControl& control,
                                                   const WorkerOptions& options,
                                                   uint64_t total_elems,
                                                   RpcClock::time_point deadline);

}  // namespace ps::internal
