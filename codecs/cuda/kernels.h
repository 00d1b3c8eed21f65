// Launchers of the CUDA encoders' kernels (dense.cu, topk.cu). Each kernel is a thin
// loop around the PS_HD functions of codecs/hd_internal.h, which the CPU codecs call
// and the CPU tests check. Every pointer is device memory; every launch is
// asynchronous on `stream` and returns the launch's error. n > 0 throughout. Between
// ps_codecs_cuda (nvcc, no abseil) and ps_codecs' device_encoder.cc.
//
// `residual`, where a launcher takes one, may be null (no error feedback) and may alias
// x: it receives x - decode(payload) per value, the same fp32 operations as the CPU's
// decode followed by worker_lib's subtraction (the kernels compile with -fmad=false).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ps::codecs::cuda {

// out[i] = a[i] + b[i] (error feedback's v = g + e).
cudaError_t LaunchAdd(const float* a, const float* b, size_t n, float* out, cudaStream_t stream);

// ---- fp16, bf16 ----

// out[2i], out[2i + 1] = the little-endian FloatToHalf(x[i]) (FloatToBf16 for bf16);
// *nonfinite_max = max over i of AbsBits(x[i]) when that is >= 0x7f800000 (a value is
// Inf or NaN), untouched otherwise (the caller zeroes it).
cudaError_t LaunchHalves(const float* x, size_t n, bool bf16, unsigned char* out,
                         uint32_t* nonfinite_max, float* residual, cudaStream_t stream);

// ---- magnitudes ----

// bucket_max[b] = max AbsBits over values [b * bucket, (b + 1) * bucket) (the caller
// zeroes the buckets first; atomicMax is order-free, so the result is exact).
cudaError_t LaunchBucketMaxAbs(const float* x, size_t n, size_t bucket, uint32_t* bucket_max,
                               cudaStream_t stream);

// ---- sign ----

// The sign payload's sum and scale: *sum = sum of |x| in double (per-block partial sums,
// then their sum in block order: a fixed order, so repeatable, but not the CPU's; see
// docs/gpu.md), *scale = float(*sum / n). `partials` holds kSumAbsBlocks doubles.
inline constexpr unsigned kSumAbsBlocks = 1024;
cudaError_t LaunchSumAbs(const float* x, size_t n, double* partials, double* sum, float* scale,
                         cudaStream_t stream);
// Word w of `bits` (ceil(n / 32) words, little-endian) = NegativeBit of values
// 32w .. 32w + 31, zero past n. residual: x - (bit ? -*scale : *scale).
cudaError_t LaunchSignBits(const float* x, size_t n, const float* scale, uint32_t* bits,
                           float* residual, cudaStream_t stream);

// ---- terngrad ----

// scales[b] = the bucket's max|x| (bucket_max as a float), 0 below FLT_MIN; byte j of
// `codes` ((n + 3) / 4 bytes) = PackCodes4 of the TernaryCode of values 4j .. 4j + 3
// with inv = 1 / scale (0 codes for a zero scale), zero codes past n.
cudaError_t LaunchTernGrad(const float* x, size_t n, size_t bucket, const uint32_t* bucket_max,
                           uint32_t seed, float* scales, unsigned char* codes, float* residual,
                           cudaStream_t stream);

// ---- 3lc ----

// scale_half[0] = M = float(min(max|x| * s, FLT_MAX)) in double, scale_half[1] =
// max(M / 2, FLT_TRUE_MIN), from *max_bits (one thread, as the CPU does on the host).
cudaError_t Launch3lcScale(const uint32_t* max_bits, double s, float* scale_half,
                           cudaStream_t stream);
// groups = ceil(n / 5). bytes[g] = Pack3lcDigits of the TernaryDigit of values 5g ..
// 5g + 4 (digit 1 past n); key[g] = g when bytes[g] is not a zero group, else -1.
// residual: x - (digit - 1) * M.
cudaError_t Launch3lcGroups(const float* x, size_t n, const float* scale_half, uint8_t* bytes,
                            int32_t* key, float* residual, cudaStream_t stream);
