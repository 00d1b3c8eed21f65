#include <bit>
#include <chrono>
#include <memory>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/client_text.h"
#include "net/grpc_bytes.h"
#include "net/grpc_credentials.h"
#include "net/grpc_status.h"
#include "core/status.h"
#include "net/layout_proto.h"
#include "net/wire.h"
#include "server/metadata_auth.h"
#include "server/pull_scheduler.h"
#include "server/service_internal.h"
#include "spdlog/spdlog.h"

namespace ps::server {

uint64_t Fingerprint(std::string_view text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

absl::StatusOr<Caller> CallGate::Admit(const FrontCall& call) const {
  const absl::StatusOr<Caller>& caller = call.caller();
  if (!caller.ok()) {
    return shard->Refuse(Refusal::kUnauthenticated,
                         absl::StrCat(caller.status().message(), " (from ",
                                      const_cast<FrontCall&>(call).context().peer(), ")"));
  }
  if (!limiter->Allow(caller->Name())) {
    return shard->Refuse(Refusal::kRateLimited,
                         absl::StrCat(caller->Name(), " is over the rate limit (",
                                      shard->options().rate_limit, " requests/s); slow down"));
  }
  return caller;
}

std::string CallGate::ClientOf(const FrontCall& call) const {
  const absl::StatusOr<Caller>& caller = call.caller();
  return caller.ok() ? caller->Name() : std::string(kAnonymousClient);
}

void CallGate::Answer(FrontCall* call, const absl::Status& status, size_t request_bytes,
                      grpc::ByteBuffer response) const {
  std::string client;
  if (!status.ok() && tarpit != nullptr && Tarpit::Charges(status.code())) {
    client = ClientOf(*call);
  }
  // Peer shards are part of the service, not its clients: a refused share is lag (a
  // late round), and holding its answer would only slow the model rounds.
  if (client.empty() || client.starts_with("shard-")) {
    call->Reply(net::ToGrpc(status), std::move(response));
    return;
  }
  tarpit->Refuse(client, request_bytes,
                 [call, answer = net::ToGrpc(status)]() { call->Reply(answer, {}); });
}

void CallGate::Answer(FrontCall* call, const absl::Status& status,
                      const google::protobuf::MessageLite& request,
                      const google::protobuf::MessageLite* response) const {
  Answer(call, status, status.ok() ? 0 : request.ByteSizeLong(),
         status.ok() && response != nullptr ? net::SerializeMessage(*response)
                                            : grpc::ByteBuffer());
}

absl::StatusOr<uint32_t> CallGate::AdmitWorker(const FrontCall& call,
                                               std::string_view session) const {
  PS_ASSIGN_OR_RETURN(Caller caller, Admit(call));
  PS_ASSIGN_OR_RETURN(uint32_t worker, shard->Authenticate(session));
  const core::Identity owner{core::Identity::Kind::kWorker, worker};
  if (caller.identity.has_value() && !(*caller.identity == owner)) {
    return shard->Refuse(Refusal::kPermissionDenied,
                         absl::StrCat("this session belongs to ", owner.Name(), ", not to ",
                                      caller.identity->Name(), " (a session is not a credential)"));
  }
  return worker;
}

PullSlots::PullSlots(uint32_t num_workers, uint32_t per_worker)
    : per_worker_(per_worker), open_(num_workers, 0) {}

absl::StatusOr<PullSlots::Slot> PullSlots::Take(uint32_t worker) {
  absl::MutexLock lock(&mu_);
  if (open_[worker] >= per_worker_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "worker ", worker, " has ", open_[worker], " pull streams open on this shard, the most "
        "--max-pulls-per-worker allows; wait for one to end"));
  }
  ++open_[worker];
  return Slot(new std::pair<PullSlots*, uint32_t>(this, worker));
}

void PullSlots::Release::operator()(std::pair<PullSlots*, uint32_t>* slot) const {
  {
    absl::MutexLock lock(&slot->first->mu_);
    --slot->first->open_[slot->second];
  }
  delete slot;
}

