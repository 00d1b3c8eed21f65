// The worker's TCP data channel (worker_lib/transport/tcp/channel.h) against a scripted
// shard on a real loopback socket, speaking net/data_frame.h byte for byte: the
// handshake and who proves what, pushes answered by tag with their refusal kinds, dense
// slices read straight into the caller's place, a shard that cannot prove the session,
// a GOAWAY, and a lost connection failing what was in flight before the next call
// connects again (several slices in one frame, and stalls: tcp_channel_slices_test.cc).
#include "worker_lib/transport/tcp/channel.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "net/tcp_options.h"
#include "tests/worker_lib/tcp_channel_fixture.h"

namespace ps::internal::tcp_plane {
namespace {

TEST_F(TcpChannelTest, PushesLeaveInOneFrameAndAreAnsweredByTagWithTheirKinds) {
  const OutgoingPush a = Push(0, "first payload"), b = Push(1, "second");
  Answers answers;
  std::unique_ptr<DataChannel::PushCall> call = channel_->NewPush({&a, &b}, Deadline());
  EXPECT_EQ(call->epoch(), 4u);
  call->Start(answers.Callback());
  ASSERT_TRUE(shard_.Accept());
  ASSERT_TRUE(shard_.Handshake());
  // Queued together under one round and codec: one PUSHES, the bodies back to back.
  std::optional<Frame> f = shard_.Read();
  ASSERT_TRUE(f.has_value());
  ASSERT_EQ(f->header.type, net::FrameType::kPushes);
  absl::StatusOr<net::PushesMeta> m = net::ParsePushesMeta(f->header, f->meta);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->round, 2u);
  EXPECT_EQ(m->layout_hash, 9u);
  EXPECT_EQ(m->codec, "fp32");
  ASSERT_EQ(m->count, 2u);
  EXPECT_EQ(m->entries[0].slice_id, 0u);
  EXPECT_EQ(m->entries[1].slice_id, 1u);
  EXPECT_NE(m->entries[0].tag, m->entries[1].tag);
  EXPECT_EQ(f->body, *a.payload + *b.payload);
  // Answered the other way round: the second accepted, the first a duplicate.
  shard_.Send(Answer(m->entries[1].tag, absl::StatusCode::kOk, "", ""));
  shard_.Send(Answer(m->entries[0].tag, absl::StatusCode::kAlreadyExists, "duplicate", "again"));
  const std::vector<absl::Status> got = answers.Await(2);
  EXPECT_EQ(core::RefusalOf(got[0]), core::Refusal::kDuplicate) << got[0];
  EXPECT_EQ(got[0].code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(got[1].ok()) << got[1];
}

TEST_F(TcpChannelTest, PushesOfAnotherRoundOrOverTheBodyLimitLeaveInFramesOfTheirOwn) {
  OutgoingPush a = Push(0, std::string(300, 'a')), b = Push(1, std::string(300, 'b'));
  OutgoingPush c = Push(2, "c"), d = Push(3, std::string(300, 'd'));
  c.round = 3;
  d.round = 3;
  Answers answers;
  std::unique_ptr<DataChannel::PushCall> call = channel_->NewPush({&a, &b, &c, &d}, Deadline());
  call->Start(answers.Callback());
  ASSERT_TRUE(shard_.Accept());
  // A body limit of 500 bytes: a and b (600) cannot share a frame; c and d (301) can.
  ASSERT_TRUE(shard_.Handshake(/*forge=*/false, /*max_body=*/500));
  std::vector<net::FrameType> types;
  std::vector<std::string> bodies;
  std::vector<uint64_t> tags;
  while (tags.size() < 4) {
    std::optional<Frame> f = shard_.Read();
    ASSERT_TRUE(f.has_value());
    types.push_back(f->header.type);
    bodies.push_back(f->body);
    if (f->header.type == net::FrameType::kPushes) {
      absl::StatusOr<net::PushesMeta> m = net::ParsePushesMeta(f->header, f->meta);
      ASSERT_TRUE(m.ok()) << m.status();
      EXPECT_EQ(m->round, 3u);
      for (uint32_t i = 0; i < m->count; ++i) tags.push_back(m->entries[i].tag);
    } else {
      ASSERT_EQ(f->header.type, net::FrameType::kPush);
      tags.push_back(f->header.tag);
    }
  }
  EXPECT_EQ(types, (std::vector<net::FrameType>{net::FrameType::kPush, net::FrameType::kPush,
                                                net::FrameType::kPushes}));
  EXPECT_EQ(bodies, (std::vector<std::string>{*a.payload, *b.payload, *c.payload + *d.payload}));
  for (uint64_t tag : tags) shard_.Send(Answer(tag, absl::StatusCode::kOk, "", ""));
  for (const absl::Status& s : answers.Await(4)) EXPECT_TRUE(s.ok()) << s;
}

// Borrowed pushes (PushOptions::borrow): the caller's bytes follow the payload on the
// wire, and the channel keeps their guard only while its write may read them.
OutgoingPush Borrowed(OutgoingPush p, const std::string& bytes, std::shared_ptr<const void> guard) {
  p.borrowed = std::span<const char>(bytes.data(), bytes.size());
  p.borrowed_guard = std::move(guard);
  return p;
}

// Waits (5 s at most) until only the test's `own` references to `guard` are left.
bool AwaitReleased(const std::shared_ptr<int>& guard, long own) {
  for (int i = 0; i < 500 && guard.use_count() > own; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return guard.use_count() == own;
}

TEST_F(TcpChannelTest, ABorrowedPushsBytesFollowItsPayloadAndTheWriteKeepsThemNoLonger) {
  const std::string first = "values of slice 0", second = "and of slice 1";
  auto guard = std::make_shared<int>(0);
  const OutgoingPush a = Borrowed(Push(0, "\x01"), first, guard);
  const OutgoingPush b = Borrowed(Push(1, "\x01"), second, guard);
  const long own = guard.use_count();  // the test's and its pushes'
  Answers answers;
  std::unique_ptr<DataChannel::PushCall> call = channel_->NewPush({&a, &b}, Deadline());
  call->Start(answers.Callback());
  ASSERT_TRUE(shard_.Accept());
  ASSERT_TRUE(shard_.Handshake());
  std::optional<Frame> f = shard_.Read();
  ASSERT_TRUE(f.has_value());
  ASSERT_EQ(f->header.type, net::FrameType::kPushes);
  absl::StatusOr<net::PushesMeta> m = net::ParsePushesMeta(f->header, f->meta);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->count, 2u);
  EXPECT_EQ(m->entries[0].body_bytes, 1 + first.size());
  EXPECT_EQ(f->body, "\x01" + first + "\x01" + second);
  shard_.Send(Answer(m->entries[0].tag, absl::StatusCode::kOk, "", ""));
  shard_.Send(Answer(m->entries[1].tag, absl::StatusCode::kOk, "", ""));
  for (const absl::Status& s : answers.Await(2)) EXPECT_TRUE(s.ok()) << s;
  call.reset();
  EXPECT_TRUE(AwaitReleased(guard, own)) << guard.use_count() - own << " references left";
}

// A shard that stops reading mid-push: the push fails at its deadline and the write that
// still reads its bytes ends with the connection, so the caller gets its buffer back.
TEST_F(TcpChannelTest, APushLateWhileItsBytesAreStillBeingWrittenClosesTheConnection) {
  const std::string values(32u << 20, 'v');  // more than the loopback socket buffers hold
  auto guard = std::make_shared<int>(0);
  const OutgoingPush p = Borrowed(Push(0, "\x01"), values, guard);
  const long own = guard.use_count();
  Answers answers;
  std::unique_ptr<DataChannel::PushCall> call =
      channel_->NewPush({&p}, RpcClock::now() + std::chrono::milliseconds(500));
  call->Start(answers.Callback());
  ASSERT_TRUE(shard_.Accept());
  ASSERT_TRUE(shard_.Handshake(/*forge=*/false, /*max_body=*/64u << 20));
  // Nothing more is read: the write stops once the socket buffers are full.
  const absl::Status st = answers.Await(1)[0];
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("was being written"));
  call.reset();
  EXPECT_TRUE(AwaitReleased(guard, own)) << "the write still holds the push's bytes";
  // The frame ends short: the connection was closed mid-way.
  EXPECT_FALSE(shard_.Read().has_value());
}

// A push late before the connection could carry it is answered and never sent: its
// retry goes as a new push, and a borrowed push's guard goes with the answer.
TEST_F(TcpChannelTest, APushLateWhileQueuedIsNotSentAfterItsAnswer) {
  const std::string values = "late values";
  auto guard = std::make_shared<int>(0);
  const OutgoingPush late = Borrowed(Push(0, "\x01"), values, guard);
  const long own = guard.use_count();
  Answers late_answer;
  std::unique_ptr<DataChannel::PushCall> call =
      channel_->NewPush({&late}, RpcClock::now() + std::chrono::milliseconds(200));
  call->Start(late_answer.Callback());
  ASSERT_TRUE(shard_.Accept());  // but no handshake yet: the push waits in the queue
  const absl::Status st = late_answer.Await(1)[0];
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  call.reset();
  EXPECT_TRUE(AwaitReleased(guard, own)) << "the queue still holds the late push";

  const OutgoingPush next = Push(1, "next");
  Answers answers;
  std::unique_ptr<DataChannel::PushCall> second = channel_->NewPush({&next}, Deadline());
  second->Start(answers.Callback());
  ASSERT_TRUE(shard_.Handshake());
  std::optional<Frame> f = shard_.Read();
  ASSERT_TRUE(f.has_value());
  ASSERT_EQ(f->header.type, net::FrameType::kPush);
  EXPECT_EQ(f->body, "next");  // the late push was not sent
  shard_.Send(Answer(f->header.tag, absl::StatusCode::kOk, "", ""));
  EXPECT_TRUE(answers.Await(1)[0].ok());
}

TEST_F(TcpChannelTest, DenseSlicesAreReadStraightIntoTheCallersPlace) {
  auto sink = std::make_shared<DenseSink>(4);
  EXPECT_EQ(channel_->Pull(PullAsk{.layout_hash = 9, .min_version = 1, .slice_ids = {5}},
                           Deadline(), sink),
            4u);
  ASSERT_TRUE(shard_.Accept());
  ASSERT_TRUE(shard_.Handshake());
  std::optional<Frame> pull = shard_.Read();
  ASSERT_TRUE(pull.has_value());
  ASSERT_EQ(pull->header.type, net::FrameType::kPull);
  absl::StatusOr<net::PullMeta> m = net::ParsePullMeta(pull->header.flags, pull->meta);
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<net::PullBody> body = net::ParsePullBody(*m, pull->body);
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(body->slice_ids, std::vector<uint32_t>{5});

  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 4.0f};
  std::string out;
  ASSERT_TRUE(net::AppendSlice(pull->header.tag, {{.slice_id = 5, .version = 7}}, 16, &out).ok());
  out.append(reinterpret_cast<const char*>(values.data()), 16);
  ASSERT_TRUE(net::AppendPullEnd(pull->header.tag, {.code = absl::StatusCode::kOk}, &out).ok());
  shard_.Send(out);
  ASSERT_TRUE(sink->AwaitDone());
  EXPECT_TRUE(sink->status.ok()) << sink->status;
  EXPECT_EQ(sink->values, values);
  EXPECT_TRUE(sink->arrived_in_place) << "read into the place, not through a buffer";
  EXPECT_EQ(sink->version, 7u);
}

