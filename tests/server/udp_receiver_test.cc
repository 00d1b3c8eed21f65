// The shard's UDP path, datagram by datagram (transport::udp::Receiver::Handle) and once through a
// real loopback socket: whole pushes close a round, hostile datagrams are dropped and
// counted by why while the honest round completes, and a lost chunk is masked out of
// the aggregate when the round closes at its deadline.
#include "server/transport/udp/receiver.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/synchronization/notification.h"
#include "codecs/codec.h"
#include "core/fp32_bytes.h"
#include "net/udp_frame.h"

namespace ps::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint32_t kSliceNumel = 10;      // one slice of 10 values
constexpr uint32_t kChunkElems = 4;  // chunks of 4, 4 and 2 values

class UdpReceiverTest : public ::testing::Test {
 protected:
  void Make(uint32_t n, const std::string& rule = "mean",
            std::chrono::milliseconds quarantine = std::chrono::milliseconds(10000),
            uint32_t quorum = 0) {
    ServerOptions o;
    o.num_workers = n;
    o.quorum = quorum;
    o.quarantine = quarantine;
    o.learning_rate = 1.0f;
    o.momentum = 0.0f;
    o.round_deadline = std::chrono::milliseconds(100);
    aggregators::AggregatorOptions a;
    a.num_workers = static_cast<int>(n);
    auto agg = aggregators::MakeAggregator(rule, a);
    ASSERT_TRUE(agg.ok()) << agg.status();
    shard_ = std::make_unique<Shard>(o, 0, *std::move(agg), &clock_, &pool_);
    // Slice 0: "w" (10 values, three chunks); slice 1: "b" (4 values).
    auto layout = core::ModelLayout::Create({{"w", kSliceNumel, 0}, {"b", 4, 1}}, 16, 1);
    ASSERT_TRUE(layout.ok());
    layout_hash_ = layout->hash();
    for (uint32_t w = 0; w < n; ++w) Join(w);
    ASSERT_TRUE(shard_->RegisterLayout(0, *layout).ok());
    std::string zeros;
    core::AppendFp32(std::vector<float>(kSliceNumel, 0.0f), &zeros);
    ASSERT_TRUE(shard_->InitSlice(0, layout_hash_, 0, zeros).ok());
    ASSERT_TRUE(shard_->InitSlice(0, layout_hash_, 1, zeros.substr(0, 16)).ok());
    front_ = std::make_unique<ShardFront>(shard_.get(), nullptr, nullptr);
    auto receiver = transport::udp::Receiver::Start("127.0.0.1", 0, 1 << 20, 2, front_.get());
    ASSERT_TRUE(receiver.ok()) << receiver.status();
    receiver_ = *std::move(receiver);
  }

  void Join(uint32_t w) {
    auto j = shard_->Join(w, layout_hash_);
    ASSERT_TRUE(j.ok()) << j.status();
    auto key = net::DatagramKey::FromBytes(j->udp_key);
    ASSERT_TRUE(key.ok());
    sessions_.resize(std::max<size_t>(sessions_.size(), w + 1), 0);
    keys_.resize(std::max<size_t>(keys_.size(), w + 1));
    sessions_[w] = j->data_session;
    keys_[w] = std::make_shared<net::DatagramKey>(*key);
  }

  // Worker w's chunk `index` of round `round`, holding `value` at every coordinate.
  std::string Chunk(uint32_t w, uint16_t index, float value, uint64_t round = 0) {
    const net::ChunkRange r = net::ChunkRangeOf(kSliceNumel, kChunkElems, index);
    std::string payload;
    auto codec = codecs::MakeCodec("fp32");
    EXPECT_TRUE((*codec)->Encode(std::vector<float>(r.count, value), &payload).ok());
    net::DatagramHeader h;
    h.session_id = sessions_[w];
    h.worker_id = w;
    h.slice_id = 0;
    h.round = round;
    h.chunk_elems = kChunkElems;
    h.chunk_index = index;
    h.chunk_count = static_cast<uint16_t>(net::ChunkCount(kSliceNumel, kChunkElems));
    std::string d;
    EXPECT_TRUE(net::EncodeDatagram(h, "fp32", payload, *keys_[w], &d).ok());
    return d;
  }

