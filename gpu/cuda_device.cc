#include "gpu/cuda_device.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#if PS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ps::gpu {

bool BuiltWithCuda() { return PS_HAVE_CUDA != 0; }

namespace {

absl::StatusOr<std::string> ProbeCuda() {
#if PS_HAVE_CUDA
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("no CUDA device: cudaGetDeviceCount: ", cudaGetErrorString(e)));
  }
  if (count == 0) return absl::UnavailableError("no CUDA device: cudaGetDeviceCount found none");
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("no CUDA device: cudaGetDevice: ", cudaGetErrorString(e)));
  }
  cudaDeviceProp prop{};
  if (const cudaError_t e = cudaGetDeviceProperties(&prop, device); e != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("CUDA device ", device, ": cudaGetDeviceProperties: ", cudaGetErrorString(e)));
  }
  return absl::StrFormat("cuda:%d %s (sm_%d%d, %.1f GiB)", device, prop.name, prop.major,
                         prop.minor, static_cast<double>(prop.totalGlobalMem) / (1ull << 30));
#else
  return absl::UnavailableError(
      "this build has no CUDA kernels (no CUDA toolkit at configure time, or PS_WITH_CUDA=OFF)");
#endif
}

}  // namespace

absl::StatusOr<std::string> CudaDevice() {
  static const absl::StatusOr<std::string> probed = ProbeCuda();
  return probed;
}

}  // namespace ps::gpu
