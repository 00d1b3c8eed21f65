// PushPipeline: everything between Worker::Push and a shard's answer. It owns, per
// tensor, the encoder (momentum, error feedback, codec) and the path its pushes take
// (PushOptions::path); per shard, the P3 send queue with its in-flight credit window;
// the retry delay queue; the newest accepted push of every slice (for replay after a
// shard restart); and the accounting WaitPushes() reports from.
//
// Flow: Push encodes a tensor's slices into OutgoingPushes. Where the slice's shard's
// channel for that path carries chunks (DataChannel::chunked(), the UDP path), each
// slice is encoded in chunks and handed to the channel at once, unanswered. Otherwise
// the pushes are queued at their shards; Dispatch sends what the window lets go through
// DataChannel::NewPush; the answer returns the call's credit (letting queued pushes go)
// and either finishes the push or, for a retriable failure (the policy), re-sends it
// after a backoff from the delay queue, re-joining first through ShardClient when the
// session was lost. After a re-join, OnRejoined re-sends the accepted pushes whose
// rounds the shard still has open (they were lost with the shard's process).
//
// Borrowed pushes (PushOptions::borrow, docs/data_path.md): a push encoded without the
// copy carries the caller's bytes and a guard (OutgoingPush) that every holder keeps
// while it may read them; Wait returns only once every guard of the pushes it waits for
// is gone (BorrowCount), and the replay copy of such a push is taken when the shard
// accepts it, only for shards that restore from checkpoints.
//
// Locks, never nested except as noted: TensorSlot::mu (one tensor's encoder),
// ShardQueue::mu (one shard's send queue), `mu_` (pending counts, first error, calls in
// flight, shutdown), `replay_mu_` (accepted pushes). ShardClient's locks are taken
// under none of them.
//
// Thread safety: every public method may be called from any thread. Lifetimes: the
// options, layout and ShardClient given to Create outlive the pipeline; the
// destructor cancels what is in flight, drops what is queued and waits for every
// callback to finish.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/layout.h"
#include "core/retry.h"
#include "core/string_pool.h"
#include "worker_lib/delay_queue_internal.h"
#include "worker_lib/link_estimator_internal.h"
#include "worker_lib/send_queue_internal.h"
#include "worker_lib/shard_client_internal.h"
#include "worker_lib/tensor_encoder_internal.h"
#include "worker_lib/transport/data_channel.h"
#include "worker_lib/worker.h"

namespace ps::internal {

// Attaches `failure` to a failed push's status (PushFailureOf reads it back;
// push_failure.cc).
void MarkPushFailure(absl::Status* status, const PushFailure& failure);

// The borrowed pushes' guards not yet released, shared with the guards (a transport
// may drop its last one after the pipeline is gone).
class BorrowCount {
 public:
  // A guard for OutgoingPush::borrowed_guard; counted until its last copy is destroyed.
  static std::shared_ptr<const void> Guard(const std::shared_ptr<BorrowCount>& count);
  // Waits until no guard is left.
  void AwaitNone();

 private:
  absl::Mutex mu_;
  size_t live_ ABSL_GUARDED_BY(mu_) = 0;
};

class PushPipeline {
 public:
  // Refuses push options for a tensor the layout lacks and bad codec specs. `client`
  // has a channel for every path a tensor takes. `policy` decides the retries.
  static absl::StatusOr<std::unique_ptr<PushPipeline>> Create(const WorkerOptions& options,
                                                              core::RetryPolicy policy,
                                                              const core::ModelLayout& layout,
                                                              ShardClient& client);
  ~PushPipeline();
  PushPipeline(const PushPipeline&) = delete;
  PushPipeline& operator=(const PushPipeline&) = delete;

