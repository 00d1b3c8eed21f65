// The gRPC side of a shard: the control methods of ps.v1 WorkerService (Join,
// RegisterLayout, InitSlice, and PutObject and GetObject over the service's ObjectStore),
// PeerService and AdminService, served through the front (server/grpc_front.h), which
// hands each call's request bytes over once it may be read. They translate messages to
// Shard calls and absl::Status to grpc::Status; all other state lives in Shard.
// WorkerService's data methods, Push and Pull, are the gRPC data plane's
// (server/transport/grpc/data_methods.h), over the same CallGate. The worker and admin
// services are in service.cc, the peer service and its client side in peer_service.cc.
//
// Ownership: the services borrow the Shard, which must outlive the grpc::Server.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"

#include "net/grpc_bytes.h"
#include "ps/v1/ps.grpc.pb.h"
#include "server/auth_internal.h"
#include "server/checkpointer.h"
#include "server/grpc_front.h"
#include "server/metrics.h"
#include "server/object_store.h"
#include "server/peer_monitor.h"
#include "server/shard.h"
#include "server/shard_front.h"
#include "server/tarpit.h"

namespace ps::net {
class ChannelAuth;
}  // namespace ps::net

namespace ps::server {

// The checks every call passes first: who is calling (UNAUTHENTICATED) and whether
// they are within the rate limit (RESOURCE_EXHAUSTED), and the answer through the
// tarpit: the gRPC glue over ShardFront, which decides. Refusals are counted on the
// shard. Borrowed pointers; all must outlive the services.
struct CallGate {
  Shard* shard = nullptr;
  const Authenticator* auth = nullptr;
  ShardFront* front = nullptr;
  // While false, Join is refused `catching_up` (UNAVAILABLE: a restored shard catching up with
  // its peers); null = always admitting.
  const std::atomic<bool>* admitting = nullptr;

  // The caller the front identified (UNAUTHENTICATED, counted, when it has none), within
  // the rate limit.
  absl::StatusOr<Caller> Admit(const FrontCall& call) const;
  // The tarpit's name for the caller: its identity; without credentials configured its
  // address; "anonymous" when it has none it may use.
  std::string ClientOf(const FrontCall& call) const;
  // Ends `call` with `status` (and `response` when it is OK): at once, or held by the
  // tarpit when it is a refusal charged to a client over its budget. `request_bytes`
  // sizes the refusal.
  void Answer(FrontCall* call, const absl::Status& status, size_t request_bytes,
              grpc::ByteBuffer response = {}) const;
  void Answer(FrontCall* call, const absl::Status& status,
              const google::protobuf::MessageLite& request,
              const google::protobuf::MessageLite* response = nullptr) const;
  // Admit, then the worker behind `session`, which must be the caller's identity
  // (ShardFront::AdmitSession).
  absl::StatusOr<DataPeer> AdmitWorker(const FrontCall& call, std::string_view session) const;
};

// A unary method of `Req` on the front: the request parsed (a body that does not parse
// is refused as malformed, through the tarpit), then `handle`.
template <typename Req>
FrontMethod Unary(const CallGate& gate, std::function<void(FrontCall*, const Req&)> handle) {
  FrontMethod m;
  m.unary = [gate, handle = std::move(handle)](FrontCall* call, const grpc::ByteBuffer& raw) {
    Req req;
    if (absl::Status parsed = net::ParseMessage(raw, &req); !parsed.ok()) {
      gate.Answer(call, gate.shard->Refuse(Refusal::kMalformed, parsed.message()), raw.Length());
      return;
    }
    handle(call, req);
  };
  return m;
}

// ps.v1.WorkerService's control methods.
class WorkerServiceImpl final {
 public:
  WorkerServiceImpl(CallGate gate, ObjectStore::Limits objects)
      : shard_(gate.shard), gate_(gate), objects_(objects) {}

  // The UDP port Join tells workers about (0: none); set before serving.
  void set_udp_port(uint16_t port) { udp_port_ = port; }
  // The TCP data plane's port Join tells workers about (--data-plane tcp); before serving.
  void set_data_port(uint16_t port) { data_port_ = port; }
  // The largest ProbeRequest payload a shard takes (1 MiB).
  static constexpr size_t kMaxProbeBytes = size_t{1} << 20;

  // Adds Join, RegisterLayout, InitSlice, PutObject, GetObject, Leave, Adopt,
  // AdoptSlice and Probe to `front` (borrowing this service).
  void AddTo(GrpcFront* front);

  void Join(FrontCall* call, const v1::JoinRequest& req);
  void RegisterLayout(FrontCall* call, const v1::RegisterLayoutRequest& req);
  void InitSlice(FrontCall* call, const v1::InitSliceRequest& req);
  void PutObject(FrontCall* call, const v1::PutObjectRequest& req);
  void GetObject(FrontCall* call, const v1::GetObjectRequest& req);
  void Leave(FrontCall* call, const v1::LeaveRequest& req);
  void Adopt(FrontCall* call, const v1::AdoptRequest& req);
  void AdoptSlice(FrontCall* call, const v1::AdoptSliceRequest& req);
  // Answers a worker's link measure (v1::ProbeRequest) with the payload's size.
  void Probe(FrontCall* call, const v1::ProbeRequest& req);

