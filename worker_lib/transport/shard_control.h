// ShardControl: the worker's control calls to one shard's WorkerService (Join,
// RegisterLayout, InitSlice, PutObject, GetObject, Leave, Adopt, AdoptSlice, Probe),
// blocking, in the ps::v1 messages; always over gRPC (one
// implementation, transport/grpc/channel.h), whatever carries the data
// (DataChannel, data_channel.h). ShardClient is its caller, tested against a fake
// (tests/worker_lib/fake_transport.h) without a server, and the job's slice size is
// resolved through shard 0's before (worker_lib/slice_size_internal.h).
//
// Owns: whatever the connection needs; nothing about sessions or retries, which the
// caller decides. A failed call's status keeps the shard's code and message as they
// came; callers add the context.
//
// Thread safety: every method may be called from any thread at once. Lifetimes: its
// owner, ShardClient, destroys it after the parts that use it.
#pragma once

#include "absl/status/status.h"
#include "ps/v1/ps.pb.h"
#include "worker_lib/transport/common.h"

namespace ps::internal {

class ShardControl {
 public:
  virtual ~ShardControl() = default;

  // Join waits for the shard to become reachable until `deadline`; RegisterLayout and
  // InitSlice fail at once when it is not.
  virtual absl::Status Join(const v1::JoinRequest& req, RpcClock::time_point deadline,
                            v1::JoinResponse* resp) = 0;
  virtual absl::Status RegisterLayout(const v1::RegisterLayoutRequest& req,
                                      RpcClock::time_point deadline,
                                      v1::RegisterLayoutResponse* resp) = 0;
  virtual absl::Status InitSlice(const v1::InitSliceRequest& req, RpcClock::time_point deadline,
                                 v1::InitSliceResponse* resp) = 0;
  // A worker's objects for the others (docs/objects.md); fail at once when unreachable.
  virtual absl::Status PutObject(const v1::PutObjectRequest& req, RpcClock::time_point deadline,
                                 v1::PutObjectResponse* resp) = 0;
  virtual absl::Status GetObject(const v1::GetObjectRequest& req, RpcClock::time_point deadline,
                                 v1::GetObjectResponse* resp) = 0;
  // Leaving, and the mid-run adoption of a worker's values (server/adoption.h); fail at
  // once when unreachable.
  virtual absl::Status Leave(const v1::LeaveRequest& req, RpcClock::time_point deadline,
                             v1::LeaveResponse* resp) = 0;
  virtual absl::Status Adopt(const v1::AdoptRequest& req, RpcClock::time_point deadline,
                             v1::AdoptResponse* resp) = 0;
  virtual absl::Status AdoptSlice(const v1::AdoptSliceRequest& req, RpcClock::time_point deadline,
                                  v1::AdoptSliceResponse* resp) = 0;
  // A measure of the link (the job's slice size, worker_lib/slice_size.h); fails at
  // once when unreachable.
  virtual absl::Status Probe(const v1::ProbeRequest& req, RpcClock::time_point deadline,
                             v1::ProbeResponse* resp) = 0;
};

}  // namespace ps::internal
