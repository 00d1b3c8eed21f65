// The worker's TCP data channel (worker_lib/transport/tcp/channel.h) against a scripted
// shard on a real loopback socket, speaking net/data_frame.h byte for byte: the
// handshake and who proves what, pushes answered by tag with their refusal kinds, dense
// slices read straight into the caller's place, a shard that cannot prove the session,
// a GOAWAY, a lost connection failing what was in flight before the next call connects
// again, and a shard stalling mid-frame (past a pull's deadline, or a call's behind it).
#include "worker_lib/transport/tcp/channel.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "core/refusal.h"
#include "crypto/auth_proof.h"
#include "net/data_frame.h"

namespace ps::internal::tcp_plane {
namespace {

constexpr uint64_t kSession = 77;
const std::string kSecret(32, 's');
const std::string kToken = "the worker's token";

struct Frame {
  net::FrameHeader header;
  std::string meta;
  std::string body;
};

// One end of the data port, driven step by step by the test (blocking sockets).
class ScriptedShard {
 public:
  ScriptedShard() {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(listen_fd_, 4), 0);
    socklen_t len = sizeof(a);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    timeval tv{.tv_sec = 10, .tv_usec = 0};
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~ScriptedShard() {
    Hangup();
    ::close(listen_fd_);
  }
  uint16_t port() const { return port_; }

  // Accepts the next connection (a failure when none comes within 10 s).
  bool Accept() {
    Hangup();
    fd_ = ::accept(listen_fd_, nullptr, nullptr);
    if (fd_ < 0) return false;
    timeval tv{.tv_sec = 10, .tv_usec = 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return true;
  }
  void Hangup() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  // The next frame, or nullopt when the worker closed the connection (or 10 s passed).
  std::optional<Frame> Read() {
    std::array<char, net::kFrameHeaderBytes> h{};
    if (!ReadExactly(h.data(), h.size())) return std::nullopt;
    absl::StatusOr<net::FrameHeader> header = net::ParseHeader(h);
    EXPECT_TRUE(header.ok()) << header.status();
    if (!header.ok()) return std::nullopt;
    Frame f{*header, std::string(header->meta_bytes, '\0'), std::string(header->body_bytes, '\0')};
    if (!ReadExactly(f.meta.data(), f.meta.size()) || !ReadExactly(f.body.data(), f.body.size())) {
      return std::nullopt;
    }
    return f;
  }
  void Send(const std::string& bytes) {
    ASSERT_EQ(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }

  // HELLO in, CHALLENGE out (with the true proof, or a forged one), PROOF in and checked,
  // ADMIT out (naming `max_body`). Whether the worker proved the session.
  bool Handshake(bool forge = false, uint32_t max_body = 1 << 20) {
    std::optional<Frame> hello = Read();
    if (!hello.has_value() || hello->header.type != net::FrameType::kHello) return false;
    absl::StatusOr<net::HelloMeta> h = net::ParseHelloMeta(hello->meta);
    EXPECT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->data_session, kSession);
    EXPECT_EQ(h->worker_id, 3u);
    const std::string client_nonce(h->client_nonce.begin(), h->client_nonce.end());
    const std::string server_nonce(crypto::kNonceBytes, 'n');
    const std::string key = crypto::DataKey(kToken, crypto::TokenKey(kToken), "shard-0", kSession, kSecret);
    net::ChallengeMeta c;
    std::copy(server_nonce.begin(), server_nonce.end(), c.server_nonce.begin());
    std::string proof = crypto::DataServerProof(forge ? std::string(32, 'k') : key, "shard-0",
                                              kSession, client_nonce, server_nonce);
    std::copy(proof.begin(), proof.end(), c.proof.begin());
    std::string out;
    EXPECT_TRUE(net::AppendChallenge(c, &out).ok());
    Send(out);
    std::optional<Frame> p = Read();
    if (!p.has_value() || p->header.type != net::FrameType::kProof) return false;
    absl::StatusOr<net::ProofMeta> pm = net::ParseProofMeta(p->meta);
    const std::string expected =
        crypto::DataClientProof(key, "shard-0", kSession, client_nonce, server_nonce);
    EXPECT_TRUE(crypto::SameProof(expected, std::string_view(pm->proof.data(), pm->proof.size())));
    out.clear();
    EXPECT_TRUE(net::AppendAdmit({.max_body_bytes = max_body, .max_unanswered_pushes = 64,
                                  .max_pull_slices = 16, .idle_timeout_ms = 60000},
                                 &out)
                    .ok());
    Send(out);
    return true;
  }

 private:
  bool ReadExactly(char* p, size_t n) {
    while (n > 0) {
      const ssize_t got = ::recv(fd_, p, n, 0);
      if (got <= 0) return false;
      p += got;
      n -= static_cast<size_t>(got);
    }
    return true;
  }

  int listen_fd_ = -1;
  int fd_ = -1;
  uint16_t port_ = 0;
};

// The outcomes of one NewPush, by index.
class Answers {
 public:
  std::function<void(size_t, absl::Status)> Callback() {
    return [this](size_t i, absl::Status s) {
      absl::MutexLock lock(&mu_);
      got_.emplace_back(i, std::move(s));
    };
  }
  // Waits (10 s at most) for `n` answers; they by index.
  std::vector<absl::Status> Await(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return got_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    std::vector<absl::Status> out(n, absl::UnknownError("no answer"));
    for (auto& [i, s] : got_) {
      if (i < n) out[i] = s;
    }
    return out;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::pair<size_t, absl::Status>> got_ ABSL_GUARDED_BY(mu_);
};

// Places dense values in `values`; records what arrived and how the pull ended.
class DenseSink final : public PullSink {
 public:
  explicit DenseSink(size_t numel) : values(numel, 0.0f) {}
  absl::StatusOr<std::span<char>> Place(const net::PullHeader& h, size_t bytes) override {
    if (bytes != values.size() * sizeof(float)) return absl::InvalidArgumentError("size");
    return std::span<char>(reinterpret_cast<char*>(values.data()), bytes);
  }
  absl::Status Arrived(const net::PullHeader& h, net::Pieces bytes) override {
    arrived_in_place = bytes.size() == 1 &&
                       bytes[0].data() == reinterpret_cast<const char*>(values.data());
    version = h.version;
    return absl::OkStatus();
  }
  void Done(absl::Status s) override {
    absl::MutexLock lock(&mu_);
    status = std::move(s);
    done_ = true;
  }
  // Waits (10 s at most) for Done; the fields may be read after it returned true. (A
  // Mutex, not an absl::Notification: ThreadSanitizer sees our Mutex calls only,
  // docs/sanitizers.md, and the values arrive by the channel's recv into `values`.)
  bool AwaitDone() {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&done_), absl::Seconds(10));
  }

