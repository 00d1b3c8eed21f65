#include "hand_client.h"

#include <deque>
#include <gtest/gtest.h>

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "auth_util.h"
#include "net/data_frame.h"
#include "net/grpc_status.h"

namespace ps::testing {

namespace {

// A session id no Join gave: the real one with every bit of its low half flipped.
constexpr uint64_t kForgedBits = 0xffffffffull;

}  // namespace

HandClient::HandClient(std::string address, std::string token, uint32_t worker,
                       uint64_t layout_hash)
    : address_(std::move(address)),
      token_(std::move(token)),
      worker_(worker),
      layout_hash_(layout_hash),
      stub_(v1::WorkerService::NewStub(
          grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()))) {
  v1::JoinRequest req;
  req.set_worker_id(worker);
  req.set_layout_hash(layout_hash);
  req.set_data_plane(v1::DATA_PLANE_ANY);  // whichever the shard runs
  const grpc::Status s = stub_->Join(Context().get(), req, &join_);
  joined_ = s.ok();
  EXPECT_TRUE(joined_) << s.error_message();
  if (joined_ && join_.data_plane() == v1::DATA_PLANE_TCP) {
    const absl::Status connected = Connected();
    joined_ = connected.ok();
    EXPECT_TRUE(joined_) << connected;
  }
}

HandClient::~HandClient() = default;

core::DataPlane HandClient::plane() const {
  return join_.data_plane() == v1::DATA_PLANE_TCP ? core::DataPlane::kTcp
                                                  : core::DataPlane::kGrpc;
}

size_t HandClient::longest_codec() const {
  return plane() == core::DataPlane::kGrpc ? size_t{1} << 20 : net::kMaxFrameCodecBytes;
}

std::unique_ptr<grpc::ClientContext> HandClient::Context() const {
  return testing::Context(address_, token_);
}

absl::StatusOr<std::unique_ptr<DataPortClient>> HandClient::NewDataConnection() const {
  auto data = std::make_unique<DataPortClient>(static_cast<uint16_t>(join_.data_port()));
  if (!data->connected()) return absl::UnavailableError("the data port refused the connection");
  absl::StatusOr<net::AdmitMeta> admitted = data->Handshake(
      join_.data_session(), worker_,
      DataConnectionKey(token_, join_.shard_id(), join_.data_session(), join_.data_secret()),
      join_.shard_id());
  if (!admitted.ok()) return admitted.status();
  return data;
}

absl::Status HandClient::Connected() {
  if (data_ != nullptr) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<DataPortClient>> data = NewDataConnection();
  if (!data.ok()) return data.status();
  data_ = *std::move(data);
  early_.clear();
  return absl::OkStatus();
}

absl::StatusOr<std::string> HandClient::PushFrame(uint64_t tag, const HandPush& push) const {
  std::string frame;
  absl::Status framed = net::AppendPush(tag,
                                        net::PushMeta{.layout_hash = push.layout_hash.value_or(layout_hash_),
                                                      .round = push.round,
                                                      .slice_id = push.slice,
                                                      .codec = push.codec},
                                        push.payload.size(), &frame);
  if (!framed.ok()) return framed;
  return frame + push.payload;
}

absl::Status HandClient::PushOn(DataPortClient& connection, uint64_t tag,
                                const HandPush& push) const {
  absl::StatusOr<std::string> frame = PushFrame(tag, push);
  if (!frame.ok()) return frame.status();
  if (!connection.Send(*frame)) return absl::UnavailableError("the PUSH was not sent");
  absl::StatusOr<DataFrame> answer = connection.Read();
  if (!answer.ok()) return answer.status();
  return DataPortClient::StatusOf(*answer);
}

absl::StatusOr<DataFrame> HandClient::FrameFor(uint64_t tag) {
  for (auto it = early_.begin(); it != early_.end(); ++it) {
    if (it->header.tag == tag) {
      DataFrame f = std::move(*it);
      early_.erase(it);
      return f;
    }
  }
  while (data_ != nullptr) {
    absl::StatusOr<DataFrame> f = data_->Read();
    if (!f.ok()) {
      data_.reset();
      return f.status();
    }
    if (f->header.type == net::FrameType::kGoaway) {
      data_.reset();
      return f;
    }
    if (f->header.tag == tag) return f;
    early_.push_back(*std::move(f));
  }
  return absl::UnavailableError("no data connection");
}

absl::Status HandClient::GrpcPush(const HandPush& push, const std::string& session) {
  v1::PushRequest req;
  req.set_session(session);
  req.set_layout_hash(push.layout_hash.value_or(layout_hash_));
  req.set_round(push.round);
  req.set_slice_id(push.slice);
  req.set_codec(push.codec);
  req.set_payload(push.payload);
  v1::PushResponse resp;
  return net::FromGrpc(stub_->Push(Context().get(), req, &resp));
}

absl::Status HandClient::Push(const HandPush& push) {
  if (plane() == core::DataPlane::kGrpc) return GrpcPush(push, join_.session());
  if (absl::Status s = Connected(); !s.ok()) return s;
  const uint64_t tag = ++tag_;
  absl::StatusOr<std::string> frame = PushFrame(tag, push);
  if (!frame.ok()) return frame.status();
  // A shard refuses a PUSH from its header (a body over --max-message-bytes) and ends
  // the connection without reading the body, so the send may fail part way: the answer
  // it sent first is still there to read, as a worker would.
  const bool sent = data_->Send(*frame);
  absl::StatusOr<DataFrame> answer = FrameFor(tag);
  if (!answer.ok()) {
    return sent ? answer.status() : absl::UnavailableError("the PUSH was not sent");
  }
  return DataPortClient::StatusOf(*answer);
}

