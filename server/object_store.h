// ObjectStore: small values a worker publishes for the others (WorkerService PutObject and
// GetObject; ps_server.torch's broadcast_object, broadcast_optimizer_state and the buffers
// of broadcast_parameters, docs/objects.md). A value lives under (its writer's worker id,
// key): a worker writes only its own keys, readers name the writer they trust (the root).
// A Put under a key replaces its value and bumps its version.
//
// Bounded per worker: at most `keys_per_worker` keys and `bytes_per_worker` bytes of
// values (keys included); a Put over either is refused (over_limit) and the old value
// stays. Refusing costs the size of the request, which the message limit bounds.
//
// Thread-safe. Values are shared immutable strings: a Get's copy is a reference.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace ps::server {

class ObjectStore {
 public:
  struct Limits {
    uint32_t num_workers = 1;
    uint32_t keys_per_worker = 16;
    uint64_t bytes_per_worker = 64u << 20;
  };
  // A key: 1 to kMaxKeyBytes of [A-Za-z0-9_.:/-].
  static constexpr size_t kMaxKeyBytes = 128;

  explicit ObjectStore(Limits limits);

  // Stores `value` under (worker, key); returns its new version (1 for the first).
  // kBadWorkerId for a worker outside the job, kMalformed for a bad key, kOverLimit
  // beyond the worker's keys or bytes.
  absl::StatusOr<uint64_t> Put(uint32_t worker, std::string_view key, std::string value);

  struct Object {
    uint64_t version = 0;
    std::shared_ptr<const std::string> value;
  };
  // NOT_FOUND (saying so) when `owner` stored nothing under `key`; kBadWorkerId and
  // kMalformed as Put.
  absl::StatusOr<Object> Get(uint32_t owner, std::string_view key) const;

  // Bytes held by `worker`'s values and keys.
  uint64_t bytes(uint32_t worker) const;

 private:
  absl::Status Check(uint32_t worker, std::string_view key) const;

  struct Shelf {
    std::map<std::string, Object, std::less<>> objects;
    uint64_t bytes = 0;
  };
  const Limits limits_;
  mutable absl::Mutex mu_;
  std::vector<Shelf> shelves_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::server
