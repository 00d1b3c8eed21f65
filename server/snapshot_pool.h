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
