#include "server/decoder_cache.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/client_text.h"
#include "core/status.h"

namespace ps::server {

DecoderCache::DecoderCache(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {}

std::shared_ptr<const codecs::Codec> DecoderCache::Find(std::string_view spec) const {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(core::AsAbsl(spec));
  return it == index_.end() ? nullptr : it->second->second;
}

absl::StatusOr<std::shared_ptr<const codecs::Codec>> DecoderCache::Get(std::string_view spec) {
  const absl::string_view key = core::AsAbsl(spec);
  {
    absl::MutexLock lock(&mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
  }
  if (spec.size() > kMaxSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat("codec spec of ", spec.size(),
                                                   " bytes; the limit is ", kMaxSpecBytes));
  }
  // Made outside the lock: other pushes go on meanwhile.
  absl::StatusOr<std::unique_ptr<codecs::Codec>> made = codecs::MakeCodec(spec);
  if (!made.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "codec \"", core::ClientText(spec), "\": ", core::ClientText(std::string_view(made.status().message().data(), made.status().message().size()), 256)));
  }
  std::shared_ptr<const codecs::Codec> codec = *std::move(made);
  absl::MutexLock lock(&mu_);
  ++made_;
  if (auto it = index_.find(key); it != index_.end()) {  // made meanwhile by another push
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->second;
  }
  lru_.emplace_front(std::string(spec), codec);
  index_.emplace(lru_.front().first, lru_.begin());
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
    ++evicted_;
  }
  return codec;
}

size_t DecoderCache::size() const {
  absl::MutexLock lock(&mu_);
  return lru_.size();
}

uint64_t DecoderCache::made() const {
  absl::MutexLock lock(&mu_);
  return made_;
}

uint64_t DecoderCache::evicted() const {
  absl::MutexLock lock(&mu_);
  return evicted_;
}

}  // namespace ps::server
