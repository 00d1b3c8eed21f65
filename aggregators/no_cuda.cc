// The device backend of builds without CUDA: always unavailable, with the reason.
#include "aggregators/device_internal.h"
#include "gpu/cuda_device.h"

namespace ps::aggregators::internal {

absl::StatusOr<std::shared_ptr<const DeviceBackend>> MakeCudaBackend() {
  return gpu::CudaDevice().status();
}

}  // namespace ps::aggregators::internal