 private:
  // OK when the Join's data plane is ANY or this shard's; else the data_plane refusal.
  absl::Status CheckPlane(const v1::JoinRequest& req) const;
  // OK when the shard has no --run-id or the Join brings the same; else wrong_run.
  absl::Status CheckRun(const v1::JoinRequest& req) const;

  Shard* const shard_;
  const CallGate gate_;
  ObjectStore objects_;
  uint16_t udp_port_ = 0;
  uint16_t data_port_ = 0;
};

// ps.v1.AdminService: operator calls, for the admin identity only (or, when the server
// takes no credentials, for callers on loopback).
class AdminServiceImpl final {
 public:
  // `checkpointer`: null without --checkpoint-dir. `serving`: the health of WorkerService.
  // All borrowed, for the service's life.
  AdminServiceImpl(CallGate gate, const ServerOptions* options, Checkpointer* checkpointer,
                   std::function<bool()> serving)
      : gate_(gate), options_(options), checkpointer_(checkpointer), serving_(std::move(serving)) {}

  void AddTo(GrpcFront* front);
  void Checkpoint(FrontCall* call, const v1::CheckpointRequest& req);
  void Status(FrontCall* call, const v1::StatusRequest& req);

 private:
  absl::Status AdmitAdmin(const FrontCall& call) const;

  v1::StatusResponse StatusNow() const;

  const CallGate gate_;
  const ServerOptions* const options_;
  Checkpointer* const checkpointer_;
  const std::function<bool()> serving_;
};

// What this shard tells its peers about itself.
struct PeerIdentity {
  uint32_t shard_id = 0;
  uint32_t num_shards = 1;
  uint64_t config_fingerprint = 0;
  std::string config_summary;
};

// This shard's identity as its options give it.
PeerIdentity PeerIdentityOf(const ServerOptions& options);

// ps.v1.PeerService.
class PeerServiceImpl final {
 public:
  PeerServiceImpl(PeerIdentity self, CallGate gate)
      : self_(std::move(self)), shard_(gate.shard), gate_(gate) {}

  void AddTo(GrpcFront* front);
  void Hello(FrontCall* call, const v1::PeerHelloRequest& req);
  void ShareRound(FrontCall* call, const v1::RoundShareRequest& req);

 private:
  // Admit, then a peer shard's identity (when identities are required); `claimed` is the
  // shard id the request names, which must be the caller's.
  absl::Status AdmitPeer(const FrontCall& call, uint32_t claimed) const;

  const PeerIdentity self_;
  Shard* const shard_;
  const CallGate gate_;
  std::atomic<uint64_t> mismatches_{0};  // Hello calls from a differently configured peer
};

// Compares a peer's answer with this shard's identity; the error names the
// difference.
absl::Status CheckPeer(const PeerIdentity& self, uint64_t own_layout_hash, uint32_t expected_id,
                       const v1::PeerHelloResponse& peer);

// A channel to peer shard `address`, authenticating with `creds` (the server's
// Authenticator::PeerCredentials; the token, if any, is proven on each call through a
// net::ChannelAuth). Errors name an unreadable certificate file.
absl::StatusOr<std::shared_ptr<grpc::Channel>> PeerChannel(const std::string& address,
                                                           const core::ClientCredentials& creds,
                                                           const ServerOptions& options);

// The channels to the peer shards, by shard id (null for this shard, and all empty with
// one shard): each peer proves it is shard-i of this run before this shard proves its
// own token (net::ChannelAuth). Shared by the peer checks and the ShareSender.
struct PeerLinks {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::shared_ptr<net::ChannelAuth>> auths;
};
absl::StatusOr<PeerLinks> ConnectPeers(const ServerOptions& options,
                                       const core::ClientCredentials& creds);

// PeerService.Hello to each peer over `links`, with a 2 s deadline, checked by CheckPeer.
class GrpcPeerGreeter final : public PeerGreeter {
 public:
  GrpcPeerGreeter(PeerIdentity self, const Shard* shard, const PeerLinks& links);
  absl::StatusOr<PeerReply> Hello(uint32_t peer) override;

 private:
  const PeerIdentity self_;
  const Shard* const shard_;
  const PeerLinks& links_;
  std::vector<std::unique_ptr<v1::PeerService::Stub>> stubs_;
};

// The wire form of a share and back.
v1::RoundShareRequest ToProto(const RoundShare& share);
RoundShare FromProto(const v1::RoundShareRequest& req);

// Stable 64-bit FNV-1a, for fingerprints that must agree across processes.
uint64_t Fingerprint(std::string_view text);

}  // namespace ps::server
