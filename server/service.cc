#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/client_text.h"
#include "core/status.h"
#include "net/grpc_bytes.h"
#include "net/grpc_status.h"
#include "net/layout_proto.h"
#include "net/wire.h"
#include "server/metadata_auth.h"
#include "server/service_internal.h"

namespace ps::server {

absl::StatusOr<Caller> CallGate::Admit(const FrontCall& call) const {
  const absl::StatusOr<Caller>& caller = call.caller();
  if (!caller.ok()) {
    return shard->Refuse(Refusal::kUnauthenticated,
                         absl::StrCat(caller.status().message(), " (from ",
                                      const_cast<FrontCall&>(call).context().peer(), ")"));
  }
  PS_RETURN_IF_ERROR(front->AdmitCaller(*caller));
  return caller;
}

std::string CallGate::ClientOf(const FrontCall& call) const {
  const absl::StatusOr<Caller>& caller = call.caller();
  return caller.ok() ? caller->Name() : std::string(kAnonymousClient);
}

void CallGate::Answer(FrontCall* call, const absl::Status& status, size_t request_bytes,
                      grpc::ByteBuffer response) const {
  // The caller's name is looked up only for a refusal the tarpit may hold.
  const std::string client =
      !status.ok() && Tarpit::Charges(status.code()) ? ClientOf(*call) : std::string();
  front->Answer(client, status, request_bytes,
                [call, answer = net::ToGrpc(status), response = std::move(response)]() mutable {
                  call->Reply(answer, std::move(response));
                });
}

void CallGate::Answer(FrontCall* call, const absl::Status& status,
                      const google::protobuf::MessageLite& request,
                      const google::protobuf::MessageLite* response) const {
  Answer(call, status, status.ok() ? 0 : request.ByteSizeLong(),
         status.ok() && response != nullptr ? net::SerializeMessage(*response)
                                            : grpc::ByteBuffer());
}

absl::StatusOr<DataPeer> CallGate::AdmitWorker(const FrontCall& call,
                                               std::string_view session) const {
  PS_ASSIGN_OR_RETURN(Caller caller, Admit(call));
  return front->AdmitSession(caller, session);
}

namespace {

// A join refused as layout_mismatch that carried the worker's layout (its second try),
// with the first difference named; the shard counted the refusal already.
absl::Status NamedMismatch(const Shard& shard, absl::Status refused, const v1::JoinRequest& req) {
  if (!req.has_layout() || core::RefusalOf(refused) != Refusal::kLayoutMismatch) return refused;
  const core::ModelLayout* have = shard.registered_layout();
  if (have == nullptr) return refused;
  const std::string difference = net::LayoutDifference(*have, req.layout());
  if (difference.empty()) return refused;  // the same layout under another hash: a forgery
  return core::Refused(Refusal::kLayoutMismatch, absl::StrCat(refused.message(), ": ", difference));
}

}  // namespace

void WorkerServiceImpl::AddTo(GrpcFront* front) {
  constexpr std::string_view kService = "/ps.v1.WorkerService/";
  auto path = [&](std::string_view method) { return std::string(kService) + std::string(method); };
  front->Add(path("Join"), Unary<v1::JoinRequest>(gate_, [this](FrontCall* c, const v1::JoinRequest& r) {
               Join(c, r);
             }));
  front->Add(path("RegisterLayout"),
             Unary<v1::RegisterLayoutRequest>(
                 gate_, [this](FrontCall* c, const v1::RegisterLayoutRequest& r) { RegisterLayout(c, r); }));
  front->Add(path("InitSlice"),
             Unary<v1::InitSliceRequest>(
                 gate_, [this](FrontCall* c, const v1::InitSliceRequest& r) { InitSlice(c, r); }));
  front->Add(path("PutObject"),
             Unary<v1::PutObjectRequest>(
                 gate_, [this](FrontCall* c, const v1::PutObjectRequest& r) { PutObject(c, r); }));
  front->Add(path("GetObject"),
             Unary<v1::GetObjectRequest>(
                 gate_, [this](FrontCall* c, const v1::GetObjectRequest& r) { GetObject(c, r); }));
  front->Add(path("Leave"), Unary<v1::LeaveRequest>(gate_, [this](FrontCall* c, const v1::LeaveRequest& r) {
               Leave(c, r);
             }));
  front->Add(path("Adopt"), Unary<v1::AdoptRequest>(gate_, [this](FrontCall* c, const v1::AdoptRequest& r) {
               Adopt(c, r);
             }));
  front->Add(path("Probe"), Unary<v1::ProbeRequest>(gate_, [this](FrontCall* c, const v1::ProbeRequest& r) {
               Probe(c, r);
             }));
  front->Add(path("AdoptSlice"),
             Unary<v1::AdoptSliceRequest>(
                 gate_, [this](FrontCall* c, const v1::AdoptSliceRequest& r) { AdoptSlice(c, r); }));
}

void WorkerServiceImpl::Join(FrontCall* call, const v1::JoinRequest& req) {
  absl::StatusOr<Caller> caller = gate_.Admit(*call);
  if (!caller.ok()) return gate_.Answer(call, caller.status(), req);
  if (gate_.admitting != nullptr && !gate_.admitting->load()) {
    return gate_.Answer(call,
                        shard_->Refuse(Refusal::kCatchingUp,
                                       "this shard was restored from a checkpoint and is catching "
                                       "up with its peers; retry shortly"),
                        req);
  }
  if (caller->identity.has_value() &&
      !(*caller->identity == core::Identity{core::Identity::Kind::kWorker, req.worker_id()})) {
    return gate_.Answer(call,
                        shard_->Refuse(Refusal::kPermissionDenied,
                                       absl::StrCat(caller->identity->Name(),
                                                    " may not join as worker ", req.worker_id(),
                                                    ": the worker id comes from the "
                                                    "credentials")),
                        req);
  }
  if (absl::Status plane = CheckPlane(req); !plane.ok()) return gate_.Answer(call, plane, req);
  if (absl::Status run = CheckRun(req); !run.ok()) return gate_.Answer(call, run, req);
  // The data session's keys are bound to the token this call proved, which the worker
  // holds (a token file's or one a cluster secret derives).
  if (req.job_slice_elems() && req.layout_hash() != 0) {
    return gate_.Answer(call,
                        shard_->Refuse(Refusal::kBadLayout,
                                       "a join for the job's slice size names a layout hash; "
                                       "send one or the other"),
                        req);
  }
  const std::optional<uint64_t> hash =
      req.job_slice_elems() ? std::nullopt : std::optional<uint64_t>(req.layout_hash());
  absl::StatusOr<JoinResult> r =
      shard_->Join(req.worker_id(), hash, gate_.auth->TokenNamed(caller->token_key));
  if (!r.ok()) return gate_.Answer(call, NamedMismatch(*shard_, r.status(), req), req);
  const ServerOptions& o = shard_->options();
  v1::JoinResponse resp;
  resp.set_session(r->session);
  resp.set_shard_id(shard_->shard_id());
  resp.set_num_shards(o.num_shards);
  resp.set_num_workers(o.num_workers);
  resp.set_layout_registered(r->layout_registered);
  resp.set_slice_elems(r->slice_elems);
  resp.set_ready(r->ready);
  resp.set_version(r->version);
  resp.set_aggregator(o.aggregator);
  resp.set_aggregate_only(o.aggregate_only);
  if (!o.aggregate_only) {
    resp.set_learning_rate(o.learning_rate);
    resp.set_momentum(o.momentum);
    resp.set_weight_decay(o.weight_decay);
  }
  resp.set_no_checkpoints(o.checkpoint_dir.empty());
  if (udp_port_ != 0) {
    resp.set_udp_port(udp_port_);
    resp.set_udp_session(r->data_session);
    resp.set_udp_key(r->udp_key);
  }
  if (o.data_plane == core::DataPlane::kTcp) {
    resp.set_data_plane(v1::DATA_PLANE_TCP);
    resp.set_data_port(data_port_);
    resp.set_data_session(r->data_session);
    resp.set_data_secret(r->data_secret);
    // Resolved by Server::Start (-1, auto, is never left).
    resp.set_data_tcp_rto_min_us(static_cast<uint32_t>(std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::microseconds>(o.tcp_rto_min).count())));
  } else {
    resp.set_data_plane(v1::DATA_PLANE_GRPC);
  }
  gate_.Answer(call, absl::OkStatus(), req, &resp);
}

