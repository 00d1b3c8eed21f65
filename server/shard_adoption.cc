// Shard's mid-run adoption of one worker's values (server/adoption.h): the votes and the
// root's slices, checked and counted as every request of the front is.
#include "server/shard.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "spdlog/spdlog.h"

namespace ps::server {

absl::StatusOr<Adoption::Tally> Shard::Adopt(uint32_t worker_id, uint64_t layout_hash,
                                             uint64_t round, uint32_t root) {
  if (draining_.load()) return Refuse(Refusal::kShuttingDown, "shard is shutting down");
  const std::string what = absl::StrCat("worker ", worker_id, "'s vote to adopt worker ", root,
                                        "'s values at round ", round);
  if (options_.aggregate_only) {
    return Refuse(Refusal::kPermissionDenied,
                  absl::StrCat(what, ": this shard runs --aggregate-only and holds no parameters "
                                     "to replace"));
  }
  if (root >= options_.WorkerIds()) {
    return Refuse(Refusal::kBadWorkerId, absl::StrCat(what, ": there are ", options_.WorkerIds(),
                                                      " workers"));
  }
  PS_RETURN_IF_ERROR(counters_.Counted(table_.CheckJoin(worker_id, layout_hash)));
  if (!table_.ready()) {
    return Refuse(Refusal::kNotReady,
                  absl::StrCat(what, ": not every slice has its initial value yet"));
  }
  const uint64_t at = table_.MaxVersion();
  if (round < at) {
    return Refuse(Refusal::kLate, absl::StrCat(what, ": the shard is at version ", at));
  }
  if (round > at) {
    return Refuse(Refusal::kFutureRound, absl::StrCat(what, ": the shard is at version ", at));
  }
  const Adoption::Tally tally = adoption_.Vote(worker_id, round, root);
  if (tally.now) {
    spdlog::info("shard {}: {} of {} workers voted to adopt worker {}'s values at round {}",
                 shard_id_, tally.votes, options_.num_workers, root, round);
  }
  return tally;
}

absl::Status Shard::AdoptSlice(uint32_t worker_id, uint64_t layout_hash, uint64_t round,
                               uint32_t slice_id, std::string_view values) {
  if (draining_.load()) return Refuse(Refusal::kShuttingDown, "shard is shutting down");
  const std::optional<Adoption::Passed> passed = adoption_.passed();
  if (!passed.has_value() || passed->round != round || passed->root != worker_id) {
    return Refuse(Refusal::kPermissionDenied,
                  absl::StrCat("worker ", worker_id, " may not set slice ", slice_id,
                               " for round ", round, ": ",
                               passed.has_value()
                                   ? absl::StrCat("the adoption that passed is worker ",
                                                  passed->root, "'s at round ", passed->round)
                                   : absl::StrCat("no adoption passed (it takes ",
                                                  adoption_.quorum(), " workers' votes)")));
  }
  PS_ASSIGN_OR_RETURN(SliceRound * s, LookupSlice(layout_hash, slice_id));
  Wakeups wake;
  PS_RETURN_IF_ERROR(counters_.Counted(s->Adopt(round, values, &wake)));
  RunWakeups(wake, true);
  if (table_.MinVersion() > round && adoption_.Done(round)) {
    // Every slice took the root's values: the model-scope round they replace is over.
    model_.FastForward(round + 1);
    spdlog::info("shard {}: adopted worker {}'s values as version {}", shard_id_, worker_id,
                 round + 1);
  }
  return absl::OkStatus();
}

}  // namespace ps::server
