// The list of the worker's channels (docs/data-plane.md, section 2): for every shard,
// its control (gRPC always) and a DataChannel per PushPath that some tensor takes: the
// data plane's (gRPC, sharing the control's connection; the plane's own connection once
// there is a TCP plane) and, when a tensor is pushed over UDP, the UDP path's (the
// channels to every shard share one sender). ShardClient owns what ConnectShards makes.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker_lib/transport/data_channel.h"
#include "worker_lib/transport/shard_control.h"
#include "worker_lib/worker.h"

namespace ps::internal {

inline constexpr size_t kPushPaths = 2;  // PushPath's values, indexes of ShardLink::channels
inline constexpr PushPath kAllPushPaths[kPushPaths] = {PushPath::kDataPlane, PushPath::kUdp};

// "data plane", "UDP": how messages name a path.
const char* PushPathName(PushPath path);

// Whether some tensor of `options` is pushed over `path` (the data plane always is
// used: pulls go over it).
bool UsesPath(const WorkerOptions& options, PushPath path);

// Everything that reaches one shard.
struct ShardLink {
  std::unique_ptr<ShardControl> control;
  // Indexed by PushPath; null for a path no tensor takes.
  std::array<std::unique_ptr<DataChannel>, kPushPaths> channels;
};

// One ShardLink per entry of options.shard_addresses, in order, with a channel for
// each path UsesPath names. Connects lazily; fails on bad credentials, a shaping relay
// that cannot start or bad UdpOptions, naming the option.
absl::StatusOr<std::vector<ShardLink>> ConnectShards(const WorkerOptions& options);

}  // namespace ps::internal
