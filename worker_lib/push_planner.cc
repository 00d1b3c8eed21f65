#include "worker_lib/push_planner_internal.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "core/device.h"
#include "core/status.h"
#include "gpu/cuda_device.h"
#include "worker_lib/codec_profile_internal.h"
#include "worker_lib/link_estimator_internal.h"

namespace ps::internal {
namespace {

// Weight of a new sample in the moving averages of ready times and round time.
constexpr double kSmoothing = 0.25;

double Smooth(const std::optional<double>& old, double sample) {
  return old.has_value() ? *old + kSmoothing * (sample - *old) : sample;
}

}  // namespace

absl::StatusOr<std::vector<PlanOption>> PushPlanner::MakeCandidates(
    const PlanOptions& options, const core::ModelLayout& layout) {
  uint64_t largest = 1;
  for (const core::SliceInfo& s : layout.slices()) largest = std::max<uint64_t>(largest, s.numel);
  std::vector<std::string> specs = options.candidates;
  if (std::find(specs.begin(), specs.end(), "fp32") == specs.end()) {
    specs.insert(specs.begin(), "fp32");
  }
  // The baseline first (PlanInput::options[0]), as an option that costs nothing to
  // encode or decode: fp32's copy is what every plan pays anyway.
  std::vector<PlanOption> out = {PlanOption{.name = "fp32"}};
  const double budget = std::chrono::duration<double>(options.profile_budget).count();
  const bool device = options.device_encode && gpu::CudaDevice().ok();
  for (const std::string& spec : specs) {
    if (spec == "fp32") continue;
    for (const core::Device d : {core::Device::kCpu, core::Device::kCuda}) {
      if (d == core::Device::kCuda && !device) break;
      PS_ASSIGN_OR_RETURN(const CodecCost cost, ProfileCodec(spec, largest, budget, d));
      if (cost.device != d) continue;  // no device encoder for this codec
      PlanOption o = OptionFromCost(cost);
      o.name = spec;  // as the caller wrote it: the name pushes use
      out.push_back(std::move(o));
    }
  }
  return out;
}

PushPlanner::PushPlanner(const PlanOptions& options, Objective objective,
                         const core::ModelLayout& layout, std::vector<PlanOption> candidates,
                         std::vector<std::string> current,
                         std::vector<core::Device> current_devices, std::function<double()> now)
    : options_(options),
      objective_(objective),
      layout_(layout),
      candidates_(std::move(candidates)),
      now_(now ? std::move(now) : SteadySeconds),
      own_devices_(std::move(current_devices)) {
  absl::MutexLock lock(&mu_);
  ready_.resize(layout_.tensors().size());
  stats_.codecs = std::move(current);
  stats_.devices = own_devices_;
}

void PushPlanner::RoundStarted(uint64_t version) {
  const double now = now_();
  absl::MutexLock lock(&mu_);
  if (round_.has_value() && version == *round_ + 1 && round_pushed_) {
    measured_ = Smooth(measured_, now - round_start_);
    stats_.measured_seconds = *measured_;
  }
  if (!round_.has_value() || version > *round_) {
    round_ = version;
    round_start_ = now;
    round_pushed_ = false;
  }
}

bool PushPlanner::PushQueued(size_t tensor, uint64_t round) {
  const double now = now_();
  absl::MutexLock lock(&mu_);
  if (!round_.has_value() || round > *round_) {
    // No pull announced this round (a caller that pushes without pulling first): it
    // starts with its first push.
    round_ = round;
    round_start_ = now;
    round_pushed_ = false;
  }
  if (round != *round_ || tensor >= ready_.size()) return false;
  ready_[tensor] = Smooth(ready_[tensor], now - round_start_);
  const bool first = !round_pushed_;
  if (first) ++rounds_seen_;
  round_pushed_ = true;
  return first;
}

void PushPlanner::PullTotals(uint64_t bytes, uint64_t values) {
  absl::MutexLock lock(&mu_);
  pulled_bytes_ = bytes;
  pulled_values_ = values;
}

bool PushPlanner::DueLocked(uint64_t round, std::span<const PlanLink> links) {
  if (rounds_seen_ < std::max<uint32_t>(options_.warmup_rounds, 1)) return false;
  for (const PlanLink& l : links) {
    if (!(l.seconds_per_byte > 0)) return false;  // a link not measured yet
  }
  if (stats_.plans == 0) return true;
  if (options_.replan_rounds > 0 && round >= stats_.planned_at + options_.replan_rounds) {
    return true;
  }
  bool drifted = false;
  for (size_t s = 0; s < links.size() && s < planned_links_.size(); ++s) {
    const double before = planned_links_[s].seconds_per_byte;
    drifted |= std::abs(links[s].seconds_per_byte - before) > options_.drift * before;
  }
  drifted_checks_ = drifted ? drifted_checks_ + 1 : 0;
  return drifted_checks_ >= std::max<uint32_t>(options_.drift_rounds, 1);
}

std::optional<std::vector<PlanOption>> PushPlanner::Replan(uint64_t round,
                                                           std::span<const PlanLink> up,
                                                           uint32_t workers,
                                                           std::span<const PlanLink> down) {
  // Uplinks then downlinks, the latter the uplink where not measured.
  std::vector<PlanLink> links(up.begin(), up.end());
  for (size_t s = 0; s < up.size(); ++s) {
    links.push_back(s < down.size() && down[s].seconds_per_byte > 0 ? down[s] : up[s]);
  }
  absl::MutexLock lock(&mu_);
  if (!DueLocked(round, links)) return std::nullopt;
  PlanInput in;
  in.options = candidates_;
  in.up.assign(links.begin(), links.begin() + static_cast<std::ptrdiff_t>(up.size()));
  in.down.assign(links.begin() + static_cast<std::ptrdiff_t>(up.size()), links.end());
  in.workers = std::max<uint32_t>(workers, 1);
  if (pulled_values_ > 0) {
    in.pull_bytes_per_value =
        static_cast<double>(pulled_bytes_) / static_cast<double>(pulled_values_);
  }
  const auto& tensors = layout_.tensors();
  for (size_t t = 0; t < tensors.size(); ++t) {
    PlanTensor pt;
    pt.numel = tensors[t].numel;
    pt.ready_seconds = ready_[t].value_or(0);
    pt.priority = static_cast<uint32_t>(std::max(tensors[t].priority, 0));
    for (uint32_t id : layout_.SlicesOfTensor(t)) {
      const core::SliceInfo& s = layout_.slices()[id];
      auto part = std::find_if(pt.parts.begin(), pt.parts.end(),
                               [&](const PlanTensor::Part& p) { return p.shard == s.shard; });
      if (part == pt.parts.end()) {
        pt.parts.push_back({s.shard, s.numel});
      } else {
        part->numel += s.numel;
      }
    }
    in.tensors.push_back(std::move(pt));
  }
  const Plan plan = objective_ == Objective::kBytes ? PlanFewestBytes(in) : PlanGreedy(in);
  std::vector<PlanOption> chosen;
  stats_.codecs.clear();
  stats_.devices.clear();
  for (size_t t = 0; t < plan.choice.size(); ++t) {
    chosen.push_back(candidates_[plan.choice[t]]);
    // Without device_encode every option was profiled on the CPU; the tensor keeps
    // encoding where its own options say.
    if (!options_.device_encode && t < own_devices_.size()) chosen.back().device = own_devices_[t];
    stats_.codecs.push_back(chosen.back().name);
    stats_.devices.push_back(chosen.back().device);
  }
  planned_links_ = std::move(links);
  drifted_checks_ = 0;
  ++stats_.plans;
  stats_.planned_at = round;
  stats_.predicted_seconds = plan.predicted_seconds;
  stats_.baseline_seconds = plan.baseline_seconds;
  return chosen;
}

PlanStats PushPlanner::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace ps::internal
