#include "worker_lib/transport/channels.h"

#include <utility>

#include "core/status.h"
#include "worker_lib/transport/grpc/channel.h"
#include "worker_lib/transport/udp/channel.h"
#include "worker_lib/transport/udp/sender.h"

namespace ps::internal {

const char* PushPathName(PushPath path) {
  switch (path) {
    case PushPath::kDataPlane:
      return "data plane";
    case PushPath::kUdp:
      return "UDP";
  }
  return "unknown path";
}

bool UsesPath(const WorkerOptions& options, PushPath path) {
  if (path == PushPath::kDataPlane || options.push.push_path() == path) return true;
  for (const auto& [name, push] : options.tensor_push) {
    if (push.push_path() == path) return true;
  }
  return false;
}

absl::StatusOr<std::vector<ShardLink>> ConnectShards(const WorkerOptions& options) {
  PS_ASSIGN_OR_RETURN(std::vector<grpc_plane::GrpcShard> grpc,
                      grpc_plane::ConnectGrpcShards(options));
  std::shared_ptr<udp_path::UdpSender> udp_sender;
  if (UsesPath(options, PushPath::kUdp)) {
    PS_ASSIGN_OR_RETURN(udp_sender,
                        udp_path::UdpSender::Start(options.udp, options.priority_order));
  }
  std::vector<ShardLink> links(grpc.size());
  for (uint32_t i = 0; i < grpc.size(); ++i) {
    ShardLink& link = links[i];
    link.control = std::move(grpc[i].control);
    for (PushPath path : kAllPushPaths) {
      std::unique_ptr<DataChannel>& channel = link.channels[static_cast<size_t>(path)];
      switch (path) {
        case PushPath::kDataPlane:
          channel = std::move(grpc[i].data);
          break;
        case PushPath::kUdp:
          if (udp_sender != nullptr) {
            channel = std::make_unique<udp_path::UdpChannel>(
                udp_sender, options.udp, options.worker_id, i, options.shard_addresses[i]);
          }
          break;
      }
    }
  }
  return links;
}

}  // namespace ps::internal
