// SnapshotPool: the buffers a slice publishes its versions in, reused. A published
// snapshot is shared by every pull that sends it; when its last reference goes, its
// buffer comes back here and a later version is written into it, so that publishing a
// version allocates nothing and faults in no new pages (docs/data_path.md). The giving
// back is core::StringPool's (thread-safe, on whichever thread drops the last reference);
// this adds the buffers' one size and the first version's warm spares.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/string_pool.h"

namespace ps::server {

class SnapshotPool {
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

  explicit SnapshotPool(size_t bytes)
      : bytes_(bytes), buffers_(std::make_shared<core::StringPool>(kMaxFree)) {}
  size_t bytes() const { return bytes_; }
  size_t free_count() const { return buffers_->free_count(); }

 private:
  std::shared_ptr<std::string> TakeOne();

  const size_t bytes_;
  const std::shared_ptr<core::StringPool> buffers_;
};

}  // namespace ps::server
