// HttpEndpoint (the metrics HTTP server) over real sockets on 127.0.0.1: idle, half-sent
// and non-reading clients must not delay a scrape, every connection is closed at its
// deadline or evicted under the connection cap, bad requests get their status; and the
// request head parser on its own.
#include "net/http_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <fstream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tests/net/metrics_text.h"

namespace ps::net {
namespace {

// The HTTP test helpers shared with the shard's metrics tests.

using ::testing::HasSubstr;
using ::testing::Not;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr char kHalfSent[] = "GET /metrics HTTP/1.1\r\n";
constexpr char kBody[] = "ps_ready 1\n";

// ---------------------------------------------------------------------------------------
// ParseHttpRequestHead and FindHttpHeadEnd.

TEST(ParseHttpRequestHeadTest, ParsesRequestLineAndFields) {
  auto head = ParseHttpRequestHead(
      "GET /metrics?a=1&b HTTP/1.1\r\nHost: 127.0.0.1:9\r\nAccept:  text/plain \r\n"
      "X-Empty:\r\n\r\n");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->method, "GET");
  EXPECT_EQ(head->path, "/metrics");
  EXPECT_EQ(head->query, "a=1&b");
  EXPECT_EQ(head->version_major, 1);
  EXPECT_EQ(head->version_minor, 1);
  ASSERT_EQ(head->headers.size(), 3u);
  EXPECT_EQ(head->headers[1].first, "Accept");
  EXPECT_EQ(head->headers[1].second, "text/plain");
  ASSERT_NE(head->FindHeader("host"), nullptr);
  EXPECT_EQ(*head->FindHeader("HOST"), "127.0.0.1:9");
  ASSERT_NE(head->FindHeader("x-empty"), nullptr);
  EXPECT_EQ(*head->FindHeader("x-empty"), "");
  EXPECT_EQ(head->FindHeader("Content-Length"), nullptr);
}

TEST(ParseHttpRequestHeadTest, AcceptsHttp10WithoutHost) {
  auto head = ParseHttpRequestHead("HEAD / HTTP/1.0\r\n\r\n");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->method, "HEAD");
  EXPECT_EQ(head->path, "/");
  EXPECT_EQ(head->version_minor, 0);
  EXPECT_TRUE(head->headers.empty());
}

TEST(ParseHttpRequestHeadTest, TakesThePathOfAnAbsoluteFormTarget) {
  auto head = ParseHttpRequestHead("GET HTTP://shard-0:9100/metrics?x HTTP/1.1\r\nHost: a\r\n\r\n");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->path, "/metrics");
  EXPECT_EQ(head->query, "x");
  auto bare = ParseHttpRequestHead("GET https://shard-0 HTTP/1.1\r\nHost: a\r\n\r\n");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(bare->path, "/");
}

TEST(ParseHttpRequestHeadTest, SkipsAnEmptyLineBeforeTheRequestLine) {
  auto head = ParseHttpRequestHead("\r\nGET /metrics HTTP/1.0\r\n\r\n");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->path, "/metrics");
}

TEST(ParseHttpRequestHeadTest, KeepsAVersionOtherThan1ForTheServerToRefuse) {
  auto head = ParseHttpRequestHead("GET /metrics HTTP/2.0\r\n\r\n");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->version_major, 2);
}

