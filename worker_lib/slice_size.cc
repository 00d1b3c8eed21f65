#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/layout.h"
#include "core/status.h"
#include "worker_lib/shard_client_internal.h"
#include "worker_lib/slice_size_internal.h"

namespace ps::internal {

namespace {

// The open join: a session and the registered slice size, retrying an unreachable shard.
absl::StatusOr<v1::JoinResponse> OpenJoin(ShardControl& control, const WorkerOptions& options,
                                          RpcClock::time_point deadline) {
  v1::JoinRequest req;
  req.set_worker_id(options.worker_id);
  req.set_job_slice_elems(true);
  req.set_data_plane(PlaneAsked(options.data_plane));
  req.set_run_id(options.run_id);
  const core::RetryPolicy policy = JoinRetryPolicy(options);
  const JoinRetries how{.policy = &policy,
                        .rpc_timeout = options.rpc_timeout,
                        .doing = [&] {
                          return absl::StrCat("joining ", ShardName(0, options.shard_addresses[0]),
                                              " for the job's slice size as worker ",
                                              options.worker_id);
                        }};
  return JoinRetrying(control, std::move(req), how, deadline);
}

// Joins shard 0 again, with the join policy's backoff, until a layout is registered
// there or `deadline`.
absl::StatusOr<v1::JoinResponse> AwaitJobSize(ShardControl& control, const WorkerOptions& options,
                                              v1::JoinResponse join,
                                              RpcClock::time_point deadline) {
  const core::RetryPolicy policy = JoinRetryPolicy(options);
  const RpcClock::time_point start = RpcClock::now();
  for (int attempt = 0; join.slice_elems() == 0; ++attempt) {
    const auto backoff = policy.Backoff(attempt);
    if (RpcClock::now() + backoff >= deadline) {
      return NoRootYet(ShardName(0, options.shard_addresses[0]), options.worker_id,
                       RpcClock::now() - start);
    }
    std::this_thread::sleep_for(backoff);
    PS_ASSIGN_OR_RETURN(join, OpenJoin(control, options, deadline));
  }
  return join;
}

// Seconds one probe took, or its failure.
absl::StatusOr<double> TimeProbe(ShardControl& control, const v1::ProbeRequest& req,
                                 std::chrono::milliseconds timeout) {
  v1::ProbeResponse resp;
  const auto start = std::chrono::steady_clock::now();
  PS_RETURN_IF_ERROR(control.Probe(req, RpcClock::now() + timeout, &resp));
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  if (resp.received_bytes() != req.payload().size()) {
    return absl::InternalError(absl::StrCat("the shard received ", resp.received_bytes(),
                                            " bytes of a probe of ", req.payload().size()));
  }
  return took.count();
}

// The link's rate in bytes per second (0 when the times do not tell it apart from a
// link too fast to time this way, which counts as fast: see the caller).
absl::StatusOr<double> MeasureLink(ShardControl& control, const std::string& session,
                                   std::chrono::milliseconds timeout) {
  v1::ProbeRequest small, large;
  small.set_session(session);
  small.set_payload(std::string(kProbeSmallBytes, '\0'));
  large.set_session(session);
  large.set_payload(std::string(kProbeLargeBytes, '\0'));
  // A small probe and kProbeWarmups large ones first, not timed: they open the
  // connection and grow HTTP/2's windows, and they make both processes' allocators keep
  // buffers of the large size. Until then glibc maps a fresh buffer per call, whose page
  // faults a new process would time as the link: 15 ms a MiB on loopback, where a
  // process that had run a while moved it in 0.6 (docs/data-plane.md).
  PS_RETURN_IF_ERROR(TimeProbe(control, small, timeout).status());
  for (int i = 0; i < kProbeWarmups; ++i) {
    PS_RETURN_IF_ERROR(TimeProbe(control, large, timeout).status());
  }
  double best_small = 1e9, best_large = 1e9;
  for (int i = 0; i < kProbeRepeats; ++i) {
    PS_ASSIGN_OR_RETURN(double s, TimeProbe(control, small, timeout));
    PS_ASSIGN_OR_RETURN(double l, TimeProbe(control, large, timeout));
    best_small = std::min(best_small, s);
    best_large = std::min(best_large, l);
  }
  const double extra = best_large - best_small;
  return extra > 0 ? static_cast<double>(kProbeLargeBytes - kProbeSmallBytes) / extra : 0.0;
}

}  // namespace

uint32_t SliceElemsForLink(double bytes_per_second) {
  return bytes_per_second >= kLargeSliceLinkBytesPerSecond ? kLargeSliceElems
                                                           : core::kDefaultSliceElems;
}

bool LargeSlicesFit(uint64_t total_elems, uint32_t num_shards) {
  return total_elems >= kLargeSlicesPerShard * kLargeSliceElems * uint64_t{num_shards};
}

absl::StatusOr<JobSliceElems> ResolveJobSliceElems(ShardControl& control,
                                                   const WorkerOptions& options,
                                                   uint64_t total_elems,
                                                   RpcClock::time_point deadline) {
  PS_ASSIGN_OR_RETURN(v1::JoinResponse join, OpenJoin(control, options, deadline));
  if (!options.may_register) {
    // It starts from the root worker's layout: the root's size, never its own choice.
    PS_ASSIGN_OR_RETURN(join, AwaitJobSize(control, options, std::move(join), deadline));
  }
  JobSliceElems out;
  if (join.slice_elems() != 0) {
    out.slice_elems = join.slice_elems();
    out.adopted = true;
    return out;
  }
  if (!LargeSlicesFit(total_elems, static_cast<uint32_t>(options.shard_addresses.size()))) {
    out.slice_elems = core::kDefaultSliceElems;
    return out;
  }
  absl::StatusOr<double> rate = MeasureLink(control, join.session(), options.rpc_timeout);
  if (!rate.ok()) {
    // A shard that refuses a probe of kProbeLargeBytes would refuse such slices as well.
    out.slice_elems = core::kDefaultSliceElems;
    return out;
  }
  // Zero: the large probe took no longer than the small one, a link too fast to tell.
  out.link_bytes_per_second = *rate;
  out.slice_elems = *rate == 0 ? kLargeSliceElems : SliceElemsForLink(*rate);
  return out;
}

}  // namespace ps::internal
