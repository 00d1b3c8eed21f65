// Shard: one ps-server shard, free of any transport: the front over its parts.
//
//   SessionTable      sessions of joined workers, their UDP identities
//   SliceTable        the registered layout and the owned slices
//   SliceRound        per owned slice: the round state machine, published values, watchers
//   DeadlineQueue     when each open round is due
//   ModelCoordinator  model scope: the share protocol between shards (ModelRounds) and the
//                     round's steps from the closed slices to publication
//   RoundAggregation  the rule, sign votes, supports, masks and SGD over closed rounds
//   AggregationJobs   the shard's work on the thread pool, and waiting for it
//   DecoderCache      codec instances by name
//   Quarantine        workers that sent a malformed push, whom no round waits for
//   Membership        workers that left or expired, whom no round waits for either
//   Adoption          the votes that let the shard take one worker's values mid-run
//   ShardCounters     ShardStats, and rate-limited logs of what a client can trigger
//
// The front checks and routes requests, counts and logs refusals once (Refuse), and runs
// slice-scope aggregations: a closed round's buffers move into a ClosedRound that
// the aggregation owns and hands back with the published result (docs/architecture.md,
// "Inside Shard").
//
// Round protocol (docs/architecture.md, "A push" and "Rounds, versions and the training
// loop"), per slice: the round `version` is open; each joined worker may push once; the
// round closes when all n workers pushed, or once its deadline passed with at least
// `quorum` pushes (the deadline starts when `starters` distinct workers pushed, or when a
// UDP round is armed; see RoundRules). The closed round is aggregated on
// the thread pool, the optimizer runs, and version + 1 is published to pull watchers.
// Pushes are decoded and validated on arrival, so a malformed push is refused at once
// and never reaches the aggregator.
//
// Thread safety: all methods may be called concurrently. Lock order: a slice's lock,
// then the DeadlineQueue's or ShardCounters'; the SliceTable's and ModelRounds' locks are
// never held while taking a slice's. Watch callbacks run on whichever thread publishes
// (a pool thread) or inline in Watch(); they must be quick.
// Ownership: the Shard borrows `clock` and `pool`, which must outlive it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "aggregators/aggregator.h"
#include "server/adoption.h"
#include "codecs/codec.h"
#include "core/clock.h"
#include "core/layout.h"
#include "core/refusal.h"
#include "core/thread_pool.h"
#include "net/udp_frame.h"
#include "server/aggregation_jobs.h"
#include "server/checkpoint.h"
#include "server/codec_policy.h"
#include "server/deadline_queue.h"
#include "server/decode_budget.h"
#include "server/decoder_cache.h"
#include "server/memory_estimate.h"
#include "server/model_coordinator.h"
#include "server/model_rounds.h"
#include "server/optimizer.h"
#include "server/options.h"
#include "server/quarantine.h"
#include "server/round_aggregation.h"
#include "server/session_table.h"
#include "server/shard_counters.h"
#include "server/slice_round.h"
#include "server/slice_table.h"
#include "server/suspicion.h"

namespace ps::server {

// Why a request was refused (core/refusal.h): each reason has its own counter, status
// code and name, and travels inside the refusing status.
using core::Refusal;
using core::RefusalName;

// ShardStats and AggregationStage: server/shard_counters.h.

struct JoinResult {
  std::string session;
  bool layout_registered = false;
  uint32_t slice_elems = 0;  // the registered layout's; 0 while none is
  bool ready = false;
  uint64_t version = 0;
  // The join's data session (server/session_table.h): a public id carried in every
  // datagram and in a TCP connection's HELLO, the datagrams' MAC key and the TCP
  // handshake's secret, handed to the worker over the (authenticated) gRPC channel.
  uint64_t data_session = 0;
  std::string udp_key;
  std::string data_secret;
};

class Shard {
 public:
  // options must be valid (ServerOptions::Validate); aggregator is the rule to use.
  Shard(const ServerOptions& options, uint32_t shard_id,
        std::unique_ptr<aggregators::Aggregator> aggregator, core::Clock* clock,
        core::ThreadPool* pool);
  ~Shard();
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  uint32_t shard_id() const { return shard_id_; }
  // The fewest inputs any round is aggregated with, on every path: --quorum, or n - f
  // raised to the rule's least input count.
  uint32_t quorum() const { return quorum_; }
  // Distinct workers whose pushes start a slice's deadline: f + 1 and at least 2 (one
  // honest worker at least, never one worker alone), at most the quorum.
  uint32_t starters() const { return starters_; }
  const ServerOptions& options() const { return options_; }

