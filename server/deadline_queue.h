// DeadlineQueue: when each slice's open round is due (--round-deadline-ms after f + 1
// workers pushed to it, or after its UDP round armed: server/slice_round.h), earliest first, and who to tell when an earlier one may exist
// (the server's ticker, which sleeps until Shard::NextDeadline()).
//
// Thread-safe: one mutex, the innermost lock of the shard (taken under a slice's lock,
// never the other way); the listener runs outside it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "core/clock.h"

namespace ps::server {

class DeadlineQueue {
 public:
  // Adds slice `slice`'s deadline, then tells the listener.
  void Add(uint32_t slice, core::SteadyTime deadline);
  // Removes it (its round closed before it came); a no-op when absent.
  void Remove(uint32_t slice, core::SteadyTime deadline);
  // Removes and returns the slices whose deadline is at or before `now`, earliest first.
  std::vector<uint32_t> PopDue(core::SteadyTime now);
  // The earliest deadline, if any.
  std::optional<core::SteadyTime> Next() const;

  // Who to tell (without locks held) when a new, earlier deadline may exist.
  void SetListener(std::function<void()> listener);
  // Tells the listener now: another deadline of the shard's (a model round's peer
  // shares) was set.
  void Notify() const;

 private:
  mutable absl::Mutex mu_;
  std::set<std::pair<core::SteadyTime, uint32_t>> due_ ABSL_GUARDED_BY(mu_);
  std::function<void()> listener_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::server