TEST_F(TcpChannelTest, APortThatCannotProveTheSessionIsToldNothingMore) {
  const OutgoingPush a = Push(0, "secret gradient");
  Answers answers;
  std::unique_ptr<DataChannel::PushCall> call = channel_->NewPush({&a}, Deadline());
  call->Start(answers.Callback());
  ASSERT_TRUE(shard_.Accept());
  EXPECT_FALSE(shard_.Handshake(/*forge=*/true)) << "no PROOF after a forged CHALLENGE";
  const absl::Status got = answers.Await(1)[0];
  EXPECT_EQ(got.code(), absl::StatusCode::kUnauthenticated) << got;
  EXPECT_NE(got.message().find("did not prove"), std::string::npos) << got;
}

TEST_F(TcpChannelTest, AGoawayFailsWhatWaitsWithTheShardsRefusal) {
  const OutgoingPush a = Push(0, "x");
  Answers answers;
  std::unique_ptr<DataChannel::PushCall> call = channel_->NewPush({&a}, Deadline());
  call->Start(answers.Callback());
  ASSERT_TRUE(shard_.Accept());
  ASSERT_TRUE(shard_.Read().has_value());  // the HELLO
  std::string out;
  ASSERT_TRUE(net::AppendGoaway({.code = absl::StatusCode::kUnauthenticated,
                                 .refusal_name = "unknown_session",
                                 .message = "join again"},
                                &out)
                  .ok());
  shard_.Send(out);
  const absl::Status got = answers.Await(1)[0];
  EXPECT_EQ(core::RefusalOf(got), core::Refusal::kUnknownSession) << got;
}

