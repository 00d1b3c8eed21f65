// Launchers of the CUDA kernels behind the aggregation backend (apply.cu, gram.cu).
// Every pointer is device memory; every launch is asynchronous on `stream` and returns
// the launch's error. Internal to ps_aggregators_cuda.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "aggregators/cuda/apply_kernel.h"

namespace ps::aggregators::cuda {

// Rows that the register path sorts; beyond, the general path.
inline constexpr uint32_t kMaxRegisterRows = 64;

// out[c] = LinearAt(a, c) for c < a.d (a.op is kRow0 or kMean).
cudaError_t LaunchLinear(const ApplyArgs& a, cudaStream_t stream);
// out[c] = SortedAt<K>(a, c), K the least of 8, 16, 32, 64 holding a.num_rows.
// Requires a.op == kSorted and a.num_rows <= kMaxRegisterRows (and unit rows with masks).
cudaError_t LaunchSortedRegisters(const ApplyArgs& a, cudaStream_t stream);
// The general path on coordinates [begin, begin + w): rows and sorted each hold
// a.num_rows x w floats.
cudaError_t LaunchSortedGeneral(const ApplyArgs& a, size_t begin, size_t w, float* rows,
                                float* sorted, cudaStream_t stream);

// sums[i] += the sum of |inputs[i][c]| in double and counts[i] += the number of
// coordinates c < d present in masks[i] (masks null: every one), for i < k.
cudaError_t LaunchAbsSums(const float* const* inputs, const uint8_t* const* masks, uint32_t k,
                          size_t d, double* sums, unsigned long long* counts, cudaStream_t stream);
// out[c] = SignVoteAt(inputs, masks, k, step, c).
cudaError_t LaunchSignVote(const float* const* inputs, const uint8_t* const* masks, uint32_t k,
                           size_t d, float step, float* out, cudaStream_t stream);
// FillAt(row, mask, median, c) for c < d.
cudaError_t LaunchFill(float* row, const uint8_t* mask, const float* median, size_t d,
                       cudaStream_t stream);

// acc[i] += sum over b < batches of partials[b * count + i], in double, b ascending.
cudaError_t LaunchAddPartials(const float* partials, size_t batches, size_t count, double* acc,
                              cudaStream_t stream);

}  // namespace ps::aggregators::cuda