uint32_t PullSlots::open(uint32_t worker) const {
  absl::MutexLock lock(&mu_);
  return open_[worker];
}

namespace {

// A unary method of `Req` on the front: the request parsed (a body that does not parse
// is refused as malformed, through the tarpit), then `handle`.
template <typename Req>
FrontMethod Unary(const CallGate& gate, std::function<void(FrontCall*, const Req&)> handle) {
  FrontMethod m;
  m.unary = [gate, handle = std::move(handle)](FrontCall* call, const grpc::ByteBuffer& raw) {
    Req req;
    if (absl::Status parsed = net::ParseMessage(raw, &req); !parsed.ok()) {
      gate.Answer(call, gate.shard->Refuse(Refusal::kMalformed, parsed.message()), raw.Length());
      return;
    }
    handle(call, req);
  };
  return m;
}

// One Pull as a gRPC stream: the PullScheduler picks the slices and their order; this
// writes each as a PullResponse (header, then the shared body) and ends the call.
class PullStream final : public StreamHandler, private PullSink {
 public:
  // `slot` is the worker's open-stream slot, given back when the stream is done.
  PullStream(Shard* shard, FrontCall* call, const net::PullRequestFrame& req, Metrics* metrics,
             PullSlots::Slot slot)
      : call_(call),
        slot_(std::move(slot)),
        scheduler_(shard, req.slice_ids, req.min_version, req.held_epoch, req.held_versions,
                   metrics) {}

  void Start() override { scheduler_.Start(this); }

  void OnWriteDone(bool ok) override {
    response_.Clear();  // drops this stream's reference to the snapshot
    scheduler_.WriteDone(ok);
  }

  void OnCancel() override { scheduler_.Cancel(); }

 private:
  // PullSink (called with the scheduler's lock held, one write at a time).
  void Write(PullItem item) override {
    const size_t bytes = item.body->size();
    response_ =
        net::HeaderAndBody(net::PullResponseHeader(item.header, bytes), std::move(item.body));
    call_->Write(&response_);
  }
  void Finish(const absl::Status& status) override { call_->Finish(net::ToGrpc(status)); }

  FrontCall* const call_;
  const PullSlots::Slot slot_;
  grpc::ByteBuffer response_;  // the message being written
  PullScheduler scheduler_;    // last: destroyed first, detaching this sink
};

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
  FrontMethod push;
  push.unary = [this](FrontCall* c, const grpc::ByteBuffer& r) { Push(c, r); };
  front->Add(path("Push"), std::move(push));
  FrontMethod pull;
  pull.stream = [this](FrontCall* c, const grpc::ByteBuffer& r) { return Pull(c, r); };
  front->Add(path("Pull"), std::move(pull));
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
  absl::StatusOr<JoinResult> r = shard_->Join(req.worker_id(), req.layout_hash());
  if (!r.ok()) return gate_.Answer(call, r.status(), req);
  const ServerOptions& o = shard_->options();
  v1::JoinResponse resp;
  resp.set_session(r->session);
  resp.set_shard_id(shard_->shard_id());
  resp.set_num_shards(o.num_shards);
  resp.set_num_workers(o.num_workers);
  resp.set_layout_registered(r->layout_registered);
  resp.set_ready(r->ready);
  resp.set_version(r->version);
  resp.set_aggregator(o.aggregator);
  resp.set_aggregate_only(o.aggregate_only);
  if (!o.aggregate_only) {
    resp.set_learning_rate(o.learning_rate);
    resp.set_momentum(o.momentum);
    resp.set_weight_decay(o.weight_decay);
  }
  if (udp_port_ != 0) {
    resp.set_udp_port(udp_port_);
    resp.set_udp_session(r->udp_session);
    resp.set_udp_key(r->udp_key);
  }
  gate_.Answer(call, absl::OkStatus(), req, &resp);
}

