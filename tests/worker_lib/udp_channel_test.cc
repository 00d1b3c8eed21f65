// The UDP path's channel: routes from the Join answer, chunks signed with the route's
// key and sent to its port through a real socket, and the refusals of a route the path
// cannot use.
#include "worker_lib/transport/udp/channel.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <thread>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <boost/asio.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "crypto/auth_proof.h"
#include "harness/lossy_loopback.h"

namespace ps::internal::udp_path {
namespace {

using ::testing::HasSubstr;

// The fp32 codec's largest encoding of n values (Codec::MaxEncodedBytes).
size_t Fp32Bytes(size_t n) { return 1 + 4 * n; }

class UdpChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A lost datagram fails the test instead of hanging it.
    timeval timeout{10, 0};
    ASSERT_EQ(setsockopt(sink_.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout)),
              0);
    options_.chunk_elems = 4;
    auto sender = UdpSender::Start(options_);
    ASSERT_TRUE(sender.ok()) << sender.status();
    sender_ = *std::move(sender);
    channel_ = std::make_unique<UdpChannel>(sender_, options_, /*token=*/"", /*worker_id=*/5,
                                            /*shard=*/1, "127.0.0.1:1");
  }

  // One datagram from the sink.
  std::string Receive() {
    char buf[2048];
    const size_t n = sink_.receive(boost::asio::buffer(buf));
    return std::string(buf, n);
  }

  DataRoute Route() const {
    DataRoute r;
    r.epoch = 2;
    r.session = "token";
    r.udp_port = sink_.local_endpoint().port();
    r.udp_session = 77;
    r.udp_key = std::string(key_.bytes());
    return r;
  }

  // Starts `pushes` as one call; the status each was answered with.
  std::vector<absl::Status> PushAll(const std::vector<OutgoingPush>& pushes, uint64_t* epoch) {
    std::vector<const OutgoingPush*> ptrs;
    for (const OutgoingPush& p : pushes) ptrs.push_back(&p);
    auto call = channel_->NewPush(ptrs, RpcClock::now());
    *epoch = call->epoch();
    std::vector<absl::Status> out(pushes.size(), absl::UnknownError("not answered"));
    call->Start([&](size_t i, absl::Status s) { out[i] = std::move(s); });
    return out;  // every `done` ran before Start returned
  }

  static OutgoingPush Chunk(uint16_t index, uint16_t count, std::string payload) {
    OutgoingPush p;
    p.layout_hash = 9;
    p.round = 3;
    p.slice_id = 6;
    p.codec = "fp32";
    p.chunk_index = index;
    p.chunk_count = count;
    p.chunk_elems = 4;  // the options' (the push pipeline asks chunk_elems())
    p.payload = std::make_shared<const std::string>(std::move(payload));
    return p;
  }

  boost::asio::io_context io_;
  boost::asio::ip::udp::socket sink_{
      io_, boost::asio::ip::udp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0)};
  net::DatagramKey key_ = *net::DatagramKey::Random();
  UdpOptions options_;
  std::shared_ptr<UdpSender> sender_;
  std::unique_ptr<UdpChannel> channel_;
};

