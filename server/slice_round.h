// SliceRound: the round state machine of one slice a shard owns: its published version
// and values, the pushes of its open round, its deadline and the pulls waiting for a
// version.
//
//        Initialize              push / chunk              Close (all pushed, or the
//   new ------------> open(v) ---------------> open(v) ---- deadline with the quorum)
//                       ^                                     |
//                       |  Publish(closed round, values)      v
//                       +---------------------- closed(v) -- TakeClosed --> aggregating(v)
//
// Ownership is in the types: closing moves the round's buffers (decoded pushes, seeded
// supports, sign bits, chunk maps) and the slice's model (parameters, SGD velocity, rule
// state) into a ClosedRound; whoever aggregates it owns them and hands them back with
// Publish, which opens round v + 1 with the same buffers. Nothing else can reach them in
// between, so the aggregation runs without the slice's lock.
//
// ResetRoundLocked is the one path that empties an open round: after a publish, when a
// slice moves up to a newer version (FastForward, Adopt) and when a checkpoint is
// restored.
//
// Refusals are typed (core/refusal.h) and neither counted nor logged here: the shard
// does that once, where the refusal leaves it.
//
// Thread-safe: one mutex per slice. It may be held while removing a deadline from the
// DeadlineQueue (the innermost lock); new deadlines are added after it is released (the
// queue then wakes the server's ticker, whose lock must never be taken under a slice's),
// and watcher callbacks are returned to the caller to run after it is released.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "codecs/codec.h"
#include "codecs/compressed.h"
#include "core/clock.h"
#include "core/layout.h"
#include "core/scratch.h"
#include "server/checkpoint.h"
#include "server/deadline_queue.h"
#include "server/optimizer.h"
#include "server/pull_delta.h"
#include "server/membership.h"
#include "server/quarantine.h"
#include "server/snapshot_pool.h"

namespace ps::server {

// Rounds that carried UDP chunks to a shard, and which of them are "armed": a chunk came
// for the round and at least `starters` distinct workers had a push or chunk of it
// taken on this shard (the shard uses RoundRules::starters, f + 1 and at least 2: one of
// them at least is honest, so the f Byzantine workers alone never arm a round). An
// armed round's deadline runs on every slice at that round, including slices nobody's
// datagrams reached, and a slice of it that stays below the quorum is dropped instead of
// stalling (docs/transport.md, "Closing a round").
//
// Thread-safe: Armed is one atomic load; Note takes a mutex (innermost, like the
// DeadlineQueue's) only for rounds not armed yet.
class UdpRounds {
 public:
  // `starters`: distinct workers that arm a round (1..num_workers).
  UdpRounds(uint32_t num_workers, uint32_t starters);
  UdpRounds(const UdpRounds&) = delete;
  UdpRounds& operator=(const UdpRounds&) = delete;

  // A push (`chunk`: a UDP chunk) of `worker` for `round` was taken. True when this call
  // armed `round`. The kWindow newest rounds are tracked; a push for an older one than
  // that counts nothing (rounds that far apart are never open together: a worker pushes
  // round t + 1 only after pulling version t + 1 of every slice).
  bool Note(uint32_t worker, uint64_t round, bool chunk);
  // Whether `round`, or a later round, is armed (a slice still at an older round once a
  // later one armed has fallen behind the workers, and gets the same treatment).
  bool Armed(uint64_t round) const;
  uint32_t starters() const { return starters_; }

  static constexpr size_t kWindow = 4;

