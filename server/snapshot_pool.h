// SnapshotPool: the buffers a slice publishes its versions in, reused. A published
// snapshot is shared by every pull that sends it; when its last reference goes, its
// buffer comes back here and a later version is written into it, so that publishing a
// version allocates nothing and faults in no new pages (docs/data_path.md).
//
// Thread-safe: the last reference to a snapshot may go on any thread (a connection's, a
// gRPC one's); that thread gives the buffer back under the pool's lock, which orders its
// reads of the old version before the next version's writes.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ps::server {

class SnapshotPool : public std::enable_shared_from_this<SnapshotPool> {
 public:
  // Buffers kept for reuse at most; more given back at once are freed.
  static constexpr size_t kMaxFree = 2;

  // A buffer of `bytes` bytes (its contents unspecified) from `*pool`, which is made, or
  // made again for another size, as needed. The buffer goes back to the pool when the
  // last reference to it goes.
  static std::shared_ptr<std::string> Take(std::shared_ptr<SnapshotPool>& pool, size_t bytes);

  // A buffer holding `values`' bytes, from `*pool` as Take, leaving kMaxFree buffers of
  // that size free in the pool: for a slice's first version, so that its first steps
  // take buffers whose pages are already in instead of faulting in new ones (16 MiB of
  // new pages cost a 1 x 1 round of 2^22 parameters 85 ms on this project's virtual
  // machines, docs/bench.md).
  static std::shared_ptr<std::string> TakeFilled(std::shared_ptr<SnapshotPool>& pool,
                                                 std::span<const float> values);

  explicit SnapshotPool(size_t bytes) : bytes_(bytes) {}
  size_t bytes() const { return bytes_; }
  size_t free_count() const;

 private:
  std::shared_ptr<std::string> TakeOne();
  void Give(std::string* buffer);

  const size_t bytes_;
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<std::string>> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::server
