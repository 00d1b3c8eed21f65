#include "core/data_plane.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace ps::core {

std::string_view DataPlaneName(DataPlane plane) {
  return plane == DataPlane::kTcp ? "tcp" : "grpc";
}

absl::StatusOr<DataPlane> ParseDataPlane(std::string_view text) {
  if (text == "grpc") return DataPlane::kGrpc;
  if (text == "tcp") return DataPlane::kTcp;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown data plane '", AsAbsl(text), "'; expected grpc or tcp"));
}

}  // namespace ps::core
