// Espresso's planner (docs/adaptive.md, "Espresso"): which way to push each tensor
// (a codec, on the CPU or the GPU) so that one round ends soonest, chosen by simulating
// the round's timeline and searching greedily as Espresso (Wang et al., EuroSys 2023)
// does. Pure functions over a cost model; no gRPC, no clock.
//
// The timeline of one round, per tensor (each split into parts, one per shard it has
// slices on):
//   gradient ready (backward) -> encode (one queue per encode device, in ready order)
//   -> push each part over its shard's uplink (one queue per shard, P3 order: the
//   lowest priority value among the parts that are encoded) -> the shard decodes the
//   workers' pushes and aggregates (one queue per shard, in arrival order) -> pull over
//   the shard's downlink (P3 order). The round ends when the last pull ends. Workers are
//   taken as alike: every worker's push of a part arrives when this worker's does.
//
// Thread safety: plain functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/device.h"

namespace ps::internal {

struct PlanTensor {
  uint64_t numel = 0;
  double ready_seconds = 0;  // gradient ready, from the round's start
  uint32_t priority = 0;     // P3: lower goes first (the layer's index from the input)
  struct Part {
    uint32_t shard = 0;
    uint64_t numel = 0;
  };
  std::vector<Part> parts;  // the tensor's values per shard (sum = numel)
};

// One way of pushing a tensor.
struct PlanOption {
  std::string name;  // "fp32", "topk(0.01)+varint+fp16", ...
  core::Device device = core::Device::kCpu;
  double bytes_per_value = 4;
  double encode_seconds_per_value = 0;
  // The shard's decode of one worker's push, per value.
  double decode_seconds_per_value = 0;
};

struct PlanLink {
  double alpha_seconds = 0;
  double seconds_per_byte = 0;
};

struct PlanInput {
  std::vector<PlanTensor> tensors;
  // options[0] is the baseline every tensor starts from (fp32, no encode cost).
  std::vector<PlanOption> options;
  std::vector<PlanLink> up, down;          // per shard
  uint32_t workers = 1;                    // pushes a shard decodes per part
  double aggregate_seconds_per_value = 0;  // the rule's pass on the shard
  double pull_bytes_per_value = 4;         // the pull codec's
};

struct RoundTimeline {
  double seconds = 0;          // when the last pull ends
  std::vector<double> pulled;  // per tensor: when its last part's pull ends
  // Per tensor: every part's push was followed by an idle uplink (the next push waited
  // for a gradient or an encode, not for this one), so compressing the tensor cannot
  // make the round end sooner.
  std::vector<bool> hidden;
};

// The round with tensor i pushed by options[choice[i]].
RoundTimeline SimulateRound(const PlanInput& input, std::span<const size_t> choice);

struct Plan {
  std::vector<size_t> choice;    // per tensor, an index into options
  double predicted_seconds = 0;  // SimulateRound of choice
  double baseline_seconds = 0;   // every tensor by options[0]
  size_t simulations = 0;        // rounds simulated to find it
};

// Espresso's greedy search: from every tensor on options[0], tensors by decreasing size
// (ties: nearer the output, i.e. higher priority value, first); a tensor the current
// plan hides is skipped; otherwise each option is tried with the others fixed and the
// one with the soonest round end kept. O(tensors x options) simulations, each
// O(parts log parts).
Plan PlanGreedy(const PlanInput& input);

// The objective "bytes" (Objective::kBytes): each tensor, by decreasing size as above,
// takes the option with the fewest bytes per value whose round still ends no later than
// with every tensor on options[0]; the others keep their choice. So the plan sends as
// few bytes as a greedy search finds without making the round slower than not
// compressing. O(tensors x options) simulations.
Plan PlanFewestBytes(const PlanInput& input);

}  // namespace ps::internal
