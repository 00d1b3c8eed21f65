// ModelRounds: the share protocol of model-scope rounds (docs/aggregators.md, "Model
// scope: exact on a sharded model"), without the arithmetic of any rule.
//
// Per round r: once every slice this shard owns has closed r, the shard takes their
// closed rounds (Hold), computes its RoundShare and sends it to every peer. The round is
// complete when a share from every shard is stored (Store returns them, once); the shard
// then combines them (CombineShares), plans, applies the plan to the held rounds
// (Release) and publishes, and Advance moves to r + 1. A peer's share may come one round
// early; one that does not come within --peer-timeout-ms makes the round overdue, and
// the shard publishes it unchanged.
//
// Thread-safe: one mutex, taken under no other lock of the shard's; it takes the
// DeadlineQueue's (to tell the ticker of the peers' deadline).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "core/clock.h"
#include "server/deadline_queue.h"
#include "server/slice_round.h"

namespace ps::server {

// One shard's part of a model-scope round: the workers that pushed to every slice it
// owns, and the Gram matrix of their pushes, followed by the rule's state rows, over
// those slices. Shares of all shards add up to the whole model's Gram matrix.
struct RoundShare {
  uint64_t layout_hash = 0;
  uint32_t shard_id = 0;
  uint64_t round = 0;
  std::vector<uint32_t> participants;  // increasing worker ids
  std::vector<double> gram;            // (participants + state rows)^2, row-major
};

using Shares = std::vector<std::shared_ptr<const RoundShare>>;

// The agreed participants of a complete round (in every shard's share; every shard
// computes the same list) and the sum of the shares' Gram matrices restricted to them
// and the state rows (summed in shard id order, so every shard gets the same bits).
struct CombinedShares {
  std::vector<uint32_t> agreed;
  std::vector<double> gram;  // (agreed + state rows)^2
};
CombinedShares CombineShares(const Shares& shares, size_t state_rows);

class ModelRounds {
 public:
  struct Config {
    uint32_t shard_id = 0;
    uint32_t num_shards = 1;
    uint32_t num_workers = 0;
    size_t state_rows = 0;
    core::Duration peer_timeout{};
  };
  // Borrows `clock` and `deadlines`, which must outlive this.
  ModelRounds(const Config& config, core::Clock* clock, DeadlineQueue* deadlines);

  // A slice closed its round; true for the last of the `owned` slices (start the round).
  bool SliceClosed(size_t owned);

  // Who sends this shard's share to the peers (called without locks held).
  void SetSender(std::function<void(std::shared_ptr<const RoundShare>)> sender);
  std::function<void(std::shared_ptr<const RoundShare>)> sender() const;

  // The shape of a peer's share: from another shard of this cluster, participants
  // increasing and below --workers, a Gram matrix of the right size with finite values.
  // A typed refusal (kMalformed) otherwise.
  absl::Status CheckShare(const RoundShare& share) const;

  // The closed rounds of `round`'s owned slices, kept until the round is published.
  void Hold(uint64_t round, std::vector<ClosedRound> slices);
  std::vector<ClosedRound> Release(uint64_t round);

  // A complete round, claimed by exactly one caller.
  struct Complete {
    uint64_t round = 0;
    Shares shares;
  };
  // Stores a share (this shard's or a peer's). OUT_OF_RANGE for a round done or more
  // than one ahead, ALREADY_EXISTS for a second share of a shard. Returns the round when
  // this share completed it.
  absl::StatusOr<std::optional<Complete>> Store(std::shared_ptr<const RoundShare> share);
  // After `round` was published: moves to round + 1, and returns it when its shares are
  // all in already.
  std::optional<Complete> Advance(uint64_t round);
  // The round whose peer shares are overdue at `now`, claimed (publish it unchanged).
  std::optional<uint64_t> Overdue(core::SteadyTime now);
  // When the peers' shares of the current round are due, if they are awaited.
  std::optional<core::SteadyTime> due() const;
  // Jumps to `round` when behind it (restore, fast-forward), forgetting older shares.
  void FastForward(uint64_t round);

 private:
  // Claims round_ when every share is in and nobody is finishing it.
  std::optional<Complete> ClaimCompleteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Config config_;
  core::Clock* const clock_;
  DeadlineQueue* const deadlines_;

  mutable absl::Mutex mu_;
  // The round being gathered, and its owned slices closed so far.
  uint64_t round_ ABSL_GUARDED_BY(mu_) = 0;
  size_t closed_ ABSL_GUARDED_BY(mu_) = 0;
  // Shares by round (this one and the next), indexed by shard id.
  std::map<uint64_t, Shares> shares_ ABSL_GUARDED_BY(mu_);
  // Closed rounds of owned slices, by round, from Hold to Release.
  std::map<uint64_t, std::vector<ClosedRound>> held_ ABSL_GUARDED_BY(mu_);
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<core::SteadyTime> due_ ABSL_GUARDED_BY(mu_);
  std::function<void(std::shared_ptr<const RoundShare>)> sender_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::server
