#include "server/pull_slots.h"

#include "absl/strings/str_cat.h"

namespace ps::server {

PullSlots::PullSlots(uint32_t num_workers, uint32_t per_worker)
    : per_worker_(per_worker), open_(num_workers, 0) {}

absl::StatusOr<PullSlots::Slot> PullSlots::Take(uint32_t worker) {
  absl::MutexLock lock(&mu_);
  if (open_[worker] >= per_worker_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "worker ", worker, " has ", open_[worker], " pull streams open on this shard, the most "
        "--max-pulls-per-worker allows; wait for one to end"));
  }
  ++open_[worker];
  return Slot(new std::pair<PullSlots*, uint32_t>(this, worker));
}

void PullSlots::Release::operator()(std::pair<PullSlots*, uint32_t>* slot) const {
  {
    absl::MutexLock lock(&slot->first->mu_);
    --slot->first->open_[slot->second];
  }
  delete slot;
}

uint32_t PullSlots::open(uint32_t worker) const {
  absl::MutexLock lock(&mu_);
  return open_[worker];
}

}  // namespace ps::server
