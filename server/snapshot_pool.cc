#include "server/snapshot_pool.h"

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
  // Zeroed as they are made: their pages are in before any step needs them.
  for (size_t i = pool->free_count(); i < kMaxFree; ++i) {
    pool->buffers_->Keep(std::string(bytes, '\0'));
  }
  return buffer;
}

std::shared_ptr<std::string> SnapshotPool::TakeOne() {
  std::string buffer = buffers_->TakeOne();
  // A new one is zeroed once; a reused one keeps an older version until overwritten.
  if (buffer.size() != bytes_) buffer.assign(bytes_, '\0');
  return buffers_->Lend(std::move(buffer));
}

}  // namespace ps::server