absl::Status WorkerServiceImpl::CheckRun(const v1::JoinRequest& req) const {
  const std::string& own = shard_->options().run_id;
  if (own.empty() || req.run_id() == own) return absl::OkStatus();
  return shard_->Refuse(
      Refusal::kWrongRun,
      absl::StrCat("worker ", req.worker_id(), " belongs to ",
                   req.run_id().empty()
                       ? std::string("no run")
                       : absl::StrCat("run '", core::ClientText(req.run_id(), 128), "'"),
                   ", shard ", shard_->shard_id(), " serves run '", own,
                   "' (--run-id): a new run needs new shards; to continue this one, give the "
                   "worker its run id (--run-id, PS_RUN_ID)"));
}

absl::Status WorkerServiceImpl::CheckPlane(const v1::JoinRequest& req) const {
  const std::string who = absl::StrCat("worker ", req.worker_id(), " asks for");
  const core::DataPlane own = gate_.front->plane();
  switch (req.data_plane()) {
    case v1::DATA_PLANE_ANY:
      return absl::OkStatus();
    case v1::DATA_PLANE_UNSPECIFIED:  // every client built before the field: gRPC
    case v1::DATA_PLANE_GRPC:
      return own == core::DataPlane::kGrpc ? absl::OkStatus() : gate_.front->RefusePlane(who, "grpc");
    case v1::DATA_PLANE_TCP:
      return own == core::DataPlane::kTcp ? absl::OkStatus() : gate_.front->RefusePlane(who, "tcp");
    default:
      return shard_->Refuse(
          Refusal::kDataPlane,
          absl::StrCat(who, " data plane ", static_cast<int>(req.data_plane()),
                       ", which shard ", shard_->shard_id(), " does not know (it moves tensors over ",
                       core::AsAbsl(core::DataPlaneName(own)),
                       "); leave WorkerOptions::data_plane unset or upgrade the shards"));
  }
}

