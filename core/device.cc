#include "core/device.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace ps::core {

absl::StatusOr<Device> ParseDevice(std::string_view text) {
  if (text == "cpu") return Device::kCpu;
  if (text == "cuda") return Device::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown device '", AsAbsl(text), "'; expected cpu or cuda"));
}

std::string_view DeviceName(Device device) { return device == Device::kCuda ? "cuda" : "cpu"; }

}  // namespace ps::core
