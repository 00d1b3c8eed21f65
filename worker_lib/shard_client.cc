#include "worker_lib/shard_client_internal.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/refusal.h"
#include "core/status.h"
#include "net/layout_proto.h"

namespace ps::internal {
namespace {

// The data plane a Join answer names (gRPC for shards from before the field).
core::DataPlane PlaneOf(const v1::JoinResponse& join) {
  return join.data_plane() == v1::DATA_PLANE_TCP ? core::DataPlane::kTcp : core::DataPlane::kGrpc;
}

}  // namespace

std::string ShardName(uint32_t id, std::string_view address) {
  return absl::StrCat("shard ", id, " (", core::AsAbsl(address), ")");
}

absl::Status WithContext(const absl::Status& s, std::string_view context) {
  if (s.ok()) return s;
  absl::Status out(s.code(), absl::StrCat(core::AsAbsl(context), ": ", s.message()));
  // Payloads (the refusal's kind, core::RefusalOf) stay with the status.
  s.ForEachPayload([&out](absl::string_view url, const absl::Cord& payload) {
    out.SetPayload(url, payload);
  });
  return out;
}

core::RetryPolicy JoinRetryPolicy(const WorkerOptions& options) {
  core::RetryPolicy p;
  p.max_attempts = 0;  // bounded by the connect deadline instead
  p.initial_backoff = options.initial_backoff;
  p.max_backoff = options.max_backoff;
  // Not UNAUTHENTICATED: a join refused its credentials will not do better next time.
  p.retriable = {absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded};
  // A shard short of buffers or over a per-client bound refuses for a moment.
  p.retry_transient_exhaustion = true;
  return p;
}

core::RetryPolicy CallRetryPolicy(const WorkerOptions& options) {
  core::RetryPolicy p = JoinRetryPolicy(options);
  // At least one attempt: max_attempts <= 0 has always meant no retries here.
  p.max_attempts = std::max(options.max_attempts, 1);
  p.retriable.push_back(absl::StatusCode::kUnauthenticated);
  return p;
}

ShardClient::ShardClient(Options options, const core::ModelLayout& layout,
                         std::vector<std::string> addresses,
                         std::vector<ShardLink> links, RejoinListener on_rejoin)
    : options_(std::move(options)), layout_(layout), on_rejoin_(std::move(on_rejoin)) {
  shards_.reserve(links.size());
  for (uint32_t i = 0; i < links.size(); ++i) {
    auto s = std::make_unique<Shard>();
    s->id = i;
    s->address = std::move(addresses[i]);
    s->link = std::move(links[i]);
    shards_.push_back(std::move(s));
  }
}

absl::Status ShardClient::Connect(std::span<const std::span<const float>> initial,
                                  RpcClock::time_point deadline) {
  uint64_t start = UINT64_MAX;
  for (auto& s : shards_) {
    PS_ASSIGN_OR_RETURN(v1::JoinResponse join, Join(s->id, deadline));
    if (join.num_shards() != layout_.num_shards()) {
      return absl::FailedPreconditionError(
          absl::StrCat(name(s->id), " belongs to a cluster of ", join.num_shards(),
                       " shards; this worker's layout is cut for ", layout_.num_shards()));
    }
    if (!join.layout_registered()) {
      if (options_.may_register) {
        PS_RETURN_IF_ERROR(RegisterLayout(*s, join, initial));
      } else {
        PS_ASSIGN_OR_RETURN(join, AwaitRegistration(s->id, std::move(join), deadline));
      }
    }
    ShardInfo info;
    info.shard_id = join.shard_id();
    info.num_workers = join.num_workers();
    info.aggregator = join.aggregator();
    info.aggregate_only = join.aggregate_only();
    info.learning_rate = join.learning_rate();
    info.momentum = join.momentum();
    info.weight_decay = join.weight_decay();
    info.version = join.version();
    info.data_plane = PlaneOf(join);
    info.restores_from_checkpoints = !join.no_checkpoints();
    infos_.push_back(std::move(info));
    // A shard that owns none of this layout's slices has no version to resume from.
    if (!layout_.SlicesOfShard(s->id).empty()) start = std::min(start, join.version());
  }
  start_version_ = start == UINT64_MAX ? 0 : start;
  return absl::OkStatus();
}

absl::Status NoRootYet(std::string_view shard, uint32_t worker_id, RpcClock::duration waited) {
  return absl::DeadlineExceededError(absl::StrCat(
      core::AsAbsl(shard), " has no parameters yet, and worker ", worker_id,
      " does not register them (it starts from the root worker's): waited ",
      std::chrono::duration_cast<std::chrono::milliseconds>(waited).count(),
      " ms for the root to join and register them; start it, or give a longer connect "
      "timeout"));
}

v1::DataPlane PlaneAsked(const std::optional<core::DataPlane>& plane) {
  return !plane.has_value()                  ? v1::DATA_PLANE_ANY
         : *plane == core::DataPlane::kTcp ? v1::DATA_PLANE_TCP
                                           : v1::DATA_PLANE_GRPC;
}

absl::StatusOr<v1::JoinResponse> JoinRetrying(ShardControl& control, v1::JoinRequest req,
                                              const JoinRetries& how,
                                              RpcClock::time_point deadline) {
  for (int attempt = 0;; ++attempt) {
    v1::JoinResponse resp;
    const absl::Status st =
        control.Join(req, std::min(deadline, RpcClock::now() + how.rpc_timeout), &resp);
    if (st.ok()) return resp;
    if (how.amend && how.amend(st, &req)) continue;
    const auto backoff = how.policy->Backoff(attempt);
    if (!how.policy->ShouldRetry(st, attempt) || RpcClock::now() + backoff >= deadline) {
      return WithContext(st, how.doing());
    }
    if (how.retries != nullptr) how.retries->fetch_add(1);
    std::this_thread::sleep_for(backoff);
  }
}

absl::StatusOr<v1::JoinResponse> ShardClient::Join(uint32_t shard, RpcClock::time_point deadline) {
  Shard& s = *shards_[shard];
  absl::MutexLock join_lock(&s.join_mu);
  absl::Status routed;
  PS_ASSIGN_OR_RETURN(v1::JoinResponse join, JoinLocked(s, deadline, &routed));
  PS_RETURN_IF_ERROR(routed);
  return join;
}

absl::StatusOr<v1::JoinResponse> ShardClient::JoinLocked(Shard& s, RpcClock::time_point deadline,
                                                         absl::Status* routed) {
  v1::JoinRequest req;
  req.set_worker_id(options_.worker_id);
  req.set_layout_hash(layout_.hash());
  req.set_data_plane(PlaneAsked(options_.data_plane));
  req.set_run_id(options_.run_id);
  JoinRetries how{.policy = &options_.join_policy,
                  .rpc_timeout = options_.rpc_timeout,
                  .amend =
                      [this](const absl::Status& st, v1::JoinRequest* r) {
                        if (core::RefusalOf(st) != core::Refusal::kLayoutMismatch ||
                            r->has_layout()) {
                          return false;
                        }
                        // Once more with the whole layout, so the refusal names the tensor
                        // that differs.
                        net::LayoutToProto(layout_, r->mutable_layout());
                        return true;
                      },
                  .doing =
                      [&] {
                        return absl::StrCat("joining ", name(s.id), " as worker ",
                                            options_.worker_id);
                      },
                  .retries = &retries_};
  PS_ASSIGN_OR_RETURN(v1::JoinResponse resp,
                      JoinRetrying(*s.link.control, std::move(req), how, deadline));
  DataRoute route;
  route.session = resp.session();
  route.udp_port = resp.udp_port();
  route.udp_session = resp.udp_session();
  route.udp_key = resp.udp_key();
  route.plane = PlaneOf(resp);
  route.data_port = resp.data_port();
  route.data_session = resp.data_session();
  route.data_secret = resp.data_secret();
  route.tcp_rto_min = std::chrono::microseconds(resp.data_tcp_rto_min_us());
  {
    absl::MutexLock lock(&s.mu);
    s.session = resp.session();
    route.epoch = ++s.epoch;
  }
  // After the epoch: a channel's route is never newer than the session callers read, so
  // a call refused under it rejoins (Rejoin compares epochs).
  *routed = absl::OkStatus();
  for (const auto& channel : s.link.channels) {
    if (channel != nullptr) routed->Update(channel->SetRoute(route));
  }
  return resp;
}

void ShardClient::Rejoin(uint32_t shard, uint64_t failed_epoch) {
  Shard& s = *shards_[shard];
  absl::StatusOr<v1::JoinResponse> join;
  {
    // The epoch is checked under the join lock, so of the callers that noticed the
    // same lost session (they queue here) only the first joins.
    absl::MutexLock join_lock(&s.join_mu);
    {
      absl::MutexLock lock(&s.mu);
      if (s.epoch != failed_epoch) return;
    }
    absl::Status routed;  // a route a channel cannot use fails its calls, which say why
    join = JoinLocked(s, RpcClock::now() + options_.rpc_timeout, &routed);
  }
  if (!join.ok()) return;  // the retried call reports what goes wrong
  if (on_rejoin_) on_rejoin_(shard, *join);
}

ShardClient::Session ShardClient::session(uint32_t shard) const {
  const Shard& s = *shards_[shard];
  absl::MutexLock lock(&s.mu);
  return Session{s.session, s.epoch};
}

std::string ShardClient::name(uint32_t shard) const {
  return ShardName(shard, shards_[shard]->address);
}

namespace {

// `call(session token)` on `shard`; once more after a join when the shard had forgotten
// the session (it restarted).
template <typename Call>
absl::Status WithSession(ShardClient& client, uint32_t shard, const Call& call) {
  ShardClient::Session s = client.session(shard);
  absl::Status st = call(s.token);
  if (st.code() == absl::StatusCode::kUnauthenticated &&
      core::RefusalOf(st) == core::Refusal::kUnknownSession) {
    client.Rejoin(shard, s.epoch);
    st = call(client.session(shard).token);
  }
  return WithContext(st, client.name(shard));
}

}  // namespace

absl::StatusOr<uint64_t> ShardClient::PutObject(uint32_t shard, std::string_view key,
                                                std::string_view value) {
  v1::PutObjectResponse resp;
  PS_RETURN_IF_ERROR(WithSession(*this, shard, [&](const std::string& token) {
    v1::PutObjectRequest req;
    req.set_session(token);
    req.set_key(std::string(key));
    req.set_value(std::string(value));
    return shards_[shard]->link.control->PutObject(req, RpcClock::now() + options_.rpc_timeout,
                                                   &resp);
  }));
  return resp.version();
}

absl::StatusOr<v1::GetObjectResponse> ShardClient::GetObject(uint32_t shard, uint32_t owner,
                                                             std::string_view key) {
  v1::GetObjectResponse resp;
  PS_RETURN_IF_ERROR(WithSession(*this, shard, [&](const std::string& token) {
    v1::GetObjectRequest req;
    req.set_session(token);
    req.set_owner(owner);
    req.set_key(std::string(key));
    return shards_[shard]->link.control->GetObject(req, RpcClock::now() + options_.rpc_timeout,
                                                   &resp);
  }));
  return resp;
}

absl::Status ShardClient::Leave(RpcClock::time_point deadline) {
  absl::Status first;
  for (uint32_t i = 0; i < shards_.size(); ++i) {
    v1::LeaveRequest req;
    req.set_session(session(i).token);
    v1::LeaveResponse resp;
    absl::Status st = shards_[i]->link.control->Leave(req, deadline, &resp);
    if (!st.ok() && first.ok()) first = WithContext(st, absl::StrCat("leaving ", name(i)));
  }
  return first;
}

absl::Status ShardClient::Adopt(uint64_t round, uint32_t root,
                                std::span<const std::span<const float>> values,
                                RpcClock::time_point deadline) {
  const bool is_root = !values.empty();
  auto vote = [&](uint32_t shard) -> absl::StatusOr<v1::AdoptResponse> {
    v1::AdoptResponse resp;
    PS_RETURN_IF_ERROR(WithSession(*this, shard, [&](const std::string& token) {
      v1::AdoptRequest req;
      req.set_session(token);
      req.set_layout_hash(layout_.hash());
      req.set_round(round);
      req.set_root(root);
      return shards_[shard]->link.control->Adopt(req, RpcClock::now() + options_.rpc_timeout,
                                                 &resp);
    }));
    return resp;
  };
  // Every vote first, so that no shard waits for this worker while it waits for another.
  std::vector<v1::AdoptResponse> tallies(shards_.size());
  for (uint32_t i = 0; i < shards_.size(); ++i) {
    absl::StatusOr<v1::AdoptResponse> t = vote(i);
    if (!is_root && !t.ok() && core::RefusalOf(t.status()) == core::Refusal::kLate) {
      continue;  // the shard adopted without this vote, or moved on: the pull says which
    }
    if (!t.ok()) return t.status();
    tallies[i] = *t;
  }
  if (!is_root) return absl::OkStatus();
  const auto start = RpcClock::now();
  for (uint32_t i = 0; i < shards_.size(); ++i) {
    for (int attempt = 0; !tallies[i].passed(); ++attempt) {
      const auto backoff = options_.join_policy.Backoff(attempt);
      if (RpcClock::now() + backoff >= deadline) {
        const auto waited =
            std::chrono::duration_cast<std::chrono::milliseconds>(RpcClock::now() - start);
        return absl::DeadlineExceededError(absl::StrCat(
            name(i), ": ", tallies[i].votes(), " of the ", tallies[i].quorum(),
            " workers it takes asked to adopt worker ", root, "'s values at round ", round,
            " after ", waited.count(),
            " ms: every worker calls it, at the same step (broadcast_parameters is collective)"));
      }
      std::this_thread::sleep_for(backoff);
      PS_ASSIGN_OR_RETURN(tallies[i], vote(i));
    }
    for (const core::SliceInfo& si : layout_.slices()) {
      if (si.shard != i) continue;
      PS_RETURN_IF_ERROR(WithSession(*this, i, [&](const std::string& token) {
        v1::AdoptSliceRequest req;
        req.set_session(token);
        req.set_layout_hash(layout_.hash());
        req.set_round(round);
        req.set_slice_id(si.id);
        req.set_values(reinterpret_cast<const char*>(values[si.tensor].data() + si.offset),
                       size_t{si.numel} * sizeof(float));
        v1::AdoptSliceResponse resp;
        return shards_[i]->link.control->AdoptSlice(req, RpcClock::now() + options_.rpc_timeout,
                                                    &resp);
      }));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::JoinResponse> ShardClient::AwaitRegistration(uint32_t shard,
                                                                 v1::JoinResponse join,
                                                                 RpcClock::time_point deadline) {
  const RpcClock::time_point start = RpcClock::now();
  for (int attempt = 0; !join.layout_registered(); ++attempt) {
    const auto backoff = options_.join_policy.Backoff(attempt);
    if (RpcClock::now() + backoff >= deadline) {
      return NoRootYet(name(shard), options_.worker_id, RpcClock::now() - start);
    }
    std::this_thread::sleep_for(backoff);
    PS_ASSIGN_OR_RETURN(join, Join(shard, deadline));
  }
  return join;
}

absl::Status ShardClient::RegisterLayout(Shard& s, const v1::JoinResponse& join,
                                         std::span<const std::span<const float>> initial) {
  v1::RegisterLayoutRequest req;
  req.set_session(session(s.id).token);
  net::LayoutToProto(layout_, req.mutable_layout());
  v1::RegisterLayoutResponse resp;
  const absl::Status st =
      s.link.control->RegisterLayout(req, RpcClock::now() + options_.rpc_timeout, &resp);
  if (absl::IsAlreadyExists(st)) return absl::OkStatus();  // lost the race
  if (!st.ok()) return WithContext(st, absl::StrCat("registering the layout on ", name(s.id)));
  if (join.aggregate_only()) return absl::OkStatus();
  if (initial.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        name(s.id), " has no parameters yet and this worker brought no initial values"));
  }
  for (uint32_t id : resp.owned_slices()) {
    if (id >= layout_.slices().size()) {
      return absl::InternalError(absl::StrCat(name(s.id), " claims unknown slice ", id));
    }
    const core::SliceInfo& si = layout_.slices()[id];
    v1::InitSliceRequest ireq;
    ireq.set_session(req.session());
    ireq.set_layout_hash(layout_.hash());
    ireq.set_slice_id(id);
    ireq.set_values(reinterpret_cast<const char*>(initial[si.tensor].data() + si.offset),
                    size_t{si.numel} * sizeof(float));
    v1::InitSliceResponse iresp;
    const absl::Status is =
        s.link.control->InitSlice(ireq, RpcClock::now() + options_.rpc_timeout, &iresp);
    if (!is.ok() && !absl::IsAlreadyExists(is)) {
      return WithContext(
          is, absl::StrCat("uploading the initial value of slice ", id, " to ", name(s.id)));
    }
  }
  return absl::OkStatus();
}

}  // namespace ps::internal
