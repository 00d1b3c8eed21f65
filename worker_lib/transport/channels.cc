#include "worker_lib/transport/channels.h"

#include <atomic>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/status.h"
#include "worker_lib/transport/grpc/channel.h"
#include "worker_lib/transport/tcp/channel.h"
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

namespace {

// The data plane's channel to one shard: gRPC's, or the TCP plane's once the shard's
// Join answer names TCP (made then, so a worker of a gRPC cluster starts no I/O thread
// for it). Every route goes to the gRPC channel too: it carries the session token.
class PlaneChannel final : public DataChannel {
 public:
  PlaneChannel(std::unique_ptr<DataChannel> grpc,
               std::function<absl::StatusOr<std::unique_ptr<DataChannel>>()> make_tcp)
      : grpc_(std::move(grpc)), make_tcp_(std::move(make_tcp)) {}

  absl::Status SetRoute(const DataRoute& route) override {
    absl::Status status = grpc_->SetRoute(route);
    if (route.plane != core::DataPlane::kTcp) {
      current_.store(grpc_.get());
      return status;
    }
    absl::MutexLock lock(&mu_);
    if (tcp_ == nullptr) {
      absl::StatusOr<std::unique_ptr<DataChannel>> made = make_tcp_();
      if (!made.ok()) return made.status();  // the data plane stays gRPC's, which refuses
      tcp_ = *std::move(made);
    }
    status = tcp_->SetRoute(route);
    current_.store(tcp_.get());
    return status;
  }

  std::unique_ptr<PushCall> NewPush(std::vector<const OutgoingPush*> pushes,
                                    RpcClock::time_point deadline) override {
    return current_.load()->NewPush(std::move(pushes), deadline);
  }
  uint64_t Pull(PullAsk ask, RpcClock::time_point deadline,
                std::shared_ptr<PullSink> sink) override {
    return current_.load()->Pull(std::move(ask), deadline, std::move(sink));
  }

 private:
  const std::unique_ptr<DataChannel> grpc_;
  const std::function<absl::StatusOr<std::unique_ptr<DataChannel>>()> make_tcp_;
  absl::Mutex mu_;
  std::unique_ptr<DataChannel> tcp_ ABSL_GUARDED_BY(mu_);  // made once, never replaced
  std::atomic<DataChannel*> current_{grpc_.get()};
};

// The worker's one I/O thread for the TCP channels to every shard, started with the
// first of them.
class SharedIoThread {
 public:
  std::shared_ptr<tcp_plane::IoThread> Get() {
    absl::MutexLock lock(&mu_);
    if (io_ == nullptr) io_ = tcp_plane::StartIoThread();
    return io_;
  }

 private:
  absl::Mutex mu_;
  std::shared_ptr<tcp_plane::IoThread> io_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::vector<ShardLink>> ConnectShards(const WorkerOptions& options) {
  PS_ASSIGN_OR_RETURN(std::vector<grpc_plane::GrpcShard> grpc,
                      grpc_plane::ConnectGrpcShards(options));
  std::shared_ptr<udp_path::UdpSender> udp_sender;
  if (UsesPath(options, PushPath::kUdp)) {
    PS_ASSIGN_OR_RETURN(udp_sender,
                        udp_path::UdpSender::Start(options.udp, options.priority_order));
  }
  auto io = std::make_shared<SharedIoThread>();
  std::vector<ShardLink> links(grpc.size());
  for (uint32_t i = 0; i < grpc.size(); ++i) {
    ShardLink& link = links[i];
    link.control = std::move(grpc[i].control);
    for (PushPath path : kAllPushPaths) {
      std::unique_ptr<DataChannel>& channel = link.channels[static_cast<size_t>(path)];
      switch (path) {
        case PushPath::kDataPlane:
          channel = std::make_unique<PlaneChannel>(
              std::move(grpc[i].data),
              [io, tcp = tcp_plane::TcpChannelOptions{
                       .worker_id = options.worker_id,
                       .shard = i,
                       .address = options.shard_addresses[i],
                       .credentials = options.credentials,
                       .connect_timeout = options.connect_timeout,
                       .shaping = options.shaping}]()
                  -> absl::StatusOr<std::unique_ptr<DataChannel>> {
                return tcp_plane::MakeTcpChannel(io->Get(), tcp);
              });
          break;
        case PushPath::kUdp:
          if (udp_sender != nullptr) {
            channel = std::make_unique<udp_path::UdpChannel>(
                udp_sender, options.udp, options.credentials.token, options.worker_id, i,
                options.shard_addresses[i]);
          }
          break;
      }
    }
  }
  return links;
}

}  // namespace ps::internal
