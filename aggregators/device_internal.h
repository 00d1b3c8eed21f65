// The interface through which an Aggregator runs on a device (docs/gpu.md). Implemented
// by aggregators/cuda/ (ps_aggregators_cuda) in builds with CUDA, and by no_cuda.cc,
// which always refuses, in builds without.
//
// A backend runs the Gram matrix of k rows and a plan's pass over the coordinates, with
// or without masks; compressed-domain supports stay on the CPU. Rows and outputs are
// host or device pointers, as `where` says; host data is copied to the device and back.
// `masks` is empty or AggregationContext::masks for the first rows (the inputs), in host
// memory, and only with host rows: a missing coordinate is filled with the median of the
// values present there before a Gram matrix or a non-native pass, and read natively by a
// coordinate rule on the inputs as they are, as on the CPU (docs/aggregators.md,
// "Masks"). Thread safety: every method may be called concurrently (calls are
// serialised on the backend's stream).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "aggregators/stage_internal.h"

namespace ps::aggregators::internal {

enum class Memory { kHost, kDevice };

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  // "cuda:0 NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)".
  virtual const std::string& description() const = 0;
  // gram (n x n doubles, n = rows.size(), row-major) += the Gram matrix of the rows' d
  // coordinates.
  virtual absl::Status AccumulateGram(std::span<const float* const> rows, size_t d, Memory where,
                                      std::span<const uint8_t* const> masks,
                                      std::span<double> gram) const = 0;
  // out = the plan applied to rows (its k inputs, then its state rows), as
  // Aggregator::Apply computes it on the CPU; then, when `state` is not null, state =
  // out (the rule's memory, out.size() floats, in the same memory as out).
  virtual absl::Status Apply(const PlanData& plan, std::span<const float* const> rows,
                             std::span<float> out, Memory where,
                             std::span<const uint8_t* const> masks, float* state) const = 0;
  // Gram matrix, plan (by `make_plan`, on the host) and Apply with the rows copied to
  // the device once. Without `needs_gram` the plan gets an empty matrix.
  virtual absl::Status Aggregate(
      std::span<const float* const> rows, std::span<float> out, Memory where,
      std::span<const uint8_t* const> masks, float* state, bool needs_gram,
      const std::function<absl::StatusOr<RoundPlan>(std::span<const double>)>& make_plan) const = 0;
};

// The CUDA backend, or UNAVAILABLE with the reason (no CUDA in this build, no device,
// cuBLAS not loadable).
absl::StatusOr<std::shared_ptr<const DeviceBackend>> MakeCudaBackend();

}  // namespace ps::aggregators::internal
