// The dense encoders' kernels (kernels.h): fp16, bf16, sign, terngrad, 3lc, and the
// scans they use. Per-value arithmetic comes from codecs/hd_internal.h.
#include <cfloat>
#include <cub/block/block_reduce.cuh>
#include <cub/device/device_scan.cuh>

#include "codecs/cuda/kernels.h"
#include "codecs/hd_internal.h"

namespace ps::codecs::cuda {
namespace {

using internal::AbsBits;

constexpr unsigned kThreads = 256;

// Blocks for one thread per item, capped (grid-stride loops cover the rest).
unsigned BlocksFor(size_t items) {
  const size_t blocks = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);
}

__device__ size_t GlobalThread() { return size_t{blockIdx.x} * blockDim.x + threadIdx.x; }
__device__ size_t GridThreads() { return size_t{gridDim.x} * blockDim.x; }

__global__ void AddKernel(const float* a, const float* b, size_t n, float* out) {
  for (size_t i = GlobalThread(); i < n; i += GridThreads()) out[i] = a[i] + b[i];
}

__global__ void HalvesKernel(const float* x, size_t n, bool bf16, unsigned char* out,
                             uint32_t* nonfinite_max, float* residual) {
  for (size_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float v = x[i];
    const uint16_t h = bf16 ? internal::FloatToBf16(v) : internal::FloatToHalf(v);
    out[2 * i] = static_cast<unsigned char>(h & 0xffu);
    out[2 * i + 1] = static_cast<unsigned char>(h >> 8);
    if (AbsBits(v) >= 0x7f800000u) atomicMax(nonfinite_max, AbsBits(v));
    if (residual != nullptr) {
      residual[i] = v - (bf16 ? internal::Bf16ToFloat(h) : internal::HalfToFloat(h));
    }
  }
}

// Each block covers kMaxTile consecutive values; its buckets' maxima meet in shared
// memory (a warp whose values share a bucket reduces first), then go to global memory.
constexpr size_t kMaxTile = 4096;

__global__ void BucketMaxKernel(const float* x, size_t n, size_t bucket, uint32_t* bucket_max) {
  __shared__ uint32_t local[kMaxTile];
  const size_t base = size_t{blockIdx.x} * kMaxTile;
  const size_t end = base + kMaxTile < n ? base + kMaxTile : n;
  const size_t first = base / bucket;
  const size_t count = (end - 1) / bucket - first + 1;  // <= kMaxTile
  for (size_t b = threadIdx.x; b < count; b += blockDim.x) local[b] = 0;
  __syncthreads();
  for (size_t i = base + threadIdx.x; i < base + kMaxTile; i += blockDim.x) {
    const bool in = i < end;
    const size_t b = in ? i / bucket - first : 0;
    const uint32_t bits = in ? AbsBits(x[i]) : 0;
    const unsigned same = __match_any_sync(0xffffffffu, b);
    const uint32_t m = __reduce_max_sync(same, bits);
    if (in && (threadIdx.x & 31) == static_cast<unsigned>(__ffs(same) - 1)) atomicMax(&local[b], m);
  }
  __syncthreads();
  for (size_t b = threadIdx.x; b < count; b += blockDim.x) atomicMax(&bucket_max[first + b], local[b]);
}

__global__ void SumAbsPartialsKernel(const float* x, size_t n, double* partials) {
  using Reduce = cub::BlockReduce<double, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  double sum = 0;
  for (size_t i = GlobalThread(); i < n; i += GridThreads()) sum += fabs(double{x[i]});
  const double block = Reduce(temp).Sum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = block;
}

// One block of kSumAbsBlocks (1024) threads: the bound keeps ptxas within the 64
// registers a thread such a block may have.
__global__ void __launch_bounds__(kSumAbsBlocks)
    SumAbsFinalKernel(const double* partials, size_t n, double* sum, float* scale) {
  using Reduce = cub::BlockReduce<double, kSumAbsBlocks>;
  __shared__ typename Reduce::TempStorage temp;
  const double total = Reduce(temp).Sum(partials[threadIdx.x]);
  if (threadIdx.x == 0) {
    *sum = total;
    *scale = static_cast<float>(total / static_cast<double>(n));
  }
}

// One warp per 32 values: the ballot of their sign bits is the payload's word.
__global__ void SignBitsKernel(const float* x, size_t n, const float* scale, uint32_t* bits,
                               float* residual) {
  const size_t words = (n + 31) / 32;
  const unsigned lane = threadIdx.x & 31;
  const size_t warps = GridThreads() / 32;
  for (size_t w = GlobalThread() / 32; w < words; w += warps) {
    const size_t i = 32 * w + lane;
    const float v = i < n ? x[i] : 0.0f;
    const uint32_t negative = internal::NegativeBit(v);
    const uint32_t word = __ballot_sync(0xffffffffu, negative != 0);
    if (lane == 0) bits[w] = word;
    if (residual != nullptr && i < n) residual[i] = v - (negative ? -*scale : *scale);
  }
}

__global__ void TernGradKernel(const float* x, size_t n, size_t bucket, const uint32_t* bucket_max,
                               uint32_t seed, float* scales, unsigned char* codes,
                               float* residual) {
  const size_t buckets = (n + bucket - 1) / bucket;
  for (size_t b = GlobalThread(); b < buckets; b += GridThreads()) {
    const float s = internal::FloatFromBits(bucket_max[b]);
    scales[b] = s < FLT_MIN ? 0.0f : s;
  }
  const size_t bytes = (n + 3) / 4;
  for (size_t j = GlobalThread(); j < bytes; j += GridThreads()) {
    uint32_t four = 0;
    for (size_t l = 0; l < 4 && 4 * j + l < n; ++l) {
      const size_t i = 4 * j + l;
      const float s = internal::FloatFromBits(bucket_max[i / bucket]);
      uint8_t code = 0;
      if (!(s < FLT_MIN)) {
        code = internal::TernaryCode(x[i], __fdiv_rn(1.0f, s), seed, static_cast<uint32_t>(i));
      }
      four |= uint32_t{code} << (8 * l);
      if (residual != nullptr) {
        const float unit = code == 1 ? 1.0f : code == 2 ? -1.0f : 0.0f;
        residual[i] = x[i] - unit * (s < FLT_MIN ? 0.0f : s);
      }
    }
    codes[j] = internal::PackCodes4(four);
  }
}

__global__ void ThreeLcScaleKernel(const uint32_t* max_bits, double s, float* scale_half) {
  const double max_abs = internal::FloatFromBits(*max_bits);
  const double m = max_abs * s;
  const float scale = static_cast<float>(m < double{FLT_MAX} ? m : double{FLT_MAX});
  const float half = 0.5f * scale;
  scale_half[0] = scale;
  scale_half[1] = half > FLT_TRUE_MIN ? half : FLT_TRUE_MIN;
}

__global__ void ThreeLcGroupsKernel(const float* x, size_t n, const float* scale_half,
                                    uint8_t* bytes, int32_t* key, float* residual) {
  const size_t groups = (n + 4) / 5;
  const float scale = scale_half[0];
  const float half = scale_half[1];
  for (size_t g = GlobalThread(); g < groups; g += GridThreads()) {
    uint64_t digits = 0;
    for (size_t j = 0; j < 5; ++j) {
      const size_t i = 5 * g + j;
      uint8_t d = 1;  // padding past n: a zero digit
      if (i < n) {
        d = internal::TernaryDigit(x[i], half);
        if (residual != nullptr) residual[i] = x[i] - static_cast<float>(int{d} - 1) * scale;
      }
      digits |= uint64_t{d} << (8 * j);
    }
    const uint8_t b = internal::Pack3lcDigits(digits);
    bytes[g] = b;
    key[g] = b == internal::k3lcZeroGroup ? -1 : static_cast<int32_t>(g);
  }
}

// The zero groups between the previous non-zero group and group g (last: the inclusive
// max-scan of the keys).
__device__ uint64_t RunBefore(const int32_t* last, size_t g) {
  const int64_t previous = g > 0 ? last[g - 1] : -1;
  return static_cast<uint64_t>(static_cast<int64_t>(g) - 1 - previous);
}

__global__ void ThreeLcSizesKernel(const uint8_t* bytes, const int32_t* last, size_t groups,
                                   uint32_t* sizes) {
  for (size_t g = GlobalThread(); g < groups; g += GridThreads()) {
    sizes[g] = bytes[g] == internal::k3lcZeroGroup
                   ? 0
                   : static_cast<uint32_t>(internal::ZeroRunTokenCount(RunBefore(last, g)) + 1);
  }
}

__global__ void ThreeLcTokensKernel(const uint8_t* bytes, const int32_t* last,
                                    const uint32_t* sizes, const uint32_t* offsets, size_t groups,
                                    unsigned char* out, uint32_t* total) {
  for (size_t g = GlobalThread(); g < groups; g += GridThreads()) {
    if (sizes[g] != 0) {
      // The run's sizes[g] - 1 tokens, then the group's byte.
      internal::WriteZeroRun(RunBefore(last, g), out + offsets[g]);
      out[offsets[g] + sizes[g] - 1] = bytes[g];
    }
    if (g == groups - 1) {
      const uint64_t trailing = RunBefore(last, groups);
      const uint32_t end = offsets[g] + sizes[g];
      internal::WriteZeroRun(trailing, out + end);
      *total = end + static_cast<uint32_t>(internal::ZeroRunTokenCount(trailing));
    }
  }
}

struct MaxOp {
  __device__ int32_t operator()(int32_t a, int32_t b) const { return a > b ? a : b; }
};

}  // namespace