void WorkerServiceImpl::RegisterLayout(FrontCall* call, const v1::RegisterLayoutRequest& req) {
  absl::StatusOr<uint32_t> worker = gate_.AdmitWorker(*call, req.session());
  if (!worker.ok()) return gate_.Answer(call, worker.status(), req);
  const v1::Layout& msg = req.layout();
  v1::RegisterLayoutResponse resp;
  if (const core::ModelLayout* have = shard_->registered_layout(); have != nullptr) {
    // The common case, answered by comparing the request with the registered layout
    // (first difference ends it): no copy, no hash, whatever the request's size.
    const bool same = net::SameLayout(*have, msg);
    if (same) resp.set_layout_hash(have->hash());
    return gate_.Answer(call,
                        shard_->AnswerRegistered(
                            *have, *worker, same,
                            absl::StrCat("another (", msg.tensors_size(), " tensors, slice_elems ",
                                         msg.slice_elems(), ", num_shards ", msg.num_shards(), ")")),
                        req, &resp);
  }
  // Nothing is built from the request before the shard looked at its size.
  absl::StatusOr<std::vector<uint32_t>> owned = shard_->RegisterLayout(
      *worker, net::TensorsFromProto(msg), msg.slice_elems(), msg.num_shards());
  if (!owned.ok()) return gate_.Answer(call, owned.status(), req);
  resp.set_layout_hash(shard_->layout_hash());
  for (uint32_t id : *owned) resp.add_owned_slices(id);
  gate_.Answer(call, absl::OkStatus(), req, &resp);
}

void WorkerServiceImpl::InitSlice(FrontCall* call, const v1::InitSliceRequest& req) {
  absl::StatusOr<uint32_t> worker = gate_.AdmitWorker(*call, req.session());
  if (!worker.ok()) return gate_.Answer(call, worker.status(), req);
  v1::InitSliceResponse resp;
  gate_.Answer(call, shard_->InitSlice(*worker, req.layout_hash(), req.slice_id(), req.values()),
               req, &resp);
}

void WorkerServiceImpl::Push(FrontCall* call, const grpc::ByteBuffer& req) {
  // Timed only for the metrics (a clock read per push otherwise wasted).
  const auto start = metrics_ != nullptr ? std::chrono::steady_clock::now()
                                         : std::chrono::steady_clock::time_point{};
  const size_t request_bytes = req.Length();
  net::ReceivedBytes bytes;
  absl::Status s = bytes.Take(req);
  absl::StatusOr<net::PushFrame> frame =
      s.ok() ? net::ParsePushRequest(bytes.pieces()) : absl::StatusOr<net::PushFrame>(s);
  if (!frame.ok()) {
    return gate_.Answer(call, shard_->Refuse(Refusal::kMalformed, frame.status().message()),
                        request_bytes);
  }
  // The payload is decoded straight from gRPC's buffers (Codec::DecodePieces).
  std::string session_bytes, codec_bytes;
  const std::string_view session = frame->session.Contiguous(&session_bytes);
  absl::StatusOr<uint32_t> worker = gate_.AdmitWorker(*call, session);
  if (worker.ok()) {
    s = shard_->Push(*worker, frame->layout_hash, frame->round, frame->slice_id,
                     frame->codec.Contiguous(&codec_bytes), frame->payload.parts(), frame->loss);
  } else {
    s = worker.status();
  }
  if (metrics_ != nullptr) {
    metrics_->ObservePush(std::chrono::steady_clock::now() - start, frame->payload.size());
  }
  // PushResponse has no fields.
  gate_.Answer(call, s, request_bytes, s.ok() ? net::HeaderAndBody({}, nullptr) : grpc::ByteBuffer());
}