// sizes[g] = the tokens a non-zero group g writes (the zero run since the previous
// non-zero group, then its byte; 0 for a zero group), from last[g], the inclusive
// max-scan of key.
cudaError_t Launch3lcSizes(const uint8_t* bytes, const int32_t* last, size_t groups,
                           uint32_t* sizes, cudaStream_t stream);
// Writes the tokens at offsets (the exclusive sum of sizes), then the run of zero groups
// after the last non-zero one; *total = the tokens' bytes.
cudaError_t Launch3lcTokens(const uint8_t* bytes, const int32_t* last, const uint32_t* sizes,
                            const uint32_t* offsets, size_t groups, unsigned char* out,
                            uint32_t* total, cudaStream_t stream);

// ---- top-k ----

// A radix select's state: the keys (AbsBits) found so far share `prefix` in their high
// bits, and the k-th largest key is the k-th largest among them; `above` counts the keys
// known to be larger. After the last digit, prefix is the k-th largest key T and the
// selection keeps every key > T and the first k keys == T (TopkSlot).
struct SelectState {
  uint32_t prefix;
  uint32_t pad;
  uint64_t k;
  uint64_t above;
};

// The digits of the 31 magnitude bits, most significant first: bits 30..20, 19..10,
// 9..0 (the CPU's first histogram also bins the top 11 bits).
inline constexpr int kSelectDigits = 3;
inline constexpr int kDigitShift[kSelectDigits] = {20, 10, 0};
inline constexpr int kDigitBits[kSelectDigits] = {11, 10, 10};
inline constexpr uint32_t kMaxBins = 2048;

// hist[d] += the keys whose bits above shift + bits equal state->prefix, by digit d =
// (key >> shift) & (2^bits - 1). The caller zeroes hist (2^bits counters).
cudaError_t LaunchRadixHistogram(const float* x, size_t n, int shift, int bits,
                                 const SelectState* state, uint32_t* hist, cudaStream_t stream);
// One thread: SelectBin on hist, then state->prefix gains the digit and state->k loses
// the keys above it.
cudaError_t LaunchSelectStep(const uint32_t* hist, int bits, SelectState* state,
                             cudaStream_t stream);

// Values per tile of the compaction (one block).
inline constexpr size_t kTopkTile = 4096;
// tile_counts[t] = (keys > T in tile t) << 32 | (keys == T in tile t), T = state->prefix.
cudaError_t LaunchTopkTileCounts(const float* x, size_t n, const SelectState* state,
                                 uint64_t* tile_counts, cudaStream_t stream);
// Writes the kept coordinates (state: keep keys > T and the first state->k keys == T)
// and their values in index order: tile_offsets is the exclusive sum of tile_counts.
cudaError_t LaunchTopkWrite(const float* x, size_t n, const SelectState* state,
                            const uint64_t* tile_offsets, uint32_t* indices, float* values,
                            cudaStream_t stream);

// keys[j] = AbsBits(x[BoundedRandom(Mix64(seed + j), n)]) for j < samples: the CPU's
// TopkSampled sample.
cudaError_t LaunchSampleKeys(const float* x, size_t n, uint64_t seed, size_t samples,
                             uint32_t* keys, cudaStream_t stream);
// out[j] = x[indices[j]].
cudaError_t LaunchGather(const float* x, const uint32_t* indices, size_t m, float* out,
                         cudaStream_t stream);
// residual[indices[j]] = x[indices[j]] - decoded[j] (the rest of residual is x already).
cudaError_t LaunchScatterResidual(const float* x, const uint32_t* indices, const float* decoded,
                                  size_t m, float* residual, cudaStream_t stream);

// ---- scans (cub) ----

// Bytes of scratch the scans below need for up to n items.
size_t ScanScratchBytes(size_t n);
// out = the inclusive max-scan of in.
cudaError_t InclusiveMaxScan(const int32_t* in, int32_t* out, size_t n, void* scratch,
                             size_t scratch_bytes, cudaStream_t stream);
// out = the exclusive sum of in.
cudaError_t ExclusiveSum(const uint32_t* in, uint32_t* out, size_t n, void* scratch,
                         size_t scratch_bytes, cudaStream_t stream);
cudaError_t ExclusiveSum(const uint64_t* in, uint64_t* out, size_t n, void* scratch,
                         size_t scratch_bytes, cudaStream_t stream);

}  // namespace ps::codecs::cuda
