// Codec profiles (docs/adaptive.md, "The cost model"): what pushing a slice with a
// codec costs per value, measured on this machine: encode and decode seconds and payload
// bytes, on Gaussian values of the slice's size. The planners read them (Espresso's
// PlanOption). Measured once per (spec, size) at start, within a time budget, so a
// worker pays a bounded start-up cost however many codecs it considers.
//
// Thread safety: plain functions.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "core/device.h"
#include "worker_lib/espresso_planner_internal.h"

namespace ps::internal {

struct CodecCost {
  std::string spec;  // canonical
  uint64_t numel = 0;
  // Where the encodes ran: kCuda only when it was asked for and the codec, the build and
  // the machine encode on the device (Codec::device_note() empty).
  core::Device device = core::Device::kCpu;
  double encode_seconds_per_value = 0;
  double decode_seconds_per_value = 0;
  double bytes_per_value = 0;
  int repeats = 0;  // encodes (and decodes) timed; the fastest of them counts
};

// Encodes and decodes `numel` Gaussian values (a fixed seed) with `spec`, at least once
// and then again while the time spent is under `budget_seconds`, at most 16 times; keeps
// each step's fastest time (the least disturbed by other work). `device` is where the
// codec is asked to encode (CodecOptions::device), from host memory as the worker
// encodes; decodes run on the CPU, as the shard's do. Refuses a spec MakeCodec refuses
// and numel 0.
absl::StatusOr<CodecCost> ProfileCodec(std::string_view spec, uint64_t numel, double budget_seconds,
                                       core::Device device = core::Device::kCpu);

// The planner's option for pushing with a profiled codec.
PlanOption OptionFromCost(const CodecCost& cost);

}  // namespace ps::internal