  // A worker joins with its rank and the hash of its layout; a new session replaces
  // any earlier one of the same rank. The data session's keys are bound to `token`, the
  // token the worker proved on this join (SessionTable::Issue; empty: none). No hash
  // (nullopt): the worker's slice size is the job's and not yet chosen; nothing is
  // checked, and the worker joins again with its layout's hash before it sends any
  // (every call that names a layout checks its hash).
  absl::StatusOr<JoinResult> Join(uint32_t worker_id, std::optional<uint64_t> layout_hash,
                                  std::string_view token = {});
  // The worker id behind a session, or UNAUTHENTICATED.
  absl::StatusOr<uint32_t> Authenticate(std::string_view session) const;

  // Registers the layout (first caller wins). Returns the owned slice ids in priority
  // order. ALREADY_EXISTS when the same layout is registered, FAILED_PRECONDITION when
  // another one is, RESOURCE_EXHAUSTED when it needs more than --max-shard-bytes.
  absl::StatusOr<std::vector<uint32_t>> RegisterLayout(uint32_t worker_id,
                                                       const core::ModelLayout& layout);
  // The same from a layout's parts, as a request carries them: answers a shard that
  // already has a layout, and refuses one over the limits, at a cost linear in the
  // tensor list (nothing is cut into slices before it passed). INVALID_ARGUMENT for an
  // invalid layout.
  absl::StatusOr<std::vector<uint32_t>> RegisterLayout(uint32_t worker_id,
                                                       std::vector<core::TensorSpec> tensors,
                                                       uint32_t slice_elems, uint32_t num_shards);
  // ALREADY_EXISTS when `same`, else the mismatch refusal naming `offered` (what the
  // request was: its hash, or its size). `have` is the registered layout.
  absl::Status AnswerRegistered(const core::ModelLayout& have, uint32_t worker_id, bool same,
                                const absl::AlphaNum& offered) const;
  // Sets a slice's initial value (fp32 bytes) once; the shard is ready when all
  // owned slices have one.
  absl::Status InitSlice(uint32_t worker_id, uint64_t layout_hash, uint32_t slice_id,
                         std::string_view values);

  // `worker_id` leaves (server/membership.h): no round waits for it until it pushes or
  // joins again; rounds that waited only for it close now.
  void Leave(uint32_t worker_id);
  // Whether rounds wait for `worker` (left or expired: not).
  Membership::State membership(uint32_t worker) const { return membership_.state(worker); }
  // Every worker id's state, by id.
  std::vector<Membership::State> MembershipStates() const;
  uint32_t workers_absent() const { return membership_.absent_count(); }
  uint32_t workers_waited() const { return membership_.waited_count(); }

  // --- mid-run adoption of one worker's values (server/adoption.h) ---
  // `worker_id`'s vote for adopting worker `root`'s values at `round`, the version every
  // slice is at. kBadWorkerId for a root outside the workers, kNotReady before every slice
  // has its initial value, kLate when a slice is past `round`, kFutureRound when none
  // reached it, kPermissionDenied on an --aggregate-only shard (it holds no parameters).
  absl::StatusOr<Adoption::Tally> Adopt(uint32_t worker_id, uint64_t layout_hash, uint64_t round,
                                        uint32_t root);
  // The root's value of one slice for the passed adoption of `round`, published as
  // version round + 1 (SliceRound::Adopt). kPermissionDenied unless `worker_id` is the
  // root of the adoption of `round` that passed here.
  absl::Status AdoptSlice(uint32_t worker_id, uint64_t layout_hash, uint64_t round,
                          uint32_t slice_id, std::string_view values);
  // The votes an adoption needs here.
  uint32_t adoption_quorum() const { return adoption_.quorum(); }

