// What the worker's parts and its transports share about shards: the clock of their
// deadlines and how a shard and a failure's context are named (defined in
// shard_client.cc).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace ps::internal {

// gRPC deadlines are system_clock; every channel takes the same.
using RpcClock = std::chrono::system_clock;

// "shard 2 (host:port)": how every message names a shard.
std::string ShardName(uint32_t id, std::string_view address);
// `s` with "<context>: " before its message, its payloads kept (OK stays OK).
absl::Status WithContext(const absl::Status& s, std::string_view context);

}  // namespace ps::internal
