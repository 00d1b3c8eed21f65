// The order in which one pull sends its slices, apart from any transport (P3's
// priority-ordered propagation on the way down, docs/transport.md).
//
// A pull asks for some slices at a minimum version. The scheduler watches each slice
// (Shard::Watch), keeps those that reached the version in a ready set ordered by
// (priority, arrival, slice) (priority 0 for all under --schedule fifo), and hands the
// sink the most urgent ready slice each time the sink can take one (it takes
// PullSink::writes_in_flight() before the first WriteDone: 1 for gRPC's one write per
// stream, 2 to 8 for the TCP backend's, by its link's pace): a slice's published values,
// or the change from the version the worker holds (compressed pulls). The slices ready at the start go out
// most urgent first, since writing starts only once every watch is registered; a slice
// handed over right after a write completed, or behind one in flight, is marked
// `queued` (it waited for the link). An urgent slice overtakes every ready one not yet
// handed over. The pull ends OK once every slice went out, CANCELLED when cancelled or
// when a write failed (after the writes in flight), UNAVAILABLE when the shard shuts
// down first.
//
// Thread safety: watch callbacks run on any thread; every entry point may be called
// from any thread. The sink is called with the scheduler's lock held, at most
// writes_in_flight() Writes outstanding (one more after each WriteDone), and Finish
// once, last; it must not call back into the scheduler from Write or Finish.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "net/wire.h"
#include "server/shard.h"

namespace ps::server {

class Metrics;

// One slice on its way: the header of its frame and the bytes after it (the published
// snapshot's values, or the change's payload), shared, never copied.
struct PullItem {
  net::PullHeader header;
  std::shared_ptr<const std::string> body;
};

// Where a pull's slices go: a transport's stream.
class PullSink {
 public:
  virtual ~PullSink() = default;
  // Starts writing `item`; the transport calls PullScheduler::WriteDone when it is
  // written (or failed).
  virtual void Write(PullItem item) = 0;
  // The pull is over with `status`; no Write follows.
  virtual void Finish(const absl::Status& status) = 0;
  // How many Writes may be outstanding at once (at least 1): a transport that queues
  // frames of its own takes the next slice while one is being written, so that it goes
  // out in the same system call or right after, without a round through the scheduler.
  virtual size_t writes_in_flight() const { return 1; }
};

class PullScheduler {
 public:
  // `slice_ids`, `min_version`: the request, validated (Shard::ValidatePull).
  // `held_epoch`, `held_versions` (parallel to slice_ids, or empty): what the worker
  // holds, for compressed pulls. `metrics` may be null.
  PullScheduler(Shard* shard, std::vector<uint32_t> slice_ids, uint64_t min_version,
                uint64_t held_epoch, const std::vector<uint64_t>& held_versions,
                Metrics* metrics);
  // Drops the watches that have not fired (a cancelled or timed-out pull would otherwise
  // leave them until their version came) and detaches the sink: late callbacks find
  // nothing to do.
  ~PullScheduler();
  PullScheduler(const PullScheduler&) = delete;
  PullScheduler& operator=(const PullScheduler&) = delete;

  // Registers the watches and starts writing into `sink`, which must outlive this
  // scheduler or its Finish, whichever comes first. Once.
  void Start(PullSink* sink);
  // The sink's last Write completed (`ok`) or failed.
  void WriteDone(bool ok);
  // Ends the pull CANCELLED, at once or after the write in flight.
  void Cancel();

 private:
  struct State;

  Shard* const shard_;
  const std::vector<uint32_t> slice_ids_;
  const uint64_t min_version_;
  std::vector<std::pair<uint32_t, uint64_t>> watches_;  // (slice, watch id) not fired at start
  std::shared_ptr<State> state_;
};

}  // namespace ps::server
