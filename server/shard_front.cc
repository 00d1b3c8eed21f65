#include "server/shard_front.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "server/auth_internal.h"
#include "server/metrics.h"
#include "server/tarpit.h"

namespace ps::server {

PullHandle::PullHandle(Shard* shard, const PullAsk& ask, Metrics* metrics, PullSlots::Slot slot)
    : slot_(std::move(slot)),
      scheduler_(shard, ask.slice_ids, ask.min_version, ask.held_epoch, ask.held_versions,
                 metrics) {}

ShardFront::ShardFront(Shard* shard, RateLimiter* limiter, Tarpit* tarpit)
    : shard_(shard),
      limiter_(limiter),
      tarpit_(tarpit),
      pull_slots_(shard->options().WorkerIds(), shard->options().max_pulls_per_worker) {}

absl::Status ShardFront::RefusePlane(std::string_view who, std::string_view asked) const {
  const std::string_view own = core::DataPlaneName(plane());
  return shard_->Refuse(
      Refusal::kDataPlane,
      absl::StrCat(core::AsAbsl(who), " the ", core::AsAbsl(asked), " data plane but shard ",
                   shard_->shard_id(), " moves tensors over ", core::AsAbsl(own),
                   " (--data-plane ", core::AsAbsl(own), "); set WorkerOptions::data_plane to ",
                   core::AsAbsl(own), " or leave it unset, or start every shard with --data-plane ",
                   core::AsAbsl(asked)));
}

absl::Status ShardFront::AdmitCaller(const Caller& caller) const {
  if (limiter_ != nullptr && !limiter_->Allow(caller.Name())) {
    return shard_->Refuse(Refusal::kRateLimited,
                          absl::StrCat(caller.Name(), " is over the rate limit (",
                                       shard_->options().rate_limit,
                                       " requests/s); slow down"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DataPeer> ShardFront::AdmitSession(const Caller& caller,
                                                  std::string_view session) const {
  PS_RETURN_IF_ERROR(AdmitCaller(caller));
  PS_ASSIGN_OR_RETURN(uint32_t worker, shard_->Authenticate(session));
  const core::Identity owner{core::Identity::Kind::kWorker, worker};
  if (caller.identity.has_value() && !(*caller.identity == owner)) {
    return shard_->Refuse(Refusal::kPermissionDenied,
                          absl::StrCat("this session belongs to ", owner.Name(), ", not to ",
                                       caller.identity->Name(),
                                       " (a session is not a credential)"));
  }
  return DataPeer{.worker = worker, .client = caller.Name()};
}

absl::Status ShardFront::Push(const DataPeer& peer, const PushHead& head,
                              const PushPayload& payload) {
  // Timed only for the metrics (a clock read per push otherwise wasted).
  const auto start = metrics_ != nullptr ? std::chrono::steady_clock::now()
                                         : std::chrono::steady_clock::time_point{};
  absl::Status s = shard_->Push(peer.worker, head.layout_hash, head.round, head.slice_id,
                                head.codec, payload, head.loss, head.lr);
  if (metrics_ != nullptr) {
    metrics_->ObservePush(std::chrono::steady_clock::now() - start, payload.bytes());
  }
  return s;
}

absl::Status ShardFront::PushChunk(const net::DatagramHeader& header, std::string_view codec,
                                   std::string_view payload) {
  return shard_->PushChunk(header, codec, payload);
}

absl::StatusOr<std::unique_ptr<PullHandle>> ShardFront::OpenPull(const DataPeer& peer,
                                                                 const PullAsk& ask) {
  if (!ask.held_versions.empty() && ask.held_versions.size() != ask.slice_ids.size()) {
    return shard_->Refuse(Refusal::kMalformed,
                          absl::StrCat("pull gives ", ask.held_versions.size(),
                                       " held versions for ", ask.slice_ids.size(), " slices"));
  }
  PS_RETURN_IF_ERROR(shard_->ValidatePull(ask.layout_hash, ask.slice_ids));
  absl::StatusOr<PullSlots::Slot> slot = pull_slots_.Take(peer.worker);
  if (!slot.ok()) return shard_->Refuse(Refusal::kOverLimit, slot.status().message());
  return std::make_unique<PullHandle>(shard_, ask, metrics_, *std::move(slot));
}

void ShardFront::Answer(std::string_view client, const absl::Status& status,
                        size_t request_bytes, absl::AnyInvocable<void() &&> send) const {
  // Peer shards are part of the service, not its clients: a refused share is lag (a
  // late round), and holding its answer would only slow the model rounds.
  if (status.ok() || tarpit_ == nullptr || !Tarpit::Charges(status.code()) ||
      client.starts_with("shard-")) {
    std::move(send)();
    return;
  }
  tarpit_->Refuse(client, request_bytes, std::move(send));
}

}  // namespace ps::server
