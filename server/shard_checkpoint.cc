// Shard's checkpoints (server/checkpoint.h): what Capture takes between rounds, and
// Restore: the slices, then the workers' membership and suspicion.
#include "server/shard.h"

#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "spdlog/spdlog.h"

namespace ps::server {

absl::StatusOr<ShardCheckpoint> Shard::Capture() const {
  ShardCheckpoint c;
  c.shard_id = shard_id_;
  c.num_shards = options_.num_shards;
  c.config_summary = options_.ConsistencySummary();
  c.run_id = options_.run_id;
  c.written_unix_s = std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
  if (!table_.ready()) {
    return absl::FailedPreconditionError(
        "nothing to checkpoint yet: the layout is not registered or not every slice has its "
        "initial value");
  }
  c.layout = *table_.layout();
  c.slices = table_.Capture(/*with_velocity=*/!options_.aggregate_only);
  const std::vector<WorkerSuspicion> scores = suspicion_.Get();
  for (uint32_t w = 0; w < membership_.ids(); ++w) {
    const Membership::State state = membership_.state(w);
    if (state == Membership::State::kNeverJoined || state == Membership::State::kSpare) continue;
    c.workers.push_back(
        WorkerCheckpoint{w, state, w < scores.size() ? scores[w] : WorkerSuspicion{}});
  }
  c.suspicion_history = suspicion_.History();
  return c;
}

absl::Status Shard::Restore(const ShardCheckpoint& c) {
  if (c.shard_id != shard_id_ || c.num_shards != options_.num_shards) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint belongs to shard ", c.shard_id, " of ", c.num_shards, "; this is shard ",
        shard_id_, " of ", options_.num_shards,
        ": refusing to restore it (point --checkpoint-dir elsewhere, or move the directory away "
        "to start from scratch)"));
  }
  if (!options_.run_id.empty() && c.run_id != options_.run_id) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint belongs to ",
        c.run_id.empty() ? std::string("no run") : absl::StrCat("run '", c.run_id, "'"),
        "; this shard serves run '", options_.run_id,
        "' (--run-id): refusing to continue another run's model (point --checkpoint-dir "
        "elsewhere for a new run, or give the checkpoint's run id to continue it)"));
  }
  if (!c.layout.has_value()) return absl::OkStatus();
  if (c.layout->num_shards() != options_.num_shards) {
    return absl::FailedPreconditionError(absl::StrCat("the checkpoint's layout is cut for ",
                                                      c.layout->num_shards(), " shards, not ",
                                                      options_.num_shards));
  }
  PS_ASSIGN_OR_RETURN(const uint64_t newest, table_.Restore(*c.layout, c.slices));
  const uint32_t moved = FastForward(newest);
  RestoreWorkers(c);
  spdlog::info("shard {}: restored layout {:x} and {} slices at version {}{}", shard_id_,
               c.layout->hash(), c.slices.size(), newest,
               moved > 0 ? absl::StrCat(" (", moved, " slices were a version behind and moved up)")
                         : std::string());
  return absl::OkStatus();
}

void Shard::RestoreWorkers(const ShardCheckpoint& c) {
  // Who had left or expired stays absent until it joins again (else the restored shard
  // would wait for it every round); who was present is waited for and expires as usual.
  const core::SteadyTime now = clock_->Now();
  uint32_t beyond = 0;
  for (const WorkerCheckpoint& w : c.workers) {
    if (w.worker >= membership_.ids()) {
      ++beyond;
      continue;
    }
    membership_.Restore(w.worker, w.state, now);
    suspicion_.Restore(w.worker, w.suspicion);
  }
  suspicion_.RestoreHistory(c.suspicion_history);
  if (beyond > 0) {
    spdlog::warn("shard {}: the checkpoint names {} workers at or beyond --max-workers {}; "
                 "their membership and suspicion are dropped",
                 shard_id_, beyond, membership_.ids());
  }
  if (!c.workers.empty()) {
    spdlog::info("shard {}: restored {} workers' membership ({} absent) and {} suspicion windows",
                 shard_id_, c.workers.size() - beyond, membership_.absent_count(),
                 c.suspicion_history.size());
  }
}

uint32_t Shard::FastForward(uint64_t version) {
  uint32_t moved = 0;
  Wakeups wake;
  table_.ForEach([&](SliceRound& s) { moved += s.FastForward(version, &wake) ? 1 : 0; });
  model_.FastForward(version);
  RunWakeups(wake, true);
  return moved;
}

}  // namespace ps::server
