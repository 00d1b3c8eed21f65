// ShardClient: the worker's sessions with its shards. It owns per shard its ShardLink
// (transport/channels.h: the control and a data channel per path) and the session
// token and join epoch the last join handed out, which it hands on to the shard's data
// channels as their route (DataChannel::SetRoute). It joins every shard at start
// (registering the layout and uploading initial slice values on a shard that has
// none), and joins again when a call finds its session forgotten (the shard
// restarted), once per lost session however many calls noticed.
//
// Thread safety: every method may be called from any thread. Per shard, `join_mu`
// serialises joins (a join is a blocking RPC, so no other lock is held across it) and
// `mu` guards the session state, read by every push and pull. The rejoin listener is
// called after a successful re-join, on the caller's thread, with no lock held.
//
// Lifetimes: the ShardClient outlives the parts that use it (PushPipeline,
// PullStreams) and every call they started on its channels.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/layout.h"
#include "core/retry.h"
#include "ps/v1/ps.pb.h"
#include "worker_lib/transport/channels.h"
#include "worker_lib/worker.h"

namespace ps::internal {

// The worker's two retry policies, both with its backoff (initial_backoff doubling up
// to max_backoff). Joins retry only an unreachable shard (UNAVAILABLE,
// DEADLINE_EXCEEDED), as often as the connect deadline allows. Pushes and pulls also
// retry UNAUTHENTICATED (the shard forgot the session: re-join, then retry), at most
// max_attempts attempts in all.
core::RetryPolicy JoinRetryPolicy(const WorkerOptions& options);
core::RetryPolicy CallRetryPolicy(const WorkerOptions& options);
// DEADLINE_EXCEEDED for a worker that does not register (WorkerOptions::may_register
// false) and waited `waited` for the root to register the layout on `shard` (its name).
absl::Status NoRootYet(std::string_view shard, uint32_t worker_id, RpcClock::duration waited);
// The data plane a Join asks for: WorkerOptions::data_plane's, or any when unset.
v1::DataPlane PlaneAsked(const std::optional<core::DataPlane>& plane);

// How JoinRetrying goes on after a refused join.
struct JoinRetries {
  const core::RetryPolicy* policy = nullptr;  // what is retried, and the backoff
  std::chrono::milliseconds rpc_timeout{30000};  // each call's bound
  // Given a refusal, may change the request and return true to send it again at once.
  std::function<bool(const absl::Status&, v1::JoinRequest*)> amend;
  // What the error says was being done ("joining shard 0 (...) as worker 3").
  std::function<std::string()> doing;
  std::atomic<uint64_t>* retries = nullptr;  // counts the backoffs; may be null
};
// Joins with `req` until answered: an unreachable shard again after the policy's
// backoff while `deadline` allows; any other refusal, or the last, with `doing()` before it.
absl::StatusOr<v1::JoinResponse> JoinRetrying(ShardControl& control, v1::JoinRequest req,
                                              const JoinRetries& how,
                                              RpcClock::time_point deadline);

class ShardClient {
 public:
  struct Options {
    uint32_t worker_id = 0;
    std::chrono::milliseconds rpc_timeout{30000};
    // JoinRetryPolicy.
    core::RetryPolicy join_policy;
    // WorkerOptions::data_plane: the plane every Join asks for (unset: any).
    std::optional<core::DataPlane> data_plane;
    std::string run_id;  // WorkerOptions::run_id, in every Join
    // WorkerOptions::may_register.
    bool may_register = true;
  };
  // Told that `shard` was joined again after losing a session, with the shard's answer.
  using RejoinListener = std::function<void(uint32_t shard, const v1::JoinResponse& join)>;

  // links[i] reaches addresses[i], shard i.
  ShardClient(Options options, const core::ModelLayout& layout, std::vector<std::string> addresses,
              std::vector<ShardLink> links, RejoinListener on_rejoin);
  ShardClient(const ShardClient&) = delete;
  ShardClient& operator=(const ShardClient&) = delete;

