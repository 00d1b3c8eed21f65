// Where compute runs: the CPU, or a CUDA device when this build has the GPU kernels and
// the machine has a device (docs/gpu.md). Every CUDA path has a CPU fallback, so asking
// for `cuda` never fails: callers check gpu::CudaDevice() (gpu/cuda_device.h) and say in
// their log which one ran. This header is the vocabulary only: the names, no CUDA.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ps::core {

enum class Device {
  kCpu,
  kCuda,
};

// "cpu" or "cuda" (as in flags and config files); anything else is INVALID_ARGUMENT
// naming the accepted values.
absl::StatusOr<Device> ParseDevice(std::string_view text);
std::string_view DeviceName(Device device);

}  // namespace ps::core