TEST(ParseHttpRequestHeadTest, RefusesMalformedHeadsWithInvalidArgument) {
  const std::string bad[] = {
      "",
      "\r\n\r\n",
      "\r\n\r\nGET /metrics HTTP/1.0\r\n\r\n",  // two empty lines first: the head ends
      "GET /metrics HTTP/1.1\r\n\r\n",                            // 1.1 without Host
      "GET /metrics HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n",     // two Hosts
      "GET /metrics HTTP/1.0\n\n",                                // bare LF
      "GET /metrics HTTP/1.0\r\nA: b\nC: d\r\n\r\n",              // bare LF inside
      "GET /metrics HTTP/1.0\r\nA: b\rc\r\n\r\n",                 // bare CR
      "GET /metrics HTTP/1.0\r\nA: b\r\n c\r\n\r\n",              // obs-fold
      "GET /metrics HTTP/1.0\r\nA : b\r\n\r\n",                   // blank before colon
      "GET /metrics HTTP/1.0\r\nNoColon\r\n\r\n",
      "GET /metrics HTTP/1.0\r\n: b\r\n\r\n",                     // empty field name
      std::string("GET /metrics HTTP/1.0\r\nA: b") + '\0' + "c\r\n\r\n",  // NUL in a value
      "GET /metrics HTTP/1.0\r\nA: \x7f\r\n\r\n",                 // DEL in a value
      "GET /metrics HTTP/1.10\r\n\r\n",
      "GET /metrics HTTP/x.1\r\n\r\n",
      "GET /metrics http/1.0\r\n\r\n",
      "GET /metrics\r\n\r\n",                                     // HTTP/0.9 style
      "GET\r\n\r\n",
      "GET  /metrics HTTP/1.0\r\n\r\n",                           // empty target
      "GET /met rics HTTP/1.0\r\n\r\n",                           // blank in target
      "GET /metrics#x HTTP/1.0\r\n\r\n",
      "GET /m\xc3\xa9trics HTTP/1.0\r\n\r\n",                     // non-ASCII target
      "GET * HTTP/1.0\r\n\r\n",
      "GET metrics HTTP/1.0\r\n\r\n",
      "GET ftp://h/metrics HTTP/1.0\r\n\r\n",
      "GET http:///metrics HTTP/1.0\r\n\r\n",                      // no host
      " GET /metrics HTTP/1.0\r\n\r\n",                           // empty method
      "G(T /metrics HTTP/1.0\r\n\r\n",
      "GET /metrics HTTP/1.0\r\n",                                // no empty line
      "GET /metrics HTTP/1.0\r\n\r\nGET / HTTP/1.0\r\n\r\n",      // bytes after the head
  };
  for (const std::string& bytes : bad) {
    SCOPED_TRACE(::testing::PrintToString(bytes));
    auto head = ParseHttpRequestHead(bytes);
    ASSERT_FALSE(head.ok());
    EXPECT_EQ(head.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(head.status().message()), HasSubstr("bad HTTP request head"));
  }
}

TEST(FindHttpHeadEndTest, FindsTheFirstEmptyLine) {
  EXPECT_EQ(FindHttpHeadEnd("GET / HTTP/1.0\r\n\r\nrest"), 18u);
  EXPECT_EQ(FindHttpHeadEnd("GET / HTTP/1.0\n\nrest"), 16u);
  EXPECT_EQ(FindHttpHeadEnd("GET / HTTP/1.0\n\r\n"), 17u);
  EXPECT_EQ(FindHttpHeadEnd("GET / HTTP/1.0\r\nHost: a\r\n\r\n\r\n"), 27u);
}

TEST(FindHttpHeadEndTest, SaysNposUntilTheHeadIsComplete) {
  const std::string head = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
  for (size_t n = 0; n < head.size(); ++n) {
    EXPECT_EQ(FindHttpHeadEnd(std::string_view(head).substr(0, n)), std::string_view::npos) << n;
  }
  // Scanning only what is new (from the previous length minus 2) finds the same end.
  for (size_t before = 0; before < head.size(); ++before) {
    EXPECT_EQ(FindHttpHeadEnd(head, before >= 2 ? before - 2 : 0), head.size()) << before;
  }
}

// ---------------------------------------------------------------------------------------
// The server, over loopback sockets.

