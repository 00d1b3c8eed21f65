// The one ShardTransport over gRPC: a channel and a WorkerService stub per shard, with
// the proof of the worker's token on every call (net/channel_auth.h: shard i must prove
// it is shard-i of this run before it gets one) and, when the link is shaped, a local
// shaping relay in front of the shard. Holds no state beyond the connection and its
// proof.
//
// Thread safety and lifetimes as ShardTransport. gRPC's types stay in grpc_transport.cc.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker_lib/shard_transport_internal.h"
#include "worker_lib/worker.h"

namespace ps::internal {

// One transport per entry of options.shard_addresses, in order. Channels connect
// lazily; fails only on bad credentials or a shaping relay that cannot start.
absl::StatusOr<std::vector<std::unique_ptr<ShardTransport>>> ConnectGrpcShards(
    const WorkerOptions& options);

}  // namespace ps::internal