  std::vector<float> values;
  bool arrived_in_place = false;
  uint64_t version = 0;
  absl::Status status;

 private:
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

class TcpChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<DataChannel>> made =
        MakeTcpChannel(io_, TcpChannelOptions{.worker_id = 3,
                                              .shard = 0,
                                              .address = "127.0.0.1:1",
                                              .credentials = {.token = kToken},
                                              .connect_timeout = std::chrono::milliseconds(5000)});
    ASSERT_TRUE(made.ok()) << made.status();
    channel_ = *std::move(made);
    ASSERT_TRUE(channel_
                    ->SetRoute(DataRoute{.epoch = 4,
                                         .data_port = shard_.port(),
                                         .data_session = kSession,
                                         .data_secret = kSecret})
                    .ok());
  }

  OutgoingPush Push(uint32_t slice, std::string payload) {
    OutgoingPush p;
    p.layout_hash = 9;
    p.round = 2;
    p.slice_id = slice;
    p.codec = "fp32";
    p.payload = std::make_shared<const std::string>(std::move(payload));
    return p;
  }
  RpcClock::time_point Deadline() { return RpcClock::now() + std::chrono::seconds(20); }
  // A push of `payload` now opens a new connection, which the shard accepts, and is
  // answered on it.
  void ExpectAPushOnANewConnection(const std::string& payload);

  ScriptedShard shard_;
  std::shared_ptr<IoThread> io_ = StartIoThread();
  std::unique_ptr<DataChannel> channel_;
};

std::string Answer(uint64_t tag, absl::StatusCode code, std::string_view name,
                   std::string_view message) {
  std::string out;
  EXPECT_TRUE(net::AppendAnswer(tag, {.code = code, .refusal_name = name, .message = message},
                                &out)
                  .ok());
  return out;
}

void TcpChannelTest::ExpectAPushOnANewConnection(const std::string& payload) {
  const OutgoingPush p = Push(0, payload);
  Answers answers;
  std::unique_ptr<DataChannel::PushCall> call = channel_->NewPush({&p}, Deadline());
  call->Start(answers.Callback());
  ASSERT_TRUE(shard_.Accept());
  ASSERT_TRUE(shard_.Handshake());
  std::optional<Frame> f = shard_.Read();
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->body, payload);
  shard_.Send(Answer(f->header.tag, absl::StatusCode::kOk, "", ""));
  EXPECT_TRUE(answers.Await(1)[0].ok());
}