  // Worker w's one chunk of slice 1 ("b", 4 values) for round 0, `value` everywhere.
  std::string SliceOneChunk(uint32_t w, float value) {
    std::string payload;
    auto codec = codecs::MakeCodec("fp32");
    EXPECT_TRUE((*codec)->Encode(std::vector<float>(4, value), &payload).ok());
    net::DatagramHeader h;
    h.session_id = sessions_[w];
    h.worker_id = w;
    h.slice_id = 1;
    h.chunk_elems = kChunkElems;
    h.chunk_count = 1;
    std::string d;
    EXPECT_TRUE(net::EncodeDatagram(h, "fp32", payload, *keys_[w], &d).ok());
    return d;
  }

  // Worker w's end of its push of slice 0 for `round`, and of the pushes `entries` name
  // (net::AppendEndEntry).
  std::string End(uint32_t w, uint64_t round = 0, uint32_t chunk_elems = kChunkElems,
                  const std::string& entries = "") {
    net::DatagramHeader h;
    h.kind = net::DatagramKind::kEnd;
    h.session_id = sessions_[w];
    h.worker_id = w;
    h.slice_id = 0;
    h.round = round;
    h.chunk_elems = chunk_elems;
    h.chunk_count = static_cast<uint16_t>(net::ChunkCount(kSliceNumel, chunk_elems));
    std::string d;
    EXPECT_TRUE(net::EncodeDatagram(h, "fp32", entries, *keys_[w], &d).ok());
    return d;
  }

  void SendAll(uint32_t w, float value, uint64_t round = 0) {
    for (uint16_t i = 0; i < 3; ++i) ASSERT_TRUE(receiver_->Handle(Chunk(w, i, value, round)).ok());
  }

  // Workers 0 and 1 push 1 and 3 whole; worker 2 pushes 5 but its last chunk is lost.
  void SendTwoAndOneWithoutItsLastChunk() {
    SendAll(0, 1.0f);
    SendAll(1, 3.0f);
    ASSERT_TRUE(receiver_->Handle(Chunk(2, 0, 5.0f)).ok());
    ASSERT_TRUE(receiver_->Handle(Chunk(2, 1, 5.0f)).ok());
    EXPECT_EQ(shard_->Snapshot(0).version, 0u);
  }

  // Worker w's whole push of slice 0 for round 0 over gRPC, `value` everywhere.
  absl::Status PushOverGrpc(uint32_t w, float value) {
    auto codec = codecs::MakeCodec("fp32");
    std::string payload;
    EXPECT_TRUE((*codec)->Encode(std::vector<float>(kSliceNumel, value), &payload).ok());
    return shard_->Push(w, layout_hash_, 0, 0, "fp32", payload);
  }

  std::vector<float> AwaitVersion(uint64_t version, uint32_t slice = 0) {
    auto done = std::make_shared<absl::Notification>();
    shard_->Watch(slice, version, [done](bool) { done->Notify(); });
    EXPECT_TRUE(done->WaitForNotificationWithTimeout(absl::Seconds(10)));
    SliceSnapshot snap = shard_->Snapshot(slice);
    std::vector<float> v(snap.values->size() / 4);
    std::memcpy(v.data(), snap.values->data(), snap.values->size());
    return v;
  }

  core::ManualClock clock_;
  core::ThreadPool pool_{2};
  std::unique_ptr<Shard> shard_;
  std::unique_ptr<ShardFront> front_;
  std::unique_ptr<transport::udp::Receiver> receiver_;
  uint64_t layout_hash_ = 0;
  std::vector<uint64_t> sessions_;
  std::vector<std::shared_ptr<net::DatagramKey>> keys_;
};

TEST_F(UdpReceiverTest, WholeChunkedPushesCloseTheRound) {
  Make(2);
  SendAll(0, 1.0f);
  EXPECT_EQ(shard_->Snapshot(0).version, 0u);
  SendAll(1, 3.0f);
  // params 0 - lr * mean(1, 3)
  EXPECT_THAT(AwaitVersion(1), ::testing::Each(-2.0f));
  EXPECT_EQ(receiver_->stats().received, 6u);
  EXPECT_EQ(shard_->stats().udp_chunks_accepted, 6u);
  EXPECT_EQ(shard_->stats().udp_chunks_lost, 0u);
  EXPECT_EQ(shard_->stats().masked_aggregations, 0u);
}

