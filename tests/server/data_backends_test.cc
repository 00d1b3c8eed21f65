// The data backends' list (server/transport/backend.h): which backends the options start,
// that each is seen through the interface only (name, port, serving and totals lines,
// metric families, stop), and that a backend that cannot start fails the list naming its
// address and stops those already started.
#include "server/transport/backend.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "aggregators/aggregator.h"
#include "core/thread_pool.h"
#include "server/shard.h"
#include "server/shard_front.h"

namespace ps::server::transport {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class DataBackendsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.num_workers = 2;
    options_.udp_port = -1;
    options_.data_plane = core::DataPlane::kGrpc;
    aggregators::AggregatorOptions a;
    a.num_workers = 2;
    auto rule = aggregators::MakeAggregator("mean", a);
    ASSERT_TRUE(rule.ok()) << rule.status();
    shard_ = std::make_unique<Shard>(options_, 0, *std::move(rule), core::Clock::Real(), &pool_);
    front_ = std::make_unique<ShardFront>(shard_.get(), nullptr, nullptr);
  }

  absl::StatusOr<std::vector<std::unique_ptr<DataBackend>>> Start() {
    BackendContext c;
    c.options = &options_;
    c.front = front_.get();
    c.clock = core::Clock::Real();
    return StartDataBackends(c);
  }

  static std::vector<std::string> Names(const std::vector<std::unique_ptr<DataBackend>>& list) {
    std::vector<std::string> out;
    for (const auto& b : list) out.emplace_back(b->name());
    return out;
  }

  static std::vector<std::string> FamilyNames(const BackendScrape& s) {
    std::vector<std::string> out;
    for (const BackendFamily& f : s.families) out.push_back(f.name);
    return out;
  }

  // Whether a TCP connection to 127.0.0.1:port is accepted.
  static bool Accepts(uint16_t port) {
    boost::asio::io_context io;
    boost::asio::ip::tcp::socket s(io);
    boost::system::error_code ec;
    s.connect({boost::asio::ip::make_address("127.0.0.1"), port}, ec);
    return !ec;
  }

  ServerOptions options_;
  core::ThreadPool pool_{1, "test-agg"};
  std::unique_ptr<Shard> shard_;
  std::unique_ptr<ShardFront> front_;
};

TEST_F(DataBackendsTest, GrpcWithoutUdpStartsNone) {
  auto list = Start();
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_THAT(*list, IsEmpty()) << "gRPC's data methods ride the control port";
  EXPECT_EQ(FindBackend(*list, "tcp"), nullptr);
}

TEST_F(DataBackendsTest, EachOptionStartsItsBackendInTheListsOrder) {
  options_.udp_port = 0;
  {
    auto list = Start();
    ASSERT_TRUE(list.ok()) << list.status();
    EXPECT_THAT(Names(*list), ElementsAre("udp"));
  }
  options_.data_plane = core::DataPlane::kTcp;
  auto list = Start();
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_THAT(Names(*list), ElementsAre("udp", "tcp"));
  const DataBackend* tcp = FindBackend(*list, "tcp");
  const DataBackend* udp = FindBackend(*list, "udp");
  ASSERT_NE(tcp, nullptr);
  ASSERT_NE(udp, nullptr);
  EXPECT_NE(tcp->port(), 0);
  EXPECT_NE(udp->port(), 0);
  EXPECT_EQ(tcp->ServingLine(), absl::StrCat("TCP data plane on 127.0.0.1:", tcp->port(), " (2 threads)"));
  EXPECT_EQ(udp->ServingLine(), absl::StrCat("UDP gradient path on 127.0.0.1:", udp->port()));
  EXPECT_TRUE(Accepts(tcp->port()));
}

TEST_F(DataBackendsTest, EachBackendReportsItsOwnFamiliesAndBytes) {
  options_.udp_port = 0;
  options_.data_plane = core::DataPlane::kTcp;
  auto list = Start();
  ASSERT_TRUE(list.ok()) << list.status();
  const ShardStats st = shard_->stats();
  const std::vector<Membership::State> states = shard_->MembershipStates();

  const BackendScrape udp = FindBackend(*list, "udp")->Collect(st, states);
  ASSERT_TRUE(udp.received_bytes.has_value()) << "UDP counts its datagrams' bytes itself";
  EXPECT_EQ(*udp.received_bytes, 0u);
  EXPECT_THAT(FamilyNames(udp), ElementsAre("ps_udp_chunks_accepted_total", "ps_udp_chunks_lost_total",
                                            "ps_udp_chunks_held_from_before_total",
                                            "ps_udp_datagrams_dropped_total",
                                            "ps_udp_push_ends_total",
                                            "ps_worker_udp_chunks_total"));
  EXPECT_EQ(udp.families[3].series.size(), 6u) << "one series per drop reason";
  EXPECT_EQ(udp.families[4].series.size(), 2u) << "taken and after_close";
  EXPECT_EQ(udp.families[5].series.size(), 2u) << "one series per worker of --workers";

  // A connection accepted by the TCP port shows in its families; its bytes are the front's.
  const DataBackend* tcp = FindBackend(*list, "tcp");
  ASSERT_TRUE(Accepts(tcp->port()));
  BackendScrape scrape;
  for (int i = 0; i < 200; ++i) {
    scrape = tcp->Collect(st, states);
    if (scrape.families[0].series[0].value >= 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(scrape.received_bytes.has_value());
  EXPECT_THAT(FamilyNames(scrape),
              ElementsAre("ps_data_connections_accepted_total", "ps_data_connections_refused_total",
                          "ps_data_connections_admitted_total", "ps_data_connections_open",
                          "ps_data_connections_closed_total"));
  EXPECT_EQ(scrape.families[0].series[0].value, 1);
  EXPECT_EQ(scrape.families[3].type, BackendFamily::Type::kGauge);

  // Stopped, each still answers; the TCP port takes no connection any more.
  for (const auto& b : *list) b->Stop();
  for (const auto& b : *list) b->Stop();  // idempotent
  EXPECT_FALSE(Accepts(tcp->port()));
  EXPECT_THAT(tcp->TotalsLine(st), HasSubstr("TCP data plane: 1 connections taken"));
  EXPECT_THAT(FindBackend(*list, "udp")->TotalsLine(st), HasSubstr("UDP: 0 chunks taken, 0 lost"));
}

TEST_F(DataBackendsTest, ABackendThatCannotBindFailsTheListNamingItsAddress) {
  // The data port is taken: the list fails with TCP's error, which names the address (UDP,
  // started before it, is stopped and freed with the list).
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor taken(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
  options_.udp_port = 0;
  options_.data_plane = core::DataPlane::kTcp;
  options_.data_port = taken.local_endpoint().port();
  auto list = Start();
  ASSERT_FALSE(list.ok());
  EXPECT_EQ(list.status().code(), absl::StatusCode::kUnavailable) << list.status();
  EXPECT_THAT(std::string(list.status().message()),
              HasSubstr(absl::StrCat("127.0.0.1:", options_.data_port)));
}

}  // namespace
}  // namespace ps::server::transport
