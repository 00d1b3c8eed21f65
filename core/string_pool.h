// StringPool: strings lent out through shared_ptrs and given back when the last reference
// to them goes, kept for reuse up to a bound. A buffer the size of a message is then
// written again with its pages already in, instead of being allocated and faulted in
// anew (docs/data_path.md). The worker's push payloads (worker_lib/push_pipeline.cc) and
// a shard's published snapshots (server/snapshot_pool.h) are its uses.
//
// Thread-safe: the last reference to a lent string may go on any thread; that thread
// gives the string back under the pool's lock, which orders its reads of the old bytes
// before the next taker's writes. A lent string keeps its pool alive.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ps::core {

class StringPool : public std::enable_shared_from_this<StringPool> {
 public:
  // Keeps at most `max_free` strings given back (raised by Take, below).
  explicit StringPool(size_t max_free = 0) : max_free_(max_free) {}

  // Sets `out` to `n` strings: the free ones first, the last given back first (their old
  // bytes left in them), then empty ones. From now on the pool keeps up to `n` free
  // strings when that is more than it kept, so that it holds one batch of what its user
  // takes at once.
  void Take(size_t n, std::vector<std::string>* out);

  // One string, as Take(1, ...) gives it, without the vector: the last given back, or an
  // empty one. Does not raise the bound.
  std::string TakeOne();

  // `s`, shared: it comes back to the pool when the last reference goes, and is freed
  // there when the pool already keeps its bound.
  std::shared_ptr<std::string> Lend(std::string s);

  // `s` kept free for a later Take, unless the pool already keeps its bound.
  void Keep(std::string s);

  size_t free_count() const;

 private:
  mutable absl::Mutex mu_;
  size_t max_free_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::core