TEST_F(TcpChannelTest, PushesLeaveInOneFrameAndAreAnsweredByTagWithTheirKinds) {
  const OutgoingPush a = Push(0, "first payload"), b = Push(1, "second");
  Answers answers;
  std::unique_ptr<DataChannel::PushCall> call = channel_->NewPush({&a, &b}, Deadline());
  EXPECT_EQ(call->epoch(), 4u);
  call->Start(answers.Callback());
  ASSERT_TRUE(shard_.Accept());
  ASSERT_TRUE(shard_.Handshake());
  // Queued together under one round and codec: one PUSHES, the bodies back to back.
  std::optional<Frame> f = shard_.Read();
  ASSERT_TRUE(f.has_value());
  ASSERT_EQ(f->header.type, net::FrameType::kPushes);
  absl::StatusOr<net::PushesMeta> m = net::ParsePushesMeta(f->header, f->meta);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->round, 2u);
  EXPECT_EQ(m->layout_hash, 9u);
  EXPECT_EQ(m->codec, "fp32");
  ASSERT_EQ(m->count, 2u);
  EXPECT_EQ(m->entries[0].slice_id, 0u);
  EXPECT_EQ(m->entries[1].slice_id, 1u);
  EXPECT_NE(m->entries[0].tag, m->entries[1].tag);
  EXPECT_EQ(f->body, *a.payload + *b.payload);
  // Answered the other way round: the second accepted, the first a duplicate.
  shard_.Send(Answer(m->entries[1].tag, absl::StatusCode::kOk, "", ""));
  shard_.Send(Answer(m->entries[0].tag, absl::StatusCode::kAlreadyExists, "duplicate", "again"));
  const std::vector<absl::Status> got = answers.Await(2);
  EXPECT_EQ(core::RefusalOf(got[0]), core::Refusal::kDuplicate) << got[0];
  EXPECT_EQ(got[0].code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(got[1].ok()) << got[1];
}

TEST_F(TcpChannelTest, PushesOfAnotherRoundOrOverTheBodyLimitLeaveInFramesOfTheirOwn) {
  OutgoingPush a = Push(0, std::string(300, 'a')), b = Push(1, std::string(300, 'b'));
  OutgoingPush c = Push(2, "c"), d = Push(3, std::string(300, 'd'));
  c.round = 3;
  d.round = 3;
  Answers answers;
  std::unique_ptr<DataChannel::PushCall> call = channel_->NewPush({&a, &b, &c, &d}, Deadline());
  call->Start(answers.Callback());
  ASSERT_TRUE(shard_.Accept());
  // A body limit of 500 bytes: a and b (600) cannot share a frame; c and d (301) can.
  ASSERT_TRUE(shard_.Handshake(/*forge=*/false, /*max_body=*/500));
  std::vector<net::FrameType> types;
  std::vector<std::string> bodies;
  std::vector<uint64_t> tags;
  while (tags.size() < 4) {
    std::optional<Frame> f = shard_.Read();
    ASSERT_TRUE(f.has_value());
    types.push_back(f->header.type);
    bodies.push_back(f->body);
    if (f->header.type == net::FrameType::kPushes) {
      absl::StatusOr<net::PushesMeta> m = net::ParsePushesMeta(f->header, f->meta);
      ASSERT_TRUE(m.ok()) << m.status();
      EXPECT_EQ(m->round, 3u);
      for (uint32_t i = 0; i < m->count; ++i) tags.push_back(m->entries[i].tag);
    } else {
      ASSERT_EQ(f->header.type, net::FrameType::kPush);
      tags.push_back(f->header.tag);
    }
  }
  EXPECT_EQ(types, (std::vector<net::FrameType>{net::FrameType::kPush, net::FrameType::kPush,
                                                net::FrameType::kPushes}));
  EXPECT_EQ(bodies, (std::vector<std::string>{*a.payload, *b.payload, *c.payload + *d.payload}));
  for (uint64_t tag : tags) shard_.Send(Answer(tag, absl::StatusCode::kOk, "", ""));
  for (const absl::Status& s : answers.Await(4)) EXPECT_TRUE(s.ok()) << s;
}

TEST_F(TcpChannelTest, DenseSlicesAreReadStraightIntoTheCallersPlace) {
  auto sink = std::make_shared<DenseSink>(4);
  EXPECT_EQ(channel_->Pull(PullAsk{.layout_hash = 9, .min_version = 1, .slice_ids = {5}},
                           Deadline(), sink),
            4u);
  ASSERT_TRUE(shard_.Accept());
  ASSERT_TRUE(shard_.Handshake());
  std::optional<Frame> pull = shard_.Read();
  ASSERT_TRUE(pull.has_value());
  ASSERT_EQ(pull->header.type, net::FrameType::kPull);
  absl::StatusOr<net::PullMeta> m = net::ParsePullMeta(pull->header.flags, pull->meta);
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<net::PullBody> body = net::ParsePullBody(*m, pull->body);
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(body->slice_ids, std::vector<uint32_t>{5});

  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 4.0f};
  std::string out;
  ASSERT_TRUE(net::AppendSlice(pull->header.tag, {{.slice_id = 5, .version = 7}}, 16, &out).ok());
  out.append(reinterpret_cast<const char*>(values.data()), 16);
  ASSERT_TRUE(net::AppendPullEnd(pull->header.tag, {.code = absl::StatusCode::kOk}, &out).ok());
  shard_.Send(out);
  ASSERT_TRUE(sink->AwaitDone());
  EXPECT_TRUE(sink->status.ok()) << sink->status;
  EXPECT_EQ(sink->values, values);
  EXPECT_TRUE(sink->arrived_in_place) << "read into the place, not through a buffer";
  EXPECT_EQ(sink->version, 7u);
}

