// ShardClient: the worker's sessions with its shards. It owns one ShardTransport per
// shard and, per shard, the session token, the join epoch and the UDP route the last
// join handed out. It joins every shard at start (registering the layout and
// uploading initial slice values on a shard that has none), and joins again when a
// call finds its session forgotten (the shard restarted), once per lost session
// however many calls noticed.
//
// Thread safety: every method may be called from any thread. Per shard, `join_mu`
// serialises joins (a join is a blocking RPC, so no other lock is held across it) and
// `mu` guards the session state, read by every push and pull. The rejoin listener is
// called after a successful re-join, on the caller's thread, with no lock held.
//
// Lifetimes: the ShardClient outlives the parts that use it (PushPipeline,
// PullStreams) and every call they started on its transports.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <utility>  // before Asio: Boost 1.74 uses std::exchange without it

#include <boost/asio/ip/udp.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/layout.h"
#include "core/retry.h"
#include "net/udp_frame.h"
#include "worker_lib/shard_transport_internal.h"
#include "worker_lib/worker.h"

namespace ps::internal {

// The worker's two retry policies, both with its backoff (initial_backoff doubling up
// to max_backoff). Joins retry only an unreachable shard (UNAVAILABLE,
// DEADLINE_EXCEEDED), as often as the connect deadline allows. Pushes and pulls also
// retry UNAUTHENTICATED (the shard forgot the session: re-join, then retry), at most
// max_attempts attempts in all.
core::RetryPolicy JoinRetryPolicy(const WorkerOptions& options);
core::RetryPolicy CallRetryPolicy(const WorkerOptions& options);

class ShardClient {
 public:
  struct Options {
    uint32_t worker_id = 0;
    std::chrono::milliseconds rpc_timeout{30000};
    // JoinRetryPolicy.
    core::RetryPolicy join_policy;
  };
  // Told that `shard` was joined again after losing a session, with the shard's answer.
  using RejoinListener = std::function<void(uint32_t shard, const v1::JoinResponse& join)>;

  // transports[i] reaches addresses[i], shard i.
  ShardClient(Options options, const core::ModelLayout& layout, std::vector<std::string> addresses,
              std::vector<std::unique_ptr<ShardTransport>> transports, RejoinListener on_rejoin);
  ShardClient(const ShardClient&) = delete;
  ShardClient& operator=(const ShardClient&) = delete;

  // Joins every shard in order until `deadline`, registers the layout and uploads
  // `initial` where a shard has none, and records what each shard said. With
  // `need_udp`, every shard must run the UDP path; its endpoint is resolved now.
  absl::Status Connect(std::span<const std::span<const float>> initial, bool need_udp,
                       RpcClock::time_point deadline);

  // Joins `shard` (again) until `deadline`, retrying while it is unreachable; a
  // success starts a new epoch.
  absl::StatusOr<v1::JoinResponse> Join(uint32_t shard, RpcClock::time_point deadline);

  // Joins `shard` again after a call of epoch `failed_epoch` found its session
  // forgotten, unless another caller already did; tells the listener on success.
  // Failures are left to the retried call to report.
  void Rejoin(uint32_t shard, uint64_t failed_epoch);

  struct Session {
    std::string token;
    uint64_t epoch = 0;  // bumped by every successful join
  };
  Session session(uint32_t shard) const;

  // Where and how datagrams for `shard` go (Connect with need_udp).
  struct UdpRoute {
    uint64_t session = 0;
    std::shared_ptr<const net::DatagramKey> key;  // null: the shard gave none
    boost::asio::ip::udp::endpoint endpoint;
  };
  UdpRoute udp_route(uint32_t shard) const;

  ShardTransport& transport(uint32_t shard) { return *shards_[shard]->transport; }
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
    std::unique_ptr<ShardTransport> transport;
    absl::Mutex join_mu;  // serialises (re)joins
    mutable absl::Mutex mu ABSL_ACQUIRED_AFTER(join_mu);
    std::string session ABSL_GUARDED_BY(mu);
    uint64_t epoch ABSL_GUARDED_BY(mu) = 0;
    uint64_t udp_session ABSL_GUARDED_BY(mu) = 0;
    std::shared_ptr<const net::DatagramKey> udp_key ABSL_GUARDED_BY(mu);
    boost::asio::ip::udp::endpoint udp_endpoint;  // set by Connect, constant after
  };

  absl::StatusOr<v1::JoinResponse> JoinLocked(Shard& s, RpcClock::time_point deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.join_mu);
  absl::Status RegisterLayout(Shard& s, const v1::JoinResponse& join,
                              std::span<const std::span<const float>> initial);

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
