// PushPipeline against fake shards: retries, give-ups, rejoin, replay, the credit
// window and the send order.
#include "worker_lib/push_pipeline_internal.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "codecs/codec.h"
#include "core/refusal.h"
#include "tests/worker_lib/fake_transport.h"

namespace ps::internal {
namespace {

using std::chrono::milliseconds;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// One shard; "conv" (most urgent) and "fc", two slices of 4 values each.
core::ModelLayout PushLayout() {
  return *core::ModelLayout::Create({{"conv", 8, 0}, {"fc", 8, 1}}, /*slice_elems=*/4, 1);
}

// A fake cluster joined, with a pipeline whose rejoins replay.
struct PushFixture {
  // chunk_elems > 0: the shard's channel carries chunks of that many values.
  explicit PushFixture(WorkerOptions o = FastOptions(), uint32_t chunk_elems = 0)
      : options(std::move(o)), c(PushLayout(), 1, options) {
    c.on_rejoin = [this](uint32_t shard, const v1::JoinResponse& join) {
      pipeline->OnRejoined(shard, join);
    };
    if (chunk_elems > 0) c.channels[0]->CarryChunks(chunk_elems);
    EXPECT_TRUE(c.client->Connect({}, RpcClock::now() + milliseconds(1000)).ok());
    pipeline = *PushPipeline::Create(options, CallRetryPolicy(options), c.layout, *c.client);
  }
  FakeDataChannel& shard() { return *c.channels[0]; }
  FakeControl& control() { return *c.controls[0]; }

  const WorkerOptions options;
  FakeCluster c;
  std::unique_ptr<PushPipeline> pipeline;
};

const std::vector<float> kGrad(8, 0.5f);

std::vector<uint32_t> SliceIds(const std::vector<v1::PushRequest>& pushes) {
  std::vector<uint32_t> out;
  for (const auto& p : pushes) out.push_back(p.slice_id());
  return out;
}

TEST(PushPipelineTest, ARetriableFailureIsRetriedWithBackoff) {
  PushFixture f;
  std::map<uint32_t, int> attempts;  // per slice
  absl::Mutex mu;
  f.shard().SetPushHandler([&](const v1::PushRequest& req) {
    absl::MutexLock lock(&mu);
    return ++attempts[req.slice_id()] < 3 ? absl::UnavailableError("restarting") : absl::OkStatus();
  });
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(f.pipeline->Push(0, 7, kGrad).ok());
  ASSERT_TRUE(f.pipeline->Wait().ok());
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(3));  // 1 ms, then 2 ms
  EXPECT_EQ(f.shard().pushes().size(), 6u);                              // 2 slices x 3 attempts
  EXPECT_EQ(f.pipeline->retries(), 4u);
  WorkerStats s;
  f.pipeline->FillStats(s);
  EXPECT_EQ(s.slices_pushed, 2u);
  EXPECT_EQ(s.slices_refused, 0u);
  EXPECT_GT(s.push_bytes, 0u);
}

TEST(PushPipelineTest, ANonRetriableRefusalIsReportedAtOnce) {
  PushFixture f;
  f.shard().SetPushHandler(
      [](const v1::PushRequest&) { return core::Refused(core::Refusal::kLate, "late"); });
  ASSERT_TRUE(f.pipeline->Push(1, 7, kGrad).ok());
  const absl::Status st = f.pipeline->Wait();
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(st.message(),
              HasSubstr("push of tensor 'fc' slice 2 round 7 to shard 0 (fake0:1): late"));
  // The kind and the push travel as payloads, not only in the message.
  EXPECT_EQ(core::RefusalOf(st), core::Refusal::kLate);
  const std::optional<PushFailure> failure = PushFailureOf(st);
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->tensor, "fc");
  EXPECT_EQ(failure->slice, 2u);
  EXPECT_EQ(failure->round, 7u);
  EXPECT_EQ(failure->shard, 0u);
  EXPECT_EQ(failure->reason, "late");
  EXPECT_THAT(st.message(), ::testing::Not(HasSubstr("attempts")));
  EXPECT_EQ(f.shard().pushes().size(), 2u);
  EXPECT_EQ(f.pipeline->retries(), 0u);
  WorkerStats s;
  f.pipeline->FillStats(s);
  EXPECT_EQ(s.slices_refused, 2u);
  EXPECT_TRUE(f.pipeline->Wait().ok());  // the error was reported once
}