void WorkerServiceImpl::RegisterLayout(FrontCall* call, const v1::RegisterLayoutRequest& req) {
  absl::StatusOr<DataPeer> peer = gate_.AdmitWorker(*call, req.session());
  if (!peer.ok()) return gate_.Answer(call, peer.status(), req);
  const uint32_t worker = peer->worker;
  const v1::Layout& msg = req.layout();
  v1::RegisterLayoutResponse resp;
  if (const core::ModelLayout* have = shard_->registered_layout(); have != nullptr) {
    // The common case, answered by comparing the request with the registered layout
    // (first difference ends it): no copy, no hash, whatever the request's size.
    const std::string difference = net::LayoutDifference(*have, msg);
    const bool same = difference.empty();
    if (same) resp.set_layout_hash(have->hash());
    return gate_.Answer(
        call, shard_->AnswerRegistered(*have, worker, same, absl::StrCat("another: ", difference)),
        req, &resp);
  }
  // Nothing is built from the request before the shard looked at its size.
  absl::StatusOr<std::vector<uint32_t>> owned = shard_->RegisterLayout(
      worker, net::TensorsFromProto(msg), msg.slice_elems(), msg.num_shards());
  if (!owned.ok()) return gate_.Answer(call, owned.status(), req);
  resp.set_layout_hash(shard_->layout_hash());
  for (uint32_t id : *owned) resp.add_owned_slices(id);
  gate_.Answer(call, absl::OkStatus(), req, &resp);
}

void WorkerServiceImpl::InitSlice(FrontCall* call, const v1::InitSliceRequest& req) {
  absl::StatusOr<DataPeer> peer = gate_.AdmitWorker(*call, req.session());
  if (!peer.ok()) return gate_.Answer(call, peer.status(), req);
  v1::InitSliceResponse resp;
  gate_.Answer(call, shard_->InitSlice(peer->worker, req.layout_hash(), req.slice_id(), req.values()),
               req, &resp);
}

void WorkerServiceImpl::Leave(FrontCall* call, const v1::LeaveRequest& req) {
  absl::StatusOr<DataPeer> peer = gate_.AdmitWorker(*call, req.session());
  if (!peer.ok()) return gate_.Answer(call, peer.status(), req);
  shard_->Leave(peer->worker);
  v1::LeaveResponse resp;
  gate_.Answer(call, absl::OkStatus(), req, &resp);
}