  // Worker::Push: encodes and queues; errors at once only for bad arguments.
  absl::Status Push(size_t tensor, uint64_t round, std::span<const float> grad);
  // Worker::WaitPushes: waits for every push queued so far; the first error since the
  // previous call (a refusal, else a send error of an unanswered path).
  absl::Status Wait();
  // Worker::SetLearningRate: the rate attached to `tensor`'s pushes queued from now on.
  absl::Status SetLearningRate(size_t tensor, double lr);
  // Worker::ReportLoss: the loss attached to the pushes of `round` queued from now on.
  absl::Status ReportLoss(uint64_t round, double loss);
  // Tensor `tensor`'s pushes from the next one on encode with `spec` on `device`
  // (TensorEncoder::SetCodec: momentum and residual carry over). A tensor pushed in
  // chunks (over UDP) keeps its codec (OK); a bad spec changes nothing.
  absl::Status SetCodec(size_t tensor, std::string_view spec, core::Device device);
  // Shard `shard`'s link as the push calls measured it (LinkCost::valid false: not yet).
  LinkCost LinkOf(uint32_t shard) const { return meters_[shard]->Estimate(); }

  // ShardClient's rejoin listener: `shard` was joined again after losing our session.
  // Re-sends the accepted pushes it lost, or records that it lost the whole run.
  void OnRejoined(uint32_t shard, const v1::JoinResponse& join);

  // The count of borrowed pushes' guards: ~Worker waits on it once the channels are
  // gone, since a transport may read the bytes until then.
  std::shared_ptr<BorrowCount> borrows() const { return borrows_; }

  // Worker::device_note.
  std::string device_note(size_t tensor) const;
  // Fills the push counters of `stats` and those its channels keep (retries: see
  // retries()).
  void FillStats(WorkerStats& stats) const;
  uint64_t retries() const { return retries_.load(); }

 private:
  struct TensorSlot {
    absl::Mutex mu;
    std::unique_ptr<TensorEncoder> encoder ABSL_GUARDED_BY(mu);
    // The strings its payloads are encoded into, back from the rounds sent before when
    // the last reference to each goes (the send queue's, a retry's, a replay's): still as
    // long as they were, so that fp32 copies and checks the values into memory already the
    // payload's length (codecs/fp32.cc), and the pool keeps one round's worth.
    const std::shared_ptr<core::StringPool> payloads = std::make_shared<core::StringPool>();
    PushPath path = PushPath::kDataPlane;  // PushOptions::push_path()
    bool chunked = false;                  // its path carries chunks, unanswered
    bool borrow = false;                   // PushOptions::borrow
    std::optional<float> lr ABSL_GUARDED_BY(mu);  // SetLearningRate
    // Pushed for the round this worker started at (ShardClient::start_version).
    bool pushed_start_round ABSL_GUARDED_BY(mu) = false;
  };

  // One slice push in flight; owned by whoever currently drives it (the send queue,
  // the channel's callback, the retry queue).
  struct Call {
    uint32_t shard = 0;
    DataChannel* channel = nullptr;  // the shard's, of the tensor's path
    int attempt = 0;
    uint64_t epoch = 0;  // the session's epoch it was sent with
    // Bytes this call holds of its shard's in-flight window, from dispatch to its end.
    uint64_t credit = 0;
    absl::StatusCode last_code = absl::StatusCode::kOk;
    bool rejoin = false;  // the last failure calls for a Join before the retry
    // A resend after the shard restarted (OnRejoined): not counted in pending_, and its
    // refusal (late, duplicate) is no error of the caller's.
    bool replay = false;
    // This process's first push of its tensor for the round it started at: the process
    // of this worker id it replaces (restarted mid-round) may have pushed it already, and
    // then that copy counts (OnDone).
    bool may_be_held = false;
    OutgoingPush message;
    std::unique_ptr<DataChannel::PushCall> rpc;
  };
  // A push a shard accepted, kept for Replay.
  struct Accepted {
    DataChannel* channel = nullptr;
    OutgoingPush message;
  };

