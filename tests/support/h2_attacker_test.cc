// The hostile HTTP/2 client's encodings (RFC 7541's examples) and its connection
// against a scripted HTTP/2 peer on loopback: the handshake, flow control, ACKs and what
// it records of the peer's frames.
#include "tests/support/h2_attacker.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <future>
#include <thread>

namespace ps::testing::h2 {
namespace {

std::string Hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (char c : bytes) {
    out.push_back(kDigits[uint8_t(c) >> 4]);
    out.push_back(kDigits[uint8_t(c) & 15]);
  }
  return out;
}

TEST(H2AttackerTest, HpackMatchesTheRfcExamples) {
  std::string out;
  AppendHpackInteger(&out, 0, 5, 10);  // C.1.1
  EXPECT_EQ(Hex(out), "0a");
  out.clear();
  AppendHpackInteger(&out, 0, 5, 1337);  // C.1.2
  EXPECT_EQ(Hex(out), "1f9a0a");
  out.clear();
  AppendHpackInteger(&out, 0, 8, 42);  // C.1.3
  EXPECT_EQ(Hex(out), "2a");
  // C.2.1: literal with incremental indexing, new name.
  EXPECT_EQ(Hex(HpackLiteral("custom-key", "custom-header", Indexing::kIncremental)),
            "400a637573746f6d2d6b65790d637573746f6d2d686561646572");
  // C.2.3: never indexed (RFC's form names the static entry; ours spells the name).
  EXPECT_EQ(Hex(HpackLiteral("password", "secret", Indexing::kNever)),
            "100870617373776f726406736563726574");
  EXPECT_EQ(Hex(HpackLiteral("a", "b")), "0001610162");
  EXPECT_EQ(Hex(HpackIndexed(2)), "82");  // C.3.1's :method GET
  EXPECT_EQ(Hex(HpackIndexed(kFirstDynamicIndex)), "be");
  EXPECT_EQ(Hex(HpackTableSizeUpdate(0)), "20");
}

TEST(H2AttackerTest, FramesAndMessages) {
  EXPECT_EQ(Hex(EncodeFrame(FrameType::kPing, kAck, 0, std::string(8, '\x01'))),
            "000008060100000000" "0101010101010101");
  EXPECT_EQ(Hex(EncodeFrame(FrameType::kRstStream, 0, 0x80000003u, std::string_view("\0\0\0\x08", 4))),
            "00000403000000000300000008");  // the reserved bit is cleared
  EXPECT_EQ(Hex(GrpcMessage("ab")), "00000000026162");
  EXPECT_EQ(Hex(HealthCheckRequestBytes("x")), "0a0178");
  EXPECT_EQ(HealthCheckRequestBytes(""), "");
  EXPECT_EQ(HealthCheckRequestBytes(std::string(200, 's')).substr(0, 3), "\x0a\xc8\x01");
  const std::string block = RequestHeaderBlock({.path = "/p", .authorization = "Bearer t"});
  EXPECT_NE(block.find(HpackLiteral(":path", "/p")), std::string::npos);
  EXPECT_NE(block.find(HpackLiteral("authorization", "Bearer t")), std::string::npos);
  EXPECT_EQ(RequestHeaderBlock({.path = "/p"}).find("authorization"), std::string::npos);
  EXPECT_EQ(ErrorCodeName(11), "ENHANCE_YOUR_CALM (11)");
  EXPECT_EQ(ErrorCodeName(99), "code 99");
}

TEST(H2AttackerTest, OnlyLoopbackTargets) {
  EXPECT_TRUE(CheckLoopback({.host = "127.0.0.1", .port = 1}).ok());
  EXPECT_TRUE(CheckLoopback({.host = "127.1.2.3", .port = 1}).ok());
  EXPECT_TRUE(CheckLoopback({.host = "::1", .port = 1}).ok());
  EXPECT_FALSE(CheckLoopback({.host = "10.0.0.1", .port = 1}).ok());
  EXPECT_FALSE(CheckLoopback({.host = "example.com", .port = 1}).ok());
  EXPECT_FALSE(Connection::Open({.target = {.host = "192.168.1.1", .port = 1}}).ok());
}

// One frame read from a blocking socket (within 5 s), or nullopt.
struct RawFrame {
  uint8_t type = 0, flags = 0;
  uint32_t stream = 0;
  std::string payload;
};
bool ReadExactly(int fd, char* buf, size_t n) {
  for (size_t got = 0; got < n;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) return false;
    const ssize_t r = ::recv(fd, buf + got, n - got, 0);
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}
std::optional<RawFrame> ReadRawFrame(int fd) {
  char head[9];
  if (!ReadExactly(fd, head, 9)) return std::nullopt;
  RawFrame f;
  const size_t length = size_t(uint8_t(head[0])) << 16 | size_t(uint8_t(head[1])) << 8 | uint8_t(head[2]);
  f.type = uint8_t(head[3]);
  f.flags = uint8_t(head[4]);
  f.stream = (uint32_t(uint8_t(head[5])) << 24 | uint32_t(uint8_t(head[6])) << 16 |
              uint32_t(uint8_t(head[7])) << 8 | uint8_t(head[8])) & kMaxStreamId;
  f.payload.resize(length);
  if (length > 0 && !ReadExactly(fd, f.payload.data(), length)) return std::nullopt;
  return f;
}
void SendAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}
std::string U32(uint32_t v) {
  return {char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
}

// A listening socket on 127.0.0.1 and the one connection it accepts.
class Peer {
 public:
  Peer() {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listener_, 4), 0);
    socklen_t len = sizeof(addr);
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
  }
  ~Peer() {
    if (fd_ >= 0) ::close(fd_);
    ::close(listener_);
  }
  uint16_t port() const { return port_; }
  // Accepts, reads the preface and sends `settings` (SETTINGS payload).
  bool Accept(const std::string& settings) {
    pollfd p{listener_, POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) return false;
    fd_ = ::accept(listener_, nullptr, nullptr);
    std::string preface(kClientPreface.size(), '\0');
    if (fd_ < 0 || !ReadExactly(fd_, preface.data(), preface.size())) return false;
    SendAll(fd_, EncodeFrame(FrameType::kSettings, 0, 0, settings));
    return preface == kClientPreface;
  }
  int fd() const { return fd_; }
  // The next frame of `type`, skipping others (up to 100).
  std::optional<RawFrame> Next(FrameType type) {
    for (int i = 0; i < 100; ++i) {
      std::optional<RawFrame> f = ReadRawFrame(fd_);
      if (!f || f->type == uint8_t(type)) return f;
    }
    return std::nullopt;
  }

 private:
  int listener_ = -1, fd_ = -1;
  uint16_t port_ = 0;
};