absl::Status HandClient::PushUnderForgedSession(const HandPush& push) {
  if (plane() == core::DataPlane::kGrpc) {
    std::string forged = join_.session();  // of the same length, every byte another
    for (char& c : forged) c = static_cast<char>(c ^ 0x5a);
    return GrpcPush(push, forged);
  }
  // The shard refuses the HELLO before any proof: the push never leaves.
  const uint64_t forged = join_.data_session() ^ kForgedBits;
  DataPortClient other(static_cast<uint16_t>(join_.data_port()));
  if (!other.connected()) return absl::UnavailableError("the data port refused the connection");
  absl::StatusOr<net::AdmitMeta> admitted = other.Handshake(
      forged, worker_,
      DataConnectionKey(token_, join_.shard_id(), forged, join_.data_secret()), join_.shard_id());
  if (admitted.ok()) return absl::InternalError("a data connection under a forged session was admitted");
  return admitted.status();
}

// gRPC: the generated stub's server stream.
class HandClient::GrpcPull final : public PullStream {
 public:
  GrpcPull(HandClient& client, const HandPull& pull) : ctx_(client.Context()) {
    v1::PullRequest req;
    req.set_session(client.join_.session());
    req.set_layout_hash(client.layout_hash_);
    req.set_min_version(pull.min_version);
    for (uint32_t id : pull.slice_ids) req.add_slice_ids(id);
    for (uint64_t v : pull.held_versions) req.add_held_versions(v);
    ctx_->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    reader_ = client.stub_->Pull(ctx_.get(), req);
  }

  absl::StatusOr<std::optional<PulledSlice>> Next() override {
    v1::PullResponse resp;
    if (reader_->Read(&resp)) {
      return PulledSlice{.slice_id = resp.slice_id(),
                         .version = resp.version(),
                         .queued = resp.queued(),
                         .codec = resp.codec(),
                         .values = resp.values()};
    }
    const absl::Status end = net::FromGrpc(reader_->Finish());
    if (!end.ok()) return end;
    return std::nullopt;
  }

 private:
  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::ClientReader<v1::PullResponse>> reader_;
};

// TCP: a PULL frame, then the SLICE and SLICES frames of its tag until its PULL_END.
class HandClient::TcpPull final : public PullStream {
 public:
  TcpPull(HandClient& client, const HandPull& pull) : client_(client), tag_(++client.tag_) {
    if (start_ = client.Connected(); !start_.ok()) return;
    std::string frame;
    start_ = net::AppendPull(tag_,
                             net::PullMeta{.layout_hash = client.layout_hash_,
                                           .min_version = pull.min_version,
                                           .count = static_cast<uint32_t>(pull.slice_ids.size()),
                                           .held = !pull.held_versions.empty()},
                             pull.slice_ids, pull.held_versions, &frame);
    if (start_.ok() && !client.data_->Send(frame)) {
      client.data_.reset();
      start_ = absl::UnavailableError("the PULL was not sent");
    }
  }

  absl::StatusOr<std::optional<PulledSlice>> Next() override {
    if (!start_.ok()) return start_;
    if (!pending_.empty()) {
      PulledSlice next = std::move(pending_.front());
      pending_.pop_front();
      return next;
    }
    if (ended_) return std::nullopt;
    absl::StatusOr<DataFrame> f = client_.FrameFor(tag_);
    if (!f.ok()) return f.status();
    if (f->header.type == net::FrameType::kSlices) {
      // Several slices in one frame: handed out one by one, in the frame's order.
      absl::StatusOr<net::SlicesMeta> meta = net::ParseSlicesMeta(f->header, f->meta);
      if (!meta.ok()) return meta.status();
      size_t at = 0;
      for (uint32_t i = 0; i < meta->count; ++i) {
        const net::SlicesEntry& e = meta->entries[i];
        pending_.push_back(PulledSlice{.slice_id = e.slice_id,
                                       .version = e.version,
                                       .queued = e.queued,
                                       .codec = std::string(meta->codec),
                                       .values = f->body.substr(at, e.body_bytes)});
        at += e.body_bytes;
      }
      return Next();
    }
    if (f->header.type != net::FrameType::kSlice) {
      ended_ = true;
      const absl::Status end = DataPortClient::StatusOf(*f);
      if (!end.ok()) return end;
      return std::nullopt;
    }
    absl::StatusOr<net::PullHeader> meta = net::ParseSliceMeta(f->header.flags, f->meta);
    if (!meta.ok()) return meta.status();
    return PulledSlice{.slice_id = meta->slice_id,
                       .version = meta->version,
                       .queued = meta->queued,
                       .codec = std::string(meta->codec),
                       .values = std::move(f->body)};
  }

 private:
  HandClient& client_;
  uint64_t tag_;
  absl::Status start_;
  bool ended_ = false;
  std::deque<PulledSlice> pending_;  // the rest of a SLICES
};

std::unique_ptr<HandClient::PullStream> HandClient::OpenPull(const HandPull& pull) {
  if (plane() == core::DataPlane::kGrpc) return std::make_unique<GrpcPull>(*this, pull);
  return std::make_unique<TcpPull>(*this, pull);
}

absl::StatusOr<std::vector<PulledSlice>> HandClient::Pull(const HandPull& pull) {
  std::unique_ptr<PullStream> stream = OpenPull(pull);
  std::vector<PulledSlice> slices;
  while (true) {
    absl::StatusOr<std::optional<PulledSlice>> next = stream->Next();
    if (!next.ok()) return next.status();
    if (!next->has_value()) return slices;
    slices.push_back(**std::move(next));
  }
}

}  // namespace ps::testing
