// Which transport carries a cluster's pushes and pulls (docs/data-plane.md): gRPC on the
// control port, or the native TCP plane on its own port (net/data_frame.h). The plane is
// per cluster: a shard runs one (--data-plane), a worker asks for one at Join, or for
// whatever the shards run.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"

namespace ps::core {

// How long, by default, a slice that becomes urgent waits at most behind data already in
// flight, in either direction: the worker's push window grows to what its link moves in
// this time (WorkerOptions::inflight_seconds) and a shard's TCP connection takes as many
// slices of a pull at once (server/transport/tcp/pull_pace.h).
inline constexpr double kDefaultInflightSeconds = 0.002;

enum class DataPlane {
  kGrpc,
  kTcp,
};

// "grpc" or "tcp", as in flags and config files.
std::string_view DataPlaneName(DataPlane plane);
// The plane named `text`; INVALID_ARGUMENT naming the accepted values otherwise.
absl::StatusOr<DataPlane> ParseDataPlane(std::string_view text);

}  // namespace ps::core
