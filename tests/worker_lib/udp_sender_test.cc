// The worker's UDP sender: seeded loss injection and sending through a real socket.
#include "worker_lib/transport/udp/sender.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <set>
#include <string>
#include <utility>

#include <boost/asio.hpp>

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
  o.loss = 0;
  o.chunk_elems = 0;
  EXPECT_EQ(UdpSender::Start(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(UdpSenderTest, SendsMostUrgentFirstAndDropsInjectedLosses) {
  boost::asio::io_context io;
  boost::asio::ip::udp::socket sink(io, boost::asio::ip::udp::endpoint(
                                            boost::asio::ip::make_address("127.0.0.1"), 0));
  // A lost datagram fails the test instead of hanging it.
  timeval timeout{10, 0};
  ASSERT_EQ(setsockopt(sink.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout)), 0);
  auto to = ResolveUdp("127.0.0.1:1", sink.local_endpoint().port());
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
  std::set<std::string> got;
  char buf[64];
  for (int i = 0; i < 3; ++i) {
    const size_t n = sink.receive(boost::asio::buffer(buf));
    got.insert(std::string(buf, n));
  }
  EXPECT_EQ(got, (std::set<std::string>{"late layer", "first layer", "first layer, other shard"}));
  EXPECT_EQ(sink.available(), 0u);
}

}  // namespace
}  // namespace ps::internal::udp_path