TEST_F(UdpChannelTest, ChunksGoOutSignedUnderTheRoutesSession) {
  ASSERT_TRUE(channel_->SetRoute(Route()).ok());
  EXPECT_TRUE(channel_->chunked());
  EXPECT_EQ(channel_->chunk_elems(4, Fp32Bytes), 4u);
  uint64_t epoch = 0;
  const std::vector<OutgoingPush> pushes = {Chunk(0, 2, std::string(16, 'a')),
                                            Chunk(1, 2, std::string(8, 'b'))};
  for (const absl::Status& s : PushAll(pushes, &epoch)) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(epoch, 2u);
  ASSERT_TRUE(channel_->WaitSent().ok());
  // The chunks, then the push's end, twice (UdpOptions::end_copies): kind 1, the push's
  // geometry, no payload; each datagram signed under a nonce of its own.
  std::map<uint16_t, std::string> payloads;
  std::set<std::string> nonces;
  for (int i = 0; i < 4; ++i) {
    const std::string bytes = Receive();
    auto view = net::ParseDatagram(bytes);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_TRUE(key_.Verify(view->nonce, view->signed_bytes, view->mac));
    const net::DatagramHeader& h = view->header;
    EXPECT_EQ(h.kind, i < 2 ? net::DatagramKind::kChunk : net::DatagramKind::kEnd) << i;
    EXPECT_EQ(h.session_id, 77u);
    EXPECT_EQ(h.worker_id, 5u);
    EXPECT_EQ(h.slice_id, 6u);
    EXPECT_EQ(h.round, 3u);
    EXPECT_EQ(h.chunk_elems, 4u);
    EXPECT_EQ(h.chunk_count, 2u);
    EXPECT_EQ(view->codec, "fp32");
    nonces.insert(std::string(view->nonce));
    if (i < 2) {
      payloads[h.chunk_index] = std::string(view->payload);
    } else {
      EXPECT_EQ(h.chunk_index, 0u);
      EXPECT_TRUE(view->payload.empty());
    }
  }
  EXPECT_EQ(payloads[0], *pushes[0].payload);
  EXPECT_EQ(payloads[1], *pushes[1].payload);
  EXPECT_EQ(nonces.size(), 4u);
  WorkerStats stats;
  channel_->FillStats(stats);
  EXPECT_EQ(stats.udp_datagrams_sent, 4u);
  EXPECT_EQ(stats.udp_datagrams_dropped, 0u);
  EXPECT_GT(stats.udp_bytes, 24u);
}

// A borrowed push's chunk (PushOptions::borrow) goes as its payload's head followed by
// the caller's values, signed together, and the sender keeps the push's guard until the
// datagram has left: the caller's buffer is free once WaitSent returned.
TEST_F(UdpChannelTest, ABorrowedChunkSendsTheCallersValuesAndLetsGoOnceSent) {
  ASSERT_TRUE(channel_->SetRoute(Route()).ok());
  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 0.0f};
  const std::string_view value_bytes(reinterpret_cast<const char*>(values.data()),
                                     values.size() * sizeof(float));
  auto guard = std::make_shared<int>(0);
  const std::weak_ptr<int> alive = guard;
  std::vector<OutgoingPush> pushes;
  pushes.push_back(Chunk(0, 1, "\x01"));
  pushes[0].borrowed = std::span<const char>(value_bytes.data(), value_bytes.size());
  pushes[0].borrowed_guard = std::move(guard);
  uint64_t epoch = 0;
  for (const absl::Status& s : PushAll(pushes, &epoch)) EXPECT_TRUE(s.ok()) << s;
  pushes.clear();  // the pipeline lets go of its pushes once Start returned
  ASSERT_TRUE(channel_->WaitSent().ok());
  EXPECT_TRUE(alive.expired()) << "the sender still holds the caller's buffer";
  const std::string bytes = Receive();
  auto view = net::ParseDatagram(bytes);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_TRUE(key_.Verify(view->nonce, view->signed_bytes, view->mac));
  EXPECT_EQ(view->header.kind, net::DatagramKind::kChunk);
  EXPECT_EQ(view->header.chunk_count, 1u);
  EXPECT_EQ(view->payload, std::string("\x01") + std::string(value_bytes));
}