TEST(PushPipelineTest, ARetriableFailureGivesUpAfterMaxAttempts) {
  PushFixture f;
  f.shard().SetPushHandler([](const v1::PushRequest&) { return absl::UnavailableError("down"); });
  ASSERT_TRUE(f.pipeline->Push(0, 1, kGrad).ok());
  const absl::Status st = f.pipeline->Wait();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(st.message(), HasSubstr("(after 3 attempts): down"));
  const std::optional<PushFailure> failure = PushFailureOf(st);
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->tensor, "conv");
  EXPECT_EQ(failure->round, 1u);
  EXPECT_EQ(failure->reason, "") << "no refusal: the shard was unreachable";
  EXPECT_FALSE(PushFailureOf(absl::OkStatus()).has_value());
  EXPECT_FALSE(PushFailureOf(absl::InvalidArgumentError("no tensor 9")).has_value());
  EXPECT_EQ(f.shard().pushes().size(), 6u);
}

TEST(PushPipelineTest, ALostSessionIsJoinedAgainOnceAndThePushResent) {
  PushFixture f;
  // Both slices go out under session-1 before either is answered (answered at once, a
  // retry's 1 ms backoff could end, and re-join, before the second slice was sent).
  ASSERT_TRUE(f.pipeline->Push(0, 3, kGrad).ok());
  ASSERT_TRUE(f.shard().AwaitHeld(2));
  f.shard().SetPushHandler([](const v1::PushRequest& req) {
    return req.session() == "session-1" ? absl::UnauthenticatedError("unknown session")
                                        : absl::OkStatus();
  });
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(f.shard().AnswerOldest(absl::UnauthenticatedError("unknown session")));
  }
  ASSERT_TRUE(f.pipeline->Wait().ok());
  EXPECT_EQ(f.control().joins(), 2);  // Connect, then one rejoin for both slices
  const auto pushes = f.shard().pushes();
  ASSERT_EQ(pushes.size(), 4u);
  EXPECT_EQ(pushes[0].session(), "session-1");
  EXPECT_EQ(pushes[1].session(), "session-1");
  EXPECT_EQ(pushes[2].session(), "session-2");
  EXPECT_EQ(pushes[3].session(), "session-2");
}

TEST(PushPipelineTest, ARetryAnsweredDuplicateWasAccepted) {
  PushFixture f;
  std::map<uint32_t, int> attempts;
  absl::Mutex mu;
  f.shard().SetPushHandler([&](const v1::PushRequest& req) {
    absl::MutexLock lock(&mu);
    return ++attempts[req.slice_id()] == 1 ? absl::DeadlineExceededError("lost answer")
                                           : absl::AlreadyExistsError("duplicate");
  });
  ASSERT_TRUE(f.pipeline->Push(0, 3, kGrad).ok());
  EXPECT_TRUE(f.pipeline->Wait().ok());
  WorkerStats s;
  f.pipeline->FillStats(s);
  EXPECT_EQ(s.slices_pushed, 2u);
}

TEST(PushPipelineTest, AFirstAttemptAnsweredDuplicateIsARefusal) {
  PushFixture f;
  f.shard().SetPushHandler([](const v1::PushRequest&) { return absl::AlreadyExistsError("dup"); });
  ASSERT_TRUE(f.pipeline->Push(0, 3, kGrad).ok());
  EXPECT_EQ(f.pipeline->Wait().code(), absl::StatusCode::kAlreadyExists);
}

