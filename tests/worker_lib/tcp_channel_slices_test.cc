// The worker's TCP data channel reading a SLICES (several slices in one frame) from the
// scripted shard: each body into its place, changes from scratch, a pull that ends or a
// place refused mid-frame; and a shard stalling mid-frame, past a pull's deadline or a
// call's behind it.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "tests/worker_lib/tcp_channel_fixture.h"

namespace ps::internal::tcp_plane {
namespace {

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

}  // namespace
}  // namespace ps::internal::tcp_plane