// A GOAWAY naming no error (status code 0) fails what waits UNAVAILABLE, as a lost
// connection does, whether it comes before the port proved itself or after ADMIT: it
// never answers a push or ends a pull as OK. Found by the data_channel fuzz target, where
// such a GOAWAY from a port that proved nothing had every push in flight reported
// accepted.
TEST_F(TcpChannelTest, AGoawayNamingNoErrorFailsWhatWaits) {
  for (const bool admitted : {false, true}) {
    SCOPED_TRACE(admitted ? "after ADMIT" : "before any CHALLENGE");
    const OutgoingPush a = Push(0, "x");
    Answers answers;
    std::unique_ptr<DataChannel::PushCall> call = channel_->NewPush({&a}, Deadline());
    call->Start(answers.Callback());
    auto sink = std::make_shared<DenseSink>(4);
    channel_->Pull(PullAsk{.layout_hash = 9, .min_version = 1, .slice_ids = {5}}, Deadline(),
                   sink);
    ASSERT_TRUE(shard_.Accept());
    if (admitted) {
      ASSERT_TRUE(shard_.Handshake());
      ASSERT_TRUE(shard_.Read().has_value());  // the PUSH
      ASSERT_TRUE(shard_.Read().has_value());  // the PULL
    } else {
      ASSERT_TRUE(shard_.Read().has_value());  // the HELLO
    }
    std::string out;
    ASSERT_TRUE(net::AppendGoaway({.code = absl::StatusCode::kOk}, &out).ok());
    shard_.Send(out);
    const absl::Status pushed = answers.Await(1)[0];
    EXPECT_EQ(pushed.code(), absl::StatusCode::kUnavailable) << pushed;
    ASSERT_TRUE(sink->AwaitDone());
    EXPECT_EQ(sink->status.code(), absl::StatusCode::kUnavailable) << sink->status;
  }
}

