// Where compute runs: the CPU, or a CUDA device when this build has the GPU kernels and
// the machine has a device (docs/gpu.md). Every CUDA path has a CPU fallback, so asking
// for `cuda` never fails: callers check CudaDevice() and say in their log which one ran.
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

// Whether this build has the CUDA kernels (a toolkit was found at configure time and
// PS_WITH_CUDA was not OFF).
bool BuiltWithCuda();

// The CUDA device this process computes on (the current device, normally 0),
// described for logs: "cuda:0 NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)". UNAVAILABLE with
// the reason when there is none: "this build has no CUDA kernels (...)", "no CUDA
// device: cudaGetDeviceCount: no CUDA-capable device is detected", or the driver being
// older than the runtime. The answer is computed once per process.
absl::StatusOr<std::string> CudaDevice();

}  // namespace ps::core