  struct ShardQueue {
    absl::Mutex mu;
    std::unique_ptr<SendQueue<std::unique_ptr<Call>>> queue ABSL_GUARDED_BY(mu);
  };

  PushPipeline(const WorkerOptions& options, core::RetryPolicy policy,
               const core::ModelLayout& layout, ShardClient& client);

  // Hands `chunks` to their channels, a run of one channel's at a time in order; the
  // first failure (what follows it is not sent).
  absl::Status SendUnanswered(const std::vector<std::unique_ptr<Call>>& chunks);
  // The fixed cost of pushing a slice of `numel` values to `shard`, in bytes of its
  // link (SliceRange::fixed_cost_bytes): (alpha + the slice's share of the round's idle
  // time) / beta, docs/adaptive.md "CAT"; -1 until the link was measured.
  double FixedCostBytes(uint32_t shard, uint64_t numel) const;
  void Replay(uint32_t shard, uint64_t version);
  // Whether `shard` restores from checkpoints (ShardInfo::restores_from_checkpoints,
  // its latest Join answer's): only then are borrowed pushes copied for Replay.
  bool Restores(uint32_t shard) const;
  // Kept for Replay: the newest accepted push of each slice.
  void KeepForReplay(const Call& call);
  // The bytes of pushes that may be in flight to `shard` now: max_inflight_bytes, or what
  // its link was measured to move in inflight_seconds where that is more.
  uint64_t Window(uint32_t shard) const;
  // Sends queued pushes to `shard`, most urgent first, while its window allows.
  void Dispatch(uint32_t shard);
  // A push is over: its bytes leave the window, which lets queued pushes go.
  void ReleaseCredit(const Call& call);
  void Send(std::unique_ptr<Call> call);
  void OnDone(std::unique_ptr<Call> call, const absl::Status& s);
  void FinishLocked(const Call& call, absl::Status st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const WorkerOptions& options_;
  const core::RetryPolicy policy_;
  const core::ModelLayout& layout_;
  ShardClient& client_;
  std::vector<std::unique_ptr<TensorSlot>> slots_;   // per tensor
  std::vector<std::unique_ptr<ShardQueue>> queues_;  // per shard
  // Per shard: the push calls' busy periods, for the link's cost (WorkerStats::push_links).
  std::vector<std::unique_ptr<TransferMeter>> meters_;
  // The rounds' time outside pushes, shared by the slices in proportion to their size.
  RoundIdleMeter idle_;
  uint64_t total_numel_ = 0;  // of the layout
  DelayQueue retry_queue_;

  absl::Mutex mu_;
  // The last ReportLoss: (round, loss).
  std::optional<std::pair<uint64_t, float>> loss_ ABSL_GUARDED_BY(mu_);
  size_t pending_ ABSL_GUARDED_BY(mu_) = 0;
  size_t replays_ ABSL_GUARDED_BY(mu_) = 0;  // replays not finished (the destructor waits)
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  std::set<DataChannel::PushCall*> in_flight_ ABSL_GUARDED_BY(mu_);

  const std::shared_ptr<BorrowCount> borrows_ = std::make_shared<BorrowCount>();
  // Per shard, set by OnRejoined: 0 as Connect's answer said, 1 restores, 2 does not.
  std::unique_ptr<std::atomic<int>[]> restores_;

  absl::Mutex replay_mu_;
  // Per slice id, the newest push a shard accepted (Replay).
  absl::flat_hash_map<uint32_t, Accepted> last_accepted_
      ABSL_GUARDED_BY(replay_mu_);

  std::atomic<uint64_t> slices_pushed_{0}, slices_borrowed_{0}, slices_refused_{0}, push_bytes_{0};
  std::atomic<uint64_t> slices_held_from_before_{0};  // WorkerStats::slices_held_from_before
  std::atomic<uint64_t> retries_{0}, pushes_replayed_{0};
};

}  // namespace ps::internal