// Places each slice's dense values in its own vector of `numel` (filled with -1 first),
// or, with `scratch`, keeps no place and takes the values in Arrived; may refuse a slice's
// place or its arrival. Records what arrived, in order.
class SlicesSink final : public PullSink {
 public:
  SlicesSink(std::vector<uint32_t> ids, size_t numel, bool scratch = false) : scratch_(scratch) {
    for (uint32_t id : ids) values[id] = std::vector<float>(numel, -1.0f);
  }
  absl::StatusOr<std::span<char>> Place(const net::PullHeader& h, size_t bytes) override {
    if (refuse_place == h.slice_id) return absl::InvalidArgumentError("place refused");
    if (scratch_) return std::span<char>();
    std::vector<float>& v = values.at(h.slice_id);
    if (bytes != v.size() * sizeof(float)) return absl::InvalidArgumentError("size");
    return std::span<char>(reinterpret_cast<char*>(v.data()), bytes);
  }
  absl::Status Arrived(const net::PullHeader& h, net::Pieces bytes) override {
    absl::MutexLock lock(&mu_);
    arrived_.push_back(h.slice_id);
    if (scratch_) {
      std::string all;
      for (std::string_view piece : bytes) all.append(piece);
      std::vector<float>& v = values.at(h.slice_id);
      if (all.size() != v.size() * sizeof(float)) return absl::InvalidArgumentError("size");
      std::memcpy(v.data(), all.data(), all.size());
    } else {
      in_place_ = in_place_ && bytes.size() == 1 &&
                  bytes[0].data() == reinterpret_cast<const char*>(values.at(h.slice_id).data());
    }
    if (refuse_arrival == h.slice_id) return absl::InvalidArgumentError("arrival refused");
    return absl::OkStatus();
  }
  void Done(absl::Status s) override {
    absl::MutexLock lock(&mu_);
    status_ = std::move(s);
    done_ = true;
  }
  // Waits (10 s at most) for `n` arrivals; the slices that arrived.
  std::vector<uint32_t> AwaitArrived(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return arrived_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return arrived_;
  }
  // Waits (10 s at most) for Done; its status (UNKNOWN "no Done" when none came).
  absl::Status AwaitDone() {
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout(absl::Condition(&done_), absl::Seconds(10))) {
      return absl::UnknownError("no Done");
    }
    return status_;
  }
  bool in_place() {
    absl::MutexLock lock(&mu_);
    return in_place_;
  }

  std::map<uint32_t, std::vector<float>> values;
  std::optional<uint32_t> refuse_place, refuse_arrival;

 private:
  const bool scratch_;
  absl::Mutex mu_;
  std::vector<uint32_t> arrived_ ABSL_GUARDED_BY(mu_);
  bool in_place_ ABSL_GUARDED_BY(mu_) = true;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

