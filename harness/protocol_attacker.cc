#include "harness/protocol_attacker.h"

#include <grpcpp/grpcpp.h>

#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codecs/codec.h"
#include "net/channel_auth.h"
#include "net/grpc_credentials.h"
#include "net/grpc_status.h"
#include "core/status.h"
#include "ps/v1/ps.grpc.pb.h"

namespace ps::harness {
namespace {

constexpr std::string_view kNames[] = {"garbage", "impersonate", "oversize", "duplicate",
                                       "replay", "old_round", "future_round"};
constexpr ProtocolAttack kKinds[] = {ProtocolAttack::kGarbage, ProtocolAttack::kImpersonate,
                                     ProtocolAttack::kOversize, ProtocolAttack::kDuplicate,
                                     ProtocolAttack::kReplay, ProtocolAttack::kOldRound,
                                     ProtocolAttack::kFutureRound};
// Above ps-server's default --max-message-bytes (8 MiB).
constexpr size_t kOversizeBytes = 9u << 20;

}  // namespace

absl::StatusOr<ProtocolAttack> ParseProtocolAttack(std::string_view name) {
  for (size_t i = 0; i < std::size(kNames); ++i) {
    if (kNames[i] == name) return kKinds[i];
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown protocol attack '", core::AsAbsl(name),
                                                 "'; known: ", absl::StrJoin(ProtocolAttackNames(), ", ")));
}

std::vector<std::string> ProtocolAttackNames() { return {std::begin(kNames), std::end(kNames)}; }

struct ProtocolAttacker::Impl {
  std::unique_ptr<v1::WorkerService::Stub> stub;
  std::unique_ptr<net::ChannelAuth> auth;  // the token's proof on every call
  std::string session;
  uint64_t layout_hash = 0;
  std::vector<uint32_t> slice_numel;
  std::optional<v1::PushRequest> last_valid;
  std::mt19937_64 rng{0x6261'6462'7974'6573ull};

  absl::Status Send(const v1::PushRequest& r) {
    v1::PushResponse resp;
    return net::FromGrpc(auth->Unary(std::chrono::system_clock::now() + std::chrono::seconds(30),
                                     /*wait_for_ready=*/false,
                                     [&](grpc::ClientContext* ctx) { return stub->Push(ctx, r, &resp); }));
  }

  absl::StatusOr<v1::PushRequest> Valid(uint64_t round, uint32_t slice_id, std::span<const float> values) {
    if (slice_id >= slice_numel.size()) {
      return absl::InvalidArgumentError(absl::StrCat("slice ", slice_id, " is not in the layout"));
    }
    v1::PushRequest r;
    r.set_session(session);
    r.set_layout_hash(layout_hash);
    r.set_round(round);
    r.set_slice_id(slice_id);
    r.set_codec("fp32");
    PS_ASSIGN_OR_RETURN(std::unique_ptr<codecs::Codec> codec, codecs::MakeCodec("fp32"));
    PS_RETURN_IF_ERROR(codec->Encode(values, r.mutable_payload()));
    return r;
  }
};

ProtocolAttacker::ProtocolAttacker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProtocolAttacker::~ProtocolAttacker() = default;

absl::StatusOr<std::unique_ptr<ProtocolAttacker>> ProtocolAttacker::Join(
    const std::string& address, uint32_t worker_id, const core::ModelLayout& layout,
    std::chrono::milliseconds timeout, const core::ClientCredentials& credentials) {
  PS_RETURN_IF_ERROR(credentials.Validate());
  PS_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> channel_credentials,
                      net::MakeChannelCredentials(credentials));
  grpc::ChannelArguments args;
  net::ApplyChannelArguments(credentials, &args);
  // The oversize attack must reach the shard: the channel's own send limit stays off.
  args.SetMaxSendMessageSize(-1);
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(address, channel_credentials, args);
  auto impl = std::make_unique<Impl>();
  impl->stub = v1::WorkerService::NewStub(channel);
  impl->auth = std::make_unique<net::ChannelAuth>(channel, credentials, address);
  impl->layout_hash = layout.hash();
  for (const core::SliceInfo& s : layout.slices()) impl->slice_numel.push_back(s.numel);
  v1::JoinRequest join;
  join.set_worker_id(worker_id);
  join.set_layout_hash(layout.hash());
  v1::JoinResponse resp;
  PS_RETURN_IF_ERROR(net::FromGrpc(impl->auth->Unary(
      std::chrono::system_clock::now() + timeout, /*wait_for_ready=*/true,
      [&](grpc::ClientContext* ctx) { return impl->stub->Join(ctx, join, &resp); })));
  impl->session = resp.session();
  return std::unique_ptr<ProtocolAttacker>(new ProtocolAttacker(std::move(impl)));
}

absl::Status ProtocolAttacker::PushValid(uint64_t round, uint32_t slice_id, std::span<const float> values) {
  PS_ASSIGN_OR_RETURN(v1::PushRequest r, impl_->Valid(round, slice_id, values));
  impl_->last_valid = r;
  return impl_->Send(r);
}

absl::Status ProtocolAttacker::Send(ProtocolAttack attack, uint64_t round, uint32_t slice_id) {
  const bool needs_last = attack == ProtocolAttack::kDuplicate || attack == ProtocolAttack::kReplay ||
                          attack == ProtocolAttack::kImpersonate;
  if (needs_last && !impl_->last_valid.has_value()) {
    return absl::FailedPreconditionError("duplicate, replay and impersonate resend an earlier PushValid");
  }
  if (needs_last) {
    v1::PushRequest r = *impl_->last_valid;
    if (attack == ProtocolAttack::kImpersonate) {
      std::string forged(16, '\0');
      for (char& c : forged) c = static_cast<char>(impl_->rng());
      r.set_session(forged);
    }
    return impl_->Send(r);
  }
  if (slice_id >= impl_->slice_numel.size()) {
    return absl::InvalidArgumentError(absl::StrCat("slice ", slice_id, " is not in the layout"));
  }
  const std::vector<float> values(impl_->slice_numel[slice_id], 0.5f);
  switch (attack) {
    case ProtocolAttack::kGarbage: {
      // Random bytes, 3 more than an fp32 payload: refused whatever they hold.
      PS_ASSIGN_OR_RETURN(v1::PushRequest r, impl_->Valid(round, slice_id, values));
      std::string& payload = *r.mutable_payload();
      payload.resize(payload.size() + 3);
      for (char& c : payload) c = static_cast<char>(impl_->rng());
      return impl_->Send(r);
    }
    case ProtocolAttack::kOversize: {
      PS_ASSIGN_OR_RETURN(v1::PushRequest r, impl_->Valid(round, slice_id, values));
      r.mutable_payload()->assign(kOversizeBytes, 'x');
      return impl_->Send(r);
    }
    case ProtocolAttack::kOldRound: {
      if (round == 0) return absl::InvalidArgumentError("old_round needs round >= 1");
      PS_ASSIGN_OR_RETURN(v1::PushRequest r, impl_->Valid(round - 1, slice_id, values));
      return impl_->Send(r);
    }
    case ProtocolAttack::kFutureRound: {
      PS_ASSIGN_OR_RETURN(v1::PushRequest r, impl_->Valid(round + 5, slice_id, values));
      return impl_->Send(r);
    }
    default:
      return absl::InternalError("unreachable");
  }
}

}  // namespace ps::harness