TEST_F(UdpChannelTest, OneEndForAllOfACallsPushes) {
  ASSERT_TRUE(channel_->SetRoute(Route()).ok());
  // Slice 6 in two chunks, slice 8 in one, slice 9's first chunk of two (its end is not
  // this call's), priorities 4, 2 and 1.
  std::vector<OutgoingPush> pushes = {Chunk(0, 2, "a"), Chunk(1, 2, "b"), Chunk(0, 1, "c"),
                                      Chunk(0, 2, "d")};
  pushes[0].priority = pushes[1].priority = 4;
  pushes[2].slice_id = 8;
  pushes[2].priority = 2;
  pushes[3].slice_id = 9;
  pushes[3].priority = 1;
  uint64_t epoch = 0;
  for (const absl::Status& s : PushAll(pushes, &epoch)) EXPECT_TRUE(s.ok()) << s;
  ASSERT_TRUE(channel_->WaitSent().ok());
  // The chunks, then the end's two copies, queued at the priority that leaves last (4),
  // so behind every chunk: slice 6 in its header, slice 8 in its one entry.
  std::vector<net::DatagramHeader> ends;
  std::vector<uint32_t> chunk_slices;
  for (int i = 0; i < 6; ++i) {
    const std::string bytes = Receive();
    auto view = net::ParseDatagram(bytes);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_TRUE(key_.Verify(view->nonce, view->signed_bytes, view->mac));
    if (view->header.kind == net::DatagramKind::kChunk) {
      EXPECT_TRUE(ends.empty()) << "a chunk after an end";
      chunk_slices.push_back(view->header.slice_id);
      continue;
    }
    const std::vector<net::DatagramHeader> ended = net::EndedPushes(view->header, view->payload);
    ASSERT_EQ(ended.size(), 2u);
    EXPECT_EQ(ended[0].slice_id, 6u);
    EXPECT_EQ(ended[0].chunk_count, 2u);
    EXPECT_EQ(ended[1].slice_id, 8u);
    EXPECT_EQ(ended[1].chunk_count, 1u);
    EXPECT_EQ(ended[1].round, 3u);
    ends.push_back(view->header);
  }
  std::sort(chunk_slices.begin(), chunk_slices.end());
  EXPECT_EQ(chunk_slices, (std::vector<uint32_t>{6, 6, 8, 9}));
  EXPECT_EQ(ends.size(), 2u);
  WorkerStats stats;
  channel_->FillStats(stats);
  EXPECT_EQ(stats.udp_datagrams_sent, 6u);
}

// With a token, the datagrams' key is the route's secret bound to it (crypto::UdpKey, as
// the shard's Authenticator derives it): a reader of the Join answer, who has the
// secret but not the token, cannot make a datagram that verifies.
TEST_F(UdpChannelTest, WithATokenTheKeyIsTheSecretBoundToIt) {
  const std::string token(64, 'f');
  UdpChannel bound(sender_, options_, token, /*worker_id=*/5, /*shard=*/1, "127.0.0.1:1");
  ASSERT_TRUE(bound.SetRoute(Route()).ok());
  std::vector<const OutgoingPush*> ptrs;
  const OutgoingPush push = Chunk(0, 1, std::string(16, 'a'));
  ptrs.push_back(&push);
  absl::Status answer = absl::UnknownError("not answered");
  bound.NewPush(ptrs, RpcClock::now())->Start([&](size_t, absl::Status s) { answer = std::move(s); });
  EXPECT_TRUE(answer.ok()) << answer;
  ASSERT_TRUE(bound.WaitSent().ok());
  const std::string bytes = Receive();
  auto view = net::ParseDatagram(bytes);
  ASSERT_TRUE(view.ok()) << view.status();
  auto derived = net::DatagramKey::FromBytes(
      crypto::UdpKey(token, crypto::TokenKey(token), "shard-1", 77, key_.bytes()));
  ASSERT_TRUE(derived.ok());
  EXPECT_TRUE(derived->Verify(view->nonce, view->signed_bytes, view->mac));
  EXPECT_FALSE(key_.Verify(view->nonce, view->signed_bytes, view->mac))
      << "the secret of the Join answer alone must not sign";
  // The secret's size is checked before it is bound: a short one is refused.
  DataRoute route = Route();
  route.udp_key = "short";
  EXPECT_EQ(bound.SetRoute(route).code(), absl::StatusCode::kInternal);
}

