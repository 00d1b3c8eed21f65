// The loopback shaping relay (net/shaper.h) against small servers on real sockets: bytes
// both ways, closes and resets, rates, latency, backpressure, addresses, and the cuts it
// injects. Timings are checked only from below (shaping guarantees those); nothing
// asserts an upper bound on a loaded host.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

// GCC 12 warns (-Wtsan) that TSan cannot model the atomic_thread_fence inside Asio's
// handler invocation, and -Werror makes that fatal in PS_SANITIZE=thread builds. Asio
// also hands operations between threads under mutexes, which TSan does see.
#if defined(__SANITIZE_THREAD__)
#pragma GCC diagnostic ignored "-Wtsan"
#endif
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include "net/shaper.h"

namespace ps::net {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using std::chrono::milliseconds;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// A loopback TCP server running `handler` on a thread per connection; the connection
// is closed when the handler returns. The destructor shuts down the connections still
// open (unblocking their handlers) and joins every thread.
class TestServer {
 public:
  using Handler = std::function<void(tcp::socket&)>;

  explicit TestServer(Handler handler,
                      const asio::ip::address& host = asio::ip::address_v4::loopback())
      : acceptor_(io_, tcp::endpoint(host, 0)), handler_(std::move(handler)) {
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }

  ~TestServer() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    {
      // Wake the blocking accept with a connection of our own.
      error_code ignored;
      tcp::socket waker(io_);
      waker.connect(acceptor_.local_endpoint(), ignored);
      accept_thread_.join();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& socket : sockets_) {
        if (socket->is_open()) ::shutdown(socket->native_handle(), SHUT_RDWR);
      }
    }
    for (auto& thread : threads_) thread.join();
  }

  uint16_t port() const { return acceptor_.local_endpoint().port(); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port()); }

 private:
  void AcceptLoop() {
    while (true) {
      auto socket = std::make_shared<tcp::socket>(io_);
      error_code ec;
      acceptor_.accept(*socket, ec);
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      if (ec) continue;
      sockets_.push_back(socket);
      threads_.emplace_back([this, socket] {
        handler_(*socket);
        std::lock_guard<std::mutex> lock(mu_);
        error_code ignored;
        socket->close(ignored);
      });
    }
  }

  asio::io_context io_;
  tcp::acceptor acceptor_;
  Handler handler_;
  std::mutex mu_;
  bool stopping_ = false;                              // guarded by mu_
  std::vector<std::shared_ptr<tcp::socket>> sockets_;  // guarded by mu_; closed only under it
  std::vector<std::thread> threads_;                   // written by the accept thread only
  std::thread accept_thread_;
};

// Echoes until EOF, then half-closes.
void Echo(tcp::socket& socket) {
  std::vector<char> buffer(32 * 1024);
  while (true) {
    error_code ec;
    const size_t n = socket.read_some(asio::buffer(buffer), ec);
    if (ec) break;
    asio::write(socket, asio::buffer(buffer.data(), n), ec);
    if (ec) return;
  }
  error_code ignored;
  socket.shutdown(tcp::socket::shutdown_send, ignored);
}

// Reads until EOF, then answers with the byte count in decimal.
void CountBytes(tcp::socket& socket) {
  std::vector<char> buffer(32 * 1024);
  uint64_t total = 0;
  error_code ec;
  while (!ec) total += socket.read_some(asio::buffer(buffer), ec);
  if (ec != asio::error::eof) return;
  asio::write(socket, asio::buffer(std::to_string(total)), ec);
}

tcp::socket Dial(asio::io_context& io, const std::string& address) {
  const size_t colon = address.rfind(':');
  tcp::socket socket(io);
  socket.connect(tcp::endpoint(asio::ip::make_address(address.substr(0, colon)),
                               static_cast<uint16_t>(std::stoi(address.substr(colon + 1)))));
  return socket;
}

