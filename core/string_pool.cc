#include "core/string_pool.h"

#include <algorithm>
#include <utility>

namespace ps::core {

void StringPool::Take(size_t n, std::vector<std::string>* out) {
  out->clear();
  out->reserve(n);
  absl::MutexLock lock(&mu_);
  max_free_ = std::max(max_free_, n);
  while (out->size() < n && !free_.empty()) {
    out->push_back(std::move(free_.back()));
    free_.pop_back();
  }
  out->resize(n);
}

std::string StringPool::TakeOne() {
  absl::MutexLock lock(&mu_);
  if (free_.empty()) return std::string();
  std::string s = std::move(free_.back());
  free_.pop_back();
  return s;
}

std::shared_ptr<std::string> StringPool::Lend(std::string s) {
  return std::shared_ptr<std::string>(new std::string(std::move(s)),
                                      [pool = shared_from_this()](std::string* p) {
                                        std::unique_ptr<std::string> owned(p);
                                        pool->Keep(std::move(*owned));
                                      });
}

void StringPool::Keep(std::string s) {
  {
    absl::MutexLock lock(&mu_);
    if (free_.size() < max_free_) {
      free_.push_back(std::move(s));
      return;
    }
  }
  // Not kept: `s` is freed here, after the lock.
}

size_t StringPool::free_count() const {
  absl::MutexLock lock(&mu_);
  return free_.size();
}

}  // namespace ps::core