// The worker reads no body over 64 MiB (the gRPC channel's receive limit), whatever the
// shard's ADMIT allows: a SLICE claiming more ends the connection from its header, before
// a buffer of that size is allocated for it. Found writing the data_channel fuzz target
// (an input made by hand: an ADMIT of 4 GiB, then a SLICE header claiming as much for a
// tag with no pull; the channel allocated the whole claim before a byte of it came).
TEST_F(TcpChannelTest, ASliceOverTheWorkersBodyLimitEndsTheConnectionFromItsHeader) {
  auto sink = std::make_shared<DenseSink>(4);
  channel_->Pull(PullAsk{.layout_hash = 9, .min_version = 1, .slice_ids = {5}}, Deadline(), sink);
  ASSERT_TRUE(shard_.Accept());
  ASSERT_TRUE(shard_.Handshake(/*forge=*/false, /*max_body=*/UINT32_MAX));
  std::optional<Frame> pull = shard_.Read();
  ASSERT_TRUE(pull.has_value());
  std::string out;
  ASSERT_TRUE(net::AppendSlice(pull->header.tag, {{.slice_id = 5, .version = 7}}, (64u << 20) + 1,
                               &out)
                  .ok());
  shard_.Send(out);  // and not one byte of the body
  ASSERT_TRUE(sink->AwaitDone());
  EXPECT_EQ(sink->status.code(), absl::StatusCode::kInternal) << sink->status;
  EXPECT_NE(sink->status.message().find("over the limit of 67108864"), std::string::npos)
      << sink->status;
  EXPECT_FALSE(shard_.Read().has_value()) << "the worker closed the connection";
}

TEST_F(TcpChannelTest, ALostConnectionFailsWhatIsInFlightAndTheNextCallConnectsAgain) {
  const OutgoingPush a = Push(0, "lost");
  Answers first;
  std::unique_ptr<DataChannel::PushCall> call = channel_->NewPush({&a}, Deadline());
  call->Start(first.Callback());
  ASSERT_TRUE(shard_.Accept());
  ASSERT_TRUE(shard_.Handshake());
  ASSERT_TRUE(shard_.Read().has_value());
  shard_.Hangup();
  const absl::Status lost = first.Await(1)[0];
  EXPECT_EQ(lost.code(), absl::StatusCode::kUnavailable) << lost;
  EXPECT_FALSE(CallsForRejoin(lost)) << "a lost connection is retried as it is: " << lost;
  ASSERT_NO_FATAL_FAILURE(ExpectAPushOnANewConnection("resent"));
}

