// PushPlanner: Espresso in the worker (docs/adaptive.md, "Espresso"). It keeps the cost
// model of one round as the worker trains and turns it into each tensor's push codec
// with PlanGreedy (espresso_planner_internal.h):
//
//   round:      from the end of the pull of version t (the parameters are in, the
//               forward pass can run) to the end of the pull of version t + 1
//               (RoundStarted); its length is the measured round time
//   ready:      when each tensor's push of the round was queued, from the round's
//               start (a moving average per tensor; backward hooks push a gradient as
//               soon as it exists, so these are the gradients' ready times)
//   links:      per shard, the push pipeline's alpha + beta x bytes estimate for the
//               uplink, the pull streams' for the downlink (the uplink's until the
//               pulls measured it)
//   codecs:     each candidate profiled at Create (ProfileCodec) at the layout's
//               largest slice, on the CPU and (PlanOptions::device_encode) on the CUDA
//               device where it encodes there
//   pulls:      bytes per value the pulls brought (dense: 4, compressed: less)
//
// The plan: PlanGreedy (Objective::kTime) or PlanFewestBytes (kBytes).
// The first plan comes once `warmup_rounds` rounds were seen and every shard's link
// was measured; a new one when a link's seconds per byte (either direction) stayed
// more than `drift` away from the one planned with for `drift_rounds` checks in a row
// (a noisy estimate does not flap the plan), or `replan_rounds` rounds after the last.
//
// Thread safety: every method may be called from any thread (one lock).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/device.h"
#include "core/layout.h"
#include "worker_lib/espresso_planner_internal.h"
#include "worker_lib/worker.h"

namespace ps::internal {

class PushPlanner {
 public:
  // `now` gives seconds on a monotonic clock (default: steady_clock). `options` come
  // from the profiles of `options.candidates` (MakeCandidates); `current` is each
  // tensor's codec and encode device before the first plan.
  PushPlanner(const PlanOptions& options, Objective objective, const core::ModelLayout& layout,
              std::vector<PlanOption> candidates, std::vector<std::string> current,
              std::vector<core::Device> current_devices, std::function<double()> now = {});

  // Profiles the candidates (fp32 first) at the layout's largest slice, within
  // options.profile_budget each: every spec on the CPU, and with options.device_encode
  // each spec again on the CUDA device, kept as an option of its own only where it
  // really encodes there (the build has the kernels, the machine a device, the codec a
  // device encoder). Refuses a spec MakeCodec refuses.
  static absl::StatusOr<std::vector<PlanOption>> MakeCandidates(const PlanOptions& options,
                                                                const core::ModelLayout& layout);

  // A pull of `version` ended: round `version` begins (and the one before ended).
  void RoundStarted(uint64_t version);
  // Tensor `tensor`'s push of `round` is queued now. True when it is the round's first
  // push: the caller then offers the links (Replan).
  bool PushQueued(size_t tensor, uint64_t round);
  // The bytes pulled so far and the values they carried (the pull codec's bytes per
  // value).
  void PullTotals(uint64_t bytes, uint64_t values);

  // Plans when a plan is due with these links and the shards' worker count. `up`: per
  // shard (an entry with seconds_per_byte 0 is not measured yet: no plan); `down`: per
  // shard, where missing or not measured the uplink is taken. Returns each tensor's
  // option (codec name and encode device; without PlanOptions::device_encode the
  // tensor's own device) when a new plan was made.
  std::optional<std::vector<PlanOption>> Replan(uint64_t round, std::span<const PlanLink> up,
                                                uint32_t workers,
                                                std::span<const PlanLink> down = {});

  PlanStats stats() const;

 private:
  // Also counts the checks in a row that found a link drifted.
  bool DueLocked(uint64_t round, std::span<const PlanLink> links)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const PlanOptions options_;
  const Objective objective_;
  const core::ModelLayout& layout_;
  const std::vector<PlanOption> candidates_;
  const std::function<double()> now_;
  const std::vector<core::Device> own_devices_;  // each tensor's PushOptions::device

  mutable absl::Mutex mu_;
  std::optional<uint64_t> round_ ABSL_GUARDED_BY(mu_);  // the round being timed
  double round_start_ ABSL_GUARDED_BY(mu_) = 0;
  bool round_pushed_ ABSL_GUARDED_BY(mu_) = false;  // a push of round_ was queued
  uint64_t rounds_seen_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<double> measured_ ABSL_GUARDED_BY(mu_);            // round seconds
  std::vector<std::optional<double>> ready_ ABSL_GUARDED_BY(mu_);  // per tensor
  uint64_t pulled_bytes_ ABSL_GUARDED_BY(mu_) = 0, pulled_values_ ABSL_GUARDED_BY(mu_) = 0;
  // What the plan used: the uplinks, then the downlinks.
  std::vector<PlanLink> planned_links_ ABSL_GUARDED_BY(mu_);
  uint32_t drifted_checks_ ABSL_GUARDED_BY(mu_) = 0;  // in a row
  PlanStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::internal
