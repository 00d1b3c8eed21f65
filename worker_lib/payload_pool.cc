#include "worker_lib/payload_pool_internal.h"

#include <algorithm>
#include <utility>

namespace ps::internal {

void PayloadPool::Take(size_t n, std::vector<std::string>* payloads) {
  payloads->clear();
  payloads->reserve(n);
  absl::MutexLock lock(&mu_);
  max_free_ = std::max(max_free_, n);
  while (payloads->size() < n && !free_.empty()) {
    payloads->push_back(std::move(free_.back()));
    free_.pop_back();
  }
  payloads->resize(n);
}

std::shared_ptr<const std::string> PayloadPool::Share(std::string payload) {
  return std::shared_ptr<const std::string>(
      new std::string(std::move(payload)),
      [pool = shared_from_this()](const std::string* s) { pool->Give(const_cast<std::string*>(s)); });
}

size_t PayloadPool::free_count() const {
  absl::MutexLock lock(&mu_);
  return free_.size();
}

void PayloadPool::Give(std::string* payload) {
  std::unique_ptr<std::string> owned(payload);  // freed here, after the lock, when not kept
  absl::MutexLock lock(&mu_);
  if (free_.size() < max_free_) free_.push_back(std::move(*owned));
}

}  // namespace ps::internal
