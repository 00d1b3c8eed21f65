// gRPC side of core/credentials.h, for the worker library, the shards' peer channels
// and ps-admin.
#pragma once

#include <memory>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "core/credentials.h"

namespace ps::core {

// Channel credentials for `c`: TLS (reading the PEM files now) or insecure. Errors name
// the file that could not be read.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientCredentials& c);
// Sets the TLS server-name override on channel arguments, if any.
void ApplyChannelArguments(const ClientCredentials& c, grpc::ChannelArguments* args);
// Adds the bearer token, if any, to one call's metadata.
void AttachCredentials(const ClientCredentials& c, grpc::ClientContext* ctx);

}  // namespace ps::core