// A port nothing listens on: bound to 127.0.0.1:0 and closed again.
uint16_t ClosedPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

TEST_F(TcpChannelTest, ADataPortThatRefusesTheConnectionCallsForAJoin) {
  // As a shard restarted on a data port the kernel picked leaves its old one.
  ASSERT_TRUE(channel_
                  ->SetRoute(DataRoute{.epoch = 5,
                                       .data_port = ClosedPort(),
                                       .data_session = kSession,
                                       .data_secret = kSecret})
                  .ok());
  const OutgoingPush a = Push(0, "x");
  Answers answers;
  std::unique_ptr<DataChannel::PushCall> call = channel_->NewPush({&a}, Deadline());
  call->Start(answers.Callback());
  const absl::Status refused = answers.Await(1)[0];
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_NE(refused.message().find("cannot connect to"), std::string::npos) << refused;
  EXPECT_TRUE(CallsForRejoin(refused)) << refused;
  EXPECT_TRUE(CallsForRejoin(absl::UnauthenticatedError("unknown session")));
  EXPECT_FALSE(CallsForRejoin(absl::UnavailableError("cannot connect to")))
      << "only the channel's mark calls for a Join, not the words";
}

// The shard's least retransmission timeout (its Join answer's data_tcp_rto_min_us) is
// set on the worker's socket before it connects; a connection opened where this kernel
// could not set it is counted (WorkerStats::tcp_rto_min_unset), and the push still goes.
TEST_F(TcpChannelTest, AConnectionWithoutTheShardsLeastRetransmissionTimeoutIsCounted) {
  const auto unset = [this] {
    WorkerStats s;
    channel_->FillStats(s);
    return s.tcp_rto_min_unset;
  };
  const auto route = [this](std::chrono::microseconds rto_min) {
    ASSERT_TRUE(channel_
                    ->SetRoute(DataRoute{.epoch = 4,
                                         .data_port = shard_.port(),
                                         .data_session = kSession,
                                         .data_secret = kSecret,
                                         .tcp_rto_min = rto_min})
                    .ok());
  };
  // The next call connects again: the one in flight is lost with the connection.
  const auto lose_the_connection = [this] {
    const OutgoingPush a = Push(0, "lost");
    Answers lost;
    std::unique_ptr<DataChannel::PushCall> call = channel_->NewPush({&a}, Deadline());
    call->Start(lost.Callback());
    ASSERT_TRUE(shard_.Read().has_value());
    shard_.Hangup();
    EXPECT_EQ(lost.Await(1)[0].code(), absl::StatusCode::kUnavailable);
  };
  // The fixture's route names none (0: the kernel's own), which asks nothing of it.
  ASSERT_NO_FATAL_FAILURE(ExpectAPushOnANewConnection("the kernel's"));
  EXPECT_EQ(unset(), 0u);
  // 1 us is below the two clock ticks every kernel takes, and a kernel before 6.15 has
  // no such option: no kernel sets it.
  route(std::chrono::microseconds(1));
  ASSERT_NO_FATAL_FAILURE(lose_the_connection());
  ASSERT_NO_FATAL_FAILURE(ExpectAPushOnANewConnection("not set"));
  EXPECT_EQ(unset(), 1u);
  // 10 ms, what a shard's auto names: set where the kernel can.
  const bool settable = net::TryTcpRtoMin(std::chrono::milliseconds(10)).ok();
  route(std::chrono::milliseconds(10));
  ASSERT_NO_FATAL_FAILURE(lose_the_connection());
  ASSERT_NO_FATAL_FAILURE(ExpectAPushOnANewConnection("set where it can be"));
  EXPECT_EQ(unset(), settable ? 1u : 2u);
}

TEST_F(TcpChannelTest, AShardWithoutADataPortIsNamedAtSetRouteAndOnEveryPush) {
  const absl::Status none = channel_->SetRoute(DataRoute{.epoch = 5});
  EXPECT_EQ(none.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(none.message().find("runs no TCP data plane"), std::string::npos) << none;
  const OutgoingPush a = Push(0, "x");
  Answers answers;
  std::unique_ptr<DataChannel::PushCall> call = channel_->NewPush({&a}, Deadline());
  call->Start(answers.Callback());
  EXPECT_EQ(answers.Await(1)[0].code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace ps::internal::tcp_plane
