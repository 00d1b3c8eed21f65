#include "server/share_sender.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <string>

#include "net/grpc_status.h"
#include "core/refusal.h"
#include "core/retry.h"
#include "ps/v1/ps.grpc.pb.h"
#include "server/service_internal.h"
#include "spdlog/spdlog.h"

namespace ps::server {

struct ShareSender::Peer {
  uint32_t id = 0;
  std::string address;
  std::unique_ptr<v1::PeerService::Stub> stub;
  std::shared_ptr<net::ChannelAuth> auth;
  std::deque<std::pair<std::chrono::steady_clock::time_point, std::shared_ptr<const RoundShare>>>
      queue ABSL_GUARDED_BY(mu);
  absl::Mutex mu;
  std::thread thread;
};

ShareSender::ShareSender(const ServerOptions& options,
                         std::vector<std::shared_ptr<grpc::Channel>> channels,
                         std::vector<std::shared_ptr<net::ChannelAuth>> auths)
    : options_(options) {
  for (uint32_t i = 0; i < options_.num_shards; ++i) {
    if (static_cast<int>(i) == options_.shard_id || channels[i] == nullptr) continue;
    auto peer = std::make_unique<Peer>();
    peer->id = i;
    peer->address = options_.peers[i];
    peer->stub = v1::PeerService::NewStub(channels[i]);
    peer->auth = auths[i];
    peers_.push_back(std::move(peer));
  }
  for (auto& peer : peers_) {
    Peer* p = peer.get();
    p->thread = std::thread([this, p] { Loop(p); });
  }
}

ShareSender::~ShareSender() { Stop(); }

void ShareSender::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  for (auto& peer : peers_) {
    {
      absl::MutexLock lock(&peer->mu);
      peer->queue.clear();
    }
    if (peer->thread.joinable()) peer->thread.join();
  }
}

void ShareSender::Send(std::shared_ptr<const RoundShare> share) {
  const auto due = std::chrono::steady_clock::now() + options_.peer_timeout;
  for (auto& peer : peers_) {
    absl::MutexLock lock(&peer->mu);
    peer->queue.emplace_back(due, share);
  }
}

namespace {

// A share is worth sending until its round's --peer-timeout-ms (the loop's bound):
// again after 20, 40, 80, ... ms, at most 200 ms apart, while the peer is unreachable
// or slow.
const core::RetryPolicy kSharePolicy{
    .max_attempts = 0,
    .initial_backoff = std::chrono::milliseconds(20),
    .multiplier = 2,
    .max_backoff = std::chrono::milliseconds(200),
    .retriable = {absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded}};

}  // namespace

void ShareSender::Loop(Peer* peer) {
  auto stopping = [this] {
    absl::MutexLock lock(&mu_);
    return stopping_;
  };
  while (!stopping()) {
    std::pair<std::chrono::steady_clock::time_point, std::shared_ptr<const RoundShare>> item;
    {
      absl::MutexLock lock(&peer->mu);
      auto has_work = [peer]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(peer->mu) {
        return !peer->queue.empty();
      };
      if (!peer->mu.AwaitWithTimeout(absl::Condition(&has_work), absl::Milliseconds(100))) {
        continue;
      }
      item = std::move(peer->queue.front());
      peer->queue.pop_front();
    }
    const auto& [due, share] = item;
    const v1::RoundShareRequest req = ToProto(*share);
    for (int attempt = 0;; ++attempt) {
      const auto now = std::chrono::steady_clock::now();
      v1::RoundShareResponse resp;
      const grpc::Status s = peer->auth->Unary(
          std::chrono::system_clock::now() +
              std::min<std::chrono::steady_clock::duration>(due - now, std::chrono::seconds(2)),
          /*wait_for_ready=*/false,
          [&](grpc::ClientContext* ctx) { return peer->stub->ShareRound(ctx, req, &resp); });
      if (s.ok()) break;
      // The peer may not have its layout yet (it registers when its workers come).
      const absl::Status st = net::FromGrpc(s);
      const bool retry = kSharePolicy.ShouldRetry(st.code(), attempt) ||
                         core::RefusalOf(st) == core::Refusal::kNoLayout;
      if (!retry || std::chrono::steady_clock::now() >= due || stopping()) {
        spdlog::warn("shard {}: share of round {} not delivered to shard {} at {}: {}",
                     options_.shard_id, share->round, peer->id, peer->address, s.error_message());
        break;
      }
      std::this_thread::sleep_for(kSharePolicy.Backoff(attempt));
    }
  }
}

}  // namespace ps::server
