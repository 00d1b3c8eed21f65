// Health: the grpc.health.v1 service of a shard's ports, served by the front
// (server/grpc_front.h) instead of gRPC's default one, so that its watches are bounded
// (docs/operations.md, "Health"). Three services: "" (alive), ps.v1.WorkerService
// (admitting workers) and ps.v1.Model (model ready).
//
// HealthState holds the statuses and their watchers; at most `max_watches` Watch streams
// are open on it at once (more are RESOURCE_EXHAUSTED), and a stream's watcher is removed
// when it ends, is cancelled or its connection closes. Each port has its own state, so a
// flood of watches on the plaintext health port cannot take the main port's.
//
// Thread safety: all methods may be called from any thread; watchers run without the
// state's lock.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpc/health/v1/health.pb.h"

namespace ps::server {

class GrpcFront;

class HealthState {
 public:
  using Status = grpc::health::v1::HealthCheckResponse::ServingStatus;
  using Watcher = std::function<void(Status)>;

  explicit HealthState(uint32_t max_watches) : max_watches_(max_watches) {}

  void Set(const std::string& service, bool serving);
  // SERVING, NOT_SERVING, or SERVICE_UNKNOWN for a service never set.
  Status Get(const std::string& service) const;
  // Calls `w` with the service's status now and at every change, until Unwatch.
  // RESOURCE_EXHAUSTED when max_watches are open.
  absl::StatusOr<uint64_t> Watch(const std::string& service, Watcher w);
  void Unwatch(uint64_t id);
  uint32_t watches() const;

 private:
  struct Entry {
    std::string service;
    Watcher watcher;
  };
  const uint32_t max_watches_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, bool> serving_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Entry> watchers_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 1;
};

// Adds grpc.health.v1.Health/Check and /Watch on `state` to `front`. `anonymous`: callers
// need no credentials (the plaintext health port). Health requests name a service in a
// few bytes: one over 1 KiB is refused unparsed.
void AddHealthMethods(GrpcFront* front, HealthState* state, bool anonymous);

}  // namespace ps::server
