// Host-side helpers for the CUDA libraries (aggregators/cuda, codecs/cuda): runtime
// errors as absl::Status and device memory that grows on demand. Included only from
// their .cc files, which are compiled when the build has CUDA (docs/gpu.md); kernels
// (.cu) include no abseil.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace ps::gpu {

// OK, or INTERNAL naming the call and CUDA's message ("cudaMalloc(4294967296 bytes):
// out of memory"); out-of-memory is RESOURCE_EXHAUSTED. An error also clears the
// thread's last-error slot, which every runtime call sets: otherwise a handled
// failure (an allocation the caller may retry smaller) would come out again of the next
// kernel launch's cudaGetLastError() though that launch succeeded. (Sticky errors, which
// spoil the context, stay.)
inline absl::Status CudaStatus(cudaError_t e, std::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  const std::string message = absl::StrCat(core::AsAbsl(what), ": ", cudaGetErrorString(e));
  return e == cudaErrorMemoryAllocation ? absl::ResourceExhaustedError(message)
                                        : absl::InternalError(message);
}

// `status`, returned by an entry point of a CUDA library once `stream` has drained when
// it is an error: no work queued before the error still reads or writes the caller's
// memory after the return.
inline absl::Status Settled(cudaStream_t stream, absl::Status status) {
  if (!status.ok()) (void)cudaStreamSynchronize(stream);
  return status;
}

// CUDA memory owned by the holder, from `alloc` and released with `release`; Reserve()
// grows it (contents are not kept). DeviceBuffer and PinnedBuffer below.
template <cudaError_t (*alloc)(void**, size_t), cudaError_t (*release)(void*)>
class CudaMemory {
 public:
  CudaMemory() = default;
  CudaMemory(const CudaMemory&) = delete;
  CudaMemory& operator=(const CudaMemory&) = delete;
  CudaMemory(CudaMemory&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  ~CudaMemory() {
    if (data_ != nullptr) release(data_);
  }

  absl::Status Reserve(size_t bytes) {
    if (bytes <= bytes_) return absl::OkStatus();
    if (data_ != nullptr) release(data_);
    data_ = nullptr;
    bytes_ = 0;
    PS_RETURN_IF_ERROR(CudaStatus(alloc(&data_, bytes), absl::StrCat("allocating ", bytes,
                                                                     " bytes of CUDA memory")));
    bytes_ = bytes;
    return absl::OkStatus();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

inline cudaError_t AllocDevice(void** p, size_t bytes) { return cudaMalloc(p, bytes); }
inline cudaError_t AllocPinned(void** p, size_t bytes) { return cudaMallocHost(p, bytes); }
// Device memory (cudaMalloc).
using DeviceBuffer = CudaMemory<&AllocDevice, &cudaFree>;
// Page-locked host memory (cudaMallocHost), for asynchronous copies.
using PinnedBuffer = CudaMemory<&AllocPinned, &cudaFreeHost>;

// Whether `p` points into device memory (cudaMalloc'ed or managed), as opposed to host
// memory; false on any error.
inline bool IsDevicePointer(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error of older runtimes
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

}  // namespace ps::gpu