  // Joins every shard in order until `deadline`, registers the layout and uploads
  // `initial` where a shard has none, and records what each shard said. Every data
  // channel must take its shard's route (a tensor pushed over UDP needs a shard with
  // the UDP path).
  absl::Status Connect(std::span<const std::span<const float>> initial,
                       RpcClock::time_point deadline);

  // Joins `shard` (again) until `deadline`, retrying while it is unreachable; a
  // success starts a new epoch and hands its route to the shard's data channels,
  // failing when one cannot take it.
  absl::StatusOr<v1::JoinResponse> Join(uint32_t shard, RpcClock::time_point deadline);

  // Joins `shard` again after a call of epoch `failed_epoch` found its session
  // forgotten, unless another caller already did; tells the listener on success.
  // Failures, and a route a channel cannot use, are left to the retried call to
  // report.
  void Rejoin(uint32_t shard, uint64_t failed_epoch);

  struct Session {
    std::string token;
    uint64_t epoch = 0;  // bumped by every successful join
  };
  Session session(uint32_t shard) const;

  // Worker::PutObject and GetObject on `shard`, once (GetObject: NOT_FOUND until the
  // owner stored the key); a call that finds its session forgotten joins again and is
  // repeated once.
  absl::StatusOr<uint64_t> PutObject(uint32_t shard, std::string_view key, std::string_view value);
  absl::StatusOr<v1::GetObjectResponse> GetObject(uint32_t shard, uint32_t owner,
                                                  std::string_view key);

  // Worker::Leave: tells every shard, once each, each call bounded by `deadline`; the
  // first failure (the others are still told).
  absl::Status Leave(RpcClock::time_point deadline);

  // Worker::Adopt: this worker's vote on every shard, then, on the root (`values` not
  // empty), each shard's slices once its vote passed, waiting with the join backoff
  // until `deadline`. A call that finds its session forgotten joins again and is repeated
  // once.
  absl::Status Adopt(uint64_t round, uint32_t root, std::span<const std::span<const float>> values,
                     RpcClock::time_point deadline);

  // `shard`'s channel for `path`; null when no tensor takes that path.
  DataChannel* channel(uint32_t shard, PushPath path) {
    return shards_[shard]->link.channels[static_cast<size_t>(path)].get();
  }
  std::string name(uint32_t shard) const;
  size_t num_shards() const { return shards_.size(); }
  // What each shard said at Connect, and the lowest version among them.
  const std::vector<ShardInfo>& infos() const { return infos_; }
  uint64_t start_version() const { return start_version_; }
  // Join attempts repeated after a shard was unreachable.
  uint64_t retries() const { return retries_.load(); }

 private:
  struct Shard {
    uint32_t id = 0;
    std::string address;
    ShardLink link;
    absl::Mutex join_mu;  // serialises (re)joins and routes
    mutable absl::Mutex mu ABSL_ACQUIRED_AFTER(join_mu);
    std::string session ABSL_GUARDED_BY(mu);
    uint64_t epoch ABSL_GUARDED_BY(mu) = 0;
  };

  // A join; `routed` gets what the data channels said of the new route (the join
  // itself succeeded either way).
  absl::StatusOr<v1::JoinResponse> JoinLocked(Shard& s, RpcClock::time_point deadline,
                                              absl::Status* routed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.join_mu);
  absl::Status RegisterLayout(Shard& s, const v1::JoinResponse& join,
                              std::span<const std::span<const float>> initial);
  // Joins `shard` again, with the join backoff, until its answer says another worker
  // registered the layout (WorkerOptions::may_register false); `join` is the first answer.
  absl::StatusOr<v1::JoinResponse> AwaitRegistration(uint32_t shard, v1::JoinResponse join,
                                                     RpcClock::time_point deadline);

  const Options options_;
  const core::ModelLayout& layout_;
  const RejoinListener on_rejoin_;
  std::vector<std::unique_ptr<Shard>> shards_;
  // Written by Connect, before any other thread uses the client.
  std::vector<ShardInfo> infos_;
  uint64_t start_version_ = 0;
  std::atomic<uint64_t> retries_{0};
};

}  // namespace ps::internal
