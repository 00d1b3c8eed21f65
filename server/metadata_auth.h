// The listening port's credentials, with an auth metadata processor that authenticates
// every call from its metadata alone, before gRPC reads the call's body
// (docs/operations.md, "Threat model and limits").
//
// Without it, gRPC receives and parses a whole request (up to --max-message-bytes) before
// a handler can look at its credentials, so a client without any credential costs the
// shard as much as a worker. With it, such a call is refused with UNAUTHENTICATED after
// its headers, charged to the tarpit's "anonymous" client (a stale proof of a known
// token: to "stale proofs"), and its body is dropped unread. The handlers
// identify a call that passes once more (Authenticator::Identify, a table lookup): gRPC
// hands the processor the connection's auth context, shared by all its calls, so it
// cannot carry a per-call result. Health checks need credentials here too; probes
// without any use the plaintext --health-port.
//
// The processor also answers challenges itself (crypto::kChallengeMethod,
// crypto/auth_proof.h): from the metadata, in the status it returns (UNAUTHENTICATED with
// the message "ps-auth-challenge-v1 ..."), since gRPC 1.51 ignores the response
// metadata a processor gives. A challenge never reaches a handler, its body is never
// read, and an answered one is no refusal (not counted, logged or held).
//
// Only for shards that require an identity (Authenticator::required()); otherwise the
// port is plaintext without a processor.
#pragma once

#include <grpcpp/security/server_credentials.h>

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "server/auth_internal.h"
#include "server/tarpit.h"

namespace ps::server {

// TLS (from the Authenticator's PEM material) or plaintext credentials; with a
// processor when auth.required(). `on_refused` sees every UNAUTHENTICATED answer it gives
// (to count and log it). Borrowed: auth and tarpit must outlive the gRPC server.
std::shared_ptr<grpc::ServerCredentials> ListeningCredentials(
    const Authenticator& auth, Tarpit* tarpit, std::function<void(const absl::Status&)> on_refused);

}  // namespace ps::server
