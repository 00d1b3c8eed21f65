// The top-k kernels (kernels.h): a radix select of the k-th largest magnitude, then a
// compaction that keeps the coordinates above it and the lowest-indexed ties, in index
// order, as TopkExact does on the CPU. Selection arithmetic comes from
// codecs/hd_internal.h.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "codecs/cuda/kernels.h"
#include "codecs/hd_internal.h"

namespace ps::codecs::cuda {
namespace {

using internal::AbsBits;

constexpr unsigned kThreads = 256;
constexpr size_t kItems = kTopkTile / kThreads;  // consecutive values per thread
static_assert(kItems * kThreads == kTopkTile);

unsigned BlocksFor(size_t items) {
  const size_t blocks = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);
}

__device__ size_t GlobalThread() { return size_t{blockIdx.x} * blockDim.x + threadIdx.x; }
__device__ size_t GridThreads() { return size_t{gridDim.x} * blockDim.x; }

__global__ void RadixHistogramKernel(const float* x, size_t n, int shift, int bits,
                                     const SelectState* state, uint32_t* hist) {
  __shared__ uint32_t local[kMaxBins];
  const uint32_t bins = 1u << bits;
  for (uint32_t b = threadIdx.x; b < bins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  const int high = shift + bits;  // 31 for the first digit: no bits known yet
  const uint32_t prefix = state->prefix;
  for (size_t i = GlobalThread(); i < n; i += GridThreads()) {
    const uint32_t key = AbsBits(x[i]);
    if ((high >= 32 ? 0u : key >> high) == prefix) atomicAdd(&local[(key >> shift) & (bins - 1)], 1u);
  }
  __syncthreads();
  for (uint32_t b = threadIdx.x; b < bins; b += blockDim.x) {
    if (local[b] != 0) atomicAdd(&hist[b], local[b]);
  }
}

__global__ void SelectStepKernel(const uint32_t* hist, int bits, SelectState* state) {
  uint64_t above = 0;
  const uint32_t digit = internal::SelectBin(hist, 1u << bits, state->k, &above);
  state->prefix = (state->prefix << bits) | digit;
  state->k -= above;
  state->above += above;
}

// The thread's kItems consecutive values: how many keys are > T and == T.
__device__ uint64_t CountThread(const float* x, size_t n, size_t begin, uint32_t t) {
  uint64_t greater = 0, equal = 0;
  for (size_t l = 0; l < kItems; ++l) {
    const size_t i = begin + l;
    if (i >= n) break;
    const uint32_t key = AbsBits(x[i]);
    greater += key > t;
    equal += key == t;
  }
  return greater << 32 | equal;
}

__global__ void TileCountsKernel(const float* x, size_t n, const SelectState* state,
                                 uint64_t* tile_counts) {
  using Reduce = cub::BlockReduce<uint64_t, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  const size_t begin = size_t{blockIdx.x} * kTopkTile + threadIdx.x * kItems;
  const uint64_t counts = Reduce(temp).Sum(CountThread(x, n, begin, state->prefix));
  if (threadIdx.x == 0) tile_counts[blockIdx.x] = counts;
}

__global__ void TopkWriteKernel(const float* x, size_t n, const SelectState* state,
                                const uint64_t* tile_offsets, uint32_t* indices, float* values) {
  using Scan = cub::BlockScan<uint64_t, kThreads>;
  __shared__ typename Scan::TempStorage temp;
  const uint32_t t = state->prefix;
  const uint64_t need = state->k;
  const size_t begin = size_t{blockIdx.x} * kTopkTile + threadIdx.x * kItems;
  uint64_t before = 0;
  Scan(temp).ExclusiveSum(CountThread(x, n, begin, t), before);
  before += tile_offsets[blockIdx.x];
  uint64_t greater_before = before >> 32;
  uint64_t equal_before = before & 0xffffffffu;
  for (size_t l = 0; l < kItems; ++l) {
    const size_t i = begin + l;
    if (i >= n) break;
    const float v = x[i];
    const uint32_t key = AbsBits(v);
    const int64_t slot = internal::TopkSlot(key > t, key == t, greater_before, equal_before, need);
    if (slot >= 0) {
      indices[slot] = static_cast<uint32_t>(i);
      values[slot] = v;
    }
    greater_before += key > t;
    equal_before += key == t;
  }
}

__global__ void SampleKeysKernel(const float* x, size_t n, uint64_t seed, size_t samples,
                                 uint32_t* keys) {
  for (size_t j = GlobalThread(); j < samples; j += GridThreads()) {
    keys[j] = AbsBits(x[internal::BoundedRandom(internal::Mix64(seed + j), n)]);
  }
}

__global__ void GatherKernel(const float* x, const uint32_t* indices, size_t m, float* out) {
  for (size_t j = GlobalThread(); j < m; j += GridThreads()) out[j] = x[indices[j]];
}

__global__ void ScatterResidualKernel(const float* x, const uint32_t* indices, const float* decoded,
                                      size_t m, float* residual) {
  for (size_t j = GlobalThread(); j < m; j += GridThreads()) {
    residual[indices[j]] = x[indices[j]] - decoded[j];
  }
}

}  // namespace

cudaError_t LaunchRadixHistogram(const float* x, size_t n, int shift, int bits,
                                 const SelectState* state, uint32_t* hist, cudaStream_t stream) {
  RadixHistogramKernel<<<BlocksFor(n / 16 + 1), kThreads, 0, stream>>>(x, n, shift, bits, state, hist);
  return cudaGetLastError();
}

cudaError_t LaunchSelectStep(const uint32_t* hist, int bits, SelectState* state,
                             cudaStream_t stream) {
  SelectStepKernel<<<1, 1, 0, stream>>>(hist, bits, state);
  return cudaGetLastError();
}

cudaError_t LaunchTopkTileCounts(const float* x, size_t n, const SelectState* state,
                                 uint64_t* tile_counts, cudaStream_t stream) {
  const auto tiles = static_cast<unsigned>((n + kTopkTile - 1) / kTopkTile);
  TileCountsKernel<<<tiles, kThreads, 0, stream>>>(x, n, state, tile_counts);
  return cudaGetLastError();
}

cudaError_t LaunchTopkWrite(const float* x, size_t n, const SelectState* state,
                            const uint64_t* tile_offsets, uint32_t* indices, float* values,
                            cudaStream_t stream) {
  const auto tiles = static_cast<unsigned>((n + kTopkTile - 1) / kTopkTile);
  TopkWriteKernel<<<tiles, kThreads, 0, stream>>>(x, n, state, tile_offsets, indices, values);
  return cudaGetLastError();
}

cudaError_t LaunchSampleKeys(const float* x, size_t n, uint64_t seed, size_t samples,
                             uint32_t* keys, cudaStream_t stream) {
  SampleKeysKernel<<<BlocksFor(samples), kThreads, 0, stream>>>(x, n, seed, samples, keys);
  return cudaGetLastError();
}

cudaError_t LaunchGather(const float* x, const uint32_t* indices, size_t m, float* out,
                         cudaStream_t stream) {
  GatherKernel<<<BlocksFor(m), kThreads, 0, stream>>>(x, indices, m, out);
  return cudaGetLastError();
}

cudaError_t LaunchScatterResidual(const float* x, const uint32_t* indices, const float* decoded,
                                  size_t m, float* residual, cudaStream_t stream) {
  ScatterResidualKernel<<<BlocksFor(m), kThreads, 0, stream>>>(x, indices, decoded, m, residual);
  return cudaGetLastError();
}

}  // namespace ps::codecs::cuda