  // One encoded gradient slice from `worker_id` for `round`, with the worker's training
  // loss when it reported one (local-update training) and the learning rate it asks the
  // round's step to take.
  absl::Status Push(uint32_t worker_id, uint64_t layout_hash, uint64_t round, uint32_t slice_id,
                    std::string_view codec, const PushPayload& payload,
                    std::optional<float> loss = std::nullopt,
                    std::optional<float> lr = std::nullopt);
  // The same, with the payload in one piece.
  absl::Status Push(uint32_t worker_id, uint64_t layout_hash, uint64_t round, uint32_t slice_id,
                    std::string_view codec, std::string_view payload,
                    std::optional<float> loss = std::nullopt) {
    return Push(worker_id, layout_hash, round, slice_id, codec,
                PushPayload(std::span<const std::string_view>(&payload, 1)), loss);
  }
  // The number of values of a push of `payload_bytes` for `slice_id` when its codec, one
  // this shard has decoded before, sends raw fp32 (codecs::Codec::raw_fp32) and the size
  // is exactly that slice's: a transport may then read the values straight into a row
  // and push a RawRow. 0 otherwise (read the payload and push its pieces). No refusal
  // is decided or counted here.
  uint32_t RawRowNumel(uint64_t layout_hash, uint32_t slice_id, std::string_view codec,
                       size_t payload_bytes) const;

  // The worker and secrets behind a data session id (UDP datagrams, TCP connections),
  // or UNAUTHENTICATED (unknown_session, counted) when it is unknown or was replaced by a
  // re-join. `what` names the sender in the refusal ("datagram", "connection").
  absl::StatusOr<std::shared_ptr<const DataSession>> FindDataSession(uint64_t data_session,
                                                                     std::string_view what) const;
  // One authenticated datagram's chunk: coordinates ChunkRangeOf(numel, chunk_elems,
  // chunk_index) of the slice, encoded on their own. The first chunk of a worker counts
  // it in the round and fixes the chunk size; the round closes when every worker's push
  // is complete, or at its deadline with the quorum, the missing chunks masked.
  // ALREADY_EXISTS for a chunk seen before (replay) or a slice already pushed over
  // gRPC, OUT_OF_RANGE for a closed round (stale), INVALID_ARGUMENT for bad geometry or
  // a payload that does not decode.
  // The end of one push (net::DatagramKind::kEnd, the payload ignored: the backend hands
  // over each push an end datagram names, net::EndedPushes) ends the worker's push
  // instead (SliceRound::AcceptEnd): its missing chunks count as lost, and the round
  // closes once every worker's push is whole or ended.
  absl::Status PushChunk(const net::DatagramHeader& header, std::string_view codec,
                         std::string_view payload);

  // The most slice ids a pull may name: the owned slices once the layout is registered
  // (a pull names each at most once), the layout limit (core::kMaxSlices) before.
  size_t MaxPullSlices() const;
  // Checks a pull request: layout, slice ids owned by this shard, no repeats; in time
  // linear in the ids, stopping at the first bad one (counted: malformed, or the
  // lookup's refusal).
  absl::Status ValidatePull(uint64_t layout_hash, std::span<const uint32_t> slice_ids);
  // Calls `ready(true)` once slice `slice_id` has a version >= min_version (inline if
  // it already has), or `ready(false)` if the shard shuts down first. The slice id
  // must have passed ValidatePull. Returns an id for Unwatch (0 when `ready` already ran).
  uint64_t Watch(uint32_t slice_id, uint64_t min_version, std::function<void(bool)> ready);
  // Forgets a watch that has not fired (a pull that was cancelled or timed out); a no-op
  // for one that fired. `ready` is not called.
  void Unwatch(uint32_t slice_id, uint64_t watch_id);
  // Watches waiting over all slices (tests, docs: every one belongs to an open pull).
  uint64_t WatcherCount() const;
  SliceSnapshot Snapshot(uint32_t slice_id) const;
  // Priority of a slice (for ordering pull streams).
  int32_t SlicePriority(uint32_t slice_id) const;
  // --schedule=priority (P3): closed slices are aggregated, and ready slices streamed,
  // most urgent first; otherwise in the order they became ready.
  bool priority_schedule() const { return priority_schedule_; }
  // Compressed pulls (--pull-codec, docs/data_path.md): the codec spec ("" when pulls
  // are dense) and this shard's epoch, the lineage of its published values: random and
  // non-zero at every start with a pull codec, 0 without one.
  const std::string& pull_codec() const { return options_.pull_codec; }
  uint64_t pull_epoch() const { return pull_epoch_; }

