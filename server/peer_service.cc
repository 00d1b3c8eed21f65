#include <bit>
#include <chrono>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/client_text.h"
#include "core/status.h"
#include "net/channel_auth.h"
#include "net/grpc_credentials.h"
#include "server/service_internal.h"
#include "spdlog/spdlog.h"

// ps.v1.PeerService (the shards' calls to each other) and the peer links' client side.
namespace ps::server {

uint64_t Fingerprint(std::string_view text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

void PeerServiceImpl::AddTo(GrpcFront* front) {
  front->Add("/ps.v1.PeerService/Hello",
             Unary<v1::PeerHelloRequest>(
                 gate_, [this](FrontCall* c, const v1::PeerHelloRequest& r) { Hello(c, r); }));
  front->Add("/ps.v1.PeerService/ShareRound",
             Unary<v1::RoundShareRequest>(
                 gate_, [this](FrontCall* c, const v1::RoundShareRequest& r) { ShareRound(c, r); }));
}

namespace {
// A shard's identity as a greeting and its answer both carry it.
template <typename Message>
void SetIdentity(const PeerIdentity& self, uint64_t layout_hash, Message* m) {
  m->set_shard_id(self.shard_id);
  m->set_num_shards(self.num_shards);
  m->set_config_fingerprint(self.config_fingerprint);
  m->set_config_summary(self.config_summary);
  m->set_layout_hash(layout_hash);
}
}  // namespace

void PeerServiceImpl::Hello(FrontCall* call, const v1::PeerHelloRequest& req) {
  if (absl::Status st = AdmitPeer(*call, req.shard_id()); !st.ok()) {
    return gate_.Answer(call, st, req);
  }
  v1::PeerHelloResponse resp;
  SetIdentity(self_, shard_->layout_hash(), &resp);
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

PeerIdentity PeerIdentityOf(const ServerOptions& options) {
  PeerIdentity id{.shard_id = static_cast<uint32_t>(options.shard_id),
                  .num_shards = options.num_shards};
  id.config_summary = options.ConsistencySummary();
  id.config_fingerprint = Fingerprint(id.config_summary);
  return id;
}

absl::StatusOr<PeerLinks> ConnectPeers(const ServerOptions& options,
                                       const core::ClientCredentials& creds) {
  PeerLinks links;
  for (uint32_t i = 0; i < options.num_shards && options.num_shards > 1; ++i) {
    links.channels.emplace_back();
    links.auths.emplace_back();
    if (static_cast<int>(i) == options.shard_id) continue;
    PS_ASSIGN_OR_RETURN(links.channels.back(), PeerChannel(options.peers[i], creds, options));
    links.auths.back() = std::make_shared<net::ChannelAuth>(
        links.channels.back(), creds, options.peers[i],
        core::Identity{core::Identity::Kind::kShard, i});
  }
  return links;
}

GrpcPeerGreeter::GrpcPeerGreeter(PeerIdentity self, const Shard* shard, const PeerLinks& links)
    : self_(std::move(self)), shard_(shard), links_(links), stubs_(links.channels.size()) {
  for (size_t i = 0; i < stubs_.size(); ++i) {
    if (links.channels[i] != nullptr) stubs_[i] = v1::PeerService::NewStub(links.channels[i]);
  }
}

absl::StatusOr<PeerReply> GrpcPeerGreeter::Hello(uint32_t peer) {
  v1::PeerHelloRequest req;
  SetIdentity(self_, shard_->layout_hash(), &req);
  v1::PeerHelloResponse resp;
  const grpc::Status s = links_.auths[peer]->Unary(
      std::chrono::system_clock::now() + std::chrono::seconds(2), /*wait_for_ready=*/false,
      [&](grpc::ClientContext* ctx) { return stubs_[peer]->Hello(ctx, req, &resp); });
  if (!s.ok()) return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  return PeerReply{.agreement = CheckPeer(self_, shard_->layout_hash(), peer, resp),
                   .ready = resp.ready(),
                   .max_version = resp.max_version()};
}

}  // namespace ps::server