void WorkerServiceImpl::Probe(FrontCall* call, const v1::ProbeRequest& req) {
  absl::StatusOr<DataPeer> peer = gate_.AdmitWorker(*call, req.session());
  if (!peer.ok()) return gate_.Answer(call, peer.status(), req);
  if (req.payload().size() > kMaxProbeBytes) {
    return gate_.Answer(call,
                        shard_->Refuse(Refusal::kOverLimit,
                                       absl::StrCat("a probe of ", req.payload().size(),
                                                    " bytes; at most ", kMaxProbeBytes)),
                        req);
  }
  v1::ProbeResponse resp;
  resp.set_received_bytes(req.payload().size());
  gate_.Answer(call, absl::OkStatus(), req, &resp);
}

void WorkerServiceImpl::Adopt(FrontCall* call, const v1::AdoptRequest& req) {
  absl::StatusOr<DataPeer> peer = gate_.AdmitWorker(*call, req.session());
  if (!peer.ok()) return gate_.Answer(call, peer.status(), req);
  absl::StatusOr<Adoption::Tally> tally =
      shard_->Adopt(peer->worker, req.layout_hash(), req.round(), req.root());
  if (!tally.ok()) return gate_.Answer(call, tally.status(), req);
  v1::AdoptResponse resp;
  resp.set_votes(tally->votes);
  resp.set_quorum(tally->quorum);
  resp.set_passed(tally->passed);
  gate_.Answer(call, absl::OkStatus(), req, &resp);
}

void WorkerServiceImpl::AdoptSlice(FrontCall* call, const v1::AdoptSliceRequest& req) {
  absl::StatusOr<DataPeer> peer = gate_.AdmitWorker(*call, req.session());
  if (!peer.ok()) return gate_.Answer(call, peer.status(), req);
  v1::AdoptSliceResponse resp;
  gate_.Answer(call,
               shard_->AdoptSlice(peer->worker, req.layout_hash(), req.round(), req.slice_id(),
                                  req.values()),
               req, &resp);
}

namespace {

// A refusal made by a part (typed), counted and logged by the shard as its own are.
absl::Status Counted(const Shard& shard, const absl::Status& st) {
  const std::optional<Refusal> r = core::RefusalOf(st);
  return r.has_value() ? shard.Refuse(*r, st.message()) : st;
}

}  // namespace

void WorkerServiceImpl::PutObject(FrontCall* call, const v1::PutObjectRequest& req) {
  absl::StatusOr<DataPeer> peer = gate_.AdmitWorker(*call, req.session());
  if (!peer.ok()) return gate_.Answer(call, peer.status(), req);
  // The request is const: its value is copied once into the store.
  absl::StatusOr<uint64_t> version = objects_.Put(peer->worker, req.key(), req.value());
  if (!version.ok()) return gate_.Answer(call, Counted(*shard_, version.status()), req);
  v1::PutObjectResponse resp;
  resp.set_version(*version);
  gate_.Answer(call, absl::OkStatus(), req, &resp);
}

void WorkerServiceImpl::GetObject(FrontCall* call, const v1::GetObjectRequest& req) {
  absl::StatusOr<DataPeer> peer = gate_.AdmitWorker(*call, req.session());
  if (!peer.ok()) return gate_.Answer(call, peer.status(), req);
  absl::StatusOr<ObjectStore::Object> object = objects_.Get(req.owner(), req.key());
  if (!object.ok()) {
    const absl::Status st = object.status();
    return gate_.Answer(call, st.code() == absl::StatusCode::kNotFound ? st : Counted(*shard_, st),
                        req);
  }
  v1::GetObjectResponse resp;
  resp.set_version(object->version);
  resp.set_value(*object->value);
  gate_.Answer(call, absl::OkStatus(), req, &resp);
}

void AdminServiceImpl::AddTo(GrpcFront* front) {
  front->Add("/ps.v1.AdminService/Checkpoint",
             Unary<v1::CheckpointRequest>(
                 gate_, [this](FrontCall* c, const v1::CheckpointRequest& r) { Checkpoint(c, r); }));
  front->Add("/ps.v1.AdminService/Status",
             Unary<v1::StatusRequest>(
                 gate_, [this](FrontCall* c, const v1::StatusRequest& r) { Status(c, r); }));
}

