// The gRPC transport: per shard one grpc::Channel and one proof of the worker's token
// (net::ChannelAuth: shard i must prove it is shard-i of this run before it gets one),
// with, when the link is shaped, a local shaping relay in front of the shard. Over it
// run the shard's ShardControl (a generated WorkerService stub) and its data-plane
// DataChannel (a grpc::GenericStub, so that tensor bytes are never copied into or out
// of a message: pushes go out as a header and the payload's own buffer, pulled slices
// are parsed where gRPC received them). Holds no state beyond the connection, its proof
// and the data channel's route (the session token every data call carries).
//
// Thread safety and lifetimes as ShardControl and DataChannel; the connection lives as
// long as the longer-lived of the two. gRPC's types stay in channel.cc.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker_lib/transport/data_channel.h"
#include "worker_lib/transport/shard_control.h"
#include "worker_lib/worker.h"

namespace ps::internal::grpc_plane {

// One shard's two halves over one gRPC connection.
struct GrpcShard {
  std::unique_ptr<ShardControl> control;
  std::unique_ptr<DataChannel> data;
};

// One GrpcShard per entry of options.shard_addresses, in order. Channels connect
// lazily; fails only on bad credentials or a shaping relay that cannot start.
absl::StatusOr<std::vector<GrpcShard>> ConnectGrpcShards(const WorkerOptions& options);

}  // namespace ps::internal::grpc_plane
