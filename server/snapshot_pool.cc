#include "server/snapshot_pool.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace ps::server {

std::shared_ptr<std::string> SnapshotPool::Take(std::shared_ptr<SnapshotPool>& pool,
                                                size_t bytes) {
  if (pool == nullptr || pool->bytes() != bytes) pool = std::make_shared<SnapshotPool>(bytes);
  return pool->TakeOne();
}

std::shared_ptr<std::string> SnapshotPool::TakeFilled(std::shared_ptr<SnapshotPool>& pool,
                                                      std::span<const float> values) {
  const size_t bytes = values.size_bytes();
  std::shared_ptr<std::string> buffer = Take(pool, bytes);
  if (bytes > 0) std::memcpy(buffer->data(), values.data(), bytes);
  // Zeroed as they are made, outside the lock: their pages are in before any step needs
  // them.
  std::vector<std::unique_ptr<std::string>> spare(kMaxFree -
                                                  std::min(kMaxFree, pool->free_count()));
  for (std::unique_ptr<std::string>& s : spare) s = std::make_unique<std::string>(bytes, '\0');
  absl::MutexLock lock(&pool->mu_);
  for (std::unique_ptr<std::string>& s : spare) {
    if (pool->free_.size() < kMaxFree) pool->free_.push_back(std::move(s));
  }
  return buffer;
}

size_t SnapshotPool::free_count() const {
  absl::MutexLock lock(&mu_);
  return free_.size();
}

std::shared_ptr<std::string> SnapshotPool::TakeOne() {
  std::unique_ptr<std::string> buffer;
  {
    absl::MutexLock lock(&mu_);
    if (!free_.empty()) {
      buffer = std::move(free_.back());
      free_.pop_back();
    }
  }
  // A new one is zeroed once; a reused one keeps an older version until overwritten.
  if (buffer == nullptr) buffer = std::make_unique<std::string>(bytes_, '\0');
  return std::shared_ptr<std::string>(
      buffer.release(), [pool = shared_from_this()](std::string* s) { pool->Give(s); });
}

void SnapshotPool::Give(std::string* buffer) {
  std::unique_ptr<std::string> owned(buffer);  // freed here, after the lock, when not kept
  absl::MutexLock lock(&mu_);
  if (free_.size() < kMaxFree) free_.push_back(std::move(owned));
}

}  // namespace ps::server
