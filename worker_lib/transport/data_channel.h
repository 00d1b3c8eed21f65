// DataChannel: how the worker's pushes and pulls reach one shard over one path
// (docs/data-plane.md, section 2): the data plane the shards run (gRPC today,
// transport/grpc/) or the lossy UDP path (transport/udp/), one channel per (shard,
// path), made by the list in channels.h. It speaks plain structs, no protobuf, so that
// a backend other than gRPC never touches a ps.v1 message; the control calls stay
// apart (ShardControl, shard_control.h). PushPipeline and PullStreams are its callers,
// tested against a fake (tests/worker_lib/fake_transport.h).
//
// Owns: whatever its path needs (a connection, a socket, a shard's route); nothing
// about retries, which the callers decide. A failed call's status keeps the shard's
// code and message as they came; callers add the context.
//
// Thread safety: every method may be called from any thread at once. Callbacks run on
// a transport thread (or, where a method says so, the caller's) and must not block for
// long. Lifetimes: a channel outlives every call started on it (its owner,
// ShardClient, is destroyed after the parts that call it).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/data_plane.h"
#include "net/wire.h"
#include "worker_lib/transport/common.h"
#include "worker_lib/worker.h"

namespace ps::internal {

// Where and under which session a shard's data goes, from its latest Join answer
// (ShardClient hands it to every channel of the shard after each join).
struct DataRoute {
  uint64_t epoch = 0;   // ShardClient's join epoch, bumped by every join
  // The plane the shard moves tensors over (its Join answer's; gRPC from shards that
  // predate the field).
  core::DataPlane plane = core::DataPlane::kGrpc;
  std::string session;  // the session token (the gRPC plane carries it per call)
  // The UDP path: the shard's port (0: it runs none), the datagram session and its key.
  uint32_t udp_port = 0;
  uint64_t udp_session = 0;
  std::string udp_key;
  // The TCP data plane: the shard's data endpoint (host empty: the host of its control
  // address; port 0: it runs none), its data session and the session's secret.
  std::string data_host;
  uint32_t data_port = 0;
  uint64_t data_session = 0;
  std::string data_secret;
  // The least retransmission timeout the shard set on its data connections, for this
  // end too (0: the kernel's; --tcp-rto-min-ms).
  std::chrono::microseconds tcp_rto_min{0};
};

// A push as it goes out: a slice's, or one chunk of it on a channel that carries
// chunks (chunked()), `chunk_elems` values each. The payload is shared: resends and replays send the same
// bytes, handed to the transport as they are. A borrowed push (PushOptions::borrow)
// goes out as `payload` followed by `borrowed`, the caller's bytes: a channel sends both
// and keeps `borrowed_guard` for as long as anything of it may still read `borrowed`
// after the push's answer (the pushing pipeline waits for the last guard before
// WaitPushes returns), or copies them before Start returns. On a channel that carries
// chunks each chunk is such a push, `borrowed` its values.
struct OutgoingPush {
  uint64_t layout_hash = 0;
  uint64_t round = 0;
  uint32_t slice_id = 0;
  int32_t priority = 0;  // the slice's (layout), for channels that queue by urgency
  std::string codec;
  std::optional<float> loss;  // ReportLoss; channels without the field drop it
  std::optional<float> lr;    // SetLearningRate; channels without the field drop it
  uint16_t chunk_index = 0;
  uint16_t chunk_count = 1;
  uint32_t chunk_elems = 0;  // a chunk's values (chunk i covers [i, i + 1) of them); 0: whole
  std::shared_ptr<const std::string> payload;
  std::span<const char> borrowed;
  std::shared_ptr<const void> borrowed_guard;