  // Whether distance-based rules run in model scope here (the rule needs a Gram
  // matrix and --aggregation-scope is "model").
  bool model_scope() const { return model_scope_; }
  // Called (on a pool thread, without locks held) with this shard's share of each
  // model-scope round, for delivery to every peer's AcceptShare().
  void SetShareSender(std::function<void(std::shared_ptr<const RoundShare>)> sender);
  // A peer's share. Refuses a share for another layout, from an unknown or this shard,
  // malformed (participants not increasing or out of range, wrong Gram size, non-finite
  // values), for a round already done or more than one ahead, or a second one.
  absl::Status AcceptShare(const RoundShare& share);

  // Closes every round whose deadline passed and that has its quorum; drops a model
  // round whose peer shares did not arrive within --peer-timeout.
  void Tick(core::SteadyTime now);
  // Earliest pending deadline, if any.
  std::optional<core::SteadyTime> NextDeadline() const;
  // Called (without locks held) whenever a new, earlier deadline may exist.
  void SetDeadlineListener(std::function<void()> listener);

  // Called on the aggregating (pool) thread with the time each aggregation step took
  // (metrics); must be quick and thread-safe. Null turns it off.
  void SetAggregationObserver(std::function<void(AggregationStage, core::Duration)> observer);

  // Refuses new pushes, lets running aggregations finish, wakes every watcher with
  // false. Returns after `timeout` at the latest.
  void Drain(core::Duration timeout);

  // --- durability (server/checkpoint.h) ---
  // The published state of every owned slice. FAILED_PRECONDITION before the layout is
  // registered and every slice initialized. Tries (briefly) to catch every slice at the
  // same version, so that a restore loses no update on any of them.
  absl::StatusOr<ShardCheckpoint> Capture() const;
  // Before any worker is admitted: installs the checkpoint's layout and slice states.
  // Slices behind the newest one move up to its version (see FastForward). Refuses a
  // checkpoint of another shard id or shard count, or when a layout is registered.
  absl::Status Restore(const ShardCheckpoint& checkpoint);
  // Moves every owned slice below `version` up to it, parameters unchanged: the
  // updates of the rounds in between are lost. Used after a restore when peer shards
  // are further on, so that round numbers agree again (docs/operations.md). Open
  // rounds below `version` are discarded. Returns how many slices moved.
  uint32_t FastForward(uint64_t version);
  // The membership and suspicion of a restored checkpoint's workers.
  void RestoreWorkers(const ShardCheckpoint& c);
  // Highest published version over the owned slices (0 before ready).
  uint64_t MaxVersion() const;

  bool layout_registered() const;
  bool ready() const;
  // Workers with a session (joined at least once), and whether `worker` is one.
  uint32_t workers_joined() const;
  bool joined(uint32_t worker) const { return sessions_.Joined(worker); }
  // Hash of the registered layout or 0.
  uint64_t layout_hash() const;
  // The registered layout, or null before registration. It never changes once
  // registered, so the pointer stays valid for the shard's lifetime.
  const core::ModelLayout* registered_layout() const;
  // Lowest published version over the owned slices (0 before ready).
  uint64_t MinVersion() const;
  ShardStats stats() const;
  // Each worker's suspicion score over the last closed windows (server/suspicion.h).
  std::vector<Suspicion::Window> SuspicionHistory() const { return suspicion_.History(); }