std::unique_ptr<StreamHandler> WorkerServiceImpl::Pull(FrontCall* call,
                                                       const grpc::ByteBuffer& raw) {
  const size_t request_bytes = raw.Length();
  // A worker pulls each slice of this shard at most once: a longer list is refused where
  // its first extra id is read, so a request naming millions of ids costs what was read
  // of it (the whole list before this shard has a layout, bounded by the layout limit).
  net::ReceivedBytes bytes;
  absl::Status taken = bytes.Take(raw);
  absl::StatusOr<net::PullRequestFrame> req =
      taken.ok() ? net::ParsePullRequest(bytes.pieces(), shard_->MaxPullSlices())
                 : absl::StatusOr<net::PullRequestFrame>(taken);
  if (!req.ok()) {
    gate_.Answer(call, shard_->Refuse(Refusal::kMalformed, req.status().message()), request_bytes);
    return nullptr;
  }
  std::string session_bytes;
  absl::StatusOr<uint32_t> worker = gate_.AdmitWorker(*call, req->session.Contiguous(&session_bytes));
  if (!worker.ok()) {
    gate_.Answer(call, worker.status(), request_bytes);
    return nullptr;
  }
  if (!req->held_versions.empty() && req->held_versions.size() != req->slice_ids.size()) {
    gate_.Answer(call,
                 shard_->Refuse(Refusal::kMalformed,
                                absl::StrCat("pull gives ", req->held_versions.size(),
                                             " held versions for ", req->slice_ids.size(),
                                             " slices")),
                 request_bytes);
    return nullptr;
  }
  absl::Status valid = shard_->ValidatePull(req->layout_hash, req->slice_ids);
  if (!valid.ok()) {
    gate_.Answer(call, valid, request_bytes);
    return nullptr;
  }
  absl::StatusOr<PullSlots::Slot> slot = pull_slots_.Take(*worker);
  if (!slot.ok()) {
    gate_.Answer(call, shard_->Refuse(Refusal::kOverLimit, slot.status().message()), request_bytes);
    return nullptr;
  }
  return std::make_unique<PullStream>(shard_, call, *req, metrics_, *std::move(slot));
}

void PeerServiceImpl::AddTo(GrpcFront* front) {
  front->Add("/ps.v1.PeerService/Hello",
             Unary<v1::PeerHelloRequest>(
                 gate_, [this](FrontCall* c, const v1::PeerHelloRequest& r) { Hello(c, r); }));
  front->Add("/ps.v1.PeerService/ShareRound",
             Unary<v1::RoundShareRequest>(
                 gate_, [this](FrontCall* c, const v1::RoundShareRequest& r) { ShareRound(c, r); }));
}

void PeerServiceImpl::Hello(FrontCall* call, const v1::PeerHelloRequest& req) {
  if (absl::Status st = AdmitPeer(*call, req.shard_id()); !st.ok()) {
    return gate_.Answer(call, st, req);
  }
  v1::PeerHelloResponse resp;
  resp.set_shard_id(self_.shard_id);
  resp.set_num_shards(self_.num_shards);
  resp.set_config_fingerprint(self_.config_fingerprint);
  resp.set_config_summary(self_.config_summary);
  resp.set_layout_hash(shard_->layout_hash());
  resp.set_ready(shard_->ready());
  resp.set_max_version(shard_->MaxVersion());
  if (req.config_fingerprint() != self_.config_fingerprint) {
    // The peer's own checker says so too; here at the 1st, 2nd, 4th, ... time, quoting
    // a bounded, printable part of what the caller sent.
    const uint64_t n = mismatches_.fetch_add(1) + 1;
    spdlog::log(std::has_single_bit(n) ? spdlog::level::err : spdlog::level::debug,
                "shard {}: peer shard {} runs another configuration ({} so far): theirs [{}], "
                "ours [{}]",
                self_.shard_id, req.shard_id(), n, core::ClientText(req.config_summary(), 512),
                self_.config_summary);
  }
  gate_.Answer(call, absl::OkStatus(), req, &resp);
}

void PeerServiceImpl::ShareRound(FrontCall* call, const v1::RoundShareRequest& req) {
  if (absl::Status st = AdmitPeer(*call, req.shard_id()); !st.ok()) {
    return gate_.Answer(call, st, req);
  }
  v1::RoundShareResponse resp;
  gate_.Answer(call, shard_->AcceptShare(FromProto(req)), req, &resp);
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
  absl::StatusOr<std::pair<std::string, uint64_t>> written = hooks_.checkpoint();
  if (!written.ok()) return gate_.Answer(call, written.status(), req);
  v1::CheckpointResponse resp;
  resp.set_path(written->first);
  resp.set_version(written->second);
  gate_.Answer(call, absl::OkStatus(), req, &resp);
}

