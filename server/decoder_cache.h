// DecoderCache: the codecs a shard decodes pushes with, by spec string. A push names its
// codec; building one (MakeCodec) per push would be wasteful, and keeping every spec a
// client ever sent would let one client grow the cache without bound or, with a fixed
// cap, fill it and lock everybody else out. So the cache holds at most `capacity`
// decoders and drops the least recently used one for a new spec: a client sending
// ever new specs only costs itself a MakeCodec per push, and honest workers' decoders
// are rebuilt when evicted, never refused.
//
// Thread safety: all methods may be called concurrently. Decoders are shared_ptr, so an
// evicted one stays valid for a push still decoding with it.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "codecs/codec.h"

namespace ps::server {

class DecoderCache {
 public:
  // Longest spec accepted; longer ones are refused before any parsing.
  static constexpr size_t kMaxSpecBytes = 128;

  explicit DecoderCache(size_t capacity);

  // The decoder of `spec`: cached, or made and cached. INVALID_ARGUMENT for a spec
  // MakeCodec refuses or one longer than kMaxSpecBytes (the message quotes a bounded,
  // printable prefix of it).
  absl::StatusOr<std::shared_ptr<const codecs::Codec>> Get(std::string_view spec);
  // The decoder of `spec` if one is cached (null otherwise): nothing is made, and the
  // recency of use is left as it was.
  std::shared_ptr<const codecs::Codec> Find(std::string_view spec) const;

  size_t size() const;
  // Decoders made and dropped so far.
  uint64_t made() const;
  uint64_t evicted() const;

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const codecs::Codec>>;

  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);  // most recently used first
  absl::flat_hash_map<std::string, std::list<Entry>::iterator> index_ ABSL_GUARDED_BY(mu_);
  uint64_t made_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t evicted_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ps::server
