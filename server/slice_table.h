// SliceTable: a shard's registered layout and the slices it owns.
//
// The layout is registered once (the first registrant wins; a second layout is refused
// as a mismatch) and never changes: the table then creates one SliceRound per owned
// slice, and those live as long as the table, so pointers to them stay valid without a
// lock. A registration is checked against the limits at a cost linear in its tensor list
// before anything is cut into slices, and only one is built at a time.
//
// Refusals are typed (core/refusal.h) and neither counted nor logged here: the shard
// does that once, where the refusal leaves it.
//
// Thread-safe: mu_ guards the layout and the initialization count; it is never held
// while a slice's lock is taken, nor the other way round. registered() is lock-free.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/layout.h"
#include "server/optimizer.h"
#include "server/slice_round.h"

namespace ps::server {

class SliceTable {
 public:
  struct Config {
    uint32_t shard_id = 0;
    uint32_t num_shards = 1;
    uint32_t num_workers = 0;
    uint64_t max_message_bytes = 0;
    // What the layout may need here (EstimateShardBytes), and what goes into that
    // estimate besides the layout.
    uint64_t max_shard_bytes = 0;
    size_t state_rows = 0;
    bool keep_published_model = false;
    // --aggregate-only: slices start at version 0 (zeros) without an initial value.
    bool aggregate_only = false;
    // --schedule=priority: publication order is the slices' priority order.
    bool priority_order = false;
  };
  // Borrows `rules`, which must outlive this (the slices use it).
  SliceTable(const Config& config, RoundRules* rules);

  // Registers the layout from a request's parts: answers a table that already has one
  // (ALREADY_EXISTS for the same hash, else kLayoutMismatch), refuses an invalid layout
  // (kBadLayout) or one over the limits (kBadLayout, kOverLimit). Returns the owned
  // slice ids in priority order.
  absl::StatusOr<std::vector<uint32_t>> Register(uint32_t worker_id,
                                                 std::vector<core::TensorSpec> tensors,
                                                 uint32_t slice_elems, uint32_t num_shards);
  absl::StatusOr<std::vector<uint32_t>> Register(uint32_t worker_id,
                                                 const core::ModelLayout& layout);
  // Before anything else: installs a checkpoint's layout and sets its owned slices from
  // `slices` (SliceRound::Restore); returns the newest version among them.
  // FAILED_PRECONDITION when a layout is registered, INVALID_ARGUMENT for a slice this
  // shard does not own or of the wrong size.
  absl::StatusOr<uint64_t> Restore(const core::ModelLayout& layout,
                                   const std::vector<SliceCheckpoint>& slices);
  // The published state of every owned slice. Slices publish one after the other;
  // between two rounds they all stand at the same version: tries for up to a second to
  // catch such a moment (a restore moves slices that are a version behind up, losing
  // that version's update on them).
  std::vector<SliceCheckpoint> Capture(bool with_velocity) const;
  // ALREADY_EXISTS when `same`, else the mismatch refusal naming `offered`.
  absl::Status AnswerRegistered(const core::ModelLayout& have, uint32_t worker_id, bool same,
                                const absl::AlphaNum& offered) const;
  // kLayoutMismatch unless `layout_hash` is the registered one (OK before registration).
  absl::Status CheckJoin(uint32_t worker_id, uint64_t layout_hash) const;

  // The owned slice a request names: kNoLayout, kLayoutMismatch, kUnknownSlice,
  // kWrongShard otherwise.
  absl::StatusOr<SliceRound*> Lookup(uint64_t layout_hash, uint32_t slice_id) const;
  // A slice that passed Lookup.
  SliceRound* slice(uint32_t slice_id) const { return slices_[slice_id].get(); }
  // Owned slice ids in increasing order, and in publication order.
  std::vector<uint32_t> owned_ids() const;
  std::vector<uint32_t> publish_order() const;
  size_t owned_count() const;
  // Calls `f` with every owned slice in increasing id order (none before registration),
  // without the table's lock.
  void ForEach(absl::FunctionRef<void(SliceRound&)> f) const;
  // Over the owned slices: the lowest and highest published version (0 before
  // registration), and the watches waiting.
  uint64_t MinVersion() const;
  uint64_t MaxVersion() const;
  uint64_t WatcherCount() const;

  // One more owned slice has its initial value; true when it was the last.
  bool SliceInitialized();

  bool registered() const { return registered_.load(std::memory_order_acquire); }
  bool ready() const;
  uint64_t hash() const;  // 0 before registration
  // The registered layout, or null; it never changes once registered.
  const core::ModelLayout* layout() const;

 private:
  // Refuses a layout cut for another shard count, with slices beyond the message size,
  // or needing more than max_shard_bytes here (with `second_moment_elems` of its tensors,
  // in all, under an optimizer with a second moment: Adam).
  absl::Status CheckFits(const core::LayoutSummary& sum, uint32_t slice_elems,
                         uint32_t num_shards, uint64_t second_moment_elems = 0) const;
  absl::Status AnswerRegisteredLocked(uint32_t worker_id, uint64_t hash) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Each tensor's optimizer (null: the shard's flags'): kBadLayout for a spec that does
  // not parse, or any spec on an --aggregate-only shard.
  absl::StatusOr<std::vector<std::shared_ptr<const Optimizer>>> TensorOptimizers(
      const core::ModelLayout& layout) const;
  // Creates the slices of `layout` and registers it; the owned ids in priority order.
  std::vector<uint32_t> InstallLocked(const core::ModelLayout& layout,
                                      const std::vector<std::shared_ptr<const Optimizer>>& optimizers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Config config_;
  RoundRules* const rules_;

  // One registration at a time: a second waits and then finds the first's.
  absl::Mutex register_mu_;
  mutable absl::Mutex mu_;
  std::optional<core::ModelLayout> layout_ ABSL_GUARDED_BY(mu_);
  uint32_t uninitialized_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint32_t> owned_ids_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> publish_order_ ABSL_GUARDED_BY(mu_);
  // Written once, before registered_ is released; indexed by global slice id, null for
  // slices of other shards.
  std::vector<std::unique_ptr<SliceRound>> slices_;
  std::atomic<bool> registered_{false};
};

}  // namespace ps::server
