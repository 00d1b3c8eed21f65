#include "net/channel_auth.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/client_text.h"
#include "core/status.h"
#include "crypto/auth_proof.h"
#include "ps/v1/auth.grpc.pb.h"

namespace ps::net {

grpc::Status SendChallenge(const std::shared_ptr<grpc::ChannelInterface>& channel,
                           std::string_view key,
                           std::string_view client_nonce,
                           std::chrono::system_clock::time_point deadline, bool wait_for_ready) {
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline);
  ctx.set_wait_for_ready(wait_for_ready);
  ctx.AddMetadata("authorization", crypto::ChallengeHeader(key, client_nonce));
  v1::ChallengeResponse resp;
  return v1::AuthService::NewStub(channel)->Challenge(&ctx, v1::ChallengeRequest(), &resp);
}

ChannelAuth::ChannelAuth(std::shared_ptr<grpc::ChannelInterface> channel,
                         core::ClientCredentials credentials, std::string target,
                         std::optional<core::Identity> shard)
    : channel_(std::move(channel)),
      token_(std::move(credentials.token)),
      key_(token_.empty() ? std::string() : crypto::TokenKey(token_)),
      target_(std::move(target)),
      shard_(shard) {}

grpc::Status ChannelAuth::Attach(grpc::ClientContext* ctx, Deadline deadline,
                                 bool wait_for_ready) {
  if (token_.empty()) return grpc::Status::OK;
  mu_.Lock();
  // One challenge at a time: the others wait for its outcome (until their deadline).
  while (header_.empty() && challenging_) {
    if (mu_.AwaitWithDeadline(absl::Condition(
                                  +[](bool* c) { return !*c; }, &challenging_),
                              absl::FromChrono(deadline))) {
      continue;
    }
    mu_.Unlock();
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        absl::StrCat("waiting for the challenge of ", target_));
  }
  if (!header_.empty()) {
    ctx->AddMetadata("authorization", header_);
    mu_.Unlock();
    return grpc::Status::OK;
  }
  challenging_ = true;
  mu_.Unlock();
  std::string header, instance;
  core::Identity server;
  const grpc::Status s = Challenge(deadline, wait_for_ready, &header, &instance, &server);
  absl::MutexLock lock(&mu_);
  challenging_ = false;
  if (!s.ok()) return s;
  header_ = header;
  instance_ = std::move(instance);
  proven_ = server;
  ++challenges_;
  ctx->AddMetadata("authorization", header);
  return grpc::Status::OK;
}

bool ChannelAuth::Stale(const grpc::Status& status) {
  if (token_.empty() || status.error_code() != grpc::StatusCode::UNAUTHENTICATED) return false;
  std::optional<std::string> instance = crypto::StaleInstance(status.error_message());
  if (!instance.has_value()) return false;
  absl::MutexLock lock(&mu_);
  // A proof for the process proven last: forget it. (Another call may have run the
  // challenge again already; its proof stays.)
  if (*instance == instance_) header_.clear();
  return true;
}

std::optional<core::Identity> ChannelAuth::proven_shard() const {
  absl::MutexLock lock(&mu_);
  return proven_;
}

uint64_t ChannelAuth::challenges() const {
  absl::MutexLock lock(&mu_);
  return challenges_;
}

grpc::Status ChannelAuth::NotProven(std::string_view why) const {
  return grpc::Status(
      grpc::StatusCode::UNAUTHENTICATED,
      absl::StrCat("the process listening on ", target_,
                   " could not prove it holds this run's secret: another process may have taken "
                   "the shard's port (or this client's token is not one the shard knows): ",
                   core::AsAbsl(why)));
}

grpc::Status ChannelAuth::Challenge(Deadline deadline, bool wait_for_ready, std::string* header,
                                    std::string* instance, core::Identity* server) const {
  absl::StatusOr<std::string> client_nonce = crypto::NewNonce();
  if (!client_nonce.ok()) {
    return grpc::Status(grpc::StatusCode::INTERNAL, std::string(client_nonce.status().message()));
  }
  const grpc::Status s =
      SendChallenge(channel_, key_, *client_nonce, deadline, wait_for_ready);
  switch (s.error_code()) {
    case grpc::StatusCode::UNAUTHENTICATED:
      break;  // an answer, or the shard's refusal
    case grpc::StatusCode::OK:
      return NotProven("it accepted the challenge as a call");
    case grpc::StatusCode::UNIMPLEMENTED:
      return NotProven(
          "it does not answer the challenge (a shard started with --insecure does not; a "
          "client holding a token talks only to a shard that proves it holds the token)");
    default:
      return grpc::Status(s.error_code(), absl::StrCat("authenticating to ", target_, ": ",
                                                       s.error_message()));
  }
  std::optional<crypto::ChallengeReply> reply = crypto::ParseChallengeAnswer(s.error_message());
  if (!reply.has_value()) {
    if (s.error_message().starts_with(crypto::kChallengeAnswerPrefix)) {
      return NotProven("its answer to the challenge is malformed");
    }
    // The shard (or whatever listens) refused the challenge: an unknown token, ...
    return grpc::Status(s.error_code(), absl::StrCat("authenticating to ", target_, ": ",
                                                     s.error_message()));
  }
  const std::string server_name = reply->server.Name();
  if (reply->server.kind != core::Identity::Kind::kShard ||
      !crypto::SameProof(reply->proof, crypto::ServerProof(token_, key_, server_name, *client_nonce,
                                                       reply->server_nonce))) {
    return NotProven(absl::StrCat("its answer to the challenge (as ",
                                  core::ClientText(server_name), ") does not verify"));
  }
  if (shard_.has_value() && !(reply->server == *shard_)) {
    // It holds the token (a shard of this run), but it is not the one expected there.
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat(target_, " is ", server_name, " of this run, not ", shard_->Name(),
                     ": list the shards' addresses in the order of their shard ids"));
  }
  *header = crypto::ProofHeader(
      key_, reply->server_nonce,
      crypto::CallProof(token_, key_, server_name, reply->server_nonce));
  *instance = crypto::InstanceId(reply->server_nonce);
  *server = reply->server;
  return grpc::Status::OK;
}

}  // namespace ps::net
