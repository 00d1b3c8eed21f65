// A member of a shard speaking ps.v1 by hand over whichever data plane its Join answer
// names (docs/data-plane.md), for the tests that send what no ps::Worker sends: pushes
// with wrong sizes, codecs, slices, rounds or sessions, pulls that name a slice twice or
// pair their held versions wrongly, and pulls read one slice at a time. On the gRPC plane
// each push or pull is a call through the generated stub; on TCP a PUSH or PULL frame on
// a data connection of its own, admitted by the handshake under the Join's data session.
// Either way a refusal comes back as the status the shard decided, with its kind
// (core::RefusalOf), so one test body checks both planes.
//
// On TCP a GOAWAY ends the data connection (as it ends a worker's); the next push or pull
// makes a new one under the same data session, as a worker reconnects.
//
// Thread safety: one client per thread.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/data_plane.h"
#include "ps/v1/ps.grpc.pb.h"
#include "tests/support/data_port_client.h"

namespace ps::testing {

// One push made by hand: `payload` as the bytes of `codec` for `slice` of `round`.
struct HandPush {
  std::string codec;
  std::string payload;
  uint32_t slice = 0;
  uint64_t round = 0;
  std::optional<uint64_t> layout_hash;  // unset: the client's
};

// One pull made by hand.
struct HandPull {
  std::vector<uint32_t> slice_ids;
  std::vector<uint64_t> held_versions;  // empty: nothing held
  uint64_t min_version = 0;
};

// One slice of a pull's answer.
struct PulledSlice {
  uint32_t slice_id = 0;
  uint64_t version = 0;
  bool queued = false;
  std::string codec;   // empty: `values` are dense little-endian fp32
  std::string values;
};

class HandClient {
 public:
  // Joins shard `address` (its gRPC port) as `worker` with `token` ("": an --insecure
  // shard) for a model of `layout_hash`, asking for whichever plane the shard runs.
  HandClient(std::string address, std::string token, uint32_t worker, uint64_t layout_hash);
  ~HandClient();
  HandClient(const HandClient&) = delete;
  HandClient& operator=(const HandClient&) = delete;

  bool joined() const { return joined_; }
  // The plane its pushes and pulls take: the one its Join answer named.
  core::DataPlane plane() const;
  // The longest codec spec a push carries on this plane: 1 MiB through gRPC here, a
  // PUSH frame's bound on TCP.
  size_t longest_codec() const;

  // The shard's answer to `push`.
  absl::Status Push(const HandPush& push);
  // The shard's answer to a push of `payload` in `codec` for `slice` of round 0.
  absl::Status Push(const std::string& codec, const std::string& payload, uint32_t slice = 0) {
    return Push(HandPush{.codec = codec, .payload = payload, .slice = slice});
  }
  // `push` under a session the shard never gave: on gRPC the request's session field, on
  // TCP a data connection whose HELLO names a data session nobody was given. The shard's
  // refusal.
  absl::Status PushUnderForgedSession(const HandPush& push);

  // TCP only: a data connection of its own, admitted under the client's data session, for
  // a test's threads to drive (one thread each). Thread-safe.
  absl::StatusOr<std::unique_ptr<DataPortClient>> NewDataConnection() const;
  // The shard's answer to `push` sent as a PUSH frame tagged `tag` on `connection` (one
  // that carries no pulls: the next frame is the answer). Thread-safe for distinct
  // connections.
  absl::Status PushOn(DataPortClient& connection, uint64_t tag, const HandPush& push) const;

  // A pull whose slices are read one at a time, as they come.
  class PullStream {
   public:
    virtual ~PullStream() = default;
    // The next slice; nullopt once the pull ended OK; the shard's status when it ended
    // otherwise (or nothing came within the client's read timeout).
    virtual absl::StatusOr<std::optional<PulledSlice>> Next() = 0;
  };
  std::unique_ptr<PullStream> OpenPull(const HandPull& pull);
  // Every slice of `pull`, or the status it ended with.
  absl::StatusOr<std::vector<PulledSlice>> Pull(const HandPull& pull);

 private:
  class GrpcPull;
  class TcpPull;

  // The data connection, made (again) when there is none.
  absl::Status Connected();
  // `push` as a whole PUSH frame tagged `tag`: header, meta and payload.
  absl::StatusOr<std::string> PushFrame(uint64_t tag, const HandPush& push) const;
  // The next frame of `tag` (a GOAWAY, tag 0, answers any), from those read earlier for
  // other tags or from the connection. A GOAWAY drops the connection.
  absl::StatusOr<DataFrame> FrameFor(uint64_t tag);
  std::unique_ptr<grpc::ClientContext> Context() const;
  // `push` as a gRPC Push under `session`.
  absl::Status GrpcPush(const HandPush& push, const std::string& session);

  std::string address_;
  std::string token_;
  uint32_t worker_;
  uint64_t layout_hash_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  v1::JoinResponse join_;
  bool joined_ = false;
  std::unique_ptr<DataPortClient> data_;  // on the TCP plane, while connected
  std::deque<DataFrame> early_;           // frames read while waiting for another tag
  uint64_t tag_ = 0;
};

}  // namespace ps::testing