// Worker 0 dies after two of its three chunks; its restarted process joins again (a new
// UDP session) and sends the whole push of the same round. The two chunks the round
// holds are taken as the predecessor's copies (counted apart, not dropped as replays),
// the third fills its range, and the round closes with the first copies' values.
TEST_F(UdpReceiverTest, ARestartedWorkersResendOfHeldChunksCountsTheEarlierCopies) {
  Make(2);
  ASSERT_TRUE(receiver_->Handle(Chunk(0, 0, 1.0f)).ok());
  ASSERT_TRUE(receiver_->Handle(Chunk(0, 1, 1.0f)).ok());
  Join(0);  // the restarted process
  SendAll(0, 7.0f);
  SendAll(1, 3.0f);
  // params 0 - lr * mean: chunks 0 and 1 of worker 0 are its first copies (1), chunk 2
  // (coordinates 8 and 9) its successor's (7).
  const std::vector<float> v = AwaitVersion(1);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], i < 8 ? -2.0f : -5.0f) << i;
  const ShardStats st = shard_->stats();
  EXPECT_EQ(st.udp_chunks_held_from_before, 2u);
  EXPECT_EQ(st.udp_chunks_accepted, 6u);
  EXPECT_EQ(receiver_->stats().replayed, 0u);
  // The totals line says which of the chunks taken were copies already held.
  EXPECT_THAT(receiver_->TotalsLine(st),
              HasSubstr("8 chunks taken (2 of them already held from a restarted worker's "
                        "predecessor)"));
}