TEST(H2AttackerTest, ConnectionFollowsTheScriptedPeer) {
  Peer peer;
  // INITIAL_WINDOW_SIZE 100, MAX_FRAME_SIZE 16384.
  const std::string settings = std::string("\0\x04", 2) + U32(100) + std::string("\0\x05", 2) + U32(16384);
  std::future<bool> accepted = std::async(std::launch::async, [&] { return peer.Accept(settings); });
  absl::StatusOr<std::unique_ptr<Connection>> c =
      Connection::Open({.target = {.port = peer.port()}, .timeout = milliseconds(5000)});
  ASSERT_TRUE(accepted.get());
  ASSERT_TRUE(c.ok()) << c.status();
  Connection& conn = **c;
  EXPECT_TRUE(conn.peer().seen);
  EXPECT_EQ(conn.peer().initial_window_size, 100u);
  // The client's SETTINGS, then its ACK of ours.
  std::optional<RawFrame> f = peer.Next(FrameType::kSettings);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->flags, 0);
  EXPECT_EQ(f->payload, std::string("\0\x02", 2) + U32(0));  // ENABLE_PUSH 0
  f = peer.Next(FrameType::kSettings);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->flags, kAck);

  // DATA within the stream's window of 100, then 50 more after a WINDOW_UPDATE.
  const uint32_t id = conn.NextStream();
  EXPECT_EQ(id, 1u);
  EXPECT_EQ(conn.NextStream(), 3u);
  ASSERT_TRUE(conn.Headers(id, RequestHeaderBlock({.path = "/x"}), false).ok());
  absl::StatusOr<size_t> sent = conn.DataNow(id, std::string(300, 'd'), true);
  ASSERT_TRUE(sent.ok());
  EXPECT_EQ(*sent, 100u);
  f = peer.Next(FrameType::kHeaders);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->flags, kEndHeaders);
  f = peer.Next(FrameType::kData);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->payload.size(), 100u);
  EXPECT_EQ(f->flags, 0);
  SendAll(peer.fd(), EncodeFrame(FrameType::kWindowUpdate, 0, id, U32(200)));
  sent = conn.Data(id, std::string(200, 'd'), true, milliseconds(5000));
  ASSERT_TRUE(sent.ok());
  EXPECT_EQ(*sent, 200u);
  f = peer.Next(FrameType::kData);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->payload.size(), 200u);
  EXPECT_EQ(f->flags, kEndStream);
  EXPECT_EQ(conn.connection_window(), 65535 - 300);

  // A PING is answered with its payload; RST_STREAM and GOAWAY are recorded.
  SendAll(peer.fd(), EncodeFrame(FrameType::kPing, 0, 0, "12345678"));
  SendAll(peer.fd(), EncodeFrame(FrameType::kRstStream, 0, id, U32(11)));
  SendAll(peer.fd(), EncodeFrame(FrameType::kGoaway, 0, 0, U32(1) + U32(11) + "calm down"));
  for (int i = 0; i < 100 && !conn.observed().goaway_code.has_value(); ++i) {
    ASSERT_TRUE(conn.Poll(milliseconds(50)).ok());
  }
  f = peer.Next(FrameType::kPing);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->flags, kAck);
  EXPECT_EQ(f->payload, "12345678");
  EXPECT_TRUE(conn.stream_reset(id));
  EXPECT_EQ(conn.observed().rst_codes.at(11), 1u);
  EXPECT_EQ(conn.observed().goaway_code, 11u);
  EXPECT_EQ(conn.observed().goaway_debug, "calm down");
  EXPECT_EQ(conn.observed().goaway_last_stream, 1u);

  // The peer closes: the connection sees it, and a write fails instead of blocking.
  ::shutdown(peer.fd(), SHUT_RDWR);
  for (int i = 0; i < 100 && conn.open(); ++i) (void)conn.Poll(milliseconds(50));
  EXPECT_FALSE(conn.open());
  EXPECT_FALSE(conn.Ping(1).ok());
}

TEST(H2AttackerTest, AttacksEndAtTheirDeadlineAgainstAPeerThatSaysNothing) {
  Peer peer;  // accepts (the kernel does) but never answers: no SETTINGS ever comes
  const auto start = std::chrono::steady_clock::now();
  const Report r = Flood({.target = {.port = peer.port()},
                          .kind = FloodKind::kPing,
                          .max_connections = 2,
                          .control = {.duration = milliseconds(3000)}});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(r.connections, 0u);
  EXPECT_EQ(r.connect_failures, 2u);
  EXPECT_NE(r.Summary().find("no SETTINGS from the server"), std::string::npos) << r.Summary();
}

}  // namespace
}  // namespace ps::testing::h2
