#include "server/object_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/client_text.h"
#include "core/refusal.h"
#include "core/status.h"

namespace ps::server {

using core::Refusal;
using core::Refused;

ObjectStore::ObjectStore(Limits limits) : limits_(limits), shelves_(limits.num_workers) {}

absl::Status ObjectStore::Check(uint32_t worker, std::string_view key) const {
  if (worker >= limits_.num_workers) {
    return Refused(Refusal::kBadWorkerId, absl::StrCat("worker ", worker, " is not among the ",
                                                       limits_.num_workers, " workers"));
  }
  const bool allowed = std::all_of(key.begin(), key.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '.' || c == ':' || c == '/' || c == '-';
  });
  if (key.empty() || key.size() > kMaxKeyBytes || !allowed) {
    return Refused(Refusal::kMalformed,
                   absl::StrCat("object key '", core::ClientText(key), "': 1 to ", kMaxKeyBytes,
                                " bytes of letters, digits and _.:/-"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ObjectStore::Put(uint32_t worker, std::string_view key,
                                          std::string value) {
  if (absl::Status st = Check(worker, key); !st.ok()) return st;
  absl::MutexLock lock(&mu_);
  Shelf& shelf = shelves_[worker];
  auto it = shelf.objects.find(key);
  const uint64_t old = it == shelf.objects.end() ? 0 : key.size() + it->second.value->size();
  const uint64_t bytes = shelf.bytes - old + key.size() + value.size();
  if (it == shelf.objects.end() && shelf.objects.size() >= limits_.keys_per_worker) {
    return Refused(Refusal::kOverLimit,
                   absl::StrCat("worker ", worker, " holds ", shelf.objects.size(),
                                " objects, the most a worker may; replace one"));
  }
  if (bytes > limits_.bytes_per_worker) {
    return Refused(Refusal::kOverLimit,
                   absl::StrCat("object '", core::AsAbsl(key), "' of ", value.size(),
                                " bytes would take worker ", worker, "'s objects to ", bytes,
                                " bytes, above its ", limits_.bytes_per_worker,
                                " (ps-server --max-object-bytes)"));
  }
  if (it == shelf.objects.end()) it = shelf.objects.emplace(std::string(key), Object{}).first;
  it->second.version += 1;
  it->second.value = std::make_shared<const std::string>(std::move(value));
  shelf.bytes = bytes;
  return it->second.version;
}

absl::StatusOr<ObjectStore::Object> ObjectStore::Get(uint32_t owner, std::string_view key) const {
  if (absl::Status st = Check(owner, key); !st.ok()) return st;
  absl::MutexLock lock(&mu_);
  const Shelf& shelf = shelves_[owner];
  auto it = shelf.objects.find(key);
  if (it == shelf.objects.end()) {
    return absl::NotFoundError(
        absl::StrCat("worker ", owner, " has stored no object '", core::AsAbsl(key), "' (yet)"));
  }
  return it->second;
}

uint64_t ObjectStore::bytes(uint32_t worker) const {
  absl::MutexLock lock(&mu_);
  return worker < shelves_.size() ? shelves_[worker].bytes : 0;
}

}  // namespace ps::server