std::string Values(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// A SLICES of `ids` at version 7 under `codec`, each body of `bytes` bytes: its header
// and meta only.
std::string SlicesHead(uint64_t tag, const std::vector<uint32_t>& ids, uint32_t bytes,
                       std::string_view codec = "") {
  net::SlicesMeta m{.codec = codec, .count = static_cast<uint32_t>(ids.size())};
  for (size_t i = 0; i < ids.size(); ++i) {
    m.entries[i] = {{.slice_id = ids[i], .version = 7, .epoch = 1}, bytes};
  }
  std::string out;
  EXPECT_TRUE(net::AppendSlices(tag, m, &out).ok());
  return out;
}

class TcpChannelSlicesTest : public TcpChannelTest {
 protected:
  // Starts a pull of `ids` into `sink`, admits the channel and reads its PULL: its tag.
  uint64_t OpenPull(const std::vector<uint32_t>& ids, std::shared_ptr<PullSink> sink) {
    channel_->Pull(PullAsk{.layout_hash = 9, .min_version = 1, .slice_ids = ids}, Deadline(),
                   std::move(sink));
    EXPECT_TRUE(shard_.Accept());
    EXPECT_TRUE(shard_.Handshake());
    std::optional<Frame> pull = shard_.Read();
    EXPECT_TRUE(pull.has_value());
    if (!pull.has_value()) return 0;
    EXPECT_EQ(pull->header.type, net::FrameType::kPull);
    return pull->header.tag;
  }
  // The connection is still in step: a second pull of slice 9 gets its SLICE and ends.
  void ExpectInStep() {
    auto next = std::make_shared<SlicesSink>(std::vector<uint32_t>{9}, 2);
    channel_->Pull(PullAsk{.layout_hash = 9, .min_version = 1, .slice_ids = {9}}, Deadline(), next);
    std::optional<Frame> f;
    do {
      f = shard_.Read();  // a CANCEL of the first pull may come first
      ASSERT_TRUE(f.has_value());
    } while (f->header.type != net::FrameType::kPull);
    const std::vector<float> v = {5.0f, 6.0f};
    std::string out;
    ASSERT_TRUE(net::AppendSlice(f->header.tag, {{.slice_id = 9, .version = 7}}, 8, &out).ok());
    out += Values(v);
    ASSERT_TRUE(net::AppendPullEnd(f->header.tag, {.code = absl::StatusCode::kOk}, &out).ok());
    shard_.Send(out);
    EXPECT_TRUE(next->AwaitDone().ok());
    EXPECT_EQ(next->values.at(9), v);
  }
};

TEST_F(TcpChannelSlicesTest, ASlicesFramesSlicesAreReadIntoTheirPlacesEachArrivingOnceItsBodyIsIn) {
  auto sink = std::make_shared<SlicesSink>(std::vector<uint32_t>{5, 6, 7}, 4);
  const uint64_t tag = OpenPull({5, 6, 7}, sink);
  const std::vector<float> a = {1, 2, 3, 4}, b = {5, 6, 7, 8}, c = {9, 10, 11, 12};
  // The first body and half of the second: the first slice arrives, not the second.
  const std::string bodies = Values(a) + Values(b) + Values(c);
  shard_.Send(SlicesHead(tag, {5, 6, 7}, 16) + bodies.substr(0, 24));
  EXPECT_EQ(sink->AwaitArrived(1), std::vector<uint32_t>{5});
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(sink->AwaitArrived(1).size(), 1u) << "slice 6 arrived before its body was in";
  std::string rest = bodies.substr(24);
  ASSERT_TRUE(net::AppendPullEnd(tag, {.code = absl::StatusCode::kOk}, &rest).ok());
  shard_.Send(rest);
  EXPECT_TRUE(sink->AwaitDone().ok());
  EXPECT_EQ(sink->AwaitArrived(3), (std::vector<uint32_t>{5, 6, 7}));
  EXPECT_EQ(sink->values.at(5), a);
  EXPECT_EQ(sink->values.at(6), b);
  EXPECT_EQ(sink->values.at(7), c);
  EXPECT_TRUE(sink->in_place()) << "read into the places, not through a buffer";
}

TEST_F(TcpChannelSlicesTest, ASlicesFramesChangesAreHandedOverFromScratch) {
  auto sink = std::make_shared<SlicesSink>(std::vector<uint32_t>{5, 6}, 2, /*scratch=*/true);
  const uint64_t tag = OpenPull({5, 6}, sink);
  const std::vector<float> a = {1, 2}, b = {3, 4};
  std::string out = SlicesHead(tag, {5, 6}, 8, "fp32") + Values(a) + Values(b);
  ASSERT_TRUE(net::AppendPullEnd(tag, {.code = absl::StatusCode::kOk}, &out).ok());
  shard_.Send(out);
  EXPECT_TRUE(sink->AwaitDone().ok());
  EXPECT_EQ(sink->values.at(5), a);
  EXPECT_EQ(sink->values.at(6), b);
}

TEST_F(TcpChannelSlicesTest, APullEndingMidFrameLeavesTheCallersLaterPlacesAlone) {
  // Slice 5's arrival is refused: the pull ends, and slices 6 and 7, whose places were
  // the caller's, are read into scratch instead. The caller's buffer may be reused at
  // once after Done.
  auto sink = std::make_shared<SlicesSink>(std::vector<uint32_t>{5, 6, 7}, 4);
  sink->refuse_arrival = 5;
  const uint64_t tag = OpenPull({5, 6, 7}, sink);
  const std::vector<float> a = {1, 2, 3, 4}, b = {5, 6, 7, 8};
  shard_.Send(SlicesHead(tag, {5, 6, 7}, 16) + Values(a) + Values(b).substr(0, 4));
  const absl::Status ended = sink->AwaitDone();
  EXPECT_EQ(ended.code(), absl::StatusCode::kInvalidArgument) << ended;
  // The rest of the frame comes after Done.
  shard_.Send(Values(b).substr(4) + Values(a));
  ASSERT_NO_FATAL_FAILURE(ExpectInStep());
  EXPECT_EQ(sink->AwaitArrived(1), std::vector<uint32_t>{5}) << "only the refused slice arrived";
  // Slice 6's place may hold the 4 bytes read with slice 5's body, nothing after.
  const std::vector<float>& six = sink->values.at(6);
  EXPECT_TRUE(six[0] == 5.0f || six[0] == -1.0f) << six[0];
  EXPECT_EQ(std::vector<float>(six.begin() + 1, six.end()), std::vector<float>(3, -1.0f))
      << "slice 6's place was written after the pull ended";
  EXPECT_EQ(sink->values.at(7), std::vector<float>(4, -1.0f)) << "slice 7's place was written";
}

TEST_F(TcpChannelSlicesTest, APlaceRefusedEndsThePullAndTheFrameIsReadIntoScratch) {
  auto sink = std::make_shared<SlicesSink>(std::vector<uint32_t>{5, 6}, 4);
  sink->refuse_place = 6;
  const uint64_t tag = OpenPull({5, 6}, sink);
  shard_.Send(SlicesHead(tag, {5, 6}, 16) + Values({1, 2, 3, 4}) + Values({5, 6, 7, 8}));
  const absl::Status ended = sink->AwaitDone();
  EXPECT_EQ(ended.code(), absl::StatusCode::kInvalidArgument) << ended;
  ASSERT_NO_FATAL_FAILURE(ExpectInStep());
  EXPECT_TRUE(sink->AwaitArrived(0).empty());
  EXPECT_EQ(sink->values.at(5), std::vector<float>(4, -1.0f))
      << "slice 5's place, asked for before slice 6's was refused, was written";
}

// A shard that stops mid-way through a body being read into the caller's place: at the
// pull's deadline the connection closes and the pull fails; nothing lands in the place
// after Done, what else was in flight fails as a lost connection (retried as it is), and
// the next call connects again.
class TcpChannelStallTest : public TcpChannelSlicesTest,
                            public ::testing::WithParamInterface<bool> {};

TEST_P(TcpChannelStallTest, AShardStallingMidFrameFailsThePullAtItsDeadlineAndClosesTheConnection) {
  const bool several = GetParam();
  auto sink = std::make_shared<SlicesSink>(std::vector<uint32_t>{5, 6}, 4);
  const auto deadline = RpcClock::now() + std::chrono::milliseconds(400);
  const std::vector<uint32_t> ids = several ? std::vector<uint32_t>{5, 6} : std::vector<uint32_t>{5};
  channel_->Pull(PullAsk{.layout_hash = 9, .min_version = 1, .slice_ids = ids}, deadline, sink);
  ASSERT_TRUE(shard_.Accept());
  ASSERT_TRUE(shard_.Handshake());
  std::optional<Frame> pull = shard_.Read();
  ASSERT_TRUE(pull.has_value());
  const uint64_t tag = pull->header.tag;
  const OutgoingPush a = Push(0, "waits behind the frame");
  Answers answers;
  std::unique_ptr<DataChannel::PushCall> call = channel_->NewPush({&a}, Deadline());
  call->Start(answers.Callback());
  ASSERT_TRUE(shard_.Read().has_value());
  std::string head;
  if (several) {
    head = SlicesHead(tag, {5, 6}, 16);
  } else {
    ASSERT_TRUE(net::AppendSlice(tag, {{.slice_id = 5, .version = 7}}, 16, &head).ok());
  }
  shard_.Send(head + Values({1, 2}));  // half of slice 5's body, then nothing
  const absl::Status ended = sink->AwaitDone();
  EXPECT_EQ(ended.code(), absl::StatusCode::kDeadlineExceeded) << ended;
  EXPECT_NE(ended.message().find("stalled mid-frame"), std::string::npos) << ended;
  EXPECT_LT(RpcClock::now() - deadline, std::chrono::seconds(2)) << "failed long after its deadline";
  const absl::Status lost = answers.Await(1)[0];
  EXPECT_EQ(lost.code(), absl::StatusCode::kUnavailable) << lost;
  EXPECT_FALSE(CallsForRejoin(lost)) << lost;
  EXPECT_FALSE(shard_.Read().has_value()) << "the worker closed the connection";
  EXPECT_TRUE(sink->AwaitArrived(0).empty());
  EXPECT_EQ(sink->values.at(5), (std::vector<float>{1, 2, -1, -1}));
  EXPECT_EQ(sink->values.at(6), std::vector<float>(4, -1.0f));
  // The next pull connects again and is served.
  auto next = std::make_shared<SlicesSink>(std::vector<uint32_t>{9}, 2);
  channel_->Pull(PullAsk{.layout_hash = 9, .min_version = 1, .slice_ids = {9}}, Deadline(), next);
  ASSERT_TRUE(shard_.Accept());
  ASSERT_TRUE(shard_.Handshake());
  std::optional<Frame> again = shard_.Read();
  ASSERT_TRUE(again.has_value());
  std::string out;
  ASSERT_TRUE(net::AppendSlice(again->header.tag, {{.slice_id = 9, .version = 7}}, 8, &out).ok());
  out += Values({5, 6});
  ASSERT_TRUE(net::AppendPullEnd(again->header.tag, {.code = absl::StatusCode::kOk}, &out).ok());
  shard_.Send(out);
  EXPECT_TRUE(next->AwaitDone().ok());
  EXPECT_EQ(next->values.at(9), (std::vector<float>{5, 6}));
  // Whatever the shard sends now lands nowhere near the first pull's places.
  EXPECT_EQ(sink->values.at(5), (std::vector<float>{1, 2, -1, -1}));
}

INSTANTIATE_TEST_SUITE_P(Frames, TcpChannelStallTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "Slices" : "Slice";
                         });

