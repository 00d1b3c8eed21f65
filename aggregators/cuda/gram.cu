// Adds the per-chunk fp32 Gram products (from cublasSgemmStridedBatched) into the
// double accumulator (docs/gpu.md, "Aggregation on the device", step 1).
#include "aggregators/cuda/kernels.h"

namespace ps::aggregators::cuda {
namespace {

__global__ void AddPartialsKernel(const float* partials, size_t batches, size_t count,
                                  double* acc) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  double s = acc[i];
  for (size_t b = 0; b < batches; ++b) s += static_cast<double>(partials[b * count + i]);
  acc[i] = s;
}

}  // namespace

cudaError_t LaunchAddPartials(const float* partials, size_t batches, size_t count, double* acc,
                              cudaStream_t stream) {
  constexpr int kThreads = 128;
  const unsigned blocks = static_cast<unsigned>((count + kThreads - 1) / kThreads);
  AddPartialsKernel<<<blocks, kThreads, 0, stream>>>(partials, batches, count, acc);
  return cudaGetLastError();
}

}  // namespace ps::aggregators::cuda
