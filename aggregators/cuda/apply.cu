// The Apply and sign-vote kernels: a thread per coordinate around the PS_HD functions
// of apply_kernel.h (docs/gpu.md).
#include "aggregators/cuda/kernels.h"

namespace ps::aggregators::cuda {
namespace {

constexpr int kThreads = 256;

unsigned BlocksFor(size_t n, int threads) {
  const size_t blocks = (n + static_cast<size_t>(threads) - 1) / static_cast<size_t>(threads);
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

__device__ size_t ThreadIndex() {
  return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__global__ void LinearKernel(ApplyArgs a) {
  const size_t c = ThreadIndex();
  if (c < a.d) a.out[c] = LinearAt(a, c);
}

// Threads per block of SortedKernel<K>: at K = 64 a thread holds 64 sorted values and
// 64 shifted ones (ptxas: 150 registers), so blocks are smaller.
template <int K>
constexpr int SortedThreads() {
  return K >= 64 ? 128 : kThreads;
}

// SortedAt<K> (apply_kernel.h), with v filled by compile-time indices only: unit rows
// are loaded straight into registers (kPadding where a mask says missing); formed rows
// are computed into this thread's column of shared memory (K x blockDim floats) and
// loaded from there. Two instantiations (kUnitRows or not) so that the unit-rows path
// (median, trimmed mean, meamed and phocas on the inputs as they are) carries none of
// the row-forming code. Masks come with unit rows only.
template <int K, bool kUnitRows>
__global__ void SortedKernel(ApplyArgs a) {
  extern __shared__ float staged[];
  const size_t c = ThreadIndex();
  if (c >= a.d) return;
  float v[K];
  uint32_t count = 0;
  if constexpr (kUnitRows) {
#pragma unroll
    for (int r = 0; r < K; ++r) {
      const bool present = static_cast<uint32_t>(r) < a.num_rows && RowPresent(a, static_cast<uint32_t>(r), c);
      v[r] = present ? a.unit_rows[r][c] : kPadding;
      count += present ? 1u : 0u;
    }
  } else {
    float* column = staged + threadIdx.x;
    for (uint32_t r = 0; r < a.num_rows; ++r) column[r * blockDim.x] = RowValue(a, r, c);
#pragma unroll
    for (int r = 0; r < K; ++r) {
      v[r] = static_cast<uint32_t>(r) < a.num_rows ? column[r * blockDim.x] : kPadding;
    }
    count = a.num_rows;
  }
  a.out[c] = SortAndApply<K>(PlanAt(a, count), v, count);
}

template <int K>
cudaError_t LaunchSortedK(const ApplyArgs& a, cudaStream_t stream) {
  constexpr int threads = SortedThreads<K>();
  if (a.unit_rows != nullptr) {
    SortedKernel<K, true><<<BlocksFor(a.d, threads), threads, 0, stream>>>(a);
  } else {
    SortedKernel<K, false><<<BlocksFor(a.d, threads), threads, sizeof(float) * K * threads, stream>>>(a);
  }
  return cudaGetLastError();
}

__global__ void FormRowsKernel(ApplyArgs a, size_t begin, size_t w, float* rows) {
  const size_t j = ThreadIndex();
  if (j < w) FormRowsAt(a, begin, w, j, rows);
}

__global__ void PlaceByRankKernel(const float* rows, uint32_t num_rows, size_t w, float* sorted) {
  const size_t j = ThreadIndex();
  if (j < w) PlaceByRankAt(rows, num_rows, w, j, sorted);
}

__global__ void SortedColumnKernel(ApplyArgs a, const float* sorted, size_t begin, size_t w) {
  const size_t j = ThreadIndex();
  if (j < w) a.out[begin + j] = SortedColumnAt(a, sorted, begin, w, j);
}

// One block per (input, stretch of coordinates): block-wide sums of |x| (double) and of
// the present count over the coordinates present, added to sums[i] and counts[i] with
// one atomic each per block.
__global__ void AbsSumKernel(const float* const* inputs, const uint8_t* const* masks, size_t d,
                             double* sums, unsigned long long* counts) {
  __shared__ double partial[kThreads];
  __shared__ unsigned long long present[kThreads];
  const float* x = inputs[blockIdx.y];
  const uint8_t* mask = masks == nullptr ? nullptr : masks[blockIdx.y];
  double s = 0.0;
  unsigned long long n = 0;
  for (size_t c = ThreadIndex(); c < d; c += static_cast<size_t>(gridDim.x) * blockDim.x) {
    if (!PresentIn(mask, c)) continue;
    s += fabs(static_cast<double>(x[c]));
    ++n;
  }
  partial[threadIdx.x] = s;
  present[threadIdx.x] = n;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half >>= 1) {
    if (static_cast<int>(threadIdx.x) < half) {
      partial[threadIdx.x] += partial[threadIdx.x + half];
      present[threadIdx.x] += present[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    atomicAdd(&sums[blockIdx.y], partial[0]);
    atomicAdd(&counts[blockIdx.y], present[0]);
  }
}

__global__ void SignVoteKernel(const float* const* inputs, const uint8_t* const* masks, uint32_t k,
                               size_t d, float step, float* out) {
  const size_t c = ThreadIndex();
  if (c < d) out[c] = SignVoteAt(inputs, masks, k, step, c);
}

__global__ void FillKernel(float* row, const uint8_t* mask, const float* median, size_t d) {
  const size_t c = ThreadIndex();
  if (c < d) FillAt(row, mask, median, c);
}

}  // namespace

cudaError_t LaunchLinear(const ApplyArgs& a, cudaStream_t stream) {
  LinearKernel<<<BlocksFor(a.d, kThreads), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t LaunchSortedRegisters(const ApplyArgs& a, cudaStream_t stream) {
  if (a.num_rows <= 8) return LaunchSortedK<8>(a, stream);
  if (a.num_rows <= 16) return LaunchSortedK<16>(a, stream);
  if (a.num_rows <= 32) return LaunchSortedK<32>(a, stream);
  if (a.num_rows <= 64) return LaunchSortedK<64>(a, stream);
  return cudaErrorInvalidValue;
}

cudaError_t LaunchSortedGeneral(const ApplyArgs& a, size_t begin, size_t w, float* rows,
                                float* sorted, cudaStream_t stream) {
  const unsigned blocks = BlocksFor(w, kThreads);
  FormRowsKernel<<<blocks, kThreads, 0, stream>>>(a, begin, w, rows);
  PlaceByRankKernel<<<blocks, kThreads, 0, stream>>>(rows, a.num_rows, w, sorted);
  SortedColumnKernel<<<blocks, kThreads, 0, stream>>>(a, sorted, begin, w);
  return cudaGetLastError();
}

cudaError_t LaunchAbsSums(const float* const* inputs, const uint8_t* const* masks, uint32_t k,
                          size_t d, double* sums, unsigned long long* counts, cudaStream_t stream) {
  // Enough blocks per input to fill the device, few enough that the atomics are rare.
  const unsigned per_input = BlocksFor(d, kThreads) < 256 ? BlocksFor(d, kThreads) : 256;
  AbsSumKernel<<<dim3(per_input, k), kThreads, 0, stream>>>(inputs, masks, d, sums, counts);
  return cudaGetLastError();
}

cudaError_t LaunchSignVote(const float* const* inputs, const uint8_t* const* masks, uint32_t k,
                           size_t d, float step, float* out, cudaStream_t stream) {
  SignVoteKernel<<<BlocksFor(d, kThreads), kThreads, 0, stream>>>(inputs, masks, k, d, step, out);
  return cudaGetLastError();
}

cudaError_t LaunchFill(float* row, const uint8_t* mask, const float* median, size_t d,
                       cudaStream_t stream) {
  FillKernel<<<BlocksFor(d, kThreads), kThreads, 0, stream>>>(row, mask, median, d);
  return cudaGetLastError();
}

}  // namespace ps::aggregators::cuda
