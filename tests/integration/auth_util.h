// Hand-made calls of the integration tests with a token: they carry its proof
// (net/channel_auth.h), as every client of a shard does, never the token. One
// net::ChannelAuth per shard address and token, kept for the test binary's life, so each
// shard process is challenged once per token.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "net/channel_auth.h"

namespace ps::testing {

// The ChannelAuth of `token` toward the shard at `address` (thread-safe).
inline net::ChannelAuth& Auth(const std::string& address, const std::string& token) {
  static std::mutex mu;
  static auto* auths = new std::map<std::pair<std::string, std::string>,
                                    std::unique_ptr<net::ChannelAuth>>();
  std::lock_guard lock(mu);
  std::unique_ptr<net::ChannelAuth>& auth = (*auths)[{address, token}];
  if (auth == nullptr) {
    core::ClientCredentials creds;
    creds.token = token;
    auth = std::make_unique<net::ChannelAuth>(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()), creds, address);
  }
  return *auth;
}

// A call's context with a deadline and, unless `token` is empty, the proof of `token`
// for the shard at `address`. A proof that cannot be made is a test failure (the call
// then goes without one). Calls that may meet a restarted shard use Auth(...).Unary,
// which runs the challenge again.
inline std::unique_ptr<grpc::ClientContext> Context(
    const std::string& address, const std::string& token,
    std::chrono::milliseconds deadline = std::chrono::milliseconds(10000)) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  const auto until = std::chrono::system_clock::now() + deadline;
  ctx->set_deadline(until);
  if (!token.empty()) {
    const grpc::Status s = Auth(address, token).Attach(ctx.get(), until);
    EXPECT_TRUE(s.ok()) << address << ": " << s.error_message();
  }
  return ctx;
}

// A call's context with a deadline and no credentials.
inline std::unique_ptr<grpc::ClientContext> Context(
    std::chrono::milliseconds deadline = std::chrono::milliseconds(10000)) {
  return Context(std::string(), std::string(), deadline);
}

}  // namespace ps::testing