cudaError_t LaunchAdd(const float* a, const float* b, size_t n, float* out, cudaStream_t stream) {
  AddKernel<<<BlocksFor(n), kThreads, 0, stream>>>(a, b, n, out);
  return cudaGetLastError();
}

cudaError_t LaunchHalves(const float* x, size_t n, bool bf16, unsigned char* out,
                         uint32_t* nonfinite_max, float* residual, cudaStream_t stream) {
  HalvesKernel<<<BlocksFor(n), kThreads, 0, stream>>>(x, n, bf16, out, nonfinite_max, residual);
  return cudaGetLastError();
}

cudaError_t LaunchBucketMaxAbs(const float* x, size_t n, size_t bucket, uint32_t* bucket_max,
                               cudaStream_t stream) {
  const size_t tiles = (n + kMaxTile - 1) / kMaxTile;
  BucketMaxKernel<<<static_cast<unsigned>(tiles), kThreads, 0, stream>>>(x, n, bucket, bucket_max);
  return cudaGetLastError();
}

cudaError_t LaunchSumAbs(const float* x, size_t n, double* partials, double* sum, float* scale,
                         cudaStream_t stream) {
  SumAbsPartialsKernel<<<kSumAbsBlocks, kThreads, 0, stream>>>(x, n, partials);
  SumAbsFinalKernel<<<1, kSumAbsBlocks, 0, stream>>>(partials, n, sum, scale);
  return cudaGetLastError();
}