// Reads until EOF or an error; `*error` gets the error (eof included).
std::string ReadAll(tcp::socket& socket, error_code* error = nullptr) {
  std::string data;
  std::vector<char> buffer(32 * 1024);
  error_code ec;
  while (!ec) {
    const size_t n = socket.read_some(asio::buffer(buffer), ec);
    data.append(buffer.data(), n);
  }
  if (error != nullptr) *error = ec;
  return data;
}

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string data(n, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  return data;
}

std::unique_ptr<ShapingRelay> MustStart(const std::string& upstream, std::string_view spec) {
  auto shaping = ParseLinkShaping(spec);
  EXPECT_TRUE(shaping.ok()) << shaping.status();
  auto relay = ShapingRelay::Start(upstream, shaping.ok() ? *shaping : LinkShaping{});
  EXPECT_TRUE(relay.ok()) << relay.status();
  return relay.ok() ? std::move(relay).value() : nullptr;
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

class ShapingRelayDataTest : public ::testing::TestWithParam<const char*> {};

TEST_P(ShapingRelayDataTest, BytesArriveUnchangedBothWaysOnConcurrentConnections) {
  TestServer server(Echo);
  auto relay = MustStart(server.address(), GetParam());
  ASSERT_NE(relay, nullptr);
  EXPECT_THAT(relay->address(), StartsWith("127.0.0.1:"));

  constexpr int kConnections = 4;
  constexpr size_t kBytes = 1 << 20;
  std::vector<std::string> sent(kConnections), received(kConnections);
  std::vector<std::thread> clients;
  for (int c = 0; c < kConnections; ++c) {
    sent[c] = RandomBytes(kBytes, /*seed=*/c + 1);
    clients.emplace_back([&, c] {
      asio::io_context io;
      tcp::socket socket = Dial(io, relay->address());
      std::thread writer([&] {
        error_code ec;
        asio::write(socket, asio::buffer(sent[c]), ec);
        EXPECT_FALSE(ec) << ec.message();
        socket.shutdown(tcp::socket::shutdown_send, ec);
      });
      error_code read_error;
      received[c] = ReadAll(socket, &read_error);
      EXPECT_EQ(read_error, asio::error::eof) << read_error.message();
      writer.join();
    });
  }
  for (auto& client : clients) client.join();
  for (int c = 0; c < kConnections; ++c) {
    EXPECT_EQ(received[c].size(), kBytes) << c;
    EXPECT_TRUE(received[c] == sent[c]) << "connection " << c << " corrupted its bytes";
  }
  // Every byte the clients read back went up first and was counted before it was written.
  EXPECT_EQ(relay->bytes_up(), kConnections * kBytes);
  EXPECT_EQ(relay->bytes_down(), kConnections * kBytes);
}

INSTANTIATE_TEST_SUITE_P(Shapings, ShapingRelayDataTest,
                         ::testing::Values("off", "latency=1ms", "rate=2gbps,latency=1ms,burst=16k",
                                           "up=1gbps"));

TEST(ShapingRelayTest, UpstreamCloseReachesTheClientAsEof) {
  TestServer server([](tcp::socket& socket) {
    error_code ignored;
    asio::write(socket, asio::buffer(std::string("bye")), ignored);
  });
  auto relay = MustStart(server.address(), "latency=1ms");
  ASSERT_NE(relay, nullptr);
  asio::io_context io;
  tcp::socket client = Dial(io, relay->address());
  error_code read_error;
  EXPECT_EQ(ReadAll(client, &read_error), "bye");
  EXPECT_EQ(read_error, asio::error::eof) << read_error.message();
}

TEST(ShapingRelayTest, ClientHalfCloseReachesUpstreamWhichMayStillAnswer) {
  TestServer server(CountBytes);
  auto relay = MustStart(server.address(), "rate=1gbps");
  ASSERT_NE(relay, nullptr);
  asio::io_context io;
  tcp::socket client = Dial(io, relay->address());
  const std::string payload = RandomBytes(100'000, 7);
  asio::write(client, asio::buffer(payload));
  client.shutdown(tcp::socket::shutdown_send);
  error_code read_error;
  EXPECT_EQ(ReadAll(client, &read_error), "100000");
  EXPECT_EQ(read_error, asio::error::eof) << read_error.message();
  EXPECT_EQ(relay->bytes_up(), 100'000u);
  EXPECT_EQ(relay->bytes_down(), 6u);
}

TEST(ShapingRelayTest, ClientResetReachesUpstreamAsReset) {
  std::promise<error_code> upstream_error;
  TestServer server([&](tcp::socket& socket) {
    char byte = 0;
    error_code ec;
    asio::read(socket, asio::buffer(&byte, 1), ec);
    if (!ec) asio::write(socket, asio::buffer(&byte, 1), ec);
    std::vector<char> buffer(1024);
    while (!ec) socket.read_some(asio::buffer(buffer), ec);
    upstream_error.set_value(ec);
  });
  auto relay = MustStart(server.address(), "off");
  ASSERT_NE(relay, nullptr);
  {
    asio::io_context io;
    tcp::socket client = Dial(io, relay->address());
    char byte = 'x';
    asio::write(client, asio::buffer(&byte, 1));
    asio::read(client, asio::buffer(&byte, 1));  // the upstream connection is up
    client.set_option(asio::socket_base::linger(true, 0));
    client.close();  // sends RST
  }
  EXPECT_EQ(upstream_error.get_future().get(), asio::error::connection_reset);
}

TEST(ShapingRelayTest, RefusingUpstreamResetsTheClient) {
  uint16_t closed_port = 0;
  {
    asio::io_context io;
    tcp::acceptor probe(io, tcp::endpoint(asio::ip::address_v4::loopback(), 0));
    closed_port = probe.local_endpoint().port();
  }
  auto relay = MustStart("127.0.0.1:" + std::to_string(closed_port), "off");
  ASSERT_NE(relay, nullptr);
  asio::io_context io;
  tcp::socket client = Dial(io, relay->address());
  error_code read_error;
  EXPECT_EQ(ReadAll(client, &read_error), "");
  EXPECT_TRUE(read_error == asio::error::connection_reset || read_error == asio::error::eof)
      << read_error.message();
}

TEST(ShapingRelayTest, DestructorReturnsWithConnectionsOpen) {
  TestServer server(Echo);
  auto relay = MustStart(server.address(), "rate=1mbps,latency=5ms");
  ASSERT_NE(relay, nullptr);
  asio::io_context io;
  std::vector<tcp::socket> idle;
  for (int i = 0; i < 3; ++i) {
    idle.push_back(Dial(io, relay->address()));
    char byte = 'x';
    asio::write(idle.back(), asio::buffer(&byte, 1));
    asio::read(idle.back(), asio::buffer(&byte, 1));
  }
  // One more that keeps the relay busy: far more data than 1 mbit/s moves in the test.
  tcp::socket busy = Dial(io, relay->address());
  std::thread writer([&] {
    const std::string payload(4 << 20, 'p');
    error_code ec;
    asio::write(busy, asio::buffer(payload), ec);  // fails once the relay is gone
  });
  std::this_thread::sleep_for(milliseconds(50));
  relay.reset();
  // Every client sees its connection end.
  for (auto& socket : idle) {
    error_code read_error;
    ReadAll(socket, &read_error);
    EXPECT_TRUE(read_error == asio::error::eof || read_error == asio::error::connection_reset)
        << read_error.message();
  }
  writer.join();
}

TEST(ShapingRelayTest, RateLimitsTheUpDirection) {
  TestServer server(CountBytes);
  auto relay = MustStart(server.address(), "rate=16mbps,burst=64k");
  ASSERT_NE(relay, nullptr);
  asio::io_context io;
  tcp::socket client = Dial(io, relay->address());
  constexpr size_t kBytes = 400 * 1024;
  const std::string payload(kBytes, 'r');
  const auto start = std::chrono::steady_clock::now();
  asio::write(client, asio::buffer(payload));
  client.shutdown(tcp::socket::shutdown_send);
  EXPECT_EQ(ReadAll(client), std::to_string(kBytes));
  // All but one bucket's worth waits for tokens at 2 MB/s.
  const double floor_s = (kBytes - 64 * 1024) * 8 / 16e6;
  EXPECT_GE(SecondsSince(start), floor_s - 0.002);
  EXPECT_EQ(relay->bytes_up(), kBytes);
  EXPECT_EQ(relay->bytes_down(), std::to_string(kBytes).size());
}

TEST(ShapingRelayTest, RateLimitsTheDownDirection) {
  constexpr size_t kBytes = 400 * 1024;
  TestServer server([&](tcp::socket& socket) {
    error_code ignored;
    asio::write(socket, asio::buffer(std::string(kBytes, 'd')), ignored);
  });
  auto relay = MustStart(server.address(), "down=16mbps");
  ASSERT_NE(relay, nullptr);
  const auto start = std::chrono::steady_clock::now();  // before the first byte can flow
  asio::io_context io;
  tcp::socket client = Dial(io, relay->address());
  EXPECT_EQ(ReadAll(client).size(), kBytes);
  EXPECT_GE(SecondsSince(start), (kBytes - 64 * 1024) * 8 / 16e6 - 0.002);
  EXPECT_EQ(relay->bytes_down(), kBytes);
  EXPECT_EQ(relay->bytes_up(), 0u);
}

TEST(ShapingRelayTest, ConnectionsShareOneBucket) {
  TestServer server(CountBytes);
  auto relay = MustStart(server.address(), "up=16mbps");
  ASSERT_NE(relay, nullptr);
  constexpr size_t kBytesEach = 200 * 1024;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> clients;
  for (int c = 0; c < 2; ++c) {
    clients.emplace_back([&] {
      asio::io_context io;
      tcp::socket client = Dial(io, relay->address());
      asio::write(client, asio::buffer(std::string(kBytesEach, 's')));
      client.shutdown(tcp::socket::shutdown_send);
      EXPECT_EQ(ReadAll(client), std::to_string(kBytesEach));
    });
  }
  for (auto& client : clients) client.join();
  // Together, not each, they had one bucket and 2 MB/s.
  EXPECT_GE(SecondsSince(start), (2 * kBytesEach - 64 * 1024) * 8 / 16e6 - 0.002);
  EXPECT_EQ(relay->bytes_up(), 2 * kBytesEach);
}

TEST(ShapingRelayTest, BackpressureLeavesTheQueueWithTheSender) {
  TestServer server(CountBytes);
  auto relay = MustStart(server.address(), "rate=1mbps");
  ASSERT_NE(relay, nullptr);
  asio::io_context io;
  tcp::socket client = Dial(io, relay->address());
  client.set_option(asio::socket_base::send_buffer_size(64 * 1024));
  client.non_blocking(true);
  const std::string block(64 * 1024, 'b');
  const auto start = std::chrono::steady_clock::now();
  size_t accepted = 0;
  while (SecondsSince(start) < 0.2) {
    error_code ec;
    accepted += client.write_some(asio::buffer(block), ec);
    if (ec == asio::error::would_block) {
      std::this_thread::sleep_for(milliseconds(1));
    } else {
      ASSERT_FALSE(ec) << ec.message();
    }
  }
  // An unbounded relay would take everything offered (megabytes by now); a bounded one
  // takes its hold limit, the kernel buffers and what 1 mbit/s drained meanwhile.
  const double drained = 125'000 * SecondsSince(start);
  EXPECT_LT(static_cast<double>(accepted), 1.5 * (1 << 20) + drained) << "drained " << drained;
  EXPECT_GT(accepted, 0u);
}

TEST(ShapingRelayTest, LatencyDelaysEachDirection) {
  TestServer server(Echo);
  auto relay = MustStart(server.address(), "latency=20ms");
  ASSERT_NE(relay, nullptr);
  asio::io_context io;
  tcp::socket client = Dial(io, relay->address());
  char byte = 'x';
  const auto start = std::chrono::steady_clock::now();
  asio::write(client, asio::buffer(&byte, 1));
  asio::read(client, asio::buffer(&byte, 1));
  EXPECT_GE(SecondsSince(start), 0.040);
  EXPECT_EQ(byte, 'x');
}

TEST(ShapingRelayTest, LocalhostUpstreamWorks) {
  TestServer server(Echo);
  auto relay = MustStart("localhost:" + std::to_string(server.port()), "off");
  ASSERT_NE(relay, nullptr);
  asio::io_context io;
  tcp::socket client = Dial(io, relay->address());
  asio::write(client, asio::buffer(std::string("ping")));
  client.shutdown(tcp::socket::shutdown_send);
  EXPECT_EQ(ReadAll(client), "ping");
}

TEST(ShapingRelayTest, BracketedIpv6UpstreamWorks) {
  std::unique_ptr<TestServer> server;
  try {
    server = std::make_unique<TestServer>(Echo, asio::ip::address_v6::loopback());
  } catch (const boost::system::system_error& e) {
    GTEST_SKIP() << "no IPv6 loopback here: " << e.what();
  }
  auto relay = MustStart("[::1]:" + std::to_string(server->port()), "off");
  ASSERT_NE(relay, nullptr);
  asio::io_context io;
  tcp::socket client = Dial(io, relay->address());
  asio::write(client, asio::buffer(std::string("ping6")));
  client.shutdown(tcp::socket::shutdown_send);
  EXPECT_EQ(ReadAll(client), "ping6");
}

// Sends `bytes` on a new connection through `relay` while reading what comes back until
// the connection ends; returns what came back and how the read ended in `*read_error`.
std::string SendThroughAndRead(const ShapingRelay& relay, const std::string& bytes,
                               error_code* read_error) {
  asio::io_context io;
  tcp::socket client = Dial(io, relay.address());
  std::thread writer([&] {
    error_code ec;
    asio::write(client, asio::buffer(bytes), ec);  // fails once the relay cuts
  });
  std::string back = ReadAll(client, read_error);
  writer.join();
  return back;
}

TEST(ShapingRelayTest, CutUpRelaysUpToTheCutThenResetsBothSides) {
  std::promise<std::pair<size_t, error_code>> upstream_end;
  TestServer server([&](tcp::socket& socket) {
    std::vector<char> buffer(32 * 1024);
    size_t total = 0;
    error_code ec;
    while (!ec) total += socket.read_some(asio::buffer(buffer), ec);
    upstream_end.set_value({total, ec});
  });
  auto relay = MustStart(server.address(), "off");
  ASSERT_NE(relay, nullptr);
  constexpr uint64_t kCut = 300'001;  // not a multiple of the relay's 16 KiB chunks
  relay->CutAfter(RelayDirection::kUp, kCut);
  error_code client_error;
  EXPECT_EQ(SendThroughAndRead(*relay, RandomBytes(1 << 20, 7), &client_error), "");
  // The reset's error goes to whichever of the client's calls sees it first: its writer
  // or its reader (which then reads EOF).
  EXPECT_TRUE(client_error == asio::error::connection_reset || client_error == asio::error::eof)
      << client_error.message();
  const auto [upstream_bytes, upstream_error] = upstream_end.get_future().get();
  EXPECT_EQ(upstream_error, asio::error::connection_reset) << upstream_error.message();
  EXPECT_LE(upstream_bytes, kCut);  // a reset may drop what the kernel still held
  EXPECT_EQ(relay->bytes_up(), kCut);
  EXPECT_EQ(relay->cuts(), 1u);
  EXPECT_EQ(relay->connections(), 1u);
}

TEST(ShapingRelayTest, CutDownEndsTheConnectionInTheMiddleAndTheNextOneIsWhole) {
  TestServer server(Echo);
  auto relay = MustStart(server.address(), "off");
  ASSERT_NE(relay, nullptr);
  constexpr uint64_t kCut = 100'003;
  relay->CutAfter(RelayDirection::kDown, kCut);
  const std::string sent = RandomBytes(1 << 20, 8);
  error_code read_error;
  const std::string back = SendThroughAndRead(*relay, sent, &read_error);
  EXPECT_TRUE(read_error == asio::error::connection_reset || read_error == asio::error::eof)
      << read_error.message();
  EXPECT_LE(back.size(), kCut);
  EXPECT_TRUE(back == sent.substr(0, back.size())) << "the bytes before the cut changed";
  EXPECT_EQ(relay->bytes_down(), kCut);
  EXPECT_EQ(relay->cuts(), 1u);
  // One cut per CutAfter: the next connection carries everything.
  asio::io_context io;
  tcp::socket client = Dial(io, relay->address());
  asio::write(client, asio::buffer(std::string("after the cut")));
  client.shutdown(tcp::socket::shutdown_send);
  EXPECT_EQ(ReadAll(client), "after the cut");
  EXPECT_EQ(relay->cuts(), 1u);
  EXPECT_EQ(relay->connections(), 2u);
}

TEST(ShapingRelayTest, ListensOnAnotherLoopbackAddressAtItsUpstreamsPort) {
  TestServer server(Echo);  // on 127.0.0.1
  auto relay = ShapingRelay::Start(
      server.address(), LinkShaping{},
      RelayOptions{.listen_host = "127.0.0.7", .listen_port = server.port()});
  ASSERT_TRUE(relay.ok()) << relay.status();
  EXPECT_EQ((*relay)->address(), "127.0.0.7:" + std::to_string(server.port()));
  asio::io_context io;
  tcp::socket client = Dial(io, (*relay)->address());
  asio::write(client, asio::buffer(std::string("ping")));
  client.shutdown(tcp::socket::shutdown_send);
  EXPECT_EQ(ReadAll(client), "ping");
  EXPECT_EQ((*relay)->connections(), 1u);

  const auto named = ShapingRelay::Start(server.address(), LinkShaping{},
                                         RelayOptions{.listen_host = "localhost"});
  ASSERT_FALSE(named.ok());
  EXPECT_EQ(named.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(named.status().message()),
              HasSubstr("listen host 'localhost' is not a literal IP address"));
}

TEST(ShapingRelayTest, StartRefusesUnparsableUpstreams) {
  const std::pair<const char*, const char*> cases[] = {
      {"nonsense", "expected host:port"},
      {"127.0.0.1:", "port must be a number in [1, 65535]"},
      {"127.0.0.1:99999", "port must be a number in [1, 65535]"},
      {"127.0.0.1:80x", "port must be a number in [1, 65535]"},
      {":80", "empty host"},
      {"[::1", "expected [v6-address]:port"},
      {"::1:80", "write IPv6 addresses as [addr]:port"},
  };
  for (const auto& [upstream, fragment] : cases) {
    const auto relay = ShapingRelay::Start(upstream, LinkShaping{});
    ASSERT_FALSE(relay.ok()) << upstream;
    EXPECT_EQ(relay.status().code(), absl::StatusCode::kInvalidArgument) << upstream;
    EXPECT_THAT(std::string(relay.status().message()),
                HasSubstr(std::string("upstream address '") + upstream + "'"));
    EXPECT_THAT(std::string(relay.status().message()), HasSubstr(fragment));
  }
}

}  // namespace
}  // namespace ps::net