TEST(PushPipelineTest, ADuplicateOfThisProcesssFirstPushOfItsStartRoundIsTheReplacedProcesssCopy) {
  // Joined at version 0 (the fake's start_version): a process of this worker id that this
  // one replaces may have pushed round 0 already; its copy counts. Only this process's
  // first push of each tensor for that round is taken so.
  PushFixture f;
  f.shard().SetPushHandler([](const v1::PushRequest&) { return absl::AlreadyExistsError("dup"); });
  ASSERT_TRUE(f.pipeline->Push(0, 0, kGrad).ok());
  EXPECT_TRUE(f.pipeline->Wait().ok());
  ASSERT_TRUE(f.pipeline->Push(1, 0, kGrad).ok());
  EXPECT_TRUE(f.pipeline->Wait().ok());
  WorkerStats s;
  f.pipeline->FillStats(s);
  EXPECT_EQ(s.slices_held_from_before, 4u);  // two slices of each tensor
  EXPECT_EQ(s.slices_pushed, 4u);
  ASSERT_TRUE(f.pipeline->Push(0, 0, kGrad).ok());  // this process's own copy again
  EXPECT_EQ(f.pipeline->Wait().code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(f.pipeline->Push(0, 1, kGrad).ok());  // a later round
  EXPECT_EQ(f.pipeline->Wait().code(), absl::StatusCode::kAlreadyExists);
}

WorkerOptions OneInFlight(bool priority_order) {
  WorkerOptions o = FastOptions();
  o.max_inflight_bytes = 1;  // one push at a time
  o.inflight_seconds = 0;    // however fast the link was measured
  o.priority_order = priority_order;
  return o;
}

TEST(PushPipelineTest, TheWindowGrowsToWhatTheLinkMovesInInflightSeconds) {
  for (const double seconds : {0.0, 100.0}) {
    SCOPED_TRACE(seconds);
    WorkerOptions o = OneInFlight(true);
    o.inflight_seconds = seconds;
    PushFixture f(o);
    ASSERT_TRUE(f.pipeline->Push(0, 0, kGrad).ok());
    ASSERT_TRUE(f.shard().AwaitHeld(1));
    EXPECT_EQ(f.shard().held().size(), 1u);  // nothing measured yet: one push
    // The answer ends a busy period: the link's first measurement.
    ASSERT_TRUE(f.shard().AnswerOldest(absl::OkStatus()));
    ASSERT_TRUE(f.shard().AwaitHeld(1));
    ASSERT_TRUE(f.pipeline->Push(1, 0, kGrad).ok());
    if (seconds == 0) {
      EXPECT_EQ(f.shard().held().size(), 1u);
    } else {
      // What a link of any measurable rate moves in 100 s: all three go at once.
      ASSERT_TRUE(f.shard().AwaitHeld(3));
      EXPECT_EQ(f.shard().held().size(), 3u);
    }
    for (int left = 3; left > 0 && f.shard().AwaitHeld(1); --left) {
      ASSERT_TRUE(f.shard().AnswerOldest(absl::OkStatus()));
    }
    EXPECT_TRUE(f.pipeline->Wait().ok());
    EXPECT_EQ(f.shard().pushes().size(), 4u);
  }
}

TEST(PushPipelineTest, TheCreditWindowLetsOnePushGoAtATime) {
  PushFixture f(OneInFlight(true));
  ASSERT_TRUE(f.pipeline->Push(0, 0, kGrad).ok());
  ASSERT_TRUE(f.pipeline->Push(1, 0, kGrad).ok());
  ASSERT_TRUE(f.shard().AwaitHeld(1));
  EXPECT_EQ(f.shard().held().size(), 1u);
  EXPECT_EQ(f.shard().pushes().size(), 1u);
  for (size_t answered = 1; answered <= 4; ++answered) {
    ASSERT_TRUE(f.shard().AnswerOldest(absl::OkStatus()));
    // The answer released the credit: the next one went, and only it.
    EXPECT_EQ(f.shard().pushes().size(), std::min<size_t>(answered + 1, 4));
    EXPECT_EQ(f.shard().held().size(), answered < 4 ? 1u : 0u);
  }
  EXPECT_TRUE(f.pipeline->Wait().ok());
}

TEST(PushPipelineTest, AFailedPushReleasesItsCreditToo) {
  PushFixture f(OneInFlight(true));
  ASSERT_TRUE(f.pipeline->Push(0, 0, kGrad).ok());
  ASSERT_TRUE(f.shard().AwaitHeld(1));
  ASSERT_TRUE(f.shard().AnswerOldest(absl::InvalidArgumentError("bad")));
  ASSERT_TRUE(f.shard().AwaitHeld(1));
  ASSERT_TRUE(f.shard().AnswerOldest(absl::OkStatus()));
  EXPECT_EQ(f.pipeline->Wait().code(), absl::StatusCode::kInvalidArgument);
}

// Pushes fc (slices 2, 3), then conv (0, 1), as backward produces them (last layer
// first), with one push in flight at a time; the slice ids in the order sent.
std::vector<uint32_t> SendOrder(bool priority_order) {
  PushFixture f(OneInFlight(priority_order));
  EXPECT_TRUE(f.pipeline->Push(1, 0, kGrad).ok());
  EXPECT_TRUE(f.pipeline->Push(0, 0, kGrad).ok());
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(f.shard().AwaitHeld(1));
    EXPECT_TRUE(f.shard().AnswerOldest(absl::OkStatus()));
  }
  EXPECT_TRUE(f.pipeline->Wait().ok());
  return SliceIds(f.shard().pushes());
}