void AdminServiceImpl::Status(FrontCall* call, const v1::StatusRequest& req) {
  if (absl::Status st = AdmitAdmin(*call); !st.ok()) return gate_.Answer(call, st, req);
  const v1::StatusResponse resp = hooks_.status();
  gate_.Answer(call, absl::OkStatus(), req, &resp);
}

absl::Status PeerServiceImpl::AdmitPeer(const FrontCall& call, uint32_t claimed) const {
  PS_ASSIGN_OR_RETURN(Caller caller, gate_.Admit(call));
  if (claimed == self_.shard_id || claimed >= self_.num_shards) {
    return shard_->Refuse(Refusal::kPermissionDenied,
                          absl::StrCat("a peer call as shard ", claimed, ", but this is shard ",
                                       self_.shard_id, " of ", self_.num_shards));
  }
  if (!caller.identity.has_value()) return absl::OkStatus();
  const core::Identity& id = *caller.identity;
  if (id.kind != core::Identity::Kind::kShard || id.index == self_.shard_id ||
      id.index >= self_.num_shards || id.index != claimed) {
    return shard_->Refuse(
        Refusal::kPermissionDenied,
        absl::StrCat(
            id.Name(), " may not call the peer service",
            id.kind == core::Identity::Kind::kShard ? absl::StrCat(" as shard ", claimed) : ""));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> PeerChannel(const std::string& address,
                                                           const core::ClientCredentials& creds,
                                                           const ServerOptions& options) {
  PS_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> channel_creds,
                      net::MakeChannelCredentials(creds));
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  args.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  net::ApplyChannelArguments(creds, &args);
  return grpc::CreateCustomChannel(address, channel_creds, args);
}

v1::RoundShareRequest ToProto(const RoundShare& share) {
  v1::RoundShareRequest req;
  req.set_layout_hash(share.layout_hash);
  req.set_shard_id(share.shard_id);
  req.set_round(share.round);
  req.mutable_participants()->Add(share.participants.begin(), share.participants.end());
  req.mutable_gram()->Add(share.gram.begin(), share.gram.end());
  return req;
}

RoundShare FromProto(const v1::RoundShareRequest& req) {
  RoundShare share;
  share.layout_hash = req.layout_hash();
  share.shard_id = req.shard_id();
  share.round = req.round();
  share.participants.assign(req.participants().begin(), req.participants().end());
  share.gram.assign(req.gram().begin(), req.gram().end());
  return share;
}

absl::Status CheckPeer(const PeerIdentity& self, uint64_t own_layout_hash, uint32_t expected_id,
                       const v1::PeerHelloResponse& peer) {
  if (peer.shard_id() != expected_id) {
    return absl::FailedPreconditionError(absl::StrCat("the peer listed as shard ", expected_id,
                                                      " says it is shard ", peer.shard_id()));
  }
  if (peer.num_shards() != self.num_shards) {
    return absl::FailedPreconditionError(absl::StrCat("shard ", expected_id, " has num_shards ",
                                                      peer.num_shards(), ", this shard ",
                                                      self.num_shards));
  }
  if (peer.config_fingerprint() != self.config_fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat("shard ", expected_id,
                                                      " runs another configuration: theirs [",
                                                      peer.config_summary(), "], ours [",
                                                      self.config_summary, "]"));
  }
  if (peer.layout_hash() != 0 && own_layout_hash != 0 && peer.layout_hash() != own_layout_hash) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", expected_id, " holds layout ", absl::Hex(peer.layout_hash()), ", this shard ",
        absl::Hex(own_layout_hash)));
  }
  return absl::OkStatus();
}

}  // namespace ps::server
