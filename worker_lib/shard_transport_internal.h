// ShardTransport: the worker's narrow view of one shard's WorkerService, between the
// worker's parts (ShardClient, PushPipeline, PullStreams) and gRPC. It speaks the
// ps::v1 messages and absl::Status only, so every part above it is tested against a
// fake (tests/worker_lib/fake_transport.h) without a server; the one real
// implementation is over the generated gRPC stub (grpc_transport_internal.h).
//
// Owns: whatever the connection needs (channel, stub, shaping relay); nothing about
// sessions or retries, which the callers decide. A failed call's status keeps the
// shard's code and message as they came; callers add the context.
//
// Thread safety: every method may be called from any thread at once. Callbacks run on
// a transport thread and must not block for long.
//
// Lifetimes: a transport outlives every call started on it (its owner, ShardClient,
// is destroyed after the parts that call it).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "net/wire.h"
#include "ps/v1/ps.pb.h"

namespace ps::internal {

// gRPC deadlines are system_clock.
using RpcClock = std::chrono::system_clock;

// "shard 2 (host:port)": how every message names a shard.
std::string ShardName(uint32_t id, std::string_view address);
// `s` with "<context>: " before its message, its payloads kept (OK stays OK).
absl::Status WithContext(const absl::Status& s, std::string_view context);

class ShardTransport {
 public:
  virtual ~ShardTransport() = default;

  // Blocking unary calls. Join waits for the shard to become reachable until
  // `deadline`; RegisterLayout and InitSlice fail at once when it is not.
  virtual absl::Status Join(const v1::JoinRequest& req, RpcClock::time_point deadline,
                            v1::JoinResponse* resp) = 0;
  virtual absl::Status RegisterLayout(const v1::RegisterLayoutRequest& req,
                                      RpcClock::time_point deadline,
                                      v1::RegisterLayoutResponse* resp) = 0;
  virtual absl::Status InitSlice(const v1::InitSliceRequest& req, RpcClock::time_point deadline,
                                 v1::InitSliceResponse* resp) = 0;

  // A push as it goes out: the request's fields, and its payload held apart, shared
  // (resends and replays send the same bytes) and handed to the transport as it is.
  struct PushMessage {
    v1::PushRequest fields;  // the payload field stays empty
    std::shared_ptr<const std::string> payload;

    size_t payload_size() const { return payload != nullptr ? payload->size() : 0; }
  };

  // One asynchronous push, made by NewPush and started once. The caller keeps the
  // object and the message alive until `done` has run.
  class PushCall {
   public:
    virtual ~PushCall() = default;
    // Sends `message`; `done` runs exactly once with the outcome (the answer has no
    // fields).
    virtual void Start(const PushMessage* message, std::function<void(absl::Status)> done) = 0;
    // Asks the call to end soon with CANCELLED. Allowed before Start (the call is then
    // cancelled as it starts) and from any thread; `done` still runs once.
    virtual void Cancel() = 0;
  };
  // A push waits for the shard to become reachable until `deadline`.
  virtual std::unique_ptr<PushCall> NewPush(RpcClock::time_point deadline) = 0;

  // Streams the slices `req` asks for: `on_slice` sees each message in order, its
  // values still in the transport's buffers (valid during the call only), and returns
  // false to end the stream (it then ends CANCELLED); `on_done` runs exactly once, last,
  // with the stream's status (INVALID_ARGUMENT "malformed PullResponse: ..." when a
  // message did not parse). Both are kept until `on_done` returned.
  virtual void Pull(v1::PullRequest req, RpcClock::time_point deadline,
                    std::function<bool(const net::PullFrame&)> on_slice,
                    std::function<void(absl::Status)> on_done) = 0;
};

}  // namespace ps::internal
