// The UDP path's DataChannel to one shard (docs/transport.md, "UDP"): it takes the
// datagram session, key and port from the shard's Join answer (the route), signs each
// chunk with the key (net::SignDatagram) and queues it on the UdpSender that the
// channels to every shard share. It answers no push and carries no pull: lost
// datagrams lose their coordinates for that round, and pulls go over the data plane.
//
// Thread safety: as DataChannel; `mu_` guards the route.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "net/udp_frame.h"
#include "worker_lib/transport/data_channel.h"
#include "worker_lib/transport/udp/sender.h"

namespace ps::internal::udp_path {

class UdpChannel final : public DataChannel {
 public:
  // Values per chunk where UdpOptions::chunk_elems is 0 and the route's MTU is unknown
  // (32 KiB fp32 datagrams, the fixed default until 2026-12-06).
  static constexpr uint32_t kUnknownMtuChunkElems = 8192;

  // To shard `shard` at `address` ("host:port", its gRPC address: the datagrams go to
  // the same host), for worker `worker_id`; `sender` is shared with the channels to the
  // other shards.
  // `token`: the worker's token (empty without one), to which the shard binds the
  // datagrams' key (crypto::UdpKey).
  UdpChannel(std::shared_ptr<UdpSender> sender, const UdpOptions& options, std::string token,
             uint32_t worker_id, uint32_t shard, std::string address);

  // FAILED_PRECONDITION when the shard runs without the UDP path, INTERNAL for a bad
  // key; the endpoint is resolved when the port is new.
  absl::Status SetRoute(const DataRoute& route) override;
  std::unique_ptr<PushCall> NewPush(std::vector<const OutgoingPush*> pushes,
                                    RpcClock::time_point deadline) override;
  // Ends at once with UNIMPLEMENTED: pulls go over the data plane.
  uint64_t Pull(PullAsk ask, RpcClock::time_point deadline,
                std::shared_ptr<PullSink> sink) override;
  bool chunked() const override { return true; }
  // UdpOptions::chunk_elems where set; else as many fp32 values as fill one packet of
  // the route's MTU (net::ChunkElemsForMtu), or kUnknownMtuChunkElems where the MTU could
  // not be read, and never more than keep the codec's largest encoding within one
  // datagram (net::kMaxDatagramBytes).
  uint32_t chunk_elems(size_t codec_bytes,
                       absl::FunctionRef<size_t(size_t)> max_encoded_bytes) const override;
  absl::Status WaitSent() override { return sender_->WaitIdle(); }
  void FillStats(WorkerStats& stats) const override;

 private:
  // Where and how datagrams go, as the last route said.
  struct Route {
    uint64_t epoch = 0;
    uint64_t session = 0;
    std::shared_ptr<const net::DatagramKey> key;  // null: the route is unusable
    uint32_t port = 0;                           // the endpoint's (0: none resolved)
    boost::asio::ip::udp::endpoint endpoint;
    size_t mtu = 0;  // of this host's route to the endpoint (0: unknown)
  };
  class Push;
  Route route() const;

  const std::shared_ptr<UdpSender> sender_;
  const UdpOptions options_;
  const uint32_t worker_id_;
  const uint32_t shard_;
  const std::string address_;
  const std::string token_;

  // The datagrams' key of `route`: its UDP secret, bound to token_ when there is one
  // (crypto::UdpKey, as the shard binds it). INVALID_ARGUMENT for a secret of the wrong size.
  absl::StatusOr<net::DatagramKey> KeyOf(const DataRoute& route) const;
  mutable absl::Mutex mu_;
  Route route_ ABSL_GUARDED_BY(mu_);
};

// What UdpChannel::chunk_elems gives on a route of `mtu` bytes (0: unknown), for callers
// that know the route without a channel (ps-bench udp).
uint32_t ChunkElemsFor(const UdpOptions& options, size_t mtu, bool ipv6, size_t codec_bytes,
                       absl::FunctionRef<size_t(size_t)> max_encoded_bytes);

}  // namespace ps::internal::udp_path