TEST(PushPipelineTest, QueuedPushesGoMostUrgentFirst) {
  // Slice 2 was on the wire before conv was queued; conv overtook slice 3.
  EXPECT_THAT(SendOrder(/*priority_order=*/true), ElementsAre(2, 0, 1, 3));
}

TEST(PushPipelineTest, FifoOrderSendsInTheOrderPushed) {
  EXPECT_THAT(SendOrder(/*priority_order=*/false), ElementsAre(2, 3, 0, 1));
}

TEST(PushPipelineTest, AcceptedPushesOfOpenRoundsAreReplayedAfterARestart) {
  PushFixture f;
  f.shard().SetPushHandler([](const v1::PushRequest&) { return absl::OkStatus(); });
  ASSERT_TRUE(f.pipeline->Push(0, 4, kGrad).ok());
  ASSERT_TRUE(f.pipeline->Push(1, 5, kGrad).ok());
  ASSERT_TRUE(f.pipeline->Push(1, 6, kGrad).ok());  // the newest of slices 2 and 3
  ASSERT_TRUE(f.pipeline->Wait().ok());
  ASSERT_EQ(f.shard().pushes().size(), 6u);

  // The shard came back from a checkpoint at version 5: rounds >= 5 are open there.
  f.shard().SetPushHandler([](const v1::PushRequest&) { return absl::AlreadyExistsError("dup"); });
  v1::JoinResponse join;
  join.set_layout_registered(true);
  join.set_version(5);
  f.pipeline->OnRejoined(0, join);
  const auto pushes = f.shard().pushes();
  ASSERT_EQ(pushes.size(), 8u);
  EXPECT_THAT(std::vector<uint32_t>({pushes[6].slice_id(), pushes[7].slice_id()}),
              ::testing::UnorderedElementsAre(2, 3));
  EXPECT_EQ(pushes[6].round(), 6u);
  EXPECT_EQ(pushes[7].round(), 6u);
  WorkerStats s;
  f.pipeline->FillStats(s);
  EXPECT_EQ(s.pushes_replayed, 2u);
  EXPECT_EQ(s.slices_refused, 0u);  // a refused replay is nobody's error
  EXPECT_TRUE(f.pipeline->Wait().ok());
}

TEST(PushPipelineTest, AShardThatLostItsLayoutFailsTheRun) {
  PushFixture f;
  v1::JoinResponse join;
  join.set_layout_registered(false);
  f.pipeline->OnRejoined(0, join);
  const absl::Status st = f.pipeline->Wait();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("shard 0 (fake0:1) restarted and lost the layout"));
}

TEST(PushPipelineTest, DestroyingCancelsWhatIsInFlightAndQueued) {
  PushFixture f(OneInFlight(true));
  ASSERT_TRUE(f.pipeline->Push(0, 0, kGrad).ok());
  ASSERT_TRUE(f.shard().AwaitHeld(1));
  const auto start = std::chrono::steady_clock::now();
  f.pipeline.reset();  // returns once the held push was cancelled and the queued dropped
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(500));
  EXPECT_EQ(f.shard().pushes().size(), 1u);
}