 private:
  struct Pending {
    uint64_t round = 0;
    bool used = false;
    bool chunk = false;  // a UDP chunk of the round came
    uint32_t count = 0;  // distinct workers
    std::vector<uint8_t> seen;
  };
  const uint32_t num_workers_;
  const uint32_t starters_;
  std::atomic<int64_t> armed_{-1};  // the newest armed round, -1: none
  absl::Mutex mu_;
  std::array<Pending, kWindow> pending_ ABSL_GUARDED_BY(mu_);
};

// What every slice of a shard closes its rounds by; shared by them, owned by the shard.
//
// Every round, over gRPC or UDP, in slice or model scope, is aggregated only with at
// least `quorum` inputs (RoundAggregation refuses fewer: the round is dropped, parameters
// unchanged, and counted). A slice's deadline starts once `starters` distinct workers
// pushed to it (f + 1 and at least 2, at most the quorum: never one worker, never the
// Byzantine ones alone), or, in a UDP round, when the round is armed on the shard
// (UdpRounds). At the deadline a slice with its quorum closes; one below it waits for
// its quorum (late pushes and chunks count), and in an armed round it is dropped once a
// further round deadline passed without the quorum.
struct RoundRules {
  uint32_t num_workers = 0;
  // Inputs every aggregated round has: --quorum, or n - f raised to the rule's least
  // input count (Shard::quorum()).
  uint32_t quorum = 0;
  // Distinct workers whose pushes start a slice's deadline (see above); 1 where a test
  // does not care.
  uint32_t starters = 1;
  core::Duration round_deadline{};
  core::Clock* clock = nullptr;
  DeadlineQueue* deadlines = nullptr;
  // Keep sign pushes' packed bits for a vote (the rule votes on signs).
  bool keep_signs = false;
  // Keep copies of the model with each publication (checkpoints are on).
  bool keep_published_model = false;
  // The shard's flags' SGD keeps a velocity (--momentum is not 0); a tensor with an
  // optimizer of its own follows that (Optimizer::has_first_moment).
  bool flags_velocity = true;
  // Rows of rule state per slice element (aggregators::Aggregator::StateRows).
  size_t state_rows = 0;
  // The shard's UDP rounds (null: no UDP, no round is ever armed).
  UdpRounds* udp = nullptr;
  // Workers no round waits for (null: every round waits for all n).
  const Quarantine* quarantine = nullptr;
  // Workers that left or expired, whom no round waits for either (null: none).
  const Membership* membership = nullptr;
  // --pull-codec: each slice keeps what the workers hold and publishes its changes
  // encoded with this spec (server/pull_delta.h). Empty: dense pulls only.
  std::string pull_codec;

