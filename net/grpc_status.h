// The one conversion between absl::Status and grpc::Status. A refusal's kind
// (core/refusal.h) travels in the gRPC status details (the grpc-status-details-bin
// trailer) as its name, so the status a client or peer gets back says which refusal it
// was. For the worker library, the shards and ps-admin; not a public header.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace ps::net {

grpc::Status ToGrpc(const absl::Status& status);
absl::Status FromGrpc(const grpc::Status& status);

}  // namespace ps::net