TEST(PushPipelineTest, BadArgumentsAreRefusedAtOnce) {
  PushFixture f;
  EXPECT_EQ(f.pipeline->Push(2, 0, kGrad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.pipeline->Push(0, 0, std::vector<float>(7)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(f.shard().pushes().empty());
  EXPECT_TRUE(f.pipeline->Wait().ok());
}

TEST(PushPipelineTest, PushOptionsForAnUnknownTensorAreRefused) {
  WorkerOptions o = FastOptions();
  o.tensor_push["nope"] = PushOptions{};
  FakeCluster c(PushLayout(), 1, o);
  const auto p = PushPipeline::Create(o, CallRetryPolicy(o), c.layout, *c.client);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
}

// Borrowed pushes (PushOptions::borrow): the caller's values go as they are.
WorkerOptions Borrowing(bool borrow = true) {
  WorkerOptions o = FastOptions();
  o.push.borrow = borrow;
  return o;
}

std::vector<float> Ramp() {
  std::vector<float> g(8);
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0.25f * static_cast<float>(i) - 1.0f;
  return g;
}

// A round's payloads are encoded into the strings of the rounds sent before
// (Slot::payloads, a core::StringPool): each round's pushes carry that round's values,
// never an earlier one's.
TEST(PushPipelineTest, EachRoundSendsItsOwnValuesThoughItReusesEarlierRoundsStrings) {
  PushFixture f;
  f.shard().SetPushHandler([](const v1::PushRequest&) { return absl::OkStatus(); });
  std::vector<std::string> want;
  for (uint64_t round = 3; round < 7; ++round) {
    std::vector<float> g = Ramp();
    for (float& v : g) v *= static_cast<float>(round);
    ASSERT_TRUE(f.pipeline->Push(0, round, g).ok());
    ASSERT_TRUE(f.pipeline->Wait().ok());
    for (size_t slice = 0; slice < 2; ++slice) {
      std::string bytes;
      ASSERT_TRUE(codecs::MakeCodec("fp32")
                      .value()
                      ->Encode(std::span<const float>(g).subspan(4 * slice, 4), &bytes)
                      .ok());
      want.push_back(bytes);
    }
  }
  const std::vector<v1::PushRequest> pushes = f.shard().pushes();
  ASSERT_EQ(pushes.size(), want.size());
  for (size_t i = 0; i < pushes.size(); ++i) {
    EXPECT_EQ(pushes[i].round(), 3 + i / 2);
    EXPECT_EQ(pushes[i].payload(), want[i]) << "push " << i;
  }
}

// Ramp() pushed in round 3, copied (false) and borrowed (true), over a channel that
// carries chunks of `chunk_elems` values (0: whole slices): what the shard got each way.
// Every piece of the borrowed push held its guard (`pieces` of them), no copied one.
std::map<bool, std::vector<v1::PushRequest>> PushedCopiedAndBorrowed(uint32_t chunk_elems,
                                                                      size_t pieces) {
  std::map<bool, std::vector<v1::PushRequest>> sent;
  for (const bool borrow : {false, true}) {
    PushFixture f(Borrowing(borrow), chunk_elems);
    f.shard().KeepGuards();
    f.shard().SetPushHandler([](const v1::PushRequest&) { return absl::OkStatus(); });
    const std::vector<float> g = Ramp();
    EXPECT_TRUE(f.pipeline->Push(0, 3, g).ok());
    EXPECT_EQ(f.shard().ReleaseGuards(), borrow ? pieces : 0u) << "borrow " << borrow;
    EXPECT_TRUE(f.pipeline->Wait().ok());
    sent[borrow] = f.shard().pushes();
  }
  return sent;
}

TEST(PushPipelineTest, ABorrowedPushSendsTheBytesACopiedPushSends) {
  // Each of the two slices' pushes holds the push's guard.
  std::map<bool, std::vector<v1::PushRequest>> sent = PushedCopiedAndBorrowed(0, 2);
  ASSERT_EQ(sent[true].size(), 2u);
  ASSERT_EQ(sent[false].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(sent[true][i].slice_id(), sent[false][i].slice_id());
    EXPECT_EQ(sent[true][i].codec(), "fp32");
    EXPECT_EQ(sent[true][i].payload(), sent[false][i].payload()) << "slice " << i;
    EXPECT_EQ(sent[true][i].payload().size(), 1 + 4 * sizeof(float));
  }
}

// On a path that carries chunks (the UDP path's shape), a borrowed push sends each chunk
// from the caller's buffer under the push's guard: the bytes copied chunks carry.
TEST(PushPipelineTest, ABorrowedPushOnAChunkedPathSendsEveryChunkBorrowed) {
  // Two slices of 4 values in chunks of 3: 3 + 1 values each, four chunks.
  std::map<bool, std::vector<v1::PushRequest>> sent =
      PushedCopiedAndBorrowed(/*chunk_elems=*/3, /*pieces=*/4);
  ASSERT_EQ(sent[true].size(), 4u);
  ASSERT_EQ(sent[false].size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(sent[true][i].slice_id(), sent[false][i].slice_id());
    EXPECT_EQ(sent[true][i].payload(), sent[false][i].payload()) << "chunk " << i;
    EXPECT_EQ(sent[true][i].payload().size(), 1 + (i % 2 == 0 ? 3 : 1) * sizeof(float)) << i;
  }
}

TEST(PushPipelineTest, WaitReturnsOnlyOnceNoTransportHoldsABorrowedPush) {
  PushFixture f(Borrowing());
  f.shard().KeepGuards();  // answered, but the write still reads the bytes
  f.shard().SetPushHandler([](const v1::PushRequest&) { return absl::OkStatus(); });
  const std::vector<float> g = Ramp();
  ASSERT_TRUE(f.pipeline->Push(0, 0, g).ok());
  std::future<absl::Status> waited =
      std::async(std::launch::async, [&f] { return f.pipeline->Wait(); });
  EXPECT_EQ(waited.wait_for(milliseconds(200)), std::future_status::timeout);
  EXPECT_EQ(f.shard().ReleaseGuards(), 2u);
  ASSERT_EQ(waited.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_TRUE(waited.get().ok());
}

TEST(PushPipelineTest, ABorrowedPushOfANonFiniteValueIsRefusedAndSendsNothing) {
  PushFixture f(Borrowing());
  f.shard().KeepGuards();
  std::vector<float> g = Ramp();
  g[6] = std::numeric_limits<float>::quiet_NaN();  // in the second slice
  const absl::Status st = f.pipeline->Push(0, 0, g);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("'conv'"));
  EXPECT_TRUE(f.shard().pushes().empty());
  EXPECT_EQ(f.shard().ReleaseGuards(), 0u);
  EXPECT_TRUE(f.pipeline->Wait().ok());
}

TEST(PushPipelineTest, ATensorWithMomentumIsCopiedThoughBorrowingWasAsked) {
  WorkerOptions o = Borrowing();
  o.push.momentum = 0.5;
  PushFixture f(o);
  f.shard().KeepGuards();
  f.shard().SetPushHandler([](const v1::PushRequest&) { return absl::OkStatus(); });
  ASSERT_TRUE(f.pipeline->Push(0, 0, Ramp()).ok());
  ASSERT_TRUE(f.pipeline->Wait().ok());
  EXPECT_EQ(f.shard().pushes().size(), 2u);
  EXPECT_EQ(f.shard().ReleaseGuards(), 0u);
}

// A restored shard gets the values pushed, not what the caller's buffer holds after
// WaitPushes returned.
TEST(PushPipelineTest, TheReplayOfABorrowedPushSendsTheValuesPushed) {
  PushFixture f(Borrowing());
  f.shard().SetPushHandler([](const v1::PushRequest&) { return absl::OkStatus(); });
  std::vector<float> g = Ramp();
  ASSERT_TRUE(f.pipeline->Push(0, 6, g).ok());
  ASSERT_TRUE(f.pipeline->Wait().ok());
  const std::vector<v1::PushRequest> first = f.shard().pushes();
  ASSERT_EQ(first.size(), 2u);
  std::fill(g.begin(), g.end(), 9.0f);  // the caller's buffer is its own again

  f.shard().SetPushHandler([](const v1::PushRequest&) { return absl::AlreadyExistsError("dup"); });
  v1::JoinResponse join;
  join.set_layout_registered(true);
  join.set_version(5);
  f.pipeline->OnRejoined(0, join);
  const std::vector<v1::PushRequest> all = f.shard().pushes();
  ASSERT_EQ(all.size(), 4u);
  for (size_t i = 2; i < 4; ++i) {
    const uint32_t slice = all[i].slice_id();
    ASSERT_LT(slice, 2u);
    EXPECT_EQ(all[i].payload(), first[slice].payload()) << "slice " << slice;
  }
  EXPECT_TRUE(f.pipeline->Wait().ok());
}

TEST(PushPipelineTest, NoReplayCopyOfABorrowedPushForAShardWithoutCheckpoints) {
  PushFixture f(Borrowing());
  f.shard().SetPushHandler([](const v1::PushRequest&) { return absl::OkStatus(); });
  v1::JoinResponse join;
  join.set_layout_registered(true);
  join.set_no_checkpoints(true);
  join.set_version(100);  // nothing open to replay yet
  f.pipeline->OnRejoined(0, join);
  ASSERT_TRUE(f.pipeline->Push(0, 6, Ramp()).ok());
  ASSERT_TRUE(f.pipeline->Wait().ok());
  join.set_version(5);
  f.pipeline->OnRejoined(0, join);
  EXPECT_EQ(f.shard().pushes().size(), 2u);  // nothing replayed
  WorkerStats s;
  f.pipeline->FillStats(s);
  EXPECT_EQ(s.pushes_replayed, 0u);
}

}  // namespace
}  // namespace ps::internal