  // Whether `round` is an armed UDP round on this shard.
  bool Armed(uint64_t round) const { return udp != nullptr && udp->Armed(round); }
  core::SteadyTime DeadlineFromNow() const;
};

// Parameters, the optimizer's buffers and the rule's memory of one slice (centered
// clipping's centre), numel values each (rule_state: state_rows * numel).
struct SliceModel {
  std::vector<float> params;
  // SGD's momentum buffer (the shard's flags' velocity), Adam's exp_avg; empty for SGD
  // without momentum (KeepsVelocity).
  std::vector<float> velocity;
  // Adam's exp_avg_sq; empty for SGD.
  std::vector<float> second_moment;
  // Optimizer steps taken (Adam's bias correction, SGD's undamped first step).
  uint64_t steps = 0;
  // The tensor's optimizer (its layout entry's); null: the shard's flags' SGD.
  std::shared_ptr<const Optimizer> optimizer;
  // Whether the step keeps a velocity: the optimizer's first moment, else the flags'
  // (`flags_velocity`, RoundRules).
  bool KeepsVelocity(bool flags_velocity) const {
    return optimizer != nullptr ? optimizer->has_first_moment() : flags_velocity;
  }
  std::vector<float> rule_state;
  // With --pull-codec: what the workers hold, and the encoder of its changes.
  HeldValues held;
  // The buffers dense versions are published in (made at the first step).
  std::shared_ptr<SnapshotPool> snapshots;
};

// One worker's UDP push of the open round: the chunk size its first chunk fixed, and
// which chunks came. chunk_count 0: no chunk came. `ended`: the push's end came (the
// worker sent every chunk), so its missing chunks are lost, not on their way.
struct ChunkedPush {
  uint32_t chunk_elems = 0;
  uint32_t chunk_count = 0;
  uint32_t received = 0;
  std::vector<uint8_t> seen;
  bool ended = false;
  // The chunk count its end named (its geometry checked against the slice), kept for a
  // push none of whose chunks came: ClosedRound::ChunksLost counts them all.
  uint32_t end_count = 0;
  // The UDP sessions its chunks came under, in the order each first sent one (more than
  // one when the worker restarted mid-round: each successor resends the push): seen[i]
  // is 1 + the index here of the session chunk i came under, 0 for a chunk not yet come.
  // A session past kMaxSessions is refused (a worker restarted that often in one round).
  static constexpr size_t kMaxSessions = 255;
  std::vector<uint64_t> sessions;
};

// One worker's decoded push of a slice: numel values, owned.
using Row = std::unique_ptr<float[]>;

// A push kept encoded until its round closes (codecs::Codec::checks_without_decoding):
// its payload, checked as it arrived, and the codec that decodes it. An empty payload:
// none kept.
struct KeptPush {
  std::string payload;
  std::shared_ptr<const codecs::Codec> codec;
};

// The rows a closed round's kept pushes are decoded into for one aggregation: the
// calling thread's own, reused from slice to slice so that they are in its caches when
// the rule reads them (rows of its own for a nested aggregation). Between aggregations
// the thread keeps up to 64 MiB of them (as many as the most inputs it aggregated, each
// the largest slice's size).
struct KeptRowsTag;
using RowScratch = core::ThreadRows<KeptRowsTag, size_t{64} << 20>;

// A raw fp32 payload (codecs::Codec::raw_fp32) that a transport read straight into a row
// of its own: the format version byte, then `numel` values in `values`. Accepted, the row
// becomes the worker's in the round and `values` holds what the round held for that
// worker before (a row of the same numel to read the next push into, or null).
struct RawRow {
  unsigned char version = 0;
  Row values;
  uint32_t numel = 0;
};

// What a push carries to its slice: the pieces its payload arrived in (decoded from
// them), or a raw row.
struct PushPayload {
  PushPayload(std::span<const std::string_view> pieces) : pieces(pieces) {}  // NOLINT
  explicit PushPayload(RawRow* raw) : raw(raw) {}
  std::span<const std::string_view> pieces;
  RawRow* raw = nullptr;
  // The payload's size on the wire.
  size_t bytes() const;
};

// The pushes of one round, per worker.
struct RoundInputs {
  // Decoded pushes, one row per worker (null until the worker's first push or chunk that
  // is decoded as it arrives).
  std::vector<Row> rows;
  // Pushes kept encoded, one per worker: where one is kept, it is the worker's input, not
  // its row (ClosedRound::Rows decodes it).
  std::vector<KeptPush> kept;
  // Compressed-domain aggregation (docs/codecs.md): the seeded support of a random-k push,
  // and the bytes of a sign push when the rule votes on signs.
  std::vector<std::optional<codecs::SeededSupport>> supports;
  std::vector<std::string> sign_payloads;
  std::vector<ChunkedPush> chunked;
  // Worker w sent something this round (a push or a chunk).
  std::vector<uint8_t> pushed;
  // The training loss worker w's push reported (local-update training); NaN: none.
  std::vector<float> losses;
  // The learning rate worker w's push asked the round's step to take; NaN: none.
  std::vector<float> lrs;
};

// The median of `reported` (losses or lrs) over the workers that pushed and reported
// one (the mean of the two middle ones for an even count); nullopt when none did. Within
// the honest range when fewer than half the reporters lie.
std::optional<float> MedianReported(const RoundInputs& inputs, const std::vector<float>& reported);
inline std::optional<float> MedianLoss(const RoundInputs& inputs) {
  return MedianReported(inputs, inputs.losses);
}
inline std::optional<float> MedianLr(const RoundInputs& inputs) {
  return MedianReported(inputs, inputs.lrs);
}

// ctx.masks for the inputs of some workers: null for a whole push, else a bitmap of the
// coordinates whose chunks came.
struct InputMasks {
  std::vector<std::vector<uint8_t>> bits;
  std::vector<const uint8_t*> ptrs;  // empty when every push is whole
};

// A closed round, owned by its aggregation: the slice's pushes and model, moved out of
// the slice at close and handed back with SliceRound::Publish.
struct ClosedRound {
  core::SliceInfo info;
  uint64_t round = 0;
  RoundInputs inputs;
  SliceModel model;

