// The gRPC side of a shard: ps.v1 WorkerService and PeerService on the callback API
// (no thread per call). They translate messages to Shard calls and absl::Status to
// grpc::Status; all state lives in Shard.
//
// Ownership: both services borrow the Shard, which must outlive the grpc::Server.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "ps/v1/ps.grpc.pb.h"
#include "server/metrics.h"
#include "server/shard.h"

namespace ps::server {

grpc::Status ToGrpc(const absl::Status& s);

class WorkerServiceImpl final : public ps::v1::WorkerService::CallbackService {
 public:
  explicit WorkerServiceImpl(Shard* shard) : shard_(shard) {}

  // The UDP port Join tells workers about (0: none); set before serving.
  void set_udp_port(uint16_t port) { udp_port_ = port; }
  // Where push and pull latencies and bytes go (null: nowhere); set before serving.
  // Borrowed: must outlive the grpc::Server.
  void set_metrics(Metrics* metrics) { metrics_ = metrics; }

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const v1::JoinRequest* req,
                                 v1::JoinResponse* resp) override;
  grpc::ServerUnaryReactor* RegisterLayout(grpc::CallbackServerContext* ctx,
                                           const v1::RegisterLayoutRequest* req,
                                           v1::RegisterLayoutResponse* resp) override;
  grpc::ServerUnaryReactor* InitSlice(grpc::CallbackServerContext* ctx,
                                      const v1::InitSliceRequest* req,
                                      v1::InitSliceResponse* resp) override;
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* ctx, const v1::PushRequest* req,
                                 v1::PushResponse* resp) override;
  grpc::ServerWriteReactor<v1::PullResponse>* Pull(grpc::CallbackServerContext* ctx,
                                                   const v1::PullRequest* req) override;

 private:
  Shard* const shard_;
  uint16_t udp_port_ = 0;
  Metrics* metrics_ = nullptr;
};

// What this shard tells its peers about itself.
struct PeerIdentity {
  uint32_t shard_id = 0;
  uint32_t num_shards = 1;
  uint64_t config_fingerprint = 0;
  std::string config_summary;
};

class PeerServiceImpl final : public ps::v1::PeerService::CallbackService {
 public:
  PeerServiceImpl(PeerIdentity self, Shard* shard) : self_(std::move(self)), shard_(shard) {}

  grpc::ServerUnaryReactor* Hello(grpc::CallbackServerContext* ctx,
                                  const v1::PeerHelloRequest* req,
                                  v1::PeerHelloResponse* resp) override;
  grpc::ServerUnaryReactor* ShareRound(grpc::CallbackServerContext* ctx,
                                       const v1::RoundShareRequest* req,
                                       v1::RoundShareResponse* resp) override;

 private:
  const PeerIdentity self_;
  Shard* const shard_;
};

// Compares a peer's answer with this shard's identity; the error names the
// difference.
absl::Status CheckPeer(const PeerIdentity& self, uint64_t own_layout_hash, uint32_t expected_id,
                       const v1::PeerHelloResponse& peer);

// The wire form of a share and back.
v1::RoundShareRequest ToProto(const RoundShare& share);
RoundShare FromProto(const v1::RoundShareRequest& req);

// Stable 64-bit FNV-1a, for fingerprints that must agree across processes.
uint64_t Fingerprint(std::string_view text);

}  // namespace ps::server
