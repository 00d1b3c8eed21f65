// device_internal.h in builds without CUDA: there is never a device encoder.
#include "codecs/device_internal.h"
#include "core/device.h"

namespace ps::codecs::internal {

absl::StatusOr<std::unique_ptr<DeviceEncode>> MakeCudaEncode(const Codec& /*cpu*/,
                                                             const CodecOptions& /*options*/) {
  return core::CudaDevice().status();
}

}  // namespace ps::codecs::internal