  // Workers that pushed, increasing.
  std::vector<uint32_t> Workers() const;
  // Their decoded rows. A kept push is decoded into `scratch`'s rows (valid while it
  // lives), or without one into the worker's own row, where it stays decoded for later
  // calls. An error only if a kept push fails to decode although its check passed.
  absl::StatusOr<std::vector<const float*>> Rows(std::span<const uint32_t> workers,
                                                 RowScratch* scratch = nullptr);
  // The kept 3lc payloads of `workers`, in order, when every one's push is kept as 3lc
  // (not yet decoded into its row); else empty.
  std::vector<std::string_view> Kept3lc(std::span<const uint32_t> workers) const;
  InputMasks MasksOf(std::span<const uint32_t> workers) const;
  // The sorted kept coordinates when every one of `workers` pushed random-k with the same
  // seeded support, else empty.
  std::vector<uint32_t> SharedSupport(std::span<const uint32_t> workers) const;
  // The packed sign bits of `workers`, or empty unless every one of them sent some.
  std::vector<std::string_view> Signs(std::span<const uint32_t> workers) const;
  // Chunks missing from workers that sent at least one chunk (masked coordinates).
  uint64_t ChunksLost() const;

  // Model scope: the Gram matrix of every worker that pushed this slice (`workers`,
  // increasing; k x k row-major), computed as the slice closed
  // (RoundAggregation::SliceGram); none when it could not be computed then.
  struct GramPart {
    std::vector<uint32_t> workers;
    std::vector<double> gram;
  };
  std::optional<GramPart> gram_part;
};

// A published slice: immutable, shared by every pull that sends it.
struct SliceSnapshot {
  uint64_t version = 0;
  std::shared_ptr<const std::string> values;  // little-endian fp32
  // With --pull-codec, the change that led to `version` (null: none, send dense).
  std::shared_ptr<const PullDelta> delta;
  // The median of the losses reported with the pushes of round version - 1, and of the
  // first round with any (AdaComm, docs/adaptive.md); nullopt: none.
  std::optional<float> loss;
  std::optional<float> first_loss;
};

// Pull callbacks whose version was reached (or false at shutdown), to run without locks.
using Wakeups = std::vector<std::function<void(bool)>>;
void RunWakeups(Wakeups& wake, bool ready);

class SliceRound {
 public:
  // Borrows `rules`, which must outlive this. Without `aggregate_only` the slice has no
  // version until Initialize; with it, version 0 is an all-zero aggregate. `optimizer`:
  // the tensor's (null: the shard's flags' SGD).
  SliceRound(const core::SliceInfo& info, RoundRules* rules, bool aggregate_only,
             std::shared_ptr<const Optimizer> optimizer = nullptr);
  SliceRound(const SliceRound&) = delete;
  SliceRound& operator=(const SliceRound&) = delete;

  const core::SliceInfo& info() const { return info_; }

  // Sets version 0 from `values` (numel little-endian fp32). ALREADY_EXISTS the second
  // time (checked first), kMalformed for a wrong size or a non-finite value.
  absl::Status Initialize(std::string_view values, Wakeups* wake);

