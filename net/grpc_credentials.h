// The gRPC side of core/credentials.h, for the worker library, the shards' peer channels
// and ps-admin. A token is never attached to a call as it is: net/channel_auth.h proves it.
#pragma once

#include <memory>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "core/credentials.h"

namespace ps::net {

// Channel credentials for `c`: TLS (reading the PEM files now) or insecure. Errors name
// the file that could not be read.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const core::ClientCredentials& c);
// Sets the TLS server-name override on channel arguments, if any.
void ApplyChannelArguments(const core::ClientCredentials& c, grpc::ChannelArguments* args);

}  // namespace ps::net