absl::Status AdminServiceImpl::AdmitAdmin(const FrontCall& call) const {
  PS_ASSIGN_OR_RETURN(Caller caller, gate_.Admit(call));
  if (caller.identity.has_value() ? caller.identity->kind == core::Identity::Kind::kAdmin
                                  : caller.loopback()) {
    return absl::OkStatus();
  }
  return gate_.shard->Refuse(
      Refusal::kPermissionDenied,
      absl::StrCat("administrative calls need the admin identity; the caller is ", caller.Name()));
}

void AdminServiceImpl::Checkpoint(FrontCall* call, const v1::CheckpointRequest& req) {
  if (absl::Status st = AdmitAdmin(*call); !st.ok()) return gate_.Answer(call, st, req);
  if (checkpointer_ == nullptr) {
    return gate_.Answer(call, absl::FailedPreconditionError("this shard runs without --checkpoint-dir"),
                        req);
  }
  absl::StatusOr<std::pair<std::string, uint64_t>> written = checkpointer_->Write("on demand");
  if (!written.ok()) return gate_.Answer(call, written.status(), req);
  v1::CheckpointResponse resp;
  resp.set_path(written->first);
  resp.set_version(written->second);
  gate_.Answer(call, absl::OkStatus(), req, &resp);
}

void AdminServiceImpl::Status(FrontCall* call, const v1::StatusRequest& req) {
  if (absl::Status st = AdmitAdmin(*call); !st.ok()) return gate_.Answer(call, st, req);
  const v1::StatusResponse resp = StatusNow();
  gate_.Answer(call, absl::OkStatus(), req, &resp);
}

v1::StatusResponse AdminServiceImpl::StatusNow() const {
  const Shard& shard = *gate_.shard;
  v1::StatusResponse r;
  r.set_shard_id(static_cast<uint32_t>(options_->shard_id));
  r.set_num_shards(options_->num_shards);
  r.set_serving(serving_());
  r.set_ready(shard.ready());
  r.set_layout_hash(shard.layout_hash());
  r.set_min_version(shard.MinVersion());
  r.set_max_version(shard.MaxVersion());
  const ShardStats st = shard.stats();
  r.set_rounds_closed(st.rounds_closed);
  r.set_pushes_accepted(st.pushes_accepted);
  uint64_t refused = 0;
  for (uint64_t n : st.refusals) refused += n;
  r.set_refusals(refused);
  for (size_t w = 0; w < st.workers.size(); ++w) {
    const Membership::State state = shard.membership(static_cast<uint32_t>(w));
    if (state == Membership::State::kSpare) continue;  // a spare id no one took yet
    const WorkerCounts& c = st.workers[w];
    v1::WorkerStatus* ws = r.add_workers();
    ws->set_worker(static_cast<uint32_t>(w));
    ws->set_joined(shard.joined(static_cast<uint32_t>(w)));
    ws->set_state(std::string(MembershipStateName(state)));
    ws->set_pushes_accepted(c.pushes_accepted);
    ws->set_udp_chunks_accepted(c.chunks_accepted);
    ws->set_late(c.refused(Refusal::kLate));
    uint64_t worker_refused = 0;
    for (uint64_t n : c.refusals) worker_refused += n;
    ws->set_refused(worker_refused);
    ws->set_malformed(c.refused(Refusal::kMalformed));
    ws->set_slice_rounds_missed(c.slice_rounds_missed);
    ws->set_quarantines(c.quarantines);
    ws->set_suspicion(c.suspicion.score);
    ws->set_suspected(c.suspicion.suspected);
    ws->set_windows_suspected(c.suspicion.windows_suspected);
    ws->set_mean_push_latency_seconds(
        c.pushes_accepted == 0 ? 0.0
                               : c.push_latency_seconds / static_cast<double>(c.pushes_accepted));
  }
  if (checkpointer_ != nullptr) {
    const Checkpointer::Info info = checkpointer_->info();
    r.set_last_checkpoint(info.last_path);
    r.set_last_checkpoint_unix_s(info.last_unix_s);
    r.set_restored_from(info.restored_from);
  }
  return r;
}

}  // namespace ps::server