TEST_F(UdpReceiverTest, HostileDatagramsAreDroppedAndCountedWhileTheHonestRoundCompletes) {
  Make(2);
  const std::string good = Chunk(0, 0, 1.0f);
  // Truncated, and one byte short of its MAC: do not parse.
  EXPECT_EQ(receiver_->Handle(good.substr(0, 30)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(receiver_->Handle(good.substr(0, good.size() - 1)).code(),
            absl::StatusCode::kInvalidArgument);
  // A flipped payload bit: the MAC fails.
  std::string flipped = good;
  flipped[net::kDatagramHeaderBytes + 6] ^= 0x01;
  EXPECT_EQ(receiver_->Handle(flipped).code(), absl::StatusCode::kUnauthenticated);
  // Worker 1 signs a datagram under worker 0's session with its own key.
  {
    net::DatagramHeader h;
    h.session_id = sessions_[0];
    h.worker_id = 0;
    h.chunk_elems = kChunkElems;
    h.chunk_count = 3;
    std::string payload;
    ASSERT_TRUE((*codecs::MakeCodec("fp32"))->Encode(std::vector<float>(4, 100.0f), &payload).ok());
    std::string d;
    ASSERT_TRUE(net::EncodeDatagram(h, "fp32", payload, *keys_[1], &d).ok());
    EXPECT_EQ(receiver_->Handle(d).code(), absl::StatusCode::kUnauthenticated);
    // Worker 0 names worker 1 in a datagram signed under its own session.
    h.worker_id = 1;
    ASSERT_TRUE(net::EncodeDatagram(h, "fp32", payload, *keys_[0], &d).ok());
    EXPECT_EQ(receiver_->Handle(d).code(), absl::StatusCode::kPermissionDenied);
    // An unknown session.
    h.session_id = sessions_[0] ^ 1;
    h.worker_id = 0;
    ASSERT_TRUE(net::EncodeDatagram(h, "fp32", payload, *keys_[0], &d).ok());
    EXPECT_EQ(receiver_->Handle(d).code(), absl::StatusCode::kUnauthenticated);
  }
  // The good chunk, then its replay.
  ASSERT_TRUE(receiver_->Handle(good).ok());
  absl::Status replay = receiver_->Handle(good);
  EXPECT_EQ(replay.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(replay.message()), HasSubstr("replayed chunk 0"));
  ASSERT_TRUE(receiver_->Handle(Chunk(0, 1, 1.0f)).ok());
  ASSERT_TRUE(receiver_->Handle(Chunk(0, 2, 1.0f)).ok());
  SendAll(1, 3.0f);
  EXPECT_THAT(AwaitVersion(1), ::testing::Each(-2.0f));
  // Round 0 is closed: its datagrams are stale now.
  EXPECT_EQ(receiver_->Handle(good).code(), absl::StatusCode::kOutOfRange);
  // A re-join replaces worker 0's UDP session: the old one is unknown.
  const std::string old_session = Chunk(0, 0, 1.0f, 1);
  Join(0);
  EXPECT_EQ(receiver_->Handle(old_session).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(receiver_->Handle(Chunk(0, 0, 1.0f, 1)).ok());

  const transport::udp::Stats st = receiver_->stats();
  EXPECT_EQ(st.malformed, 2u);
  EXPECT_EQ(st.forged, 3u);
  EXPECT_EQ(st.unknown_session, 2u);
  EXPECT_EQ(st.replayed, 1u);
  EXPECT_EQ(st.stale, 1u);
  EXPECT_EQ(st.received, 7u);
}

TEST_F(UdpReceiverTest, ChunkGeometryAndMixingWithGrpcAreRefused) {
  // Quarantines off: each refusal on its own (a quarantine: the next test).
  Make(2, "mean", std::chrono::milliseconds(0));
  // A chunk count that does not fit the slice.
  net::DatagramHeader h;
  h.session_id = sessions_[0];
  h.worker_id = 0;
  h.chunk_elems = 5;
  h.chunk_index = 0;
  h.chunk_count = 3;  // 10 / 5 = 2
  std::string payload;
  ASSERT_TRUE((*codecs::MakeCodec("fp32"))->Encode(std::vector<float>(5, 1.0f), &payload).ok());
  std::string d;
  ASSERT_TRUE(net::EncodeDatagram(h, "fp32", payload, *keys_[0], &d).ok());
  absl::Status st = receiver_->Handle(d);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  // A payload that holds the wrong number of values for its chunk.
  h.chunk_count = 2;
  ASSERT_TRUE((*codecs::MakeCodec("fp32"))->Encode(std::vector<float>(4, 1.0f), &payload).ok());
  ASSERT_TRUE(net::EncodeDatagram(h, "fp32", payload, *keys_[0], &d).ok());
  EXPECT_EQ(receiver_->Handle(d).code(), absl::StatusCode::kInvalidArgument);
  // Worker 1 pushed the slice over gRPC: its chunks are duplicates.
  std::string whole;
  ASSERT_TRUE((*codecs::MakeCodec("fp32"))->Encode(std::vector<float>(kSliceNumel, 3.0f), &whole).ok());
  ASSERT_TRUE(shard_->Push(1, layout_hash_, 0, 0, "fp32", whole).ok());
  EXPECT_EQ(receiver_->Handle(Chunk(1, 0, 3.0f)).code(), absl::StatusCode::kAlreadyExists);
  // A chunk size that changes within one push.
  ASSERT_TRUE(receiver_->Handle(Chunk(0, 0, 1.0f)).ok());
  EXPECT_EQ(receiver_->Handle(d).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard_->stats().workers[0].refused(core::Refusal::kMalformed), 3u);
  EXPECT_EQ(receiver_->stats().malformed, 3u);
  // A slice outside the layout is refused (INVALID_ARGUMENT like the malformed ones) but
  // dropped as a refusal: the receiver sorts by the refusal's kind, not its code.
  h.slice_id = 99;
  h.chunk_count = 2;
  ASSERT_TRUE((*codecs::MakeCodec("fp32"))->Encode(std::vector<float>(5, 1.0f), &payload).ok());
  ASSERT_TRUE(net::EncodeDatagram(h, "fp32", payload, *keys_[0], &d).ok());
  const absl::Status unknown = receiver_->Handle(d);
  EXPECT_EQ(core::RefusalOf(unknown), core::Refusal::kUnknownSlice) << unknown;
  EXPECT_EQ(receiver_->stats().malformed, 3u);
  EXPECT_EQ(receiver_->stats().refused, 1u);
}

TEST_F(UdpReceiverTest, AMalformedChunkQuarantinesItsWorker) {
  // A quorum of 1: the round may close with worker 1 alone (the default, 2, would keep
  // it waiting for the quarantine to end).
  Make(2, "mean", std::chrono::milliseconds(10000), /*quorum=*/1);
  SendAll(1, 3.0f);
  EXPECT_EQ(shard_->Snapshot(0).version, 0u) << "waiting for worker 0";
  // Worker 0's chunk count does not fit the slice (10 / 5 = 2, not 3).
  net::DatagramHeader h;
  h.session_id = sessions_[0];
  h.worker_id = 0;
  h.chunk_elems = 5;
  h.chunk_count = 3;
  std::string payload;
  ASSERT_TRUE((*codecs::MakeCodec("fp32"))->Encode(std::vector<float>(5, 1.0f), &payload).ok());
  std::string d;
  ASSERT_TRUE(net::EncodeDatagram(h, "fp32", payload, *keys_[0], &d).ok());
  EXPECT_EQ(receiver_->Handle(d).code(), absl::StatusCode::kInvalidArgument);
  // The round closes at once with worker 1's push alone, and worker 0's chunks are refused.
  EXPECT_THAT(AwaitVersion(1), ElementsAre(-3, -3, -3, -3, -3, -3, -3, -3, -3, -3));
  const absl::Status refused = receiver_->Handle(Chunk(0, 0, 1.0f, 1));
  EXPECT_EQ(core::RefusalOf(refused), core::Refusal::kQuarantined) << refused;
  EXPECT_EQ(shard_->stats().quarantines, 1u);
  EXPECT_EQ(shard_->stats().rounds_closed_at_deadline, 0u);
}

TEST_F(UdpReceiverTest, ALostChunkIsMaskedWhenTheRoundClosesAtItsDeadline) {
  Make(3);
  // Worker 2's last chunk (coordinates 8 and 9) is lost.
  SendTwoAndOneWithoutItsLastChunk();
  clock_.Advance(std::chrono::milliseconds(150));
  shard_->Tick(clock_.Now());
  // Coordinates 0-7: mean(1, 3, 5) = 3; 8-9: mean(1, 3) = 2, worker 2's stale bytes unused.
  EXPECT_THAT(AwaitVersion(1), ElementsAre(-3, -3, -3, -3, -3, -3, -3, -3, -2, -2));
  const ShardStats st = shard_->stats();
  EXPECT_EQ(st.udp_chunks_lost, 1u);
  EXPECT_EQ(st.masked_aggregations, 1u);
  EXPECT_EQ(st.rounds_closed_at_deadline, 1u);
  // Slice 1 got no datagram at all: below the quorum at its deadline, it waits one more.
  EXPECT_EQ(st.deadlines_below_quorum, 1u);
  EXPECT_EQ(shard_->Snapshot(1).version, 0u);
}

// The end of worker 2's push says its missing chunk is lost, not on its way: the round
// closes at once, masked as at a deadline; the end's second copy meets a closed round.
TEST_F(UdpReceiverTest, AnEndClosesALossyRoundWithoutWaitingForItsDeadline) {
  Make(3);
  SendTwoAndOneWithoutItsLastChunk();
  ASSERT_TRUE(receiver_->Handle(End(2)).ok());
  EXPECT_THAT(AwaitVersion(1), ElementsAre(-3, -3, -3, -3, -3, -3, -3, -3, -2, -2));
  const absl::Status copy = receiver_->Handle(End(2));
  EXPECT_EQ(core::RefusalOf(copy), core::Refusal::kLate) << copy;
  const ShardStats st = shard_->stats();
  EXPECT_EQ(st.udp_chunks_lost, 1u);
  EXPECT_EQ(st.masked_aggregations, 1u);
  EXPECT_EQ(st.rounds_closed_at_deadline, 0u);
  const transport::udp::Stats u = receiver_->stats();
  EXPECT_EQ(u.ends, 1u);
  EXPECT_EQ(u.ends_after_close, 1u);
  EXPECT_EQ(u.stale, 0u) << "an end's later copy is not a stale datagram";
  EXPECT_EQ(st.workers[2].refusals[static_cast<size_t>(Refusal::kLate)], 0u)
      << "nor a late push of its worker";
  EXPECT_EQ(u.received, 8u);
}

// One end datagram ends worker 2's pushes of both slices: both rounds close at once,
// each masked by what it lost (quorum 2: slice 1 keeps the two pushes that came).
TEST_F(UdpReceiverTest, OneEndClosesTheRoundOfEverySliceItNames) {
  Make(3, "mean", std::chrono::milliseconds(10000), /*quorum=*/2);
  SendTwoAndOneWithoutItsLastChunk();
  // Slice 1 (one chunk): workers 0 and 1 push 2 and 4; worker 2's chunk is lost.
  ASSERT_TRUE(receiver_->Handle(SliceOneChunk(0, 2.0f)).ok());
  ASSERT_TRUE(receiver_->Handle(SliceOneChunk(1, 4.0f)).ok());
  EXPECT_EQ(shard_->Snapshot(1).version, 0u);
  std::string entries;
  net::AppendEndEntry(1, 1, &entries);
  ASSERT_TRUE(receiver_->Handle(End(2, 0, kChunkElems, entries)).ok());
  EXPECT_THAT(AwaitVersion(1), ElementsAre(-3, -3, -3, -3, -3, -3, -3, -3, -2, -2));
  EXPECT_THAT(AwaitVersion(1, 1), ElementsAre(-3, -3, -3, -3));
  const absl::Status copy = receiver_->Handle(End(2, 0, kChunkElems, entries));
  EXPECT_EQ(core::RefusalOf(copy), core::Refusal::kLate) << copy;
  const ShardStats st = shard_->stats();
  // Slice 0's last chunk of worker 2, and slice 1's one chunk of it, which the end named.
  EXPECT_EQ(st.udp_chunks_lost, 2u);
  EXPECT_EQ(st.rounds_closed_at_deadline, 0u);
  const transport::udp::Stats u = receiver_->stats();
  EXPECT_EQ(u.ends, 2u);  // a push each
  EXPECT_EQ(u.ends_after_close, 2u);
  EXPECT_EQ(u.end_datagrams, 2u);  // the end and its copy

  // An entry naming a slice with another geometry is malformed, as a header's would be.
  std::string bad;
  net::AppendEndEntry(1, 2, &bad);
  const absl::Status malformed = receiver_->Handle(End(0, 1, kChunkElems, bad));
  EXPECT_EQ(core::RefusalOf(malformed), core::Refusal::kMalformed) << malformed;
  EXPECT_THAT(std::string(malformed.message()), HasSubstr("slice 1"));
}

// An end whose chunks were all lost settles its worker without making it an input: the
// round closes with the others when they are the quorum, and is dropped at once below it.
TEST_F(UdpReceiverTest, AnEndWithoutChunksSettlesItsWorkerWithoutAnInput) {
  Make(3, "mean", std::chrono::milliseconds(10000), /*quorum=*/2);
  SendAll(0, 1.0f);
  SendAll(1, 3.0f);
  ASSERT_TRUE(receiver_->Handle(End(2)).ok());
  EXPECT_THAT(AwaitVersion(1), ::testing::Each(-2.0f));
  EXPECT_EQ(shard_->stats().rounds_closed_at_deadline, 0u);
  EXPECT_EQ(shard_->stats().masked_aggregations, 0u);
  EXPECT_EQ(shard_->stats().udp_chunks_lost, 3u) << "the three chunks its end named";
}

TEST_F(UdpReceiverTest, EveryWorkerEndedBelowTheQuorumDropsTheRoundAtOnce) {
  Make(3);  // quorum 3
  SendAll(0, 1.0f);
  ASSERT_TRUE(receiver_->Handle(Chunk(1, 0, 3.0f)).ok());
  ASSERT_TRUE(receiver_->Handle(End(1)).ok());
  ASSERT_TRUE(receiver_->Handle(End(2)).ok());
  EXPECT_THAT(AwaitVersion(1), ::testing::Each(0.0f));
  EXPECT_EQ(shard_->stats().rounds_dropped_below_quorum, 1u);
  EXPECT_EQ(shard_->stats().rounds_closed_at_deadline, 0u);
}

// A chunk reordered behind its push's end is still taken while the round is open; an
// end that disagrees with its chunks is malformed; a slice pushed over gRPC has no end,
// and a worker whose UDP push ended cannot push the slice over gRPC.
TEST_F(UdpReceiverTest, EndsAreCheckedAgainstTheirPush) {
  Make(3, "mean", std::chrono::milliseconds(10000), /*quorum=*/2);
  ASSERT_TRUE(receiver_->Handle(Chunk(0, 0, 1.0f)).ok());
  ASSERT_TRUE(receiver_->Handle(Chunk(0, 1, 1.0f)).ok());
  ASSERT_TRUE(receiver_->Handle(End(0)).ok());
  ASSERT_TRUE(receiver_->Handle(Chunk(0, 2, 1.0f)).ok()) << "reordered behind its end";

  // Worker 2 pushes over gRPC; an end of it after that is a duplicate.
  ASSERT_TRUE(PushOverGrpc(2, 5.0f).ok());
  const absl::Status after_grpc = receiver_->Handle(End(2));
  EXPECT_EQ(core::RefusalOf(after_grpc), core::Refusal::kDuplicate) << after_grpc;
  EXPECT_EQ(shard_->Snapshot(0).version, 0u) << "worker 1 has not settled";

  // Worker 1: chunks of 4, then an end of chunks of 5: malformed, which quarantines it,
  // and the round closes with workers 0 and 2, the quorum.
  ASSERT_TRUE(receiver_->Handle(Chunk(1, 0, 3.0f)).ok());
  const absl::Status other = receiver_->Handle(End(1, 0, 5));
  EXPECT_EQ(core::RefusalOf(other), core::Refusal::kMalformed) << other;
  EXPECT_THAT(std::string(other.message()), HasSubstr("2 chunks of 5 after chunks of 4, 3 of them"));
  EXPECT_THAT(AwaitVersion(1), ::testing::Each(-3.0f));
}

TEST_F(UdpReceiverTest, AnEndedWorkerCannotPushTheSliceOverGrpc) {
  Make(2);
  ASSERT_TRUE(receiver_->Handle(End(0)).ok());  // every chunk of it lost
  const absl::Status st = PushOverGrpc(0, 5.0f);
  EXPECT_EQ(core::RefusalOf(st), core::Refusal::kDuplicate) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("its UDP push of it ended"));
}

TEST_F(UdpReceiverTest, ASliceWhoseDatagramsWereAllLostIsDroppedAfterOneMoreDeadline) {
  Make(2);
  SendAll(0, 1.0f);
  SendAll(1, 3.0f);
  EXPECT_THAT(AwaitVersion(1), ::testing::Each(-2.0f));
  // Nothing of slice 1 arrived from anyone; its deadline started when the round armed
  // (a chunk from the quorum of workers on this shard). At the deadline it is below the
  // quorum and waits one more, for late pushes; then it is dropped, not stalled.
  EXPECT_EQ(shard_->Snapshot(1).version, 0u);
  clock_.Advance(std::chrono::milliseconds(150));
  shard_->Tick(clock_.Now());
  EXPECT_EQ(shard_->Snapshot(1).version, 0u) << "one more deadline for late pushes";
  clock_.Advance(std::chrono::milliseconds(100));
  shard_->Tick(clock_.Now());
  EXPECT_THAT(AwaitVersion(1, 1), ::testing::Each(0.0f));
  EXPECT_EQ(shard_->stats().rounds_dropped_below_quorum, 1u);
  EXPECT_EQ(shard_->stats().aggregation_errors, 0u);
  // Slice 1 opened round 1 before any chunk of round 1 came; the arming of round 1 (by
  // the chunks of slice 0) starts its deadline too.
  SendAll(0, 1.0f, 1);
  SendAll(1, 1.0f, 1);
  for (int i = 0; i < 2; ++i) {
    clock_.Advance(std::chrono::milliseconds(150));
    shard_->Tick(clock_.Now());
  }
  EXPECT_EQ(AwaitVersion(2, 1).size(), 4u);
  EXPECT_EQ(shard_->Snapshot(1).version, 2u);
  EXPECT_EQ(shard_->stats().rounds_dropped_below_quorum, 2u);
}

TEST_F(UdpReceiverTest, AWorkerWhoseDatagramsWereAllLostIsAbsentAtTheDeadline) {
  Make(3, "mean", std::chrono::milliseconds(10000), /*quorum=*/2);
  SendAll(0, 1.0f);
  SendAll(1, 3.0f);
  clock_.Advance(std::chrono::milliseconds(150));
  shard_->Tick(clock_.Now());
  // Worker 2 sent nothing that arrived: the round closes with the two that did, the
  // quorum this shard was given.
  EXPECT_THAT(AwaitVersion(1), ::testing::Each(-2.0f));
  EXPECT_EQ(shard_->stats().rounds_closed_at_deadline, 1u);
}

// With the default quorum (n - f = 3 for the mean with f = 0) two inputs are too few:
// the round is dropped a deadline later, parameters unchanged, and counted.
TEST_F(UdpReceiverTest, BelowTheDefaultQuorumALossyRoundIsDropped) {
  Make(3);
  SendAll(0, 1.0f);
  SendAll(1, 3.0f);
  for (int i = 0; i < 2; ++i) {
    clock_.Advance(std::chrono::milliseconds(150));
    shard_->Tick(clock_.Now());
  }
  EXPECT_THAT(AwaitVersion(1), ::testing::Each(0.0f));
  EXPECT_THAT(AwaitVersion(1, 1), ::testing::Each(0.0f));
  EXPECT_EQ(shard_->stats().rounds_dropped_below_quorum, 2u);  // slices 0 and 1
  EXPECT_EQ(shard_->stats().rounds_closed_at_deadline, 0u);
}

TEST_F(UdpReceiverTest, DatagramsArriveThroughARealLoopbackSocket) {
  Make(1);
  boost::asio::io_context io;
  boost::asio::ip::udp::socket socket(io, boost::asio::ip::udp::v4());
  const boost::asio::ip::udp::endpoint to(boost::asio::ip::make_address("127.0.0.1"),
                                          receiver_->port());
  for (uint16_t i = 0; i < 3; ++i) socket.send_to(boost::asio::buffer(Chunk(0, i, 2.0f)), to);
  EXPECT_THAT(AwaitVersion(1), ::testing::Each(-2.0f));
  // The receiving thread counts a chunk after the shard took it, which may be after the
  // round it completed was published: wait (bounded) for the count.
  for (int i = 0; i < 1000 && receiver_->stats().received < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(receiver_->stats().received, 3u);
}

// A burst from eight workers at once (the receiving threads share the socket and take
// several datagrams per system call), with empty datagrams in between: every chunk is
// taken once, each empty datagram is counted as malformed, and the round closes with
// every worker.
TEST_F(UdpReceiverTest, ABurstThroughTheSocketIsTakenWholeByTheThreads) {
  constexpr uint32_t kWorkers = 8;
  Make(kWorkers);
  boost::asio::io_context io;
  boost::asio::ip::udp::socket socket(io, boost::asio::ip::udp::v4());
  const boost::asio::ip::udp::endpoint to(boost::asio::ip::make_address("127.0.0.1"),
                                          receiver_->port());
  for (uint16_t i = 0; i < 3; ++i) {
    for (uint32_t w = 0; w < kWorkers; ++w) {
      socket.send_to(boost::asio::buffer(Chunk(w, i, static_cast<float>(w))), to);
    }
    socket.send_to(boost::asio::buffer(std::string()), to);
  }
  // mean(0..7) = 3.5
  EXPECT_THAT(AwaitVersion(1), ::testing::Each(-3.5f));
  for (int i = 0; i < 1000 && (receiver_->stats().received < 3 * kWorkers ||
                               receiver_->stats().malformed < 3);
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(receiver_->stats().received, 3u * kWorkers);
  EXPECT_EQ(receiver_->stats().malformed, 3u);
  EXPECT_EQ(receiver_->stats().replayed, 0u);
}

// Every worker's last chunk and its end leave back to back, round after round: the
// receiving threads take them in batches of their own, and an end must never be applied
// before the chunks queued ahead of it (none is counted lost, every round is exact), nor
// wait for a deadline (the manual clock never moves).
TEST_F(UdpReceiverTest, AnEndThroughTheSocketNeverOvertakesItsChunks) {
  constexpr uint32_t kWorkers = 8;
  constexpr uint64_t kRounds = 30;
  Make(kWorkers);
  boost::asio::io_context io;
  boost::asio::ip::udp::socket socket(io, boost::asio::ip::udp::v4());
  const boost::asio::ip::udp::endpoint to(boost::asio::ip::make_address("127.0.0.1"),
                                          receiver_->port());
  float expected = 0;
  for (uint64_t round = 0; round < kRounds; ++round) {
    for (uint32_t w = 0; w < kWorkers; ++w) {
      for (uint16_t i = 0; i < 3; ++i) {
        socket.send_to(boost::asio::buffer(Chunk(w, i, static_cast<float>(w), round)), to);
      }
      socket.send_to(boost::asio::buffer(End(w, round)), to);
    }
    expected -= 3.5f;  // mean(0..7)
    EXPECT_THAT(AwaitVersion(round + 1), ::testing::Each(expected)) << "round " << round;
  }
  const ShardStats st = shard_->stats();
  EXPECT_EQ(st.udp_chunks_lost, 0u);
  EXPECT_EQ(st.masked_aggregations, 0u);
  EXPECT_EQ(st.rounds_closed_at_deadline, 0u);
}

}  // namespace
}  // namespace ps::server