  // What a taken push did to the round.
  struct Progress {
    bool closed = false;  // the round closed: aggregate it (TakeClosed)
    bool at_deadline = false;
    // The payload's decoding took (thread CPU time); 0 for a raw row taken in place,
    // whose check is not timed (AcceptPush).
    std::chrono::nanoseconds decode{0};
    // A chunk the round already held from the same worker under an earlier session
    // (AcceptChunk): taken as that copy, which counts, and nothing changed.
    bool held_from_before = false;
  };
  using DecoderFn = absl::FunctionRef<absl::StatusOr<std::shared_ptr<const codecs::Codec>>()>;
  // A whole push of `worker` for `round`. The round's state is checked before `decoder`
  // is asked for the codec: late (kLate), early (kFutureRound), uninitialized (kNotReady),
  // duplicate (kDuplicate); kMalformed when the payload does not decode.
  // `codec` is the name the push gave (quoted, cut short, in refusals). The payload is
  // decoded from the pieces it arrived in (Codec::DecodePieces); a raw row is checked
  // where it is (the same checks and messages) and taken as the worker's row, with no
  // copy, when the codec sends raw fp32 (and decoded from it like pieces otherwise).
  // `loss`, the worker's training loss, must be finite, and `lr`, the learning rate it
  // asks the round's step to take, finite and >= 0 (kMalformed before decoding
  // otherwise).
  absl::StatusOr<Progress> AcceptPush(uint32_t worker, uint64_t round, std::string_view codec,
                                      DecoderFn decoder, const PushPayload& payload,
                                      std::optional<float> loss = std::nullopt,
                                      std::optional<float> lr = std::nullopt);
  absl::StatusOr<Progress> AcceptPush(uint32_t worker, uint64_t round, std::string_view codec,
                                      DecoderFn decoder, std::string_view payload,
                                      std::optional<float> loss = std::nullopt,
                                      std::optional<float> lr = std::nullopt) {
    return AcceptPush(worker, round, codec, decoder,
                      PushPayload(std::span<const std::string_view>(&payload, 1)), loss, lr);
  }
  // One chunk of a UDP push: coordinates [first, first + count) of the slice, chunk
  // `index` of `count_in_push` chunks of `chunk_elems`, under UDP session `session`.
  // Also kDuplicate for a replayed chunk (one the round holds from the same session) or
  // a slice already pushed over gRPC, kMalformed for a chunk size changing within a
  // push. A chunk the round holds from an earlier session of the worker is a restarted
  // worker's resend of what its predecessor sent: taken as that copy
  // (Progress::held_from_before). The first chunk of a worker counts it in the round.
  struct Chunk {
    uint32_t worker = 0;
    uint64_t round = 0;
    uint32_t index = 0;
    uint32_t count_in_push = 0;
    uint32_t chunk_elems = 0;
    uint32_t first = 0;
    uint32_t count = 0;
    uint64_t session = 0;
  };
  absl::StatusOr<Progress> AcceptChunk(const Chunk& chunk, std::string_view codec,
                                       DecoderFn decoder, std::string_view payload);
  // The end of `worker`'s UDP push for `round` (net::DatagramKind::kEnd): it sent every
  // chunk, in chunks of `chunk_elems`, `count_in_push` of them. The round waits for no
  // more of them: it closes once every worker's push is whole or ended (missing chunks
  // masked; below the quorum too, which its aggregation then drops), without waiting
  // for its deadline. The round's state is checked as for a chunk; kDuplicate for a slice
  // the worker pushed over gRPC, kMalformed for a chunk size or count other than its
  // chunks'. An end of a worker none of whose chunks came makes it settled without an
  // input. A second end of the same push changes nothing.
  struct PushEnd {
    uint32_t worker = 0;
    uint64_t round = 0;
    uint32_t count_in_push = 0;
    uint32_t chunk_elems = 0;
  };
  absl::StatusOr<Progress> AcceptEnd(const PushEnd& end);

  // What a deadline did (Shard::Tick logs it).
  struct DeadlineOutcome {
    bool due = false;     // the deadline was this slice's and has passed
    bool closed = false;  // aggregate it (TakeClosed)
    // Closed below the quorum: an armed UDP round that waited a further round deadline;
    // its aggregation drops it (RoundAggregation's quorum check).
    bool below_quorum = false;
    // Below the quorum, in an armed UDP round: waits one more round deadline, then is
    // dropped (without `grace` it waits for the quorum however long it takes).
    bool grace = false;
    uint64_t round = 0;
    uint32_t pushed = 0, complete = 0, quorum = 0;
  };
  DeadlineOutcome OnDeadline(core::SteadyTime now);
  // `round` was just armed on this shard (UdpRounds): starts this slice's deadline if it
  // is at that round and has none, so that a slice whose datagrams were all lost still
  // closes or is dropped.
  void StartDeadlineAt(uint64_t round);
  // A worker was just quarantined, left or expired: closes the open round if it has its
  // quorum and waits for nobody else (every worker whose push is not whole is absent:
  // quarantined, left or expired). Returns the round it closed.
  std::optional<uint64_t> CloseIfOnlyAbsentMissing();

