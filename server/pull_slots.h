// PullSlots: the pulls each worker has open on this shard, bounded by
// --max-pulls-per-worker, whatever data plane carries them (server/shard_front.h).
//
// Thread safety: every method may be called from any thread. A Slot is held by an open
// pull and given back when it is destroyed; the PullSlots must outlive its slots.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace ps::server {

class PullSlots {
 public:
  struct Release {
    void operator()(std::pair<PullSlots*, uint32_t>* slot) const;
  };
  using Slot = std::unique_ptr<std::pair<PullSlots*, uint32_t>, Release>;

  PullSlots(uint32_t num_workers, uint32_t per_worker);
  // A slot of `worker` (< num_workers), or RESOURCE_EXHAUSTED when all are taken.
  absl::StatusOr<Slot> Take(uint32_t worker);
  uint32_t open(uint32_t worker) const;

 private:
  const uint32_t per_worker_;
  mutable absl::Mutex mu_;
  std::vector<uint32_t> open_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::server
