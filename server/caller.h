// Caller: who made a request, as the transport that carried it established it (a gRPC
// call's certificate or token proof; a data connection's handshake), with no transport
// type in sight. Rate limits and the tarpit key on its name.
#pragma once

#include <optional>
#include <string>

#include "core/credentials.h"

namespace ps::server {

// The tarpit's name for callers without a valid identity.
inline constexpr char kAnonymousClient[] = "anonymous";
// The tarpit's name for callers whose proof was made for an earlier process of the shard.
inline constexpr char kStaleProofClient[] = "stale proofs";

// Who made a call; nullopt identity = anonymous (no client authentication configured).
struct Caller {
  std::optional<core::Identity> identity;
  std::string address;  // gRPC peer string, e.g. "ipv4:127.0.0.1:5123"
  // The key of the token the call proved (crypto::TokenKey, which names it without
  // revealing it); empty when it proved none (a client certificate alone, --insecure, a
  // data connection's caller).
  std::string token_key;

  // The identity's name, or the address when anonymous (rate-limit key, log text).
  std::string Name() const;
  bool loopback() const;
};

}  // namespace ps::server