  // The round Close parked for its aggregation (nullopt if another took it).
  std::optional<ClosedRound> TakeClosed();
  // Publishes `round`'s result: version + 1 with `values` (fp32 bytes) and, with
  // --pull-codec, `delta_payload`, the change from this version (null: none); the model
  // and the buffers back from the aggregation; opens the next round.
  void Publish(ClosedRound round, std::shared_ptr<const std::string> values,
               std::shared_ptr<const std::string> delta_payload, Wakeups* wake);

  // Moves a slice below `version` up to it (parameters unchanged, the open round
  // discarded); not one that is closed or uninitialized. Returns whether it moved.
  bool FastForward(uint64_t version, Wakeups* wake);
  // Publishes `values` (numel little-endian fp32, finite), adopted from a worker
  // (server/adoption.h), as version round + 1: the open round's pushes are discarded, the
  // optimizer starts afresh from them (momentum and moments zero, no steps taken) and the
  // rule's state is kept; pulls of the version are dense. A slice below `round` moves up
  // to it. kLate once the slice is past `round`, or closed it (its aggregation publishes
  // round + 1), kNotReady before the initial value, kMalformed for a wrong size or a
  // non-finite value.
  absl::Status Adopt(uint64_t round, std::string_view values, Wakeups* wake);
  // Before any worker is admitted: sets the slice from a checkpoint. With a pull codec
  // and the checkpoint's parameters, x and x̂ both come back as they were, so the next
  // changes are those an uninterrupted shard would have sent; without either, x̂ = x.
  absl::Status Restore(const SliceCheckpoint& checkpoint);
  // The published state, as a checkpoint stores it.
  SliceCheckpoint Capture(bool with_velocity) const;

  // Calls `ready(true)` inline when the slice has `min_version`, `ready(false)` when
  // `closed_to_watchers` (shutting down); else keeps it and returns its id.
  uint64_t Watch(uint64_t min_version, std::function<void(bool)> ready, uint64_t id,
                 bool closed_to_watchers);
  // Forgets a watch that has not fired.
  void Unwatch(uint64_t watch_id);
  // Every waiting watch (shutdown).
  Wakeups TakeAllWatchers();

  SliceSnapshot Snapshot() const;
  uint64_t version() const;
  size_t watcher_count() const;
  // When the open round opened: its version was published (or initialized, restored,
  // fast-forwarded); nullopt before. What a push's latency is measured from
  // (ps_worker_push_latency).
  std::optional<core::SteadyTime> opened() const {
    const int64_t ticks = opened_.load(std::memory_order_relaxed);
    if (ticks == kNotOpened) return std::nullopt;
    return core::SteadyTime(core::Duration(ticks));
  }

 private:
  // Holds mu_; on release registers a deadline set meanwhile with the DeadlineQueue,
  // after mu_ is unlocked.
  class ABSL_SCOPED_LOCKABLE Locked {
   public:
    explicit Locked(SliceRound* s) ABSL_EXCLUSIVE_LOCK_FUNCTION(s->mu_);
    ~Locked() ABSL_UNLOCK_FUNCTION();
    Locked(const Locked&) = delete;
    Locked& operator=(const Locked&) = delete;

   private:
    SliceRound* const s_;
  };