  // A refusal of kind `r` (core::Refused: r's code, `message`, r as payload), counted
  // and logged (rate-limited: the 1st, 2nd, 4th, ... of each reason) here, once. The
  // gRPC services refuse through it too.
  absl::Status Refuse(Refusal r, absl::string_view message) const;

 private:
  // The decoder of `codec` for a push or chunk of `worker_id`, or the (uncounted) refusal.
  absl::StatusOr<std::shared_ptr<const codecs::Codec>> Decoder(uint32_t worker_id,
                                                               uint32_t slice_id,
                                                               std::string_view codec);
  // A push or chunk of `worker_id` for `round` was taken: counts the worker in the
  // round's UDP arming (UdpRounds), and when that arms the round, starts the deadline of
  // every owned slice at that round.
  void NoteRound(uint32_t worker_id, uint64_t round, bool chunk);
  // Logs a registration, or counts its refusal.
  absl::StatusOr<std::vector<uint32_t>> Registered(uint32_t worker_id,
                                                   absl::StatusOr<std::vector<uint32_t>> owned);
  // The owned slice a request names, or the (counted) refusal.
  absl::StatusOr<SliceRound*> LookupSlice(uint64_t layout_hash, uint32_t slice_id);
  // A push or chunk of `worker_id` refused by its slice: counted; a malformed one
  // quarantines the worker.
  absl::Status RefusedPush(uint32_t worker_id, absl::Status status);
  // A worker stopped being waited for (quarantined, left, expired): every round that now
  // waits only for absent workers closes; says when fewer workers than the quorum are
  // left to push: loudly (an error) unless `left`, a worker's own Leave, as every worker
  // sends at the end of a job.
  void WorkerGone(bool left = false);
  // `worker_id` had a push or chunk taken at `now` (or joined): present again.
  void NotePresent(uint32_t worker_id, core::SteadyTime now, std::string_view how);
  // Whether this log line about workers leaving or coming back is one to write at info:
  // the 1st, 2nd, 4th, ... (a worker may do either in a loop); the others go at debug.
  bool LoudMembershipLog();

  // A slice closed `round` (counted when `at_deadline`): schedules its aggregation
  // (slice scope), or tells the model coordinator (model scope).
  void Closed(const SliceRound& slice, uint64_t round, bool at_deadline);
  // Slice scope: aggregates the closed round of slice `slice_id` and publishes it.
  void AggregateSlice(uint32_t slice_id);
  // Publishes a closed round from its aggregate (or, when !st.ok(), the unchanged
  // parameters) and wakes its watchers: both scopes publish here. `aggregate` may be one
  // of `round`'s rows (RoundAggregation::Aggregate).
  void PublishRound(ClosedRound round, std::span<const float> aggregate, absl::Status st);

  const ServerOptions options_;
  const uint64_t pull_epoch_;
  const uint32_t shard_id_;
  const uint32_t quorum_;
  const uint32_t starters_;
  const std::unique_ptr<aggregators::Aggregator> aggregator_;
  // The rounds that carried UDP chunks here; armed by `starters_` distinct workers.
  UdpRounds udp_rounds_;
  RoundAggregation aggregation_;
  const bool model_scope_;
  // --schedule=priority: closed slices are aggregated, and model rounds published, most
  // urgent first; otherwise in the order they closed (slice id order in model scope).
  const bool priority_schedule_;
  core::Clock* const clock_;

  DecoderCache decoders_;
  const CodecPolicy codec_policy_;  // --allowed-codecs
  DecodeBudget decode_budget_;      // --max-decode-ms
  std::atomic<uint64_t> next_watch_id_{1};

  // Counting is not a change of the shard's state: const methods refuse too.
  mutable ShardCounters counters_;
  Suspicion suspicion_;
  SessionTable sessions_;
  DeadlineQueue deadlines_;
  Quarantine quarantine_;
  Membership membership_;
  Adoption adoption_;
  RoundRules rules_;
  SliceTable table_;
  ModelCoordinator model_;

  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> membership_logs_{0};

  // Last: destroyed first, after waiting for the jobs that use everything above.
  AggregationJobs jobs_;
};

}  // namespace ps::server