TEST_F(UdpChannelTest, AShardWithoutTheUdpPathOrWithABadKeyIsRefused) {
  uint64_t epoch = 0;
  EXPECT_THAT(PushAll({Chunk(0, 1, "x")}, &epoch)[0].message(), HasSubstr("gave no UDP key"));
  DataRoute route = Route();
  route.udp_port = 0;
  absl::Status st = channel_->SetRoute(route);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(),
              HasSubstr("shard 1 (127.0.0.1:1) runs without the UDP path (start it with --udp-port)"));
  route = Route();
  route.udp_key = "short";
  st = channel_->SetRoute(route);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(st.message(), HasSubstr("handed out a bad UDP key"));
  // The refused route is in effect: its pushes fail, none leaves.
  const std::vector<absl::Status> answers = PushAll({Chunk(0, 2, "x"), Chunk(1, 2, "y")}, &epoch);
  for (const absl::Status& s : answers) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.message(), HasSubstr("shard 1 (127.0.0.1:1) gave no UDP key"));
  }
  EXPECT_EQ(epoch, 2u);
  ASSERT_TRUE(channel_->WaitSent().ok());
  EXPECT_EQ(sink_.available(), 0u);
}

TEST_F(UdpChannelTest, AChunkThatDoesNotFitEndsThePush) {
  ASSERT_TRUE(channel_->SetRoute(Route()).ok());
  uint64_t epoch = 0;
  const std::vector<absl::Status> answers =
      PushAll({Chunk(0, 2, std::string(70000, 'z')), Chunk(1, 2, "small")}, &epoch);
  EXPECT_EQ(answers[0].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(answers[0].message(), HasSubstr("UDP chunk 0 of slice 6: "));
  EXPECT_THAT(answers[0].message(), HasSubstr("(lower udp.chunk_elems)"));
  EXPECT_EQ(answers[1], answers[0]) << "what follows a failure is not sent";
  ASSERT_TRUE(channel_->WaitSent().ok());
  EXPECT_EQ(sink_.available(), 0u);
}

TEST_F(UdpChannelTest, PullsGoOverTheDataPlane) {
  struct Sink final : PullSink {
    absl::StatusOr<std::span<char>> Place(const net::PullHeader&, size_t) override {
      ADD_FAILURE() << "nothing is pulled over UDP";
      return std::span<char>();
    }
    absl::Status Arrived(const net::PullHeader&, net::Pieces) override {
      return absl::InternalError("unexpected");
    }
    void Done(absl::Status s) override { status = std::move(s); }
    absl::Status status;
  };
  ASSERT_TRUE(channel_->SetRoute(Route()).ok());
  auto sink = std::make_shared<Sink>();
  EXPECT_EQ(channel_->Pull(PullAsk{}, RpcClock::now(), sink), 2u);
  EXPECT_EQ(sink->status.code(), absl::StatusCode::kUnimplemented);
}

// Without a set chunk size, a chunk fills one packet of the route to its shard: on
// loopback, of loopback's MTU; in a network namespace of the test's own, of a veth
// device's 1400-byte MTU (and, with no route at all, the fallback of 8192 values). A set
// chunk size wins everywhere. The namespace needs root, nft and ip.
TEST(UdpChannelChunkTest, WithoutASetSizeAChunkFillsOnePacketOfTheRoutesMtu) {
  const auto channel_to = [](const std::string& address, uint32_t port, uint32_t chunk_elems) {
    UdpOptions options;
    options.chunk_elems = chunk_elems;
    auto sender = UdpSender::Start(options);
    EXPECT_TRUE(sender.ok()) << sender.status();
    auto channel = std::make_unique<UdpChannel>(*std::move(sender), options, /*token=*/"",
                                                /*worker_id=*/5, /*shard=*/1, address);
    DataRoute r;
    r.epoch = 1;
    r.udp_port = port;
    r.udp_session = 7;
    r.udp_key = std::string(net::kDatagramKeyBytes, 'k');
    const absl::Status routed = channel->SetRoute(r);
    EXPECT_TRUE(routed.ok()) << routed;
    return channel;
  };
  size_t lo_mtu = 0;
  std::ifstream("/sys/class/net/lo/mtu") >> lo_mtu;
  ASSERT_GT(lo_mtu, 0u);
  const auto loopback = channel_to("127.0.0.1:1", 9, 0);
  EXPECT_TRUE(loopback->chunked());
  EXPECT_EQ(loopback->chunk_elems(4, Fp32Bytes), net::ChunkElemsForMtu(lo_mtu, false, 4));
  EXPECT_EQ(loopback->chunk_elems(40, Fp32Bytes), net::ChunkElemsForMtu(lo_mtu, false, 40));
  EXPECT_EQ(channel_to("127.0.0.1:1", 9, 512)->chunk_elems(4, Fp32Bytes), 512u);
  // A codec whose largest encoding takes 8 bytes a value gets chunks that keep it within
  // one datagram; a set size is the caller's to choose (Push refuses one that fails).
  const auto eight = [](size_t n) { return 8 + 8 * n; };
  const uint32_t wide = loopback->chunk_elems(4, eight);
  EXPECT_LE(eight(wide), net::kMaxDatagramBytes - net::DatagramOverhead(4));
  EXPECT_GT(eight(wide + 1), net::kMaxDatagramBytes - net::DatagramOverhead(4));
  EXPECT_EQ(channel_to("127.0.0.1:1", 9, 9000)->chunk_elems(4, eight), 9000u);
  // IPv6's header is 40 bytes: 4 values fewer on loopback (where ::1 is up).
  bool have_v6_loopback = false;
  std::ifstream inet6("/proc/net/if_inet6");
  for (std::string line; std::getline(inet6, line);) {
    have_v6_loopback = have_v6_loopback || line.starts_with("00000000000000000000000000000001");
  }
  if (have_v6_loopback) {
    EXPECT_EQ(channel_to("[::1]:1", 9, 0)->chunk_elems(4, Fp32Bytes), net::ChunkElemsForMtu(lo_mtu, true, 4));
    EXPECT_EQ(net::ChunkElemsForMtu(65536, true, 4), 16349u);
  }

  std::string skip;
  // The namespace is the thread's (harness::LossyLoopback): the test's main thread, and
  // the tests after it, stay where they were; `ip` runs as a child of this thread.
  std::thread in_namespace([&] {
    absl::StatusOr<harness::LossyLoopback> ns = harness::LossyLoopback::Enter();
    if (!ns.ok()) {
      skip = ns.status().ToString();
      return;
    }
    if (std::system("ip link add ps0 type veth peer name ps1 && ip link set ps0 mtu 1400 up && "
                    "ip link set ps1 up && ip addr add 10.77.0.1/24 dev ps0") != 0) {
      skip = "ip could not make a veth pair";
      return;
    }
    EXPECT_EQ(channel_to("10.77.0.2:1", 9, 0)->chunk_elems(4, Fp32Bytes), net::ChunkElemsForMtu(1400, false, 4));
    EXPECT_EQ(channel_to("10.77.0.2:1", 9, 0)->chunk_elems(4, Fp32Bytes), 320u);  // (1400 - 28 - 92) / 4
    EXPECT_EQ(channel_to("10.77.0.2:1", 9, 100)->chunk_elems(4, Fp32Bytes), 100u);
    // No route to 192.0.2.1 in this namespace: the MTU is unknown.
    EXPECT_EQ(channel_to("192.0.2.1:1", 9, 0)->chunk_elems(4, Fp32Bytes), UdpChannel::kUnknownMtuChunkElems);
  });
  in_namespace.join();
  if (!skip.empty()) GTEST_SKIP() << "no network namespace with a veth pair here: " << skip;
}

}  // namespace
}  // namespace ps::internal::udp_path
