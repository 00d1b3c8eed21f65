// Which transport carries a cluster's pushes and pulls (docs/data-plane.md): gRPC on the
// control port, or the native TCP plane on its own port (net/data_frame.h). The plane is
// per cluster: a shard runs one (--data-plane), a worker asks for one at Join, or for
// whatever the shards run.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"

namespace ps::core {

enum class DataPlane {
  kGrpc,
  kTcp,
};

// "grpc" or "tcp", as in flags and config files.
std::string_view DataPlaneName(DataPlane plane);
// The plane named `text`; INVALID_ARGUMENT naming the accepted values otherwise.
absl::StatusOr<DataPlane> ParseDataPlane(std::string_view text);

}  // namespace ps::core
