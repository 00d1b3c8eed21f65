// The device encoders in builds without CUDA: gpu::CudaDevice() always says why there
// is no device, so MakeCudaEncode, DeviceEncoder::Make and TimeDeviceEncode return its
// UNAVAILABLE status, and no DeviceEncoder is ever constructed.
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "codecs/device_encoder.h"
#include "codecs/device_internal.h"
#include "gpu/cuda_device.h"

namespace ps::codecs {

class DeviceEncoder::Impl {};

absl::StatusOr<std::unique_ptr<DeviceEncoder>> DeviceEncoder::Make(std::string_view /*spec*/,
                                                                   const CodecOptions& /*options*/,
                                                                   size_t /*numel*/,
                                                                   bool /*error_feedback*/) {
  return gpu::CudaDevice().status();
}

DeviceEncoder::DeviceEncoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceEncoder::~DeviceEncoder() = default;

// Unreachable: Make never returns an encoder without CUDA.
absl::Status DeviceEncoder::Encode(const float* /*device_values*/, size_t /*n*/,
                                   const EncodeContext& /*ctx*/, std::string* /*out*/) {
  return gpu::CudaDevice().status();
}
const Codec& DeviceEncoder::codec() const { std::abort(); }
const float* DeviceEncoder::residual() const { return nullptr; }

absl::StatusOr<EncodeTiming> TimeDeviceEncode(std::string_view /*spec*/, const CodecOptions& /*options*/,
                                              std::span<const float> /*values*/, int /*repeats*/) {
  return gpu::CudaDevice().status();
}

namespace internal {

absl::StatusOr<std::unique_ptr<DeviceEncode>> MakeCudaEncode(const Codec& /*cpu*/,
                                                             const CodecOptions& /*options*/) {
  return gpu::CudaDevice().status();
}

}  // namespace internal
}  // namespace ps::codecs
