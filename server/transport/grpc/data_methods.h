// The gRPC data plane: ps.v1.WorkerService's Push and Pull, on the control port's front
// (server/grpc_front.h), so that gRPC data shares the control port and its bounds. Both
// read their requests in place (net/wire.h, docs/data_path.md) instead of through
// protobuf's copies; the wire format is the generated messages' all the same. What is
// accepted, refused, scheduled and held is ShardFront's (server/shard_front.h); this
// backend only turns gRPC bytes into its calls and its answers into gRPC messages.
//
// Ownership: borrows the gate's shard and front, which must outlive the grpc::Server.
#pragma once

#include <memory>

#include <grpcpp/support/byte_buffer.h>

#include "server/grpc_front.h"
#include "server/service_internal.h"

namespace ps::server::transport::grpc {

class DataMethods final {
 public:
  explicit DataMethods(CallGate gate) : gate_(gate) {}

  // Adds /ps.v1.WorkerService/Push and Pull to `front` (borrowing this).
  void AddTo(GrpcFront* front);

  // A ps.v1.PushRequest in; an empty PushResponse out (push.cc).
  void Push(FrontCall* call, const ::grpc::ByteBuffer& req);
  // A ps.v1.PullRequest in; a stream of ps.v1.PullResponse out, each a header and the
  // published slice's bytes, which every stream shares (pull.cc). Null: the call was
  // answered.
  std::unique_ptr<StreamHandler> Pull(FrontCall* call, const ::grpc::ByteBuffer& req);

 private:
  const CallGate gate_;
};

}  // namespace ps::server::transport::grpc
