// Which CUDA device this process computes on, if any (docs/gpu.md). The vocabulary of
// devices (core::Device, "cpu" and "cuda") is core/device.h; asking the CUDA runtime is
// here, in ps_gpu, which links the static CUDA runtime in a build with CUDA so that
// ps_core does not. Every CUDA path has a CPU fallback: callers check CudaDevice() and
// say in their log which one ran.
//
// Thread-safe: the answer is computed once per process.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace ps::gpu {

// Whether this build has the CUDA kernels (a toolkit was found at configure time and
// PS_WITH_CUDA was not OFF).
bool BuiltWithCuda();

// The CUDA device this process computes on (the current device, normally 0),
// described for logs: "cuda:0 NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)". UNAVAILABLE with
// the reason when there is none: "this build has no CUDA kernels (...)", "no CUDA
// device: cudaGetDeviceCount: no CUDA-capable device is detected", or the driver being
// older than the runtime. The answer is computed once per process.
absl::StatusOr<std::string> CudaDevice();

}  // namespace ps::gpu
