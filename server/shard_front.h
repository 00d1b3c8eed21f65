// ShardFront: the shard as every data plane sees it (docs/data-plane.md). A backend
// (server/transport/grpc, server/transport/udp; the TCP plane next) turns bytes into
// these calls and their answers back into bytes; the rules live here and in Shard, once:
//
//   - who may send: a caller within the rate limit (AdmitCaller), the worker behind a
//     session that must be the caller's own (AdmitSession);
//   - a push accepted from the pieces it arrived in (Push; PushChunk for one datagram's
//     chunk of the lossy path), timed for the metrics;
//   - a pull validated, counted against --max-pulls-per-worker and scheduled in P3's
//     order into the backend's sink (OpenPull);
//   - every refusal answered now or after the tarpit's hold (Answer).
//
// No transport type appears here: a backend keeps its own connection state and tells
// the front only what it established (a Caller, a session, a slice's bytes).
//
// Thread safety: every method may be called from any thread at once. Borrowed pointers;
// the shard, limiter, tarpit and metrics must outlive the front and every PullHandle.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/data_plane.h"
#include "net/udp_frame.h"
#include "server/caller.h"
#include "server/pull_scheduler.h"
#include "server/pull_slots.h"
#include "server/shard.h"

namespace ps::server {

class Metrics;
class RateLimiter;
class Tarpit;

// A sender of data admitted through its session.
struct DataPeer {
  uint32_t worker = 0;
  std::string client;  // the tarpit's and the rate limiter's name for it
};

// A push as every plane carries it, apart from its payload.
struct PushHead {
  uint64_t layout_hash = 0;
  uint64_t round = 0;
  uint32_t slice_id = 0;
  std::string_view codec;
  std::optional<float> loss;  // the worker's training loss (local-update training)
  std::optional<float> lr;    // the learning rate it asks the round's step to take
};

// What a pull asks for, parsed by its backend.
struct PullAsk {
  uint64_t layout_hash = 0;
  uint64_t min_version = 0;
  // What the worker holds, for compressed pulls: the shard epoch its values come from,
  // and one version per slice (or none).
  uint64_t held_epoch = 0;
  std::vector<uint32_t> slice_ids;
  std::vector<uint64_t> held_versions;
};

// One open pull: its place among the worker's pulls and its scheduler. The backend
// starts it with its sink and reports each write's completion; destroying it unwatches
// what never fired and gives the place back.
class PullHandle {
 public:
  PullHandle(Shard* shard, const PullAsk& ask, Metrics* metrics, PullSlots::Slot slot);
  PullHandle(const PullHandle&) = delete;
  PullHandle& operator=(const PullHandle&) = delete;

  // As PullScheduler's (server/pull_scheduler.h): the sink must outlive this handle or
  // its Finish, whichever comes first.
  void Start(PullSink* sink) { scheduler_.Start(sink); }
  void WriteDone(bool ok) { scheduler_.WriteDone(ok); }
  void Cancel() { scheduler_.Cancel(); }

 private:
  const PullSlots::Slot slot_;
  PullScheduler scheduler_;  // last: destroyed first, detaching the sink
};

class ShardFront {
 public:
  // `tarpit` null: every refusal is answered at once. `metrics` may be null.
  ShardFront(Shard* shard, RateLimiter* limiter, Tarpit* tarpit);
  ShardFront(const ShardFront&) = delete;
  ShardFront& operator=(const ShardFront&) = delete;

  // Where push and pull latencies and bytes go (null: nowhere); set before serving.
  void set_metrics(Metrics* metrics) { metrics_ = metrics; }
  Shard* shard() const { return shard_; }

  // The data plane this shard runs (--data-plane).
  core::DataPlane plane() const { return shard_->options().data_plane; }
  // The refusal (data_plane, FAILED_PRECONDITION, counted) of a request on the `asked`
  // plane ("grpc", "tcp") where this shard runs another, naming both planes and both
  // fixes. `who` starts the message: "worker 2 asks for", "worker-2 calls Push on".
  absl::Status RefusePlane(std::string_view who, std::string_view asked) const;

  // `caller` within its rate limit (RESOURCE_EXHAUSTED, counted, when not).
  absl::Status AdmitCaller(const Caller& caller) const;
  // AdmitCaller, then the worker behind `session`, which must be the caller's identity
  // (PERMISSION_DENIED: a stolen or replayed session).
  absl::StatusOr<DataPeer> AdmitSession(const Caller& caller, std::string_view session) const;

  // A push whose payload arrived in `payload`'s pieces (decoded from them in place), or
  // was read straight into a raw row (see RawRowNumel).
  absl::Status Push(const DataPeer& peer, const PushHead& head, const PushPayload& payload);
  // The values a push's payload of `payload_bytes` may be read into a RawRow as
  // (Shard::RawRowNumel), or 0.
  uint32_t RawRowNumel(const PushHead& head, size_t payload_bytes) const {
    return shard_->RawRowNumel(head.layout_hash, head.slice_id, head.codec, payload_bytes);
  }
  // A datagram's chunk of the lossy path, or its push's end, its MAC and sender already
  // checked by the backend against the session of `header.worker_id` (Shard::PushChunk).
  absl::Status PushChunk(const net::DatagramHeader& header, std::string_view codec,
                         std::string_view payload);

  // A pull of `peer`: the held versions pair up with the slices (malformed), the slices
  // are this shard's (Shard::ValidatePull), and the worker has a pull place left
  // (over_limit). Refusals are counted; the handle is not started.
  absl::StatusOr<std::unique_ptr<PullHandle>> OpenPull(const DataPeer& peer, const PullAsk& ask);

  // Runs `send` now, or after the tarpit's hold when `status` is a refusal charged to a
  // `client` over its refusal budget (never for peer shards, whose refused shares are
  // lag, not abuse). `request_bytes` sizes the refusal.
  void Answer(std::string_view client, const absl::Status& status, size_t request_bytes,
              absl::AnyInvocable<void() &&> send) const;

 private:
  Shard* const shard_;
  RateLimiter* const limiter_;
  Tarpit* const tarpit_;
  Metrics* metrics_ = nullptr;
  PullSlots pull_slots_;
};

}  // namespace ps::server
