// The worker's UDP sender: seeded loss injection and sending through a real socket.
#include "worker_lib/transport/udp/sender.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <set>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include <boost/asio.hpp>

#include "absl/strings/str_cat.h"
#include "harness/lossy_loopback.h"

namespace ps::internal::udp_path {
namespace {

TEST(InjectedLossTest, IsSeededAndHitsItsRate) {
  UdpOptions o;
  o.loss = 0.1;
  o.loss_seed = 7;
  int lost = 0;
  for (uint32_t chunk = 0; chunk < 20000; ++chunk) lost += InjectedLoss(o, 1, 2, 3, chunk);
  EXPECT_NEAR(lost / 20000.0, 0.1, 0.01);
  // The same inputs lose the same datagrams; another seed loses others.
  UdpOptions other = o;
  other.loss_seed = 8;
  int same = 0, differ = 0;
  for (uint32_t chunk = 0; chunk < 2000; ++chunk) {
    same += InjectedLoss(o, 1, 2, 3, chunk) == InjectedLoss(o, 1, 2, 3, chunk);
    differ += InjectedLoss(o, 1, 2, 3, chunk) != InjectedLoss(other, 1, 2, 3, chunk);
  }
  EXPECT_EQ(same, 2000);
  EXPECT_GT(differ, 100);
  o.loss = 0;
  for (uint32_t chunk = 0; chunk < 1000; ++chunk) EXPECT_FALSE(InjectedLoss(o, 1, 2, 3, chunk));
}

TEST(UdpSenderTest, RefusesBadOptions) {
  UdpOptions o;
  o.loss = 1.0;
  EXPECT_EQ(UdpSender::Start(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.loss = -0.1;
  EXPECT_EQ(UdpSender::Start(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.loss = 0;
  o.rate_mbps = -1;
  EXPECT_EQ(UdpSender::Start(o).status().code(), absl::StatusCode::kInvalidArgument);
  // chunk_elems 0 is the default: chunks of one packet of each route's MTU.
  o.rate_mbps = 0;
  o.chunk_elems = 0;
  EXPECT_TRUE(UdpSender::Start(o).ok());
}

// A UDP socket on loopback for a sender to send to; a lost datagram fails the test
// instead of hanging it.
struct Sink {
  boost::asio::io_context io;
  boost::asio::ip::udp::socket socket{
      io, boost::asio::ip::udp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0)};

  Sink() {
    timeval timeout{10, 0};
    EXPECT_EQ(setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout)),
              0);
  }
  uint16_t port() const { return socket.local_endpoint().port(); }
  // The next n datagrams, in whatever order they came.
  std::set<std::string> Receive(int n) {
    std::set<std::string> got;
    std::string buf(65536, '\0');
    for (int i = 0; i < n; ++i) {
      const size_t size = socket.receive(boost::asio::buffer(buf));
      got.insert(buf.substr(0, size));
    }
    return got;
  }
};

TEST(UdpSenderTest, SendsMostUrgentFirstAndDropsInjectedLosses) {
  Sink s;
  auto to = ResolveUdp("127.0.0.1:1", s.port());
  ASSERT_TRUE(to.ok()) << to.status();
  UdpOptions o;
  auto sender = UdpSender::Start(o);
  ASSERT_TRUE(sender.ok());
  // Queued while the sender may still be asleep; whatever order they leave in, the
  // dropped one never arrives.
  // Datagrams of the same priority and round (two slices, two shards) are all kept.
  (*sender)->Enqueue(2, 0, *to, "late layer", false);
  (*sender)->Enqueue(0, 0, *to, "first layer", false);
  (*sender)->Enqueue(0, 0, *to, "first layer, other shard", false);
  (*sender)->Enqueue(1, 0, *to, "lost", true);
  ASSERT_TRUE((*sender)->WaitIdle().ok());
  EXPECT_EQ((*sender)->datagrams_sent(), 3u);
  EXPECT_EQ((*sender)->datagrams_dropped(), 1u);
  const std::set<std::string> got = s.Receive(3);
  EXPECT_EQ(got, (std::set<std::string>{"late layer", "first layer", "first layer, other shard"}));
  EXPECT_EQ(s.socket.available(), 0u);
}

// A datagram the local kernel refuses is lost as the network would lose it: counted, and
// WaitIdle stays OK while other datagrams to the same shard went. Only a destination that
// every datagram since the last wait failed to reach fails WaitIdle, naming it and the
// error. Real refusals: a datagram over UDP's 65,507 bytes (EMSGSIZE) and the limited
// broadcast address without SO_BROADCAST (EACCES, or no route where none leads there).
TEST(UdpSenderTest, AKernelRefusalIsALossUnlessNothingReachedTheShard) {
  Sink s;
  auto to = ResolveUdp("127.0.0.1:1", s.port());
  ASSERT_TRUE(to.ok()) << to.status();
  const boost::asio::ip::udp::endpoint nowhere(boost::asio::ip::make_address("255.255.255.255"),
                                               s.port());
  auto sender = UdpSender::Start(UdpOptions{});
  ASSERT_TRUE(sender.ok());
  (*sender)->Enqueue(0, 0, *to, "a", false);
  (*sender)->Enqueue(0, 0, *to, std::string(70'000, 'x'), false);
  (*sender)->Enqueue(0, 0, *to, "b", false);
  EXPECT_TRUE((*sender)->WaitIdle().ok());
  EXPECT_EQ((*sender)->datagrams_sent(), 2u);
  EXPECT_EQ((*sender)->send_errors(), 1u);
  EXPECT_EQ((*sender)->datagrams_dropped(), 0u) << "the loss injection's count only";

  (*sender)->Enqueue(0, 0, nowhere, "x", false);
  (*sender)->Enqueue(0, 0, *to, "c", false);
  (*sender)->Enqueue(0, 0, nowhere, "y", false);
  const absl::Status cut_off = (*sender)->WaitIdle();
  EXPECT_EQ(cut_off.code(), absl::StatusCode::kUnavailable) << cut_off;
  EXPECT_THAT(std::string(cut_off.message()),
              ::testing::AllOf(::testing::HasSubstr("UDP send to 255.255.255.255:"),
                               ::testing::HasSubstr("all 2 datagrams to it since the last wait")));
  EXPECT_EQ((*sender)->send_errors(), 3u);
  EXPECT_TRUE((*sender)->WaitIdle().ok()) << "each wait looks at what was sent since the last";

  const std::set<std::string> got = s.Receive(3);
  EXPECT_EQ(got, (std::set<std::string>{"a", "b", "c"}));
}

// The same through a real firewall: in a network namespace of the test's own, an
// nftables rule on output drops the datagrams of one length to the sink, then all of
// them, and the kernel fails each such send with EPERM (the refusal that once stopped the
// Fashion-MNIST trainer). Those are losses: counted once each (sendmmsg reports only the
// first failure of a batch; the sender sends the rest again, and the rule refuses the
// same datagrams again), the rest delivered, WaitIdle OK; when every datagram is refused,
// WaitIdle fails with the kernel's words. Needs root and nft.
TEST(UdpSenderTest, AFirewallsDropOnOutputIsALossUnlessItDropsEverything) {
  std::string skip;
  // The namespace is the thread's: the test's main thread, and the tests after it, stay
  // where they were.
  std::thread in_namespace([&skip] {
    absl::StatusOr<harness::LossyLoopback> ns = harness::LossyLoopback::Enter();
    if (!ns.ok()) {
      skip = ns.status().ToString();
      return;
    }
    Sink s;  // bound on the namespace's loopback
    auto to = ResolveUdp("127.0.0.1:1", s.port());
    ASSERT_TRUE(to.ok()) << to.status();
    const auto rule = [&](const char* match) {
      return absl::StrCat("table inet ps_test\ndelete table inet ps_test\n",
                          "table inet ps_test {\n  chain out {\n",
                          "    type filter hook output priority 0; policy accept;\n",
                          "    udp dport ", s.port(), " ", match, " drop\n  }\n}\n");
    };
    // 13 bytes of UDP: its 8-byte header and a 5-byte datagram.
    absl::StatusOr<std::string> five = ns->Nft(rule("udp length 13"));
    ASSERT_TRUE(five.ok()) << five.status();
    auto sender = UdpSender::Start(UdpOptions{});
    ASSERT_TRUE(sender.ok());
    for (int i = 0; i < 3; ++i) {
      (*sender)->Enqueue(0, 0, *to, absl::StrCat("lost", i), false);
      (*sender)->Enqueue(0, 0, *to, absl::StrCat("kept0", i), false);
    }
    EXPECT_TRUE((*sender)->WaitIdle().ok());
    EXPECT_EQ((*sender)->send_errors(), 3u);
    EXPECT_EQ((*sender)->datagrams_sent(), 3u);
    const std::set<std::string> got = s.Receive(3);
    EXPECT_EQ(got, (std::set<std::string>{"kept00", "kept01", "kept02"}));
    EXPECT_EQ(s.socket.available(), 0u);

    absl::StatusOr<std::string> all = ns->Nft(rule(""));
    ASSERT_TRUE(all.ok()) << all.status();
    (*sender)->Enqueue(0, 0, *to, "x", false);
    (*sender)->Enqueue(0, 0, *to, "y", false);
    const absl::Status cut_off = (*sender)->WaitIdle();
    EXPECT_EQ(cut_off.code(), absl::StatusCode::kUnavailable) << cut_off;
    EXPECT_THAT(std::string(cut_off.message()),
                ::testing::AllOf(::testing::HasSubstr(absl::StrCat("127.0.0.1:", s.port())),
                                 ::testing::HasSubstr("Operation not permitted"),
                                 ::testing::HasSubstr("all 2 datagrams to it since the last wait")));
    EXPECT_EQ((*sender)->send_errors(), 5u);
  });
  in_namespace.join();
  if (!skip.empty()) GTEST_SKIP() << "no network namespace with nftables here: " << skip;
}

// A datagram queued in pieces leaves as one: head, payload (sent from where it lies, and
// kept alive by the sender after the caller let go), MAC; a payload in two pieces (a
// borrowed push's head and the caller's values), each kept until sent; an empty payload
// too. The byte count is the datagrams'.
TEST(UdpSenderTest, SendsAPiecewiseDatagramAsOne) {
  Sink s;
  const boost::asio::ip::udp::endpoint to(boost::asio::ip::make_address("127.0.0.1"), s.port());
  auto sender = UdpSender::Start(UdpOptions{});
  ASSERT_TRUE(sender.ok());

  auto payload = std::make_shared<const std::string>(3000, 'p');
  net::SignedDatagram parts;
  parts.head = "head:";
  for (size_t i = 0; i < parts.mac.size(); ++i) parts.mac[i] = static_cast<uint8_t>('a' + i);
  const std::string mac(parts.mac.begin(), parts.mac.end());
  DatagramPayload whole;
  whole.pieces[0] = *payload;
  whole.keep[0] = std::move(payload);
  (*sender)->Enqueue(0, 0, to, parts, std::move(whole), false);
  // Two pieces: a head the sender shares, and bytes it borrows under a guard.
  auto head = std::make_shared<const std::string>("h");
  const std::string values(2000, 'v');
  auto guard = std::make_shared<int>(0);
  const std::weak_ptr<int> guard_alive = guard;
  net::SignedDatagram two;
  two.head = "two:";
  two.mac = parts.mac;
  DatagramPayload pieces;
  pieces.pieces = {*head, values};
  pieces.keep = {std::move(head), std::move(guard)};
  (*sender)->Enqueue(2, 0, to, two, std::move(pieces), false);
  net::SignedDatagram empty;
  empty.head = "empty:";
  empty.mac = parts.mac;
  (*sender)->Enqueue(1, 0, to, empty, DatagramPayload{}, false);
  ASSERT_TRUE((*sender)->WaitIdle().ok());
  EXPECT_TRUE(guard_alive.expired()) << "the sender let go of the borrowed bytes once sent";
  EXPECT_EQ((*sender)->datagrams_sent(), 3u);
  EXPECT_EQ((*sender)->bytes_sent(), (5 + 3000 + 16) + (4 + 1 + 2000 + 16) + (6 + 16u));

  const std::set<std::string> got = s.Receive(3);
  EXPECT_EQ(got, (std::set<std::string>{"head:" + std::string(3000, 'p') + mac,
                                        "two:h" + values + mac, "empty:" + mac}));
}

}  // namespace
}  // namespace ps::internal::udp_path
