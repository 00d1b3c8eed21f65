// What the worker's TCP data channel tests share (tcp_channel_test.cc,
// tcp_channel_slices_test.cc): a scripted shard on a real loopback socket speaking
// net/data_frame.h byte for byte, sinks that record what arrived, and the fixture that
// routes a channel to the scripted shard.
#pragma once

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
#include "worker_lib/transport/tcp/channel.h"

namespace ps::internal::tcp_plane {

inline constexpr uint64_t kSession = 77;
inline const std::string kSecret(32, 's');
inline const std::string kToken = "the worker's token";

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

inline std::string Answer(uint64_t tag, absl::StatusCode code, std::string_view name,
                   std::string_view message) {
  std::string out;
  EXPECT_TRUE(net::AppendAnswer(tag, {.code = code, .refusal_name = name, .message = message},
                                &out)
                  .ok());
  return out;
}

inline void TcpChannelTest::ExpectAPushOnANewConnection(const std::string& payload) {
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

}  // namespace ps::internal::tcp_plane