  // The bytes on the wire: the payload's and the borrowed ones.
  size_t payload_size() const {
    return (payload != nullptr ? payload->size() : 0) + borrowed.size();
  }
  // The same bytes in one string (a copy; for fakes and the replay copy).
  std::string Bytes() const;
};

// A pull's question: the slices, the version wanted, and what the worker holds of them
// (HeldModel::Describe; held_versions empty when nothing, else one per slice id).
struct PullAsk {
  uint64_t layout_hash = 0;
  uint64_t min_version = 0;
  std::vector<uint32_t> slice_ids;
  uint64_t held_epoch = 0;
  std::vector<uint64_t> held_versions;
};

// A caller's end of one pull. Its methods run on the channel's thread, one at a time.
class PullSink {
 public:
  virtual ~PullSink() = default;
  // Where the `bytes` bytes of values of the slice `h` announces go, decided from its
  // header alone: a span of that size in the caller's buffer (dense values: a channel
  // that reads from a socket reads them straight there), or an empty span to have them
  // handed to Arrived where the channel holds them (a change, which HeldModel decodes).
  // An error ends the pull with it.
  virtual absl::StatusOr<std::span<char>> Place(const net::PullHeader& h, size_t bytes) = 0;
  // The slice's values: in the placed span or, when none was placed, in the channel's
  // buffers (valid during the call only). An error ends the pull with it.
  virtual absl::Status Arrived(const net::PullHeader& h, net::Pieces bytes) = 0;
  // How the pull ended; exactly once, last.
  virtual void Done(absl::Status status) = 0;
};

// Hands a slice message parsed where a channel received it to `sink`: Place, the copy
// into the place when the sink gave one (the one copy of dense values on the worker),
// Arrived. For channels whose transport parses whole messages (gRPC, the tests' fake).
absl::Status DeliverPullFrame(const net::PullFrame& frame, PullSink& sink);

// UNAVAILABLE with `message`, marked as a data endpoint this worker could not reach (no
// connection, no admission in time): the shard may have come back on another data port
// (one the kernel picked), which only a new Join answer names.
absl::Status DataEndpointUnreachable(std::string message);
// Whether a call that failed with `s` should join its shard again before it is retried:
// the shard no longer knows its session (UNAUTHENTICATED), or its data endpoint could
// not be reached (DataEndpointUnreachable).
bool CallsForRejoin(const absl::Status& s);

class DataChannel {
 public:
  virtual ~DataChannel() = default;

  // The shard's route after a join. A route the path cannot use (no UDP port, a bad
  // key) is still taken, and the error returned: pushes then fail with it until a
  // later route is good.
  virtual absl::Status SetRoute(const DataRoute& route) = 0;

  // Pushes made by NewPush and started once. The caller keeps the object and the
  // pushes alive until every `done` has run; the last `done` may destroy them.
  class PushCall {
   public:
    virtual ~PushCall() = default;
    // The join epoch of the route the pushes go under (ShardClient::Rejoin's argument
    // when one fails UNAUTHENTICATED).
    virtual uint64_t epoch() const = 0;
    // Sends the pushes, several in one write where the channel can; done(i, s) runs
    // exactly once for pushes[i] with its outcome. A channel that carries chunks
    // answers none: it queues them and runs every `done` before Start returns, OK once
    // queued (its send errors come from WaitSent).
    virtual void Start(std::function<void(size_t index, absl::Status)> done) = 0;
    // Asks the pushes to end soon with CANCELLED. Allowed before Start (they are then
    // cancelled as they start) and from any thread; `done` still runs once for each.
    virtual void Cancel() = 0;
  };
  // Pushes wait for the shard to become reachable until `deadline`, most urgent first
  // in `pushes`.
  virtual std::unique_ptr<PushCall> NewPush(std::vector<const OutgoingPush*> pushes,
                                            RpcClock::time_point deadline) = 0;

  // Streams the slices `ask` names into `sink`, in the order the shard sends them.
  // Returns the join epoch of the route the pull goes under (as PushCall::epoch).
  virtual uint64_t Pull(PullAsk ask, RpcClock::time_point deadline,
                        std::shared_ptr<PullSink> sink) = 0;

  // Whether the channel carries slices in chunks and answers no push (UDP datagrams);
  // false for whole slices, each answered.
  virtual bool chunked() const { return false; }
  // A chunked channel's coordinates per chunk for pushes under a codec spec of
  // `codec_bytes` bytes whose largest encoding of n values is `max_encoded_bytes(n)`,
  // as its route stands now (at least 1); 0 where not chunked.
  virtual uint32_t chunk_elems(size_t codec_bytes,
                               absl::FunctionRef<size_t(size_t)> max_encoded_bytes) const {
    return 0;
  }
  // Waits until what the channel queued unanswered has left; the first send error
  // since the previous call (of any channel sharing the sender).
  virtual absl::Status WaitSent() { return absl::OkStatus(); }
  // Sets the counters of `stats` the channel's path keeps (shared by the path's
  // channels to every shard, so setting them from each gives the same).
  virtual void FillStats(WorkerStats& stats) const {}
};

}  // namespace ps::internal