// A frame read into scratch (the sink keeps no place) that stops mid-way: its pull fails
// at its deadline as any pull does, and once a second call waiting behind the frame is
// late too, with no byte of the frame for a second, the connection closes. Before, every
// later call on it waited out its own deadline.
TEST_F(TcpChannelSlicesTest, AFrameStalledInScratchClosesTheConnectionOnceACallWaitingBehindItIsLate) {
  auto sink = std::make_shared<SlicesSink>(std::vector<uint32_t>{5}, 4, /*scratch=*/true);
  const auto start = RpcClock::now();
  channel_->Pull(PullAsk{.layout_hash = 9, .min_version = 1, .slice_ids = {5}},
                 start + std::chrono::milliseconds(300), sink);
  ASSERT_TRUE(shard_.Accept());
  ASSERT_TRUE(shard_.Handshake());
  std::optional<Frame> pull = shard_.Read();
  ASSERT_TRUE(pull.has_value());
  const OutgoingPush a = Push(0, "waits behind the frame");
  Answers answers;
  std::unique_ptr<DataChannel::PushCall> call =
      channel_->NewPush({&a}, start + std::chrono::milliseconds(1500));
  call->Start(answers.Callback());
  ASSERT_TRUE(shard_.Read().has_value());
  std::string head;
  ASSERT_TRUE(net::AppendSlice(pull->header.tag, {{.slice_id = 5, .version = 7}}, 16, &head).ok());
  shard_.Send(head + Values({1, 2}));  // half of the body, then nothing
  const absl::Status ended = sink->AwaitDone();
  EXPECT_EQ(ended.code(), absl::StatusCode::kDeadlineExceeded) << ended;
  const absl::Status lost = answers.Await(1)[0];
  EXPECT_EQ(lost.code(), absl::StatusCode::kUnavailable) << lost;
  EXPECT_NE(lost.message().find("sent part of a SLICE frame and nothing more"), std::string::npos)
      << lost;
  // The pull's CANCEL, then the end of the stream.
  std::optional<Frame> f;
  while ((f = shard_.Read()).has_value()) EXPECT_EQ(f->header.type, net::FrameType::kCancel);
  EXPECT_LT(RpcClock::now() - start, std::chrono::seconds(5)) << "the connection stayed open";
  ASSERT_NO_FATAL_FAILURE(ExpectAPushOnANewConnection("resent"));
}