// A blocking client socket on 127.0.0.1 with a poll-based read timeout.
class Client {
 public:
  // `receive_buffer` > 0 sets SO_RCVBUF before connecting (which turns off the kernel's
  // receive buffer autotuning for this socket).
  explicit Client(uint16_t port, int receive_buffer = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (receive_buffer > 0) {
      ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof(receive_buffer));
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    connected_ = fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~Client() {
    if (fd_ >= 0) ::close(fd_);
  }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  bool connected() const { return connected_; }

  bool Send(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // Everything until the server closes; nullopt when it stays open past `timeout`.
  std::optional<std::string> ReadToClose(milliseconds timeout) {
    const auto until = Clock::now() + timeout;
    std::string out;
    char buf[65536];
    for (;;) {
      const auto left = std::chrono::duration_cast<milliseconds>(until - Clock::now()).count();
      if (left <= 0) return std::nullopt;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n == 0 || (n < 0 && errno == ECONNRESET)) return out;
      if (n < 0) return std::nullopt;
      out.append(buf, static_cast<size_t>(n));
    }
  }

  // Whether the server has closed this connection (without waiting).
  bool ClosedByServer() {
    char c;
    const ssize_t n = ::recv(fd_, &c, 1, MSG_DONTWAIT | MSG_PEEK);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

struct Response {
  int status = 0;
  std::string head;  // status line and fields
  std::string body;
};

Response ParseResponse(const std::string& raw) {
  Response r;
  const size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos || raw.compare(0, 9, "HTTP/1.1 ") != 0) return r;
  r.head = raw.substr(0, end + 2);
  r.body = raw.substr(end + 4);
  if (!absl::SimpleAtoi(raw.substr(9, 3), &r.status)) r.status = 0;
  return r;
}

// Sends `request` on a fresh connection and reads the response to the close.
Response Exchange(uint16_t port, std::string_view request) {
  Client c(port);
  EXPECT_TRUE(c.connected());
  EXPECT_TRUE(c.Send(request));
  std::optional<std::string> raw = c.ReadToClose(milliseconds(3000));
  EXPECT_TRUE(raw.has_value()) << "no response within 3 s to " << request;
  return raw ? ParseResponse(*raw) : Response{};
}

// Polls `done` every millisecond for at most `limit`.
template <typename F>
bool WaitFor(F done, milliseconds limit = milliseconds(3000)) {
  const auto until = Clock::now() + limit;
  while (!done()) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

class HttpEndpointTest : public ::testing::Test {
 protected:
  void Start(HttpEndpointOptions options = {}, std::function<std::string()> render = [] {
    return std::string(kBody);
  }) {
    endpoint_ = std::make_unique<HttpEndpoint>(std::move(render), std::move(options));
    auto port = endpoint_->Start("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.status();
    ASSERT_NE(*port, 0);
    ASSERT_EQ(endpoint_->port(), *port);
    port_ = *port;
  }

  // Opens `n` connections that each send half a request line and then nothing, one
  // accepted after the other (so their age follows their index).
  std::vector<std::unique_ptr<Client>> OpenHalfSent(size_t n) {
    std::vector<std::unique_ptr<Client>> clients;
    for (size_t i = 0; i < n; ++i) {
      const uint64_t accepted = endpoint_->stats().accepted;
      clients.push_back(std::make_unique<Client>(port_));
      EXPECT_TRUE(clients.back()->connected());
      EXPECT_TRUE(clients.back()->Send(kHalfSent));
      EXPECT_TRUE(WaitFor([&] { return endpoint_->stats().accepted > accepted; }));
    }
    return clients;
  }

  // A scrape through the shared test helper (HTTP/1.0, 5 s socket timeouts); fails the
  // test unless it answers 200 with the body within `limit`.
  void ExpectScrapeWithin(milliseconds limit) {
    const auto start = Clock::now();
    absl::StatusOr<testing::HttpResponse> r = testing::HttpGet(port_, "/metrics");
    const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, kBody);
    EXPECT_LT(took, limit);
  }

  std::unique_ptr<HttpEndpoint> endpoint_;
  uint16_t port_ = 0;
};

TEST_F(HttpEndpointTest, ServesTheBodyInThePrometheusTextFormatAndCloses) {
  Start();
  Response r = Exchange(port_, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, kBody);
  EXPECT_THAT(r.head, HasSubstr("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
  EXPECT_THAT(r.head, HasSubstr(absl::StrCat("\r\nContent-Length: ", sizeof(kBody) - 1, "\r\n")));
  EXPECT_THAT(r.head, HasSubstr("\r\nConnection: close\r\n"));

  Response head = Exchange(port_, "HEAD /metrics HTTP/1.0\r\n\r\n");
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.body, "");
  EXPECT_THAT(head.head, HasSubstr(absl::StrCat("\r\nContent-Length: ", sizeof(kBody) - 1)));
  EXPECT_TRUE(WaitFor([&] { return endpoint_->stats().open == 0; }));
  EXPECT_EQ(endpoint_->stats().served, 2u);
  EXPECT_EQ(endpoint_->stats().refused, 0u);
}

TEST_F(HttpEndpointTest, ServesEachResourceAtItsPathWithItsType) {
  endpoint_ = std::make_unique<HttpEndpoint>(std::vector<HttpResource>{
      {"/metrics", "text/plain; charset=utf-8", [] { return std::string("m 1\n"); }},
      {"/status", "text/html; charset=utf-8", [] { return std::string("<p>ok</p>"); }}});
  auto port = endpoint_->Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  Response metrics = Exchange(*port, "GET /metrics HTTP/1.0\r\n\r\n");
  EXPECT_EQ(metrics.body, "m 1\n");
  EXPECT_THAT(metrics.head, HasSubstr("\r\nContent-Type: text/plain; charset=utf-8\r\n"));
  Response status = Exchange(*port, "GET /status HTTP/1.0\r\n\r\n");
  EXPECT_EQ(status.status, 200);
  EXPECT_EQ(status.body, "<p>ok</p>");
  EXPECT_THAT(status.head, HasSubstr("\r\nContent-Type: text/html; charset=utf-8\r\n"));
  EXPECT_EQ(Exchange(*port, "GET /statu HTTP/1.0\r\n\r\n").status, 404);
  EXPECT_EQ(Exchange(*port, "GET / HTTP/1.0\r\n\r\n").status, 404);
}

TEST_F(HttpEndpointTest, AnswersUnknownPath404OtherMethods405AndGarbage400) {
  Start();
  Response not_found = Exchange(port_, "GET /nope HTTP/1.0\r\n\r\n");
  EXPECT_EQ(not_found.status, 404);
  EXPECT_EQ(not_found.body, "Not Found\n");
  Response post = Exchange(port_, "POST /metrics HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc");
  EXPECT_EQ(post.status, 405);
  EXPECT_THAT(post.head, HasSubstr("\r\nAllow: GET, HEAD\r\n"));
  EXPECT_EQ(Exchange(port_, "\x16\x03\x01\x02\x05\x01\xfc garbage\n\n").status, 400);
  EXPECT_EQ(Exchange(port_, "GET /metrics HTTP/1.0\n\n").status, 400);     // bare LF
  EXPECT_EQ(Exchange(port_, "GET /metrics HTTP/1.1\r\n\r\n").status, 400);  // no Host
  EXPECT_EQ(Exchange(port_, "GET /metrics HTTP/2.0\r\n\r\n").status, 505);
  EXPECT_TRUE(WaitFor([&] { return endpoint_->stats().refused == 6; }));
  EXPECT_EQ(endpoint_->stats().served, 0u);
}

TEST_F(HttpEndpointTest, AnOversizedHeadGets431) {
  Start();
  // No end in sight: answered once the cap is passed, the rest still unsent.
  Client endless(port_);
  ASSERT_TRUE(endless.Send("GET /metrics HTTP/1.1\r\nX: " + std::string(9000, 'a')));
  std::optional<std::string> raw = endless.ReadToClose(milliseconds(3000));
  ASSERT_TRUE(raw.has_value());
  EXPECT_EQ(ParseResponse(*raw).status, 431);
  // A complete head, but longer than 8 KiB.
  Response r =
      Exchange(port_, "GET /metrics HTTP/1.0\r\nX: " + std::string(8200, 'a') + "\r\n\r\n");
  EXPECT_EQ(r.status, 431);
  // Just under the cap is fine.
  const std::string fits = "GET /metrics HTTP/1.0\r\nX: ";
  EXPECT_EQ(Exchange(port_, fits + std::string(8192 - fits.size() - 4, 'a') + "\r\n\r\n").status,
            200);
}

// The security finding: with civetweb's two worker threads, two connections that sent
// half a request blocked every scrape for about 30 s.
class HalfSentRequestsTest : public HttpEndpointTest,
                             public ::testing::WithParamInterface<size_t> {};

TEST_P(HalfSentRequestsTest, DoNotDelayAScrape) {
  Start();  // the default deadline of 5 s: longer than the test
  std::vector<std::unique_ptr<Client>> idle = OpenHalfSent(GetParam());
  ExpectScrapeWithin(milliseconds(1000));
  ExpectScrapeWithin(milliseconds(1000));
  for (auto& c : idle) EXPECT_FALSE(c->ClosedByServer());
  EXPECT_EQ(endpoint_->stats().evicted, 0u);
  EXPECT_EQ(endpoint_->stats().timed_out, 0u);
}

INSTANTIATE_TEST_SUITE_P(Idle, HalfSentRequestsTest, ::testing::Values(2, 20));

// A response body the kernel cannot buffer for a client that does not read and set a
// 4 KiB receive buffer: more than the server's send buffer can grow to (the maximum in
// tcp_wmem, 4 MiB by default), so the server's write to that client stays pending.
std::string UnbufferableBody() {
  size_t max_send_buffer = 4 << 20;
  std::ifstream wmem("/proc/sys/net/ipv4/tcp_wmem");
  size_t min = 0, initial = 0, max = 0;
  if (wmem >> min >> initial >> max && max > 0 && max <= (64 << 20)) max_send_buffer = max;
  return std::string(max_send_buffer + (1 << 20), 'x');
}

TEST_F(HttpEndpointTest, AClientThatDoesNotReadItsResponseDoesNotDelayOthers) {
  const std::string big = UnbufferableBody();
  Start({}, [&big] { return big; });
  Client stuck(port_, /*receive_buffer=*/4096);
  ASSERT_TRUE(stuck.Send("GET /metrics HTTP/1.0\r\n\r\n"));
  ASSERT_TRUE(WaitFor([&] { return endpoint_->stats().accepted == 1; }));
  std::this_thread::sleep_for(milliseconds(50));  // its write has started and stalled

  Response r = Exchange(port_, "GET /metrics HTTP/1.0\r\n\r\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body.size(), big.size());
  // Served while the stuck one's response is still being written (not after its
  // deadline closed it).
  EXPECT_EQ(endpoint_->stats().served, 1u);
  EXPECT_EQ(endpoint_->stats().timed_out, 0u);
  EXPECT_TRUE(WaitFor([&] { return endpoint_->stats().open == 1; }));  // the stuck one
}

TEST_F(HttpEndpointTest, AClientThatDoesNotReadItsResponseIsClosedAtItsDeadline) {
  HttpEndpointOptions o;
  o.deadline = milliseconds(300);
  const std::string big = UnbufferableBody();
  Start(o, [&big] { return big; });
  Client stuck(port_, /*receive_buffer=*/4096);
  ASSERT_TRUE(stuck.Send("GET /metrics HTTP/1.0\r\n\r\n"));
  const auto start = Clock::now();
  EXPECT_TRUE(WaitFor([&] { return endpoint_->stats().timed_out == 1; }));
  EXPECT_GE(Clock::now() - start, milliseconds(200));
  EXPECT_EQ(endpoint_->stats().served, 0u);
  EXPECT_EQ(endpoint_->stats().open, 0u);
  // What the kernel had buffered, then the close.
  std::optional<std::string> got = stuck.ReadToClose(milliseconds(3000));
  ASSERT_TRUE(got.has_value());
  EXPECT_LT(got->size(), big.size());
}

TEST_F(HttpEndpointTest, AConnectionThatSendsNothingIsClosedAtItsDeadline) {
  HttpEndpointOptions o;
  o.deadline = milliseconds(200);
  Start(o);
  const auto start = Clock::now();
  Client silent(port_);
  Client half(port_);
  ASSERT_TRUE(half.Send(kHalfSent));
  std::optional<std::string> got = silent.ReadToClose(milliseconds(2000));
  const auto took = Clock::now() - start;
  ASSERT_TRUE(got.has_value()) << "still open after 2 s";
  EXPECT_EQ(*got, "");  // closed without a response
  EXPECT_GE(took, milliseconds(150));
  EXPECT_LT(took, milliseconds(1500));
  got = half.ReadToClose(milliseconds(2000));
  ASSERT_TRUE(got.has_value()) << "still open after 2 s";
  EXPECT_EQ(*got, "");
  EXPECT_TRUE(WaitFor([&] { return endpoint_->stats().timed_out == 2; }));
  EXPECT_EQ(endpoint_->stats().open, 0u);
}

TEST_F(HttpEndpointTest, The65thConnectionEvictsTheOldest) {
  Start();
  ASSERT_EQ(HttpEndpointOptions{}.max_connections, 64u);
  std::vector<std::unique_ptr<Client>> idle = OpenHalfSent(64);
  EXPECT_EQ(endpoint_->stats().open, 64u);
  EXPECT_FALSE(idle[0]->ClosedByServer());

  Client newest(port_);
  ASSERT_TRUE(newest.connected());
  EXPECT_TRUE(idle[0]->ReadToClose(milliseconds(2000)).has_value()) << "oldest not evicted";
  EXPECT_EQ(endpoint_->stats().evicted, 1u);
  EXPECT_TRUE(WaitFor([&] { return endpoint_->stats().open == 64; }));
  for (size_t i = 1; i < idle.size(); ++i) EXPECT_FALSE(idle[i]->ClosedByServer()) << i;
  EXPECT_FALSE(newest.ClosedByServer());
}

TEST_F(HttpEndpointTest, AFloodOfIdleConnectionsCannotKeepAScraperOut) {
  HttpEndpointOptions o;
  o.max_connections = 8;
  Start(o);
  std::vector<std::unique_ptr<Client>> idle;
  for (int i = 0; i < 100; ++i) {
    idle.push_back(std::make_unique<Client>(port_));
    ASSERT_TRUE(idle.back()->Send(kHalfSent));
  }
  ASSERT_TRUE(WaitFor([&] { return endpoint_->stats().accepted == 100; }));
  EXPECT_EQ(endpoint_->stats().evicted, 92u);
  ExpectScrapeWithin(milliseconds(1000));
  EXPECT_LE(endpoint_->stats().open, 8u);
}

TEST_F(HttpEndpointTest, StopWithOpenConnectionsReturnsPromptly) {
  Start();
  std::vector<std::unique_ptr<Client>> idle = OpenHalfSent(10);
  Client silent(port_);
  ASSERT_TRUE(WaitFor([&] { return endpoint_->stats().open == 11; }));
  const auto start = Clock::now();
  endpoint_->Stop();
  EXPECT_LT(Clock::now() - start, milliseconds(500));
  EXPECT_EQ(endpoint_->port(), 0);
  EXPECT_EQ(endpoint_->stats().open, 0u);
  for (auto& c : idle) EXPECT_TRUE(c->ReadToClose(milliseconds(1000)).has_value());
  EXPECT_TRUE(silent.ReadToClose(milliseconds(1000)).has_value());
  EXPECT_FALSE(Client(port_).connected());
  endpoint_->Stop();  // idempotent
}

TEST_F(HttpEndpointTest, StartRefusesATakenPortAndASecondStartButStartsAgainAfterStop) {
  testing::ListeningSocket taken;
  ASSERT_NE(taken.port(), 0);
  HttpEndpoint endpoint([] { return std::string(kBody); });
  auto port = endpoint.Start("127.0.0.1", taken.port());
  ASSERT_FALSE(port.ok());
  EXPECT_EQ(port.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(port.status().message()), HasSubstr("cannot listen"));
  EXPECT_EQ(endpoint.port(), 0);

  EXPECT_EQ(endpoint.Start("no-such-host.invalid", 0).status().code(),
            absl::StatusCode::kUnavailable);

  port = endpoint.Start("localhost", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  EXPECT_EQ(endpoint.Start("127.0.0.1", 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  endpoint.Stop();
  port = endpoint.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  EXPECT_EQ(Exchange(*port, "GET /metrics HTTP/1.0\r\n\r\n").status, 200);
}

TEST_F(HttpEndpointTest, ARenderThatThrowsGets500AndTheServerGoesOn) {
  std::atomic<int> calls{0};
  Start({}, [&calls]() -> std::string {
    if (calls.fetch_add(1) == 0) throw std::runtime_error("render failed");
    return kBody;
  });
  EXPECT_EQ(Exchange(port_, "GET /metrics HTTP/1.0\r\n\r\n").status, 500);
  ExpectScrapeWithin(milliseconds(1000));
}

}  // namespace
}  // namespace ps::net
