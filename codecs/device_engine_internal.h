// The engines behind the GPU encoders (device_encoder.cc): what every engine works
// with, and the engine base. The sparse engine (top-k and threshold) is in
// device_sparse_engine.cc. CUDA builds only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "codecs/codec.h"
#include "codecs/sparse_internal.h"
#include "core/status.h"
#include "gpu/cuda_internal.h"

namespace ps::codecs::internal {

// What every engine works with: the stream, the CPU codec and a pinned staging area.
struct Context {
  cudaStream_t stream = nullptr;
  Codec* cpu = nullptr;  // owned by the Impl, outlives the engine
  gpu::PinnedBuffer staging;
  // With error feedback the engines' kernels write the residual over their input v =
  // g + e; this rewrites v from g and e (which stay intact until the encoding
  // succeeded), so that a fallback to the CPU (a value not finite) reads v itself and
  // refuses it with the CPU codec's message. Null without error feedback.
  std::function<absl::Status()> rebuild_input;

  // Copies `bytes` from device memory into staging at `offset` (asynchronously).
  absl::Status ToStaging(size_t offset, const void* device, size_t bytes) {
    if (bytes == 0) return absl::OkStatus();  // a buffer never allocated
    return gpu::CudaStatus(cudaMemcpyAsync(staging.as<unsigned char>() + offset, device, bytes,
                                      cudaMemcpyDeviceToHost, stream),
                      "cudaMemcpyAsync (payload to the host)");
  }
  absl::Status Sync() {
    return gpu::CudaStatus(cudaStreamSynchronize(stream), "encoding on the device");
  }

  // The CPU codec's encoding of a host copy of x, and x - decode(payload) into residual
  // (device memory, may alias x) when not null.
  absl::Status EncodeOnHost(const float* x, size_t n, const EncodeContext& ctx, std::string* out,
                            float* residual) {
    if (rebuild_input) PS_RETURN_IF_ERROR(rebuild_input());
    std::vector<float> host(n);
    if (n > 0) {
      PS_RETURN_IF_ERROR(gpu::CudaStatus(
          cudaMemcpyAsync(host.data(), x, n * sizeof(float), cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync (values to the host)"));
      PS_RETURN_IF_ERROR(Sync());
    }
    std::string bytes;
    PS_RETURN_IF_ERROR(cpu->Encode(host, ctx, &bytes));
    if (residual != nullptr && n > 0) {
      std::vector<float> decoded(n);
      PS_RETURN_IF_ERROR(cpu->Decode(bytes, decoded));
      for (size_t i = 0; i < n; ++i) host[i] -= decoded[i];
      PS_RETURN_IF_ERROR(gpu::CudaStatus(
          cudaMemcpyAsync(residual, host.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync (residual to the device)"));
      PS_RETURN_IF_ERROR(Sync());
    }
    *out = std::move(bytes);
    return absl::OkStatus();
  }
};

inline absl::Status Launched(cudaError_t e, std::string_view what) {
  return gpu::CudaStatus(e, what);
}

// One codec family on the device. Encode's x (n > 0) is device memory; residual as in
// kernels.h.
class Engine {
 public:
  explicit Engine(Context* context) : c_(*context) {}
  virtual ~Engine() = default;
  virtual absl::Status Encode(const float* x, size_t n, const EncodeContext& ctx, std::string* out,
                              float* residual) = 0;

 protected:
  Context& c_;
};

// The engine of the sparse codecs (topk, threshold; not level=cat).
std::unique_ptr<Engine> MakeSparseEngine(Context* context, SparseConfig config, uint64_t seed);

}  // namespace ps::codecs::internal
