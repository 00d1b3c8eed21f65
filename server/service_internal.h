// The gRPC side of a shard: ps.v1 WorkerService and PeerService on the callback API
// (no thread per call). They translate messages to Shard calls and absl::Status to
// grpc::Status; all state lives in Shard.
//
// Ownership: both services borrow the Shard, which must outlive the grpc::Server.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"

#include "ps/v1/ps.grpc.pb.h"
#include "server/auth_internal.h"
#include "server/metrics.h"
#include "server/shard.h"
#include "server/tarpit.h"

namespace ps::server {

// The checks every call passes first: who is calling (UNAUTHENTICATED) and whether
// they are within the rate limit (RESOURCE_EXHAUSTED). Refusals are counted on the
// shard, and answered through the tarpit. Borrowed pointers; all must outlive the
// services.
struct CallGate {
  Shard* shard = nullptr;
  const Authenticator* auth = nullptr;
  RateLimiter* limiter = nullptr;
  Tarpit* tarpit = nullptr;  // null: every refusal is answered at once
  // While false, Join is refused with UNAVAILABLE (a restored shard catching up with
  // its peers); null = always admitting.
  const std::atomic<bool>* admitting = nullptr;

  absl::StatusOr<Caller> Admit(const grpc::ServerContextBase& ctx) const;
  // The tarpit's name for the caller: its identity; without credentials configured its
  // address without the port; "anonymous" when it has none it may use.
  std::string ClientOf(const grpc::ServerContextBase& ctx) const;
  // Answers `status` on `finish`: at once, or held by the tarpit when it is a refusal
  // charged to a client over its budget. `request` sizes the refusal.
  void Answer(const grpc::ServerContextBase& ctx, const absl::Status& status,
              size_t request_bytes, absl::AnyInvocable<void(grpc::Status) &&> finish) const;
  void Answer(const grpc::ServerContextBase& ctx, const absl::Status& status,
              const google::protobuf::MessageLite& request,
              absl::AnyInvocable<void(grpc::Status) &&> finish) const {
    Answer(ctx, status, status.ok() ? 0 : request.ByteSizeLong(), std::move(finish));
  }
  // Admit, then the worker behind `session`, which must be the caller's identity
  // (PERMISSION_DENIED: a stolen or replayed session).
  absl::StatusOr<uint32_t> AdmitWorker(const grpc::ServerContextBase& ctx,
                                       std::string_view session) const;
};

// The pull streams each worker has open, bounded by --max-pulls-per-worker. A Slot is
// held by a stream and given back when it is destroyed.
class PullSlots {
 public:
  struct Release {
    void operator()(std::pair<PullSlots*, uint32_t>* slot) const;
  };
  using Slot = std::unique_ptr<std::pair<PullSlots*, uint32_t>, Release>;

  PullSlots(uint32_t num_workers, uint32_t per_worker);
  // A slot of `worker` (< num_workers), or RESOURCE_EXHAUSTED when all are taken.
  absl::StatusOr<Slot> Take(uint32_t worker);
  uint32_t open(uint32_t worker) const;

 private:
  const uint32_t per_worker_;
  mutable absl::Mutex mu_;
  std::vector<uint32_t> open_ ABSL_GUARDED_BY(mu_);
};

// Push and Pull are raw methods: their messages carry the tensor bytes, which are read
// and written in place (net/wire.h, docs/data_path.md) instead of through protobuf's
// copies. The wire format is the generated messages' all the same.
class WorkerServiceImpl final
    : public ps::v1::WorkerService::WithRawCallbackMethod_Push<
          ps::v1::WorkerService::WithRawCallbackMethod_Pull<ps::v1::WorkerService::CallbackService>> {
 public:
  explicit WorkerServiceImpl(CallGate gate)
      : shard_(gate.shard),
        gate_(gate),
        pull_slots_(gate.shard->options().num_workers,
                    gate.shard->options().max_pulls_per_worker) {}

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
  // A ps.v1.PushRequest in; an empty PushResponse out.
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                 grpc::ByteBuffer* resp) override;
  // A ps.v1.PullRequest in; a stream of ps.v1.PullResponse out, each a header and the
  // published slice's bytes, which every stream shares.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Pull(grpc::CallbackServerContext* ctx,
                                                   const grpc::ByteBuffer* req) override;

 private:
  Shard* const shard_;
  const CallGate gate_;
  uint16_t udp_port_ = 0;
  Metrics* metrics_ = nullptr;
  PullSlots pull_slots_;
};

// ps.v1.AdminService: operator calls, for the admin identity only (or, when the server
// takes no credentials, for callers on loopback).
class AdminServiceImpl final : public ps::v1::AdminService::CallbackService {
 public:
  struct Hooks {
    // Writes a checkpoint now: the path and its version.
    std::function<absl::StatusOr<std::pair<std::string, uint64_t>>()> checkpoint;
    std::function<v1::StatusResponse()> status;
  };
  AdminServiceImpl(CallGate gate, Hooks hooks) : gate_(gate), hooks_(std::move(hooks)) {}

  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* ctx,
                                       const v1::CheckpointRequest* req,
                                       v1::CheckpointResponse* resp) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx, const v1::StatusRequest* req,
                                   v1::StatusResponse* resp) override;

 private:
  absl::Status AdmitAdmin(const grpc::ServerContextBase& ctx) const;

  const CallGate gate_;
  const Hooks hooks_;
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
  PeerServiceImpl(PeerIdentity self, CallGate gate)
      : self_(std::move(self)), shard_(gate.shard), gate_(gate) {}

  grpc::ServerUnaryReactor* Hello(grpc::CallbackServerContext* ctx,
                                  const v1::PeerHelloRequest* req,
                                  v1::PeerHelloResponse* resp) override;
  grpc::ServerUnaryReactor* ShareRound(grpc::CallbackServerContext* ctx,
                                       const v1::RoundShareRequest* req,
                                       v1::RoundShareResponse* resp) override;

 private:
  // Admit, then a peer shard's identity (when identities are required); `claimed` is the
  // shard id the request names, which must be the caller's.
  absl::Status AdmitPeer(const grpc::ServerContextBase& ctx, uint32_t claimed) const;

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

// The wire form of a share and back.
v1::RoundShareRequest ToProto(const RoundShare& share);
RoundShare FromProto(const v1::RoundShareRequest& req);

// Stable 64-bit FNV-1a, for fingerprints that must agree across processes.
uint64_t Fingerprint(std::string_view text);

}  // namespace ps::server
