#include "bench/hostile_clients.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "crypto/auth_proof.h"
#include "core/credentials.h"
#include "net/channel_auth.h"
#include "net/grpc_credentials.h"

namespace ps::bench {

core::ModelLayout HonestLayout() {
  return *core::ModelLayout::Create({{"w1", 32768, 0}, {"w2", 1024, 1}}, kSliceElems, 1);
}

std::string CodeName(int code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

// ---- Calls ---------------------------------------------------------------------------

AttackerProofs& AttackerProofs::Get() {
  static AttackerProofs* proofs = new AttackerProofs();
  return *proofs;
}

void AttackerProofs::Reset(const std::string& address) {
  absl::MutexLock lock(&mu_);
  channel_ = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  headers_.clear();
}

std::string AttackerProofs::Header(std::string_view token) {
  absl::MutexLock lock(&mu_);
  auto it = headers_.find(token);
  if (it != headers_.end()) return it->second;
  const std::string key = crypto::TokenKey(token);
  absl::StatusOr<std::string> nonce = crypto::NewNonce();
  std::string header;
  if (nonce.ok() && channel_ != nullptr) {
    const grpc::Status s = net::SendChallenge(
        channel_, key, *nonce, std::chrono::system_clock::now() + kCallDeadline, true);
    if (std::optional<crypto::ChallengeReply> r = crypto::ParseChallengeAnswer(s.error_message())) {
      header = crypto::ProofHeader(
          key, r->server_nonce, crypto::CallProof(token, key, r->server.Name(), r->server_nonce));
    }
  }
  headers_.emplace(std::string(token), header);
  return header;
}

void Prepare(grpc::ClientContext& ctx, std::string_view token,
             std::chrono::milliseconds deadline) {
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  if (token.empty()) return;
  if (const std::string header = AttackerProofs::Get().Header(token); !header.empty()) {
    ctx.AddMetadata("authorization", header);
  }
}

std::shared_ptr<grpc::Channel> OwnChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(-1);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
      net::MakeChannelCredentials(core::ClientCredentials{});
  return grpc::CreateCustomChannel(address,
                                   creds.ok() ? *creds : grpc::InsecureChannelCredentials(), args);
}

grpc::Status CallRaw(grpc::GenericStub& stub, const std::string& method, const std::string& bytes,
                     std::string_view token) {
  grpc::ClientContext ctx;
  Prepare(ctx, token);
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

std::string WithInvalidUtf8(const google::protobuf::Message& message) {
  std::string bytes = message.SerializeAsString();
  for (size_t at = bytes.find(kUtf8Marker); at != std::string::npos;
       at = bytes.find(kUtf8Marker, at)) {
    std::fill_n(bytes.begin() + std::ptrdiff_t(at), kUtf8Marker.size(), '\xff');
  }
  return bytes;
}

std::string Garbage(std::mt19937_64& rng, size_t max_bytes) {
  std::string out(1 + rng() % std::max<size_t>(max_bytes, 1), '\0');
  for (size_t i = 1; i < out.size(); i += 8) {
    const uint64_t r = rng();
    std::memcpy(out.data() + i, &r, std::min<size_t>(8, out.size() - i));
  }
  out[0] = '\x01';
  return out;
}

std::string SpecSource::Next() {
  const uint64_t k = next_.fetch_add(1);
  const uint64_t step = k / 3;
  const uint64_t bucket = 1 + step % (uint64_t{1} << 24);
  switch (k % 3) {
    case 0:
      return absl::StrCat("int8(bucket=", bucket, ")");
    case 1:
      return absl::StrCat("terngrad(bucket=", bucket, ")");
    default:
      return absl::StrCat("qsgd(s=", 1 + step % 65536, ",bucket=", 1 + step / 65536 % 4096, ")");
  }
}

// ---- Tally ------------------------------------------------------------------------------

void Tally::Count(const grpc::Status& s) {
  requests_.fetch_add(1);
  phase_requests_.fetch_add(1);
  codes_[std::clamp(int(s.error_code()), 0, kStatusCodes - 1)].fetch_add(1);
}

void Tally::CountOther(uint64_t n) {
  requests_.fetch_add(n);
  phase_requests_.fetch_add(n);
}

void Tally::Accepted(std::string what) {
  accepted_.fetch_add(1);
  Note(std::move(what));
}

void Tally::Note(std::string note) {
  absl::MutexLock lock(&mu_);
  if (notes_.size() < 8 && std::find(notes_.begin(), notes_.end(), note) == notes_.end()) {
    notes_.push_back(std::move(note));
  }
}

std::vector<std::string> Tally::notes() const {
  absl::MutexLock lock(&mu_);
  return notes_;
}

// ---- Attacker -----------------------------------------------------------------------------

std::string Attacker::session() const {
  absl::MutexLock lock(&mu_);
  return session_;
}

grpc::Status Attacker::Join(v1::WorkerService::Stub& stub) {
  grpc::ClientContext ctx;
  Prepare(ctx, token_);
  v1::JoinRequest req;
  req.set_worker_id(kAttackerId);
  req.set_layout_hash(layout_hash_);
  // Either plane: the data_* attacks' servers run --data-plane tcp.
  req.set_data_plane(v1::DATA_PLANE_ANY);
  v1::JoinResponse resp;
  grpc::Status s = stub.Join(&ctx, req, &resp);
  if (s.ok()) {
    absl::MutexLock lock(&mu_);
    session_ = resp.session();
    udp_port_ = static_cast<uint16_t>(resp.udp_port());
    udp_session_ = resp.udp_session();
    // The datagrams' key: the UDP secret bound to the token (crypto::UdpKey), or the
    // secret itself without one.
    udp_key_ = crypto::BoundUdpKey(token_, absl::StrCat("shard-", resp.shard_id()),
                                   resp.udp_session(), resp.udp_key());
    data_port_ = static_cast<uint16_t>(resp.data_port());
    data_session_ = resp.data_session();
    data_secret_ = resp.data_secret();
  }
  return s;
}

#if PS_HAVE_DATA_PORT_CLIENT
DataPortTarget Attacker::data_target() const {
  absl::MutexLock lock(&mu_);
  return {.port = data_port_,
          .worker = kAttackerId,
          .token = token_,
          .data_session = data_session_,
          .data_secret = data_secret_};
}
#endif

uint16_t Attacker::udp_port() const {
  absl::MutexLock lock(&mu_);
  return udp_port_;
}

uint64_t Attacker::udp_session() const {
  absl::MutexLock lock(&mu_);
  return udp_session_;
}

std::string Attacker::udp_key() const {
  absl::MutexLock lock(&mu_);
  return udp_key_;
}

}  // namespace ps::bench