cudaError_t LaunchSignBits(const float* x, size_t n, const float* scale, uint32_t* bits,
                           float* residual, cudaStream_t stream) {
  SignBitsKernel<<<BlocksFor(n), kThreads, 0, stream>>>(x, n, scale, bits, residual);
  return cudaGetLastError();
}

cudaError_t LaunchTernGrad(const float* x, size_t n, size_t bucket, const uint32_t* bucket_max,
                           uint32_t seed, float* scales, unsigned char* codes, float* residual,
                           cudaStream_t stream) {
  TernGradKernel<<<BlocksFor((n + 3) / 4), kThreads, 0, stream>>>(x, n, bucket, bucket_max, seed,
                                                                 scales, codes, residual);
  return cudaGetLastError();
}

cudaError_t Launch3lcScale(const uint32_t* max_bits, double s, float* scale_half,
                           cudaStream_t stream) {
  ThreeLcScaleKernel<<<1, 1, 0, stream>>>(max_bits, s, scale_half);
  return cudaGetLastError();
}

cudaError_t Launch3lcGroups(const float* x, size_t n, const float* scale_half, uint8_t* bytes,
                            int32_t* key, float* residual, cudaStream_t stream) {
  ThreeLcGroupsKernel<<<BlocksFor((n + 4) / 5), kThreads, 0, stream>>>(x, n, scale_half, bytes,
                                                                       key, residual);
  return cudaGetLastError();
}

cudaError_t Launch3lcSizes(const uint8_t* bytes, const int32_t* last, size_t groups,
                           uint32_t* sizes, cudaStream_t stream) {
  ThreeLcSizesKernel<<<BlocksFor(groups), kThreads, 0, stream>>>(bytes, last, groups, sizes);
  return cudaGetLastError();
}

cudaError_t Launch3lcTokens(const uint8_t* bytes, const int32_t* last, const uint32_t* sizes,
                            const uint32_t* offsets, size_t groups, unsigned char* out,
                            uint32_t* total, cudaStream_t stream) {
  ThreeLcTokensKernel<<<BlocksFor(groups), kThreads, 0, stream>>>(bytes, last, sizes, offsets,
                                                                  groups, out, total);
  return cudaGetLastError();
}

size_t ScanScratchBytes(size_t n) {
  size_t a = 0, b = 0, c = 0;
  cub::DeviceScan::InclusiveScan(nullptr, a, static_cast<const int32_t*>(nullptr),
                                 static_cast<int32_t*>(nullptr), MaxOp{}, n);
  cub::DeviceScan::ExclusiveSum(nullptr, b, static_cast<const uint32_t*>(nullptr),
                                static_cast<uint32_t*>(nullptr), n);
  cub::DeviceScan::ExclusiveSum(nullptr, c, static_cast<const uint64_t*>(nullptr),
                                static_cast<uint64_t*>(nullptr), n);
  return a > b ? (a > c ? a : c) : (b > c ? b : c);
}

cudaError_t InclusiveMaxScan(const int32_t* in, int32_t* out, size_t n, void* scratch,
                             size_t scratch_bytes, cudaStream_t stream) {
  return cub::DeviceScan::InclusiveScan(scratch, scratch_bytes, in, out, MaxOp{}, n, stream);
}

cudaError_t ExclusiveSum(const uint32_t* in, uint32_t* out, size_t n, void* scratch,
                         size_t scratch_bytes, cudaStream_t stream) {
  return cub::DeviceScan::ExclusiveSum(scratch, scratch_bytes, in, out, n, stream);
}

cudaError_t ExclusiveSum(const uint64_t* in, uint64_t* out, size_t n, void* scratch,
                         size_t scratch_bytes, cudaStream_t stream) {
  return cub::DeviceScan::ExclusiveSum(scratch, scratch_bytes, in, out, n, stream);
}

}  // namespace ps::codecs::cuda