  absl::Status CheckOpenRoundLocked(uint32_t worker, uint64_t round) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The slot of `worker`'s decoded push (allocating the worker's row at first use).
  // Taken before the decode budget's clock starts: the row's allocation and the page
  // faults of zeroing it are the shard's cost, not the worker's decoding.
  std::span<float> SlotLocked(uint32_t worker, uint32_t first, uint32_t count)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `payload` is raw fp32 values already in a row of their own (RawRow), checked
  // in place and swapped in by DecodeLocked: such a push needs no slot.
  bool InPlaceLocked(const codecs::Codec& codec, const PushPayload& payload) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `payload` decoded into `slot` (SlotLocked's whole row), or, when `slot` is empty
  // (the caller found InPlaceLocked), checked and swapped in.
  absl::Status DecodeLocked(uint32_t worker, const codecs::Codec& codec,
                            const PushPayload& payload, std::span<float> slot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The payload in `pieces` gathered into `worker`'s KeptPush and checked (Codec::Check);
  // on a refusal nothing is kept.
  absl::Status KeepLocked(uint32_t worker, std::shared_ptr<const codecs::Codec> codec,
                          std::span<const std::string_view> pieces)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a push, chunk or end was taken: closes the round when every push is complete
  // or ended (or the deadline passed with the quorum, or only absent workers are
  // missing), else starts its deadline once `starters` workers pushed.
  Progress AfterPushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The round has its quorum and waits only for absent workers (quarantined, left or
  // expired).
  bool OnlyAbsentMissingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the round and the model into closed_ for the aggregation.
  void CloseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Empties the open round (the one reset path) and forgets its deadline.
  void ResetRoundLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetDeadlineLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies of the model for checkpoints, when they are kept.
  void KeepPublishedModelLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The snapshot of a first version (Initialize, Adopt): with dense pulls from the
  // model's snapshot pool, filled then (SnapshotPool::TakeFilled).
  std::shared_ptr<const std::string> PublishFirstLocked(std::span<const float> params)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TakeDueWatchersLocked(Wakeups* wake) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const core::SliceInfo info_;
  RoundRules* const rules_;

  mutable absl::Mutex mu_;
  // Whether version 0 (the initial value) exists; nothing is published before.
  bool initialized_ ABSL_GUARDED_BY(mu_) = false;
  // opened(), in clock ticks; written under mu_, read without it.
  static constexpr int64_t kNotOpened = INT64_MIN;
  std::atomic<int64_t> opened_{kNotOpened};
  void MarkOpenedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Published version; round `version_` is the open one.
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<const std::string> published_ ABSL_GUARDED_BY(mu_);
  // The change that led to published_ (null: none; pulls of this version are dense).
  std::shared_ptr<const PullDelta> delta_ ABSL_GUARDED_BY(mu_);
  // The published losses (SliceSnapshot::loss, first_loss).
  std::optional<float> loss_ ABSL_GUARDED_BY(mu_);
  std::optional<float> first_loss_ ABSL_GUARDED_BY(mu_);
  // With checkpoints on: the velocity and rule state that go with `published_`, and with
  // a pull codec the parameters x, of which `published_` is what the workers hold (x̂).
  std::shared_ptr<const std::vector<float>> published_velocity_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const std::vector<float>> published_second_moment_ ABSL_GUARDED_BY(mu_);
  uint64_t published_steps_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<const std::vector<float>> published_rule_state_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const std::vector<float>> published_params_ ABSL_GUARDED_BY(mu_);
  // The model and the open round's pushes, while the round is open.
  SliceModel model_ ABSL_GUARDED_BY(mu_);
  RoundInputs inputs_ ABSL_GUARDED_BY(mu_);
  uint32_t num_pushed_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t num_complete_ ABSL_GUARDED_BY(mu_) = 0;
  // Workers whose UDP push ended but is not whole: with num_complete_, the settled ones.
  uint32_t num_ended_ ABSL_GUARDED_BY(mu_) = 0;
  // Set from Close until Publish: pushes for the round are late.
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  // The round closed last and which workers' whole pushes it took (empty: none since a
  // fast-forward or restore, or that round was dropped below its quorum). A worker whose
  // connection was lost before the answer sends its push again: when the round closed
  // with the first copy, that is refused as the duplicate it is (which the worker's retry
  // counts as delivered), not as late (which fails the worker's round).
  uint64_t last_closed_round_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint8_t> last_closed_pushed_ ABSL_GUARDED_BY(mu_);
  std::optional<ClosedRound> closed_ ABSL_GUARDED_BY(mu_);
  std::optional<core::SteadyTime> deadline_ ABSL_GUARDED_BY(mu_);
  // Set by SetDeadlineLocked, registered by ~Locked.
  std::optional<core::SteadyTime> pending_deadline_ ABSL_GUARDED_BY(mu_);
  // The deadline passed below the quorum: the round closes as soon as it has it (or,
  // in an armed UDP round, is dropped at the next deadline).
  bool deadline_passed_ ABSL_GUARDED_BY(mu_) = false;
  // Waiting watches by id: the version each waits for and what to call.
  absl::flat_hash_map<uint64_t, std::pair<uint64_t, std::function<void(bool)>>> watchers_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::server