TEST_F(TcpChannelTest, APortThatCannotProveTheSessionIsToldNothingMore) {
  const OutgoingPush a = Push(0, "secret gradient");
  Answers answers;
  std::unique_ptr<DataChannel::PushCall> call = channel_->NewPush({&a}, Deadline());
  call->Start(answers.Callback());
  ASSERT_TRUE(shard_.Accept());
  EXPECT_FALSE(shard_.Handshake(/*forge=*/true)) << "no PROOF after a forged CHALLENGE";
  const absl::Status got = answers.Await(1)[0];
  EXPECT_EQ(got.code(), absl::StatusCode::kUnauthenticated) << got;
  EXPECT_NE(got.message().find("did not prove"), std::string::npos) << got;
}

TEST_F(TcpChannelTest, AGoawayFailsWhatWaitsWithTheShardsRefusal) {
  const OutgoingPush a = Push(0, "x");
  Answers answers;
  std::unique_ptr<DataChannel::PushCall> call = channel_->NewPush({&a}, Deadline());
  call->Start(answers.Callback());
  ASSERT_TRUE(shard_.Accept());
  ASSERT_TRUE(shard_.Read().has_value());  // the HELLO
  std::string out;
  ASSERT_TRUE(net::AppendGoaway({.code = absl::StatusCode::kUnauthenticated,
                                 .refusal_name = "unknown_session",
                                 .message = "join again"},
                                &out)
                  .ok());
  shard_.Send(out);
  const absl::Status got = answers.Await(1)[0];
  EXPECT_EQ(core::RefusalOf(got), core::Refusal::kUnknownSession) << got;
}

// A GOAWAY naming no error (status code 0) fails what waits UNAVAILABLE, as a lost
// connection does, whether it comes before the port proved itself or after ADMIT: it
// never answers a push or ends a pull as OK. Found by the data_channel fuzz target, where
// such a GOAWAY from a port that proved nothing had every push in flight reported
// accepted.
TEST_F(TcpChannelTest, AGoawayNamingNoErrorFailsWhatWaits) {
  for (const bool admitted : {false, true}) {
    SCOPED_TRACE(admitted ? "after ADMIT" : "before any CHALLENGE");
    const OutgoingPush a = Push(0, "x");
    Answers answers;
    std::unique_ptr<DataChannel::PushCall> call = channel_->NewPush({&a}, Deadline());
    call->Start(answers.Callback());
    auto sink = std::make_shared<DenseSink>(4);
    channel_->Pull(PullAsk{.layout_hash = 9, .min_version = 1, .slice_ids = {5}}, Deadline(),
                   sink);
    ASSERT_TRUE(shard_.Accept());
    if (admitted) {
      ASSERT_TRUE(shard_.Handshake());
      ASSERT_TRUE(shard_.Read().has_value());  // the PUSH
      ASSERT_TRUE(shard_.Read().has_value());  // the PULL
    } else {
      ASSERT_TRUE(shard_.Read().has_value());  // the HELLO
    }
    std::string out;
    ASSERT_TRUE(net::AppendGoaway({.code = absl::StatusCode::kOk}, &out).ok());
    shard_.Send(out);
    const absl::Status pushed = answers.Await(1)[0];
    EXPECT_EQ(pushed.code(), absl::StatusCode::kUnavailable) << pushed;
    ASSERT_TRUE(sink->AwaitDone());
    EXPECT_EQ(sink->status.code(), absl::StatusCode::kUnavailable) << sink->status;
  }
}

// The worker reads no body over 64 MiB (the gRPC channel's receive limit), whatever the
// shard's ADMIT allows: a SLICE claiming more ends the connection from its header, before
// a buffer of that size is allocated for it. Found writing the data_channel fuzz target
// (an input made by hand: an ADMIT of 4 GiB, then a SLICE header claiming as much for a
// tag with no pull; the channel allocated the whole claim before a byte of it came).
TEST_F(TcpChannelTest, ASliceOverTheWorkersBodyLimitEndsTheConnectionFromItsHeader) {
  auto sink = std::make_shared<DenseSink>(4);
  channel_->Pull(PullAsk{.layout_hash = 9, .min_version = 1, .slice_ids = {5}}, Deadline(), sink);
  ASSERT_TRUE(shard_.Accept());
  ASSERT_TRUE(shard_.Handshake(/*forge=*/false, /*max_body=*/UINT32_MAX));
  std::optional<Frame> pull = shard_.Read();
  ASSERT_TRUE(pull.has_value());
  std::string out;
  ASSERT_TRUE(net::AppendSlice(pull->header.tag, {{.slice_id = 5, .version = 7}}, (64u << 20) + 1,
                               &out)
                  .ok());
  shard_.Send(out);  // and not one byte of the body
  ASSERT_TRUE(sink->AwaitDone());
  EXPECT_EQ(sink->status.code(), absl::StatusCode::kInternal) << sink->status;
  EXPECT_NE(sink->status.message().find("over the limit of 67108864"), std::string::npos)
      << sink->status;
  EXPECT_FALSE(shard_.Read().has_value()) << "the worker closed the connection";
}

TEST_F(TcpChannelTest, ALostConnectionFailsWhatIsInFlightAndTheNextCallConnectsAgain) {
  const OutgoingPush a = Push(0, "lost");
  Answers first;
  std::unique_ptr<DataChannel::PushCall> call = channel_->NewPush({&a}, Deadline());
  call->Start(first.Callback());
  ASSERT_TRUE(shard_.Accept());
  ASSERT_TRUE(shard_.Handshake());
  ASSERT_TRUE(shard_.Read().has_value());
  shard_.Hangup();
  const absl::Status lost = first.Await(1)[0];
  EXPECT_EQ(lost.code(), absl::StatusCode::kUnavailable) << lost;
  EXPECT_FALSE(CallsForRejoin(lost)) << "a lost connection is retried as it is: " << lost;
  ASSERT_NO_FATAL_FAILURE(ExpectAPushOnANewConnection("resent"));
}

// A port nothing listens on: bound to 127.0.0.1:0 and closed again.
uint16_t ClosedPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

TEST_F(TcpChannelTest, ADataPortThatRefusesTheConnectionCallsForAJoin) {
  // As a shard restarted on a data port the kernel picked leaves its old one.
  ASSERT_TRUE(channel_
                  ->SetRoute(DataRoute{.epoch = 5,
                                       .data_port = ClosedPort(),
                                       .data_session = kSession,
                                       .data_secret = kSecret})
                  .ok());
  const OutgoingPush a = Push(0, "x");
  Answers answers;
  std::unique_ptr<DataChannel::PushCall> call = channel_->NewPush({&a}, Deadline());
  call->Start(answers.Callback());
  const absl::Status refused = answers.Await(1)[0];
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_NE(refused.message().find("cannot connect to"), std::string::npos) << refused;
  EXPECT_TRUE(CallsForRejoin(refused)) << refused;
  EXPECT_TRUE(CallsForRejoin(absl::UnauthenticatedError("unknown session")));
  EXPECT_FALSE(CallsForRejoin(absl::UnavailableError("cannot connect to")))
      << "only the channel's mark calls for a Join, not the words";
}

TEST_F(TcpChannelTest, AShardWithoutADataPortIsNamedAtSetRouteAndOnEveryPush) {
  const absl::Status none = channel_->SetRoute(DataRoute{.epoch = 5});
  EXPECT_EQ(none.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(none.message().find("runs no TCP data plane"), std::string::npos) << none;
  const OutgoingPush a = Push(0, "x");
  Answers answers;
  std::unique_ptr<DataChannel::PushCall> call = channel_->NewPush({&a}, Deadline());
  call->Start(answers.Callback());
  EXPECT_EQ(answers.Await(1)[0].code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace ps::internal::tcp_plane
