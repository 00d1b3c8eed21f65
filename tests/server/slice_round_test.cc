// The round state machine of one slice (SliceRound) and the share protocol of model
// rounds (ModelRounds), each on its own: no Shard, no thread pool.
#include "server/slice_round.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "aggregators/aggregator.h"
#include "codecs/codec.h"
#include "core/clock.h"
#include "core/fp32_bytes.h"
#include "core/refusal.h"
#include "core/thread_pool.h"
#include "server/deadline_queue.h"
#include "server/memory_estimate.h"
#include "server/model_rounds.h"
#include "server/round_aggregation.h"
#include "server/slice_table.h"

namespace ps::server {
namespace {

using std::chrono::milliseconds;

std::string Fp32(const std::vector<float>& v) {
  std::string s;
  core::AppendFp32(v, &s);
  return s;
}

class SliceRoundTest : public ::testing::Test {
 protected:
  SliceRoundTest() {
    rules_.num_workers = 3;
    rules_.quorum = 2;
    rules_.round_deadline = milliseconds(100);
    rules_.clock = &clock_;
    rules_.deadlines = &deadlines_;
    info_.id = 4;
    info_.numel = 2;
    codec_ = std::shared_ptr<const codecs::Codec>(codecs::MakeCodec("fp32").value());
    encoder_ = codecs::MakeCodec("fp32").value();
  }

  // What the shard's ticker does at `clock_.Now()`: takes the due deadlines off the
  // queue and tells `s` (whose deadline must be among them to be due).
  SliceRound::DeadlineOutcome Tick(SliceRound& s) {
    (void)deadlines_.PopDue(clock_.Now());
    return s.OnDeadline(clock_.Now());
  }

  // A FunctionRef to decode_, which outlives every call.
  SliceRound::DecoderFn Decoder() { return decode_; }

  absl::StatusOr<SliceRound::Progress> Push(SliceRound& s, uint32_t worker, uint64_t round,
                                            std::vector<float> values) {
    return s.AcceptPush(worker, round, "fp32", Decoder(), Encoded(values));
  }

  // A push's payload: `values` through the fp32 codec.
  std::string Encoded(const std::vector<float>& values) {
    std::string out;
    EXPECT_TRUE(encoder_->Encode(values, &out).ok());
    return out;
  }

  void Init(SliceRound& s) {
    Wakeups wake;
    absl::Status st = s.Initialize(Fp32({1.0f, 2.0f}), &wake);
    ASSERT_TRUE(st.ok()) << st;
  }

  core::ManualClock clock_;
  DeadlineQueue deadlines_;
  RoundRules rules_;
  core::SliceInfo info_;
  std::shared_ptr<const codecs::Codec> codec_;
  std::unique_ptr<codecs::Codec> encoder_;
  int decoder_calls_ = 0;
  std::function<absl::StatusOr<std::shared_ptr<const codecs::Codec>>()> decode_ = [this] {
    ++decoder_calls_;
    return absl::StatusOr<std::shared_ptr<const codecs::Codec>>(codec_);
  };
};

TEST_F(SliceRoundTest, ClosingMovesTheBuffersIntoTheClosedRoundAndPublishBringsThemBack) {
  SliceRound s(info_, &rules_, /*aggregate_only=*/false);
  Init(s);
  ASSERT_TRUE(Push(s, 0, 0, {1, 1}).ok());
  ASSERT_TRUE(Push(s, 2, 0, {3, 5}).ok());
  absl::StatusOr<SliceRound::Progress> last = Push(s, 1, 0, {2, 2});
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_TRUE(last->closed);
  EXPECT_FALSE(last->at_deadline);
  EXPECT_EQ(deadlines_.Next(), std::nullopt) << "a closed round has no deadline";

  // Closed, not yet published: a push for the round is refused (worker 0's again as the
  // duplicate it is: see the next test), and nothing is decoded.
  const int calls = decoder_calls_;
  absl::StatusOr<SliceRound::Progress> again = Push(s, 0, 0, {9, 9});
  EXPECT_EQ(core::RefusalOf(again.status()), core::Refusal::kDuplicate);
  EXPECT_EQ(decoder_calls_, calls);

  std::optional<ClosedRound> r = s.TakeClosed();
  ASSERT_TRUE(r.has_value());
  EXPECT_FALSE(s.TakeClosed().has_value()) << "a closed round is taken once";
  EXPECT_EQ(r->round, 0u);
  EXPECT_EQ(r->Workers(), (std::vector<uint32_t>{0, 1, 2}));
  const std::vector<uint32_t> two = {0, 2};
  std::vector<const float*> rows = r->Rows(two);
  EXPECT_EQ(rows[1][0], 3.0f);
  EXPECT_EQ(rows[1][1], 5.0f);
  EXPECT_EQ(r->model.params, (std::vector<float>{1.0f, 2.0f}));
  EXPECT_TRUE(r->MasksOf(two).ptrs.empty()) << "whole pushes need no masks";
  EXPECT_TRUE(r->SharedSupport(two).empty());
  EXPECT_EQ(r->ChunksLost(), 0u);
  const float* buffer = r->inputs.rows[1].get();

  r->model.params = {7.0f, 8.0f};
  Wakeups wake;
  s.Publish(*std::move(r), core::SharedFp32(std::vector<float>{7.0f, 8.0f}), nullptr, &wake);
  EXPECT_EQ(s.version(), 1u);
  EXPECT_EQ(*s.Snapshot().values, Fp32({7.0f, 8.0f}));
  // Round 1 is open with the same buffer, emptied.
  ASSERT_TRUE(Push(s, 1, 1, {4, 4}).ok());
  ASSERT_TRUE(Push(s, 0, 1, {4, 4}).ok());
  ASSERT_TRUE(Push(s, 2, 1, {4, 4}).ok());
  std::optional<ClosedRound> next = s.TakeClosed();
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->inputs.rows[1].get(), buffer) << "the worker's row is reused, not reallocated";
  EXPECT_EQ(next->model.params, (std::vector<float>{7.0f, 8.0f}));
}

TEST_F(SliceRoundTest, PublicationsCarryTheMedianOfTheReportedLosses) {
  SliceRound s(info_, &rules_, /*aggregate_only=*/false);
  Init(s);
  EXPECT_FALSE(s.Snapshot().loss.has_value()) << "nothing reported yet";
  // A non-finite loss is refused before anything is decoded, and the worker may still
  // push the round.
  const int calls = decoder_calls_;
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    absl::StatusOr<SliceRound::Progress> p =
        s.AcceptPush(0, 0, "fp32", Decoder(), Encoded({1, 1}), bad);
    EXPECT_EQ(core::RefusalOf(p.status()), core::Refusal::kMalformed) << p.status();
    EXPECT_THAT(p.status().message(), testing::HasSubstr("is not finite"));
  }
  EXPECT_EQ(decoder_calls_, calls);

  auto round = [&](uint64_t r, std::vector<std::optional<float>> losses) {
    for (uint32_t w = 0; w < losses.size(); ++w) {
      ASSERT_TRUE(s.AcceptPush(w, r, "fp32", Decoder(), Encoded({1, 1}), losses[w]).ok());
    }
    std::optional<ClosedRound> closed = s.TakeClosed();
    ASSERT_TRUE(closed.has_value());
    Wakeups wake;
    s.Publish(*std::move(closed), core::SharedFp32(std::vector<float>{1.0f, 2.0f}), nullptr, &wake);
  };
  // One liar with a huge loss does not move the median of three.
  round(0, {2.0f, 1e30f, 2.5f});
  EXPECT_EQ(s.Snapshot().loss, 2.5f);
  EXPECT_EQ(s.Snapshot().first_loss, 2.5f);
  // A worker that reports nothing is left out: the median of two is their mean.
  round(1, {1.0f, std::nullopt, 2.0f});
  EXPECT_EQ(s.Snapshot().loss, 1.5f);
  EXPECT_EQ(s.Snapshot().first_loss, 2.5f) << "the first round's median stays";
  // A round without reports publishes none, and the first stays.
  round(2, {std::nullopt, std::nullopt, std::nullopt});
  EXPECT_FALSE(s.Snapshot().loss.has_value());
  EXPECT_EQ(s.Snapshot().first_loss, 2.5f);
}

TEST(MedianLossTest, OnlyWorkersThatPushedAndReportedCount) {
  RoundInputs in;
  const float none = std::numeric_limits<float>::quiet_NaN();
  in.pushed = {1, 1, 0, 1, 1};
  in.losses = {4.0f, none, 100.0f, 1.0f, 3.0f};
  EXPECT_EQ(MedianLoss(in), 3.0f);  // of {4, 1, 3}; worker 2 did not push
  in.pushed[2] = 1;
  EXPECT_EQ(MedianLoss(in), 3.5f);  // of {4, 100, 1, 3}
  in.losses.assign(5, none);
  EXPECT_EQ(MedianLoss(in), std::nullopt);
}

// A worker whose connection was lost before its push's answer sends the push again. Once
// the round closed with the first copy, the copy is a duplicate (the worker's retry
// counts that as delivered), found before the codec; a worker the round did not count is
// late. Found by ConnectionLossTest (tests/integration/connection_loss_test.cc): "late"
// failed the worker's round although its push was in it.
TEST_F(SliceRoundTest, APushAgainAfterItsRoundClosedWithItIsADuplicateAndAMissingOneIsLate) {
  SliceRound s(info_, &rules_, /*aggregate_only=*/false);
  Init(s);
  ASSERT_TRUE(Push(s, 0, 0, {1, 1}).ok());
  ASSERT_TRUE(Push(s, 1, 0, {2, 2}).ok());
  clock_.Advance(milliseconds(150));
  ASSERT_TRUE(Tick(s).closed) << "the deadline closes round 0 with its quorum, 0 and 1";
  const int calls = decoder_calls_;
  EXPECT_EQ(core::RefusalOf(Push(s, 0, 0, {1, 1}).status()), core::Refusal::kDuplicate);
  EXPECT_EQ(core::RefusalOf(Push(s, 2, 0, {3, 3}).status()), core::Refusal::kLate);
  std::optional<ClosedRound> r = s.TakeClosed();
  ASSERT_TRUE(r.has_value());
  Wakeups wake;
  s.Publish(*std::move(r), core::SharedFp32(std::vector<float>{5.0f, 5.0f}), nullptr, &wake);
  // Published: the same answers for round 0, and round 1 is open to everyone.
  absl::StatusOr<SliceRound::Progress> again = Push(s, 1, 0, {2, 2});
  EXPECT_EQ(core::RefusalOf(again.status()), core::Refusal::kDuplicate);
  EXPECT_THAT(std::string(again.status().message()),
              ::testing::HasSubstr("closed with its first copy"));
  EXPECT_EQ(core::RefusalOf(Push(s, 2, 0, {3, 3}).status()), core::Refusal::kLate);
  EXPECT_EQ(decoder_calls_, calls);
  ASSERT_TRUE(Push(s, 0, 1, {1, 1}).ok());
  ASSERT_TRUE(Push(s, 2, 1, {1, 1}).ok());
  EXPECT_EQ(core::RefusalOf(Push(s, 2, 1, {1, 1}).status()), core::Refusal::kDuplicate);
}

TEST_F(SliceRoundTest, RefusalsAreTypedAndStateChecksComeBeforeTheCodec) {
  SliceRound s(info_, &rules_, /*aggregate_only=*/false);
  EXPECT_EQ(core::RefusalOf(Push(s, 0, 0, {1, 1}).status()), core::Refusal::kNotReady);
  Init(s);
  Wakeups wake;
  EXPECT_EQ(s.Initialize(Fp32({1.0f, 2.0f}), &wake).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(core::RefusalOf(Push(s, 0, 1, {1, 1}).status()), core::Refusal::kFutureRound);
  ASSERT_TRUE(Push(s, 0, 0, {1, 1}).ok());
  const int calls = decoder_calls_;
  EXPECT_EQ(core::RefusalOf(Push(s, 0, 0, {1, 1}).status()), core::Refusal::kDuplicate);
  EXPECT_EQ(decoder_calls_, calls) << "a duplicate is refused before its codec is looked at";
  EXPECT_EQ(core::RefusalOf(Push(s, 1, 0, {1}).status()), core::Refusal::kMalformed);
  EXPECT_EQ(core::RefusalOf(s.AcceptPush(1, 0, "fp32", Decoder(), "junk").status()),
            core::Refusal::kMalformed);
  // A malformed push does not count: worker 1 may still push.
  ASSERT_TRUE(Push(s, 1, 0, {1, 1}).ok());
  // The decoder's own refusal comes back as it is.
  absl::StatusOr<SliceRound::Progress> unknown = s.AcceptPush(
      2, 0, "nope",
      []() -> absl::StatusOr<std::shared_ptr<const codecs::Codec>> {
        return core::Refused(core::Refusal::kUnknownCodec, "no such codec");
      },
      Encoded({1, 1}));
  EXPECT_EQ(core::RefusalOf(unknown.status()), core::Refusal::kUnknownCodec);
}

// A raw row as a transport reads one: the version byte, then `values` in a row of its own.
RawRow Raw(const std::vector<float>& values, unsigned char version = codecs::FormatByte(codecs::PayloadFormat::kFp32)) {
  RawRow raw{.version = version,
             .values = std::make_unique<float[]>(values.size()),
             .numel = static_cast<uint32_t>(values.size())};
  std::copy(values.begin(), values.end(), raw.values.get());
  return raw;
}

TEST_F(SliceRoundTest, ARawRowIsCheckedInPlaceAndTakenAsTheWorkersRowGivingBackTheOldOne) {
  SliceRound s(info_, &rules_, /*aggregate_only=*/false);
  Init(s);
  ASSERT_TRUE(Push(s, 1, 0, {9, 9}).ok());  // worker 1's row, zeroed at first use, then decoded

  RawRow raw = Raw({3, 5});
  const float* taken = raw.values.get();
  absl::StatusOr<SliceRound::Progress> in_place = s.AcceptPush(0, 0, "fp32", Decoder(), PushPayload(&raw));
  ASSERT_TRUE(in_place.ok()) << in_place.status();
  EXPECT_EQ(raw.values, nullptr) << "worker 0 had no row yet: nothing to give back";
  EXPECT_EQ(in_place->decode, std::chrono::nanoseconds{0})
      << "a row taken in place is checked, not timed: it charges the decode budget nothing";

  // Refusals keep the row with the transport, and say what decoding the bytes says.
  RawRow nan = Raw({1, std::numeric_limits<float>::quiet_NaN()});
  const float* kept = nan.values.get();
  absl::StatusOr<SliceRound::Progress> refused =
      s.AcceptPush(2, 0, "fp32", Decoder(), PushPayload(&nan));
  EXPECT_EQ(core::RefusalOf(refused.status()), core::Refusal::kMalformed);
  EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("value 1 is not finite"));
  EXPECT_EQ(nan.values.get(), kept);
  RawRow old_format = Raw({1, 1}, /*version=*/7);
  absl::StatusOr<SliceRound::Progress> versioned =
      s.AcceptPush(2, 0, "fp32", Decoder(), PushPayload(&old_format));
  EXPECT_EQ(core::RefusalOf(versioned.status()), core::Refusal::kMalformed);
  EXPECT_THAT(std::string(versioned.status().message()), ::testing::HasSubstr("payload in the sign format (7), expected the fp32 format (1)"));
  RawRow duplicate = Raw({1, 1});
  EXPECT_EQ(core::RefusalOf(s.AcceptPush(0, 0, "fp32", Decoder(), PushPayload(&duplicate)).status()),
            core::Refusal::kDuplicate);

  ASSERT_TRUE(Push(s, 2, 0, {1, 1}).ok());
  std::optional<ClosedRound> r = s.TakeClosed();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->inputs.rows[0].get(), taken) << "the row the values were read into, not a copy";
  const std::vector<uint32_t> first = {0};
  EXPECT_EQ(r->Rows(first)[0][0], 3.0f);
  EXPECT_EQ(r->Rows(first)[0][1], 5.0f);
  Wakeups wake;
  s.Publish(*std::move(r), core::SharedFp32(std::vector<float>{7.0f, 8.0f}), nullptr, &wake);

  // Round 1: the next raw row replaces worker 0's row, which comes back for the next read.
  RawRow next = Raw({2, 4});
  ASSERT_TRUE(s.AcceptPush(0, 1, "fp32", Decoder(), PushPayload(&next)).ok());
  EXPECT_EQ(next.values.get(), taken);
  EXPECT_EQ(next.numel, 2u);
}

TEST_F(SliceRoundTest, ARawRowUnderACodecThatIsNotRawFp32IsDecodedAsItsBytes) {
  SliceRound s(info_, &rules_, /*aggregate_only=*/false);
  Init(s);
  codec_ = std::shared_ptr<const codecs::Codec>(codecs::MakeCodec("fp16").value());
  RawRow raw = Raw({1, 1});
  const float* kept = raw.values.get();
  // Nine bytes are no fp16 payload of two values: refused as the fp16 decoder refuses them.
  absl::StatusOr<SliceRound::Progress> refused =
      s.AcceptPush(0, 0, "fp16", Decoder(), PushPayload(&raw));
  EXPECT_EQ(core::RefusalOf(refused.status()), core::Refusal::kMalformed);
  EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("fp16"));
  EXPECT_EQ(raw.values.get(), kept) << "only a raw fp32 row is ever taken";
}

TEST_F(SliceRoundTest, TheDeadlineClosesARoundWithItsQuorumOrWaitsForIt) {
  SliceRound s(info_, &rules_, /*aggregate_only=*/false);
  Init(s);
  ASSERT_TRUE(Push(s, 0, 0, {1, 1}).ok());
  ASSERT_TRUE(deadlines_.Next().has_value()) << "the first push starts the deadline";
  clock_.Advance(milliseconds(150));
  SliceRound::DeadlineOutcome below = s.OnDeadline(clock_.Now());
  EXPECT_TRUE(below.due);
  EXPECT_FALSE(below.closed);
  EXPECT_EQ(below.pushed, 1u);
  EXPECT_EQ(below.quorum, 2u);
  // The quorum is reached after the deadline: that push closes the round at once.
  absl::StatusOr<SliceRound::Progress> second = Push(s, 1, 0, {1, 1});
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE(second->closed);
  EXPECT_TRUE(second->at_deadline);
  std::optional<ClosedRound> r = s.TakeClosed();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->Workers(), (std::vector<uint32_t>{0, 1}));
}

// Issue 45, finding 5: a slice's deadline started with one worker's first push (or
// chunk), so a Byzantine worker pushing first set every round's clock. It now starts
// once `starters` distinct workers pushed (the shard sets f + 1, at least 2).
TEST_F(SliceRoundTest, TheDeadlineStartsWithTheStartersNeverWithOneWorker) {
  rules_.starters = 2;
  SliceRound s(info_, &rules_, /*aggregate_only=*/false);
  Init(s);
  const SliceRound::Chunk one{/*worker=*/2, /*round=*/0, /*index=*/0, /*count_in_push=*/2,
                              /*chunk_elems=*/1, /*first=*/0, /*count=*/1};
  ASSERT_TRUE(s.AcceptChunk(one, "fp32", Decoder(), Encoded({1e6f})).ok());
  EXPECT_EQ(deadlines_.Next(), std::nullopt) << "one worker's chunk starts no deadline";
  clock_.Advance(milliseconds(1000));
  EXPECT_FALSE(Tick(s).due);
  ASSERT_TRUE(Push(s, 0, 0, {1, 1}).ok());
  ASSERT_TRUE(deadlines_.Next().has_value()) << "the second worker's push starts it";
  EXPECT_EQ(*deadlines_.Next(), clock_.Now() + milliseconds(100));
  clock_.Advance(milliseconds(100));
  const SliceRound::DeadlineOutcome out = Tick(s);
  EXPECT_TRUE(out.closed) << "two pushes: the quorum";
  EXPECT_FALSE(out.below_quorum);
}

// Without a UDP round, a deadline that passes below the quorum only starts the wait for
// it: no further deadline, nothing dropped, however long it takes.
TEST_F(SliceRoundTest, BelowTheQuorumARoundWaitsForItWithoutAnotherDeadline) {
  rules_.starters = 2;
  rules_.quorum = 3;
  UdpRounds udp(3, 3);
  rules_.udp = &udp;
  SliceRound s(info_, &rules_, /*aggregate_only=*/false);
  Init(s);
  ASSERT_TRUE(Push(s, 0, 0, {1, 1}).ok());
  ASSERT_TRUE(Push(s, 1, 0, {1, 1}).ok());
  clock_.Advance(milliseconds(100));
  const SliceRound::DeadlineOutcome out = Tick(s);
  EXPECT_TRUE(out.due);
  EXPECT_FALSE(out.closed);
  EXPECT_FALSE(out.grace);
  EXPECT_EQ(deadlines_.Next(), std::nullopt);
  clock_.Advance(milliseconds(100000));
  absl::StatusOr<SliceRound::Progress> third = Push(s, 2, 0, {1, 1});
  ASSERT_TRUE(third.ok());
  EXPECT_TRUE(third->closed);
}

// A UDP round arms on a shard once a chunk came for it and the quorum of distinct
// workers sent something (a push or a chunk) for it there: never by fewer, never by
// gRPC pushes alone.
TEST(UdpRoundsTest, ARoundArmsWithAChunkAndTheQuorumOfWorkers) {
  UdpRounds udp(4, 3);
  EXPECT_FALSE(udp.Armed(0));
  EXPECT_FALSE(udp.Note(3, 0, /*chunk=*/true));
  EXPECT_FALSE(udp.Note(3, 0, /*chunk=*/true)) << "the same worker again";
  EXPECT_FALSE(udp.Note(0, 0, /*chunk=*/false));
  EXPECT_FALSE(udp.Armed(0));
  EXPECT_TRUE(udp.Note(1, 0, /*chunk=*/false)) << "a third worker, and a chunk came";
  EXPECT_TRUE(udp.Armed(0));
  EXPECT_FALSE(udp.Note(2, 0, /*chunk=*/true)) << "armed once";
  EXPECT_FALSE(udp.Armed(1));
  for (uint32_t w : {0u, 1u, 2u, 3u}) EXPECT_FALSE(udp.Note(w, 1, /*chunk=*/false));
  EXPECT_FALSE(udp.Armed(1)) << "gRPC pushes alone never arm a round";
  EXPECT_TRUE(udp.Note(0, 1, /*chunk=*/true));
  // Rounds are tracked UdpRounds::kWindow at a time: one that far behind the newest
  // counts nothing; an older round counts as armed once a later one is.
  EXPECT_FALSE(udp.Note(0, 9, true));
  EXPECT_FALSE(udp.Note(1, 5, true));
  EXPECT_FALSE(udp.Note(2, 5, true));
  EXPECT_FALSE(udp.Note(3, 5, true));
  EXPECT_FALSE(udp.Armed(5));
  EXPECT_FALSE(udp.Note(1, 9, true));
  EXPECT_TRUE(udp.Note(2, 9, true));
  EXPECT_TRUE(udp.Armed(5));
  EXPECT_FALSE(udp.Note(7, 10, true)) << "a worker id out of range counts nothing";
}

// In an armed UDP round a slice below the quorum at its deadline waits one more round
// deadline, during which late pushes and chunks count (they close it at the quorum), and
// is then closed to be dropped, rather than stalling every pull. One the shard armed
// later than its own deadline passed waits a full deadline from the arming.
TEST_F(SliceRoundTest, AnArmedUdpRoundWaitsOneMoreDeadlineThenClosesToBeDropped) {
  rules_.starters = 2;
  UdpRounds udp(3, 2);
  rules_.udp = &udp;
  core::SliceInfo other = info_;
  other.id = 5;
  SliceRound late(info_, &rules_, /*aggregate_only=*/false);
  SliceRound lost(other, &rules_, /*aggregate_only=*/false);
  Init(late);
  Init(lost);
  const SliceRound::Chunk chunk{/*worker=*/0, /*round=*/0, /*index=*/0, /*count_in_push=*/2,
                                /*chunk_elems=*/1, /*first=*/0, /*count=*/1};
  ASSERT_TRUE(late.AcceptChunk(chunk, "fp32", Decoder(), Encoded({5})).ok());
  ASSERT_FALSE(udp.Note(0, 0, true));
  ASSERT_TRUE(udp.Note(1, 0, true)) << "worker 1 sent a chunk of another slice";
  late.StartDeadlineAt(0);
  lost.StartDeadlineAt(0);
  clock_.Advance(milliseconds(100));
  for (SliceRound* s : {&late, &lost}) {
    const SliceRound::DeadlineOutcome out = Tick(*s);
    EXPECT_TRUE(out.due);
    EXPECT_FALSE(out.closed);
    EXPECT_TRUE(out.grace);
  }
  ASSERT_TRUE(deadlines_.Next().has_value()) << "the grace deadline";
  // A late gRPC push during the grace counts, and reaches the quorum.
  absl::StatusOr<SliceRound::Progress> grpc = Push(late, 2, 0, {1, 1});
  ASSERT_TRUE(grpc.ok()) << grpc.status();
  EXPECT_TRUE(grpc->closed);
  EXPECT_TRUE(grpc->at_deadline);
  std::optional<ClosedRound> r = late.TakeClosed();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->Workers(), (std::vector<uint32_t>{0, 2}));
  // Nothing came for the other slice: it is closed below the quorum.
  clock_.Advance(milliseconds(100));
  const SliceRound::DeadlineOutcome dropped = Tick(lost);
  EXPECT_TRUE(dropped.closed);
  EXPECT_TRUE(dropped.below_quorum);
  EXPECT_EQ(dropped.pushed, 0u);
  std::optional<ClosedRound> empty = lost.TakeClosed();
  ASSERT_TRUE(empty.has_value());
  EXPECT_TRUE(empty->Workers().empty());

  // Round 1 of a third slice: its own deadline passes below the quorum before the round
  // arms; the arming gives it one more deadline, then it is closed to be dropped.
  other.id = 6;
  SliceRound behind(other, &rules_, /*aggregate_only=*/false);
  Init(behind);
  Wakeups wake;
  ASSERT_TRUE(Push(behind, 0, 0, {1, 1}).ok());
  ASSERT_TRUE(Push(behind, 1, 0, {1, 1}).ok());
  ASSERT_TRUE(Push(behind, 2, 0, {1, 1}).ok());
  behind.Publish(*behind.TakeClosed(), core::SharedFp32(std::vector<float>{1, 2}), nullptr, &wake);
  rules_.quorum = 3;
  ASSERT_TRUE(Push(behind, 0, 1, {1, 1}).ok());
  ASSERT_TRUE(Push(behind, 1, 1, {1, 1}).ok());
  clock_.Advance(milliseconds(100));
  SliceRound::DeadlineOutcome out = Tick(behind);
  EXPECT_TRUE(out.due);
  EXPECT_FALSE(out.grace) << "round 1 is not armed";
  clock_.Advance(milliseconds(500));
  ASSERT_FALSE(udp.Note(0, 1, true));
  ASSERT_TRUE(udp.Note(1, 1, false));
  behind.StartDeadlineAt(1);
  clock_.Advance(milliseconds(99));
  EXPECT_FALSE(Tick(behind).due);
  clock_.Advance(milliseconds(1));
  out = Tick(behind);
  EXPECT_TRUE(out.closed);
  EXPECT_TRUE(out.below_quorum);
}

TEST_F(SliceRoundTest, ChunksFillTheirRangesAndMissingOnesAreMasked) {
  SliceRound s(info_, &rules_, /*aggregate_only=*/false);
  Init(s);
  const SliceRound::Chunk first{/*worker=*/0,        /*round=*/0, /*index=*/0,
                                /*count_in_push=*/2,
                                /*chunk_elems=*/1,   /*first=*/0, /*count=*/1};
  ASSERT_TRUE(s.AcceptChunk(first, "fp32", Decoder(), Encoded({6})).ok());
  EXPECT_EQ(core::RefusalOf(s.AcceptChunk(first, "fp32", Decoder(), Encoded({6})).status()),
            core::Refusal::kDuplicate)
      << "a replayed chunk";
  SliceRound::Chunk resized = first;
  resized.index = 1;
  resized.chunk_elems = 2;
  EXPECT_EQ(core::RefusalOf(s.AcceptChunk(resized, "fp32", Decoder(), Encoded({6})).status()),
            core::Refusal::kMalformed);
  ASSERT_TRUE(Push(s, 1, 0, {1, 1}).ok());
  SliceRound::Chunk over_grpc = first;
  over_grpc.worker = 1;
  EXPECT_EQ(core::RefusalOf(s.AcceptChunk(over_grpc, "fp32", Decoder(), Encoded({6})).status()),
            core::Refusal::kDuplicate)
      << "a chunk for a slice the worker pushed over gRPC";
  clock_.Advance(milliseconds(150));
  SliceRound::DeadlineOutcome out = s.OnDeadline(clock_.Now());
  ASSERT_TRUE(out.closed);
  std::optional<ClosedRound> r = s.TakeClosed();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->ChunksLost(), 1u);
  const std::vector<uint32_t> workers = r->Workers();
  const InputMasks masks = r->MasksOf(workers);
  ASSERT_EQ(masks.ptrs.size(), 2u);
  ASSERT_NE(masks.ptrs[0], nullptr);
  EXPECT_EQ(masks.ptrs[0][0], 0b01) << "only coordinate 0 of worker 0 came";
  EXPECT_EQ(masks.ptrs[1], nullptr) << "worker 1's push is whole";
  EXPECT_EQ(r->Rows(workers)[0][0], 6.0f);
}

TEST_F(SliceRoundTest, WatchersWakeAtTheirVersionAndFastForwardIsTheResetPath) {
  SliceRound s(info_, &rules_, /*aggregate_only=*/false);
  std::vector<std::pair<int, bool>> fired;
  // Before the initial value, even version 0 waits.
  EXPECT_NE(s.Watch(
                0,
                [&](bool ok) {
                  fired.push_back({0, ok});
                },
                1, false),
            0u);
  EXPECT_NE(s.Watch(
                3,
                [&](bool ok) {
                  fired.push_back({3, ok});
                },
                2, false),
            0u);
  const uint64_t gone = s.Watch(
      5,
      [&](bool ok) {
        fired.push_back({5, ok});
      },
      3, false);
  EXPECT_EQ(s.watcher_count(), 3u);
  s.Unwatch(gone);
  EXPECT_EQ(s.watcher_count(), 2u);
  Wakeups wake;
  ASSERT_TRUE(s.Initialize(Fp32({1.0f, 2.0f}), &wake).ok());
  RunWakeups(wake, true);
  EXPECT_EQ(fired, (std::vector<std::pair<int, bool>>{{0, true}}));

  ASSERT_TRUE(Push(s, 0, 0, {1, 1}).ok());
  ASSERT_TRUE(deadlines_.Next().has_value());
  ASSERT_TRUE(s.FastForward(3, &wake));
  EXPECT_EQ(deadlines_.Next(), std::nullopt) << "the discarded round's deadline goes with it";
  RunWakeups(wake, true);
  EXPECT_EQ(fired.back(), (std::pair<int, bool>{3, true}));
  EXPECT_EQ(s.version(), 3u);
  EXPECT_FALSE(s.FastForward(2, &wake)) << "never backwards";
  // The round at version 3 is empty: worker 0 may push again.
  EXPECT_TRUE(Push(s, 0, 3, {1, 1}).ok());
  // Already there: inline. Shutting down: false at once.
  EXPECT_EQ(s.Watch(
                1,
                [&](bool ok) {
                  fired.push_back({1, ok});
                },
                4, false),
            0u);
  EXPECT_EQ(s.Watch(
                9,
                [&](bool ok) {
                  fired.push_back({9, ok});
                },
                5, true),
            0u);
  EXPECT_EQ(fired.back(), (std::pair<int, bool>{9, false}));
}

// A push's learning rate must be a finite number >= 0, refused before decoding; the
// round's inputs keep each worker's.
TEST_F(SliceRoundTest, PushedLearningRatesAreCheckedAndKeptPerWorker) {
  SliceRound s(info_, &rules_, /*aggregate_only=*/false);
  Init(s);
  const int calls = decoder_calls_;
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), -0.5f,
                    std::numeric_limits<float>::infinity()}) {
    absl::StatusOr<SliceRound::Progress> p =
        s.AcceptPush(0, 0, "fp32", Decoder(), Encoded({1, 1}), std::nullopt, bad);
    EXPECT_EQ(core::RefusalOf(p.status()), core::Refusal::kMalformed) << p.status();
    EXPECT_THAT(p.status().message(), testing::HasSubstr("learning rate"));
  }
  EXPECT_EQ(decoder_calls_, calls);
  const std::vector<std::optional<float>> lrs = {0.1f, std::nullopt, 0.3f};
  for (uint32_t w = 0; w < 3; ++w) {
    ASSERT_TRUE(s.AcceptPush(w, 0, "fp32", Decoder(), Encoded({1, 1}), std::nullopt, lrs[w]).ok());
  }
  std::optional<ClosedRound> closed = s.TakeClosed();
  ASSERT_TRUE(closed.has_value());
  // Of {0.1, 0.3}: worker 1 carried none.
  EXPECT_FLOAT_EQ(MedianLr(closed->inputs).value_or(-1), 0.2f);
}

// An optimizer with a second moment: Initialize makes it, a checkpoint keeps it with the
// steps taken, and a restore brings both back.
TEST_F(SliceRoundTest, AnAdamSlicesMomentsAndStepsSurviveCaptureAndRestore) {
  rules_.keep_published_model = true;
  auto adam = std::make_shared<const Optimizer>(*Optimizer::Parse("adam(lr=0.1)"));
  SliceRound s(info_, &rules_, /*aggregate_only=*/false, adam);
  Init(s);
  for (uint32_t w = 0; w < 3; ++w) ASSERT_TRUE(Push(s, w, 0, {1, -1}).ok());
  std::optional<ClosedRound> closed = s.TakeClosed();
  ASSERT_TRUE(closed.has_value());
  ASSERT_EQ(closed->model.second_moment.size(), 2u);
  EXPECT_EQ(closed->model.optimizer, adam);
  closed->model.second_moment = {0.5f, 0.25f};
  closed->model.steps = 1;
  Wakeups wake;
  s.Publish(*std::move(closed), core::SharedFp32(std::vector<float>{1.0f, 2.0f}), nullptr, &wake);
  SliceCheckpoint c = s.Capture(/*with_velocity=*/true);
  EXPECT_EQ(c.second_moment, (std::vector<float>{0.5f, 0.25f}));
  EXPECT_EQ(c.optimizer_steps, 1u);
  SliceRound again(info_, &rules_, /*aggregate_only=*/false, adam);
  ASSERT_TRUE(again.Restore(c).ok());
  EXPECT_EQ(again.Capture(true).second_moment, c.second_moment);
  EXPECT_EQ(again.Capture(true).optimizer_steps, 1u);
  // A checkpoint from before the field: zeros, as at the start.
  c.second_moment.clear();
  SliceRound old(info_, &rules_, /*aggregate_only=*/false, adam);
  ASSERT_TRUE(old.Restore(c).ok());
  EXPECT_EQ(old.Capture(true).second_moment, (std::vector<float>{0.0f, 0.0f}));
}

// The flags' SGD without momentum keeps no velocity: none is made, none is checkpointed,
// and one a checkpoint brings (from a run with momentum) is dropped; a tensor whose own
// optimizer has momentum keeps one.
TEST_F(SliceRoundTest, WithoutMomentumASliceKeepsNoVelocity) {
  rules_.keep_published_model = true;
  rules_.flags_velocity = false;
  SliceRound s(info_, &rules_, /*aggregate_only=*/false);
  Init(s);
  for (uint32_t w = 0; w < 3; ++w) ASSERT_TRUE(Push(s, w, 0, {1, -1}).ok());
  std::optional<ClosedRound> closed = s.TakeClosed();
  ASSERT_TRUE(closed.has_value());
  EXPECT_TRUE(closed->model.velocity.empty());
  Wakeups wake;
  s.Publish(*std::move(closed), core::SharedFp32(std::vector<float>{1.0f, 2.0f}), nullptr, &wake);
  SliceCheckpoint c = s.Capture(/*with_velocity=*/true);
  EXPECT_TRUE(c.velocity.empty());
  c.velocity = {0.5f, 0.25f};
  SliceRound restored(info_, &rules_, /*aggregate_only=*/false);
  ASSERT_TRUE(restored.Restore(c).ok());
  EXPECT_TRUE(restored.Capture(true).velocity.empty());

  auto momentum = std::make_shared<const Optimizer>(*Optimizer::Parse("sgd(lr=0.1, momentum=0.9)"));
  SliceRound own(info_, &rules_, /*aggregate_only=*/false, momentum);
  ASSERT_TRUE(own.Restore(c).ok());
  EXPECT_EQ(own.Capture(true).velocity, c.velocity);
}

TEST_F(SliceRoundTest, CaptureAndRestoreKeepTheModel) {
  rules_.keep_published_model = true;
  rules_.state_rows = 1;
  SliceRound s(info_, &rules_, /*aggregate_only=*/false);
  SliceCheckpoint c;
  c.slice_id = info_.id;
  c.version = 7;
  c.values = Fp32({3.0f, 4.0f});
  c.velocity = {0.5f, 0.25f};
  c.rule_state = {1.0f, -1.0f};
  ASSERT_TRUE(s.Restore(c).ok());
  SliceCheckpoint back = s.Capture(/*with_velocity=*/true);
  EXPECT_EQ(back.version, 7u);
  EXPECT_EQ(back.values, c.values);
  EXPECT_EQ(back.velocity, c.velocity);
  EXPECT_EQ(back.rule_state, c.rule_state);
  EXPECT_TRUE(s.Capture(/*with_velocity=*/false).velocity.empty());
  SliceCheckpoint short_values = c;
  short_values.values.resize(4);
  EXPECT_EQ(s.Restore(short_values).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Push(s, 0, 7, {1, 1}).ok()) << "the restored version's round is open";
}

// --pull-codec: each publication carries the change from the version before, encoded;
// replaying the changes from the initial values gives the published values bit for bit,
// while the true parameters run ahead only by what the codec has not sent yet. A restore
// or a fast-forward starts over with dense values.
TEST_F(SliceRoundTest, PublicationsCarryTheChangeThatLeadsToThem) {
  rules_.num_workers = 1;
  rules_.quorum = 1;
  rules_.pull_codec = "3lc(s=1.9)";
  info_.numel = 300;
  SliceRound s(info_, &rules_, /*aggregate_only=*/false);
  std::vector<float> init(info_.numel);
  for (size_t i = 0; i < init.size(); ++i) init[i] = 0.01f * static_cast<float>(i % 13);
  Wakeups wake;
  ASSERT_TRUE(s.Initialize(Fp32(init), &wake).ok());
  EXPECT_EQ(s.Snapshot().delta, nullptr);
  aggregators::AggregatorOptions ao;
  ao.num_workers = 1;
  auto rule = aggregators::MakeAggregator("mean", ao);
  ASSERT_TRUE(rule.ok());
  core::ThreadPool pool(1);
  RoundAggregation a(rule->get(), &pool, SgdOptions{0.1f, 0.0f, 0.0f}, false, /*quorum=*/1);
  auto codec = codecs::MakeCodec("3lc(s=1.9)");
  ASSERT_TRUE(codec.ok());
  std::vector<float> replay = init, truth = init;
  // The gradient keeps its direction, so a change the codec dropped without error
  // feedback would stay missing, and the lag would grow with every version.
  std::vector<float> g(info_.numel);
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0.5f + 0.5f * std::sin(0.1f * static_cast<float>(i));
  auto lag = [&] {
    float worst = 0;
    for (size_t i = 0; i < truth.size(); ++i) worst = std::max(worst, std::abs(truth[i] - replay[i]));
    return worst;
  };
  float lag_at_30 = 0;
  for (uint64_t r = 0; r < 60; ++r) {
    if (r == 30) lag_at_30 = lag();
    ASSERT_TRUE(Push(s, 0, r, g).ok());
    std::optional<ClosedRound> closed = s.TakeClosed();
    ASSERT_TRUE(closed.has_value());
    std::vector<float> out(info_.numel);
    absl::Status st = a.Aggregate(*closed, out, nullptr);
    RoundAggregation::Publication p = a.Step(*closed, out, st);
    ASSERT_TRUE(st.ok());
    ASSERT_NE(p.delta_payload, nullptr);
    for (size_t i = 0; i < g.size(); ++i) truth[i] -= 0.1f * g[i];
    s.Publish(*std::move(closed), p.values, p.delta_payload, &wake);
    const SliceSnapshot snap = s.Snapshot();
    ASSERT_NE(snap.delta, nullptr);
    EXPECT_EQ(snap.delta->base_version, r);
    EXPECT_EQ(snap.delta->version, r + 1);
    std::vector<float> change(info_.numel);
    ASSERT_TRUE((*codec)->Decode(*snap.delta->payload, change).ok());
    core::AddInto(replay, change);
    ASSERT_EQ(*snap.values, Fp32(replay)) << "version " << r + 1;
  }
  // The error the codec made stays with the shard and is sent later: what the workers
  // hold trails the true parameters by a bounded lag, which does not grow.
  EXPECT_GT(lag_at_30, 0.0f);
  EXPECT_LE(lag(), 1.25f * lag_at_30 + 0.05f) << "at 30 versions: " << lag_at_30;
  ASSERT_TRUE(s.FastForward(70, &wake));
  EXPECT_EQ(s.Snapshot().delta, nullptr);
}

TEST(ModelRoundsTest, ARoundCompletesOnceWithEveryShareAndAdvances) {
  core::ManualClock clock;
  DeadlineQueue deadlines;
  ModelRounds m(
      {/*shard_id=*/0, /*num_shards=*/2, /*num_workers=*/3, /*state_rows=*/0, milliseconds(50)},
      &clock, &deadlines);
  EXPECT_FALSE(m.SliceClosed(2));
  EXPECT_TRUE(m.SliceClosed(2)) << "the last owned slice starts the round";
  EXPECT_FALSE(m.SliceClosed(2)) << "and the count starts again";
  auto share = [](uint32_t shard, uint64_t round) {
    auto s = std::make_shared<RoundShare>();
    s->shard_id = shard;
    s->round = round;
    s->participants = {0, 2};
    s->gram = {1, 2, 2, 4};
    return s;
  };
  // A peer's share for the next round may come early.
  ASSERT_TRUE(m.Store(share(1, 1)).ok());
  EXPECT_EQ(m.Store(share(1, 2)).status().code(), absl::StatusCode::kOutOfRange);
  absl::StatusOr<std::optional<ModelRounds::Complete>> own = m.Store(share(0, 0));
  ASSERT_TRUE(own.ok());
  EXPECT_FALSE(own->has_value());
  ASSERT_TRUE(m.due().has_value()) << "the peers' shares are awaited";
  EXPECT_EQ(m.Store(share(0, 0)).status().code(), absl::StatusCode::kAlreadyExists);
  absl::StatusOr<std::optional<ModelRounds::Complete>> done = m.Store(share(1, 0));
  ASSERT_TRUE(done.ok());
  ASSERT_TRUE(done->has_value());
  EXPECT_EQ((*done)->round, 0u);
  EXPECT_EQ((*done)->shares.size(), 2u);
  EXPECT_FALSE(m.due().has_value());
  EXPECT_FALSE(m.Overdue(clock.Now() + milliseconds(100)).has_value())
      << "a round being finished is not overdue";
  EXPECT_FALSE(m.Advance(0).has_value()) << "round 1 lacks this shard's share";
  EXPECT_EQ(m.Store(share(1, 0)).status().code(), absl::StatusCode::kOutOfRange) << "done";
  ASSERT_TRUE(m.Store(share(0, 1)).ok());
  EXPECT_FALSE(m.Overdue(clock.Now()).has_value());
  // Round 1 had both shares the moment its own came: it was claimed by that Store.
  EXPECT_FALSE(m.due().has_value());
}

TEST(ModelRoundsTest, MissingPeerSharesMakeTheRoundOverdueOnce) {
  core::ManualClock clock;
  DeadlineQueue deadlines;
  int told = 0;
  deadlines.SetListener([&] { ++told; });
  ModelRounds m({0, 2, 3, 0, milliseconds(50)}, &clock, &deadlines);
  auto own = std::make_shared<RoundShare>();
  own->participants = {0};
  own->gram = {1};
  ASSERT_TRUE(m.Store(own).ok());
  EXPECT_EQ(told, 1) << "the ticker learns of the peers' deadline";
  EXPECT_FALSE(m.Overdue(clock.Now()).has_value());
  clock.Advance(milliseconds(60));
  EXPECT_EQ(m.Overdue(clock.Now()), 0u);
  EXPECT_FALSE(m.Overdue(clock.Now()).has_value()) << "claimed once";
  m.FastForward(5);
  own = std::make_shared<RoundShare>(*own);
  EXPECT_EQ(m.Store(own).status().code(), absl::StatusCode::kOutOfRange) << "round 0 is gone";
}

TEST(ModelRoundsTest, ChecksTheShapeOfAPeersShare) {
  core::ManualClock clock;
  DeadlineQueue deadlines;
  ModelRounds m({0, 2, 3, 1, milliseconds(50)}, &clock, &deadlines);
  RoundShare s;
  s.shard_id = 1;
  s.participants = {0, 2};
  s.gram.assign(9, 1.0);
  EXPECT_TRUE(m.CheckShare(s).ok());
  RoundShare own = s;
  own.shard_id = 0;
  EXPECT_EQ(core::RefusalOf(m.CheckShare(own)), core::Refusal::kMalformed);
  RoundShare unordered = s;
  unordered.participants = {2, 0};
  EXPECT_EQ(core::RefusalOf(m.CheckShare(unordered)), core::Refusal::kMalformed);
  RoundShare beyond = s;
  beyond.participants = {0, 3};
  EXPECT_EQ(core::RefusalOf(m.CheckShare(beyond)), core::Refusal::kMalformed);
  RoundShare small = s;
  small.gram.resize(4);
  EXPECT_EQ(core::RefusalOf(m.CheckShare(small)), core::Refusal::kMalformed);
  RoundShare nan = s;
  nan.gram[4] = NAN;
  EXPECT_EQ(core::RefusalOf(m.CheckShare(nan)), core::Refusal::kMalformed);
}

TEST(CombineSharesTest, SumsOnlyTheAgreedParticipantsAndTheStateRows) {
  auto a = std::make_shared<RoundShare>();
  a->participants = {0, 1, 2};
  // 3 participants + 1 state row: 4 x 4, entry (i, j) = 10 * i + j.
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 4; ++j) a->gram.push_back(10 * i + j);
  }
  auto b = std::make_shared<RoundShare>();
  b->participants = {0, 2};
  b->gram.assign(9, 1.0);
  const CombinedShares c = CombineShares({a, b}, /*state_rows=*/1);
  EXPECT_EQ(c.agreed, (std::vector<uint32_t>{0, 2}));
  // Rows of a: worker 0 -> 0, worker 2 -> 2, state -> 3.
  const std::vector<double> expected = {0 + 1,  2 + 1,  3 + 1,   //
                                        20 + 1, 22 + 1, 23 + 1,  //
                                        30 + 1, 32 + 1, 33 + 1};
  EXPECT_EQ(c.gram, expected);
}

// A closed round of `numel` values per worker, each row given.
ClosedRound RoundOf(const std::vector<std::vector<float>>& rows) {
  ClosedRound r;
  r.info.numel = static_cast<uint32_t>(rows[0].size());
  const size_t n = rows.size();
  r.inputs.pushed.assign(n, 1);
  r.inputs.supports.assign(n, std::nullopt);
  r.inputs.chunked.assign(n, ChunkedPush{});
  for (const auto& row : rows) {
    r.inputs.rows.push_back(std::make_unique<float[]>(row.size()));
    std::copy(row.begin(), row.end(), r.inputs.rows.back().get());
  }
  r.model.params.assign(r.info.numel, 1.0f);
  r.model.velocity.assign(r.info.numel, 0.0f);
  return r;
}

TEST(RoundAggregationTest, AggregatesTheRoundAndStepsTheModel) {
  core::ThreadPool pool(1);
  aggregators::AggregatorOptions opts;
  opts.num_workers = 3;
  std::unique_ptr<aggregators::Aggregator> mean = aggregators::MakeAggregator("mean", opts).value();
  RoundAggregation a(mean.get(), &pool, SgdOptions{0.5f, 0.0f, 0.0f}, /*aggregate_only=*/false,
                     /*quorum=*/2);
  ClosedRound r = RoundOf({{1, 2}, {3, 4}, {5, 9}});
  r.inputs.pushed[1] = 0;  // worker 1 did not push: its row is not read
  std::vector<float> out(2);
  AggregationCounts counts;
  ASSERT_TRUE(a.Aggregate(r, out, &counts).ok());
  EXPECT_EQ(out, (std::vector<float>{3, 5.5f}));
  EXPECT_EQ(counts.on_support + counts.sign_votes + counts.masked, 0u);
  absl::Status st;
  std::shared_ptr<const std::string> values = a.Step(r, out, st).values;
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(r.model.params, (std::vector<float>{1 - 1.5f, 1 - 2.75f}));
  EXPECT_EQ(*values, Fp32(r.model.params));

  // A non-finite aggregate becomes an error, and the parameters stay.
  std::vector<float> inf = {INFINITY, 0};
  absl::Status bad;
  values = a.Step(r, inf, bad).values;
  EXPECT_EQ(bad.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(*values, Fp32({1 - 1.5f, 1 - 2.75f}));

  // Below the quorum the rule does not run: the round is refused as BelowQuorum, which
  // the shard publishes unchanged and counts as dropped, not as an aggregation error.
  ClosedRound alone = RoundOf({{1, 2}, {3, 4}, {5, 9}});
  alone.inputs.pushed[1] = alone.inputs.pushed[2] = 0;
  std::vector<float> untouched = {7, 7};
  absl::Status below = a.Aggregate(alone, untouched, &counts);
  EXPECT_TRUE(IsBelowQuorum(below)) << below;
  EXPECT_THAT(std::string(below.message()), ::testing::HasSubstr("1 of the 2 inputs"));
  EXPECT_EQ(untouched, (std::vector<float>{7, 7}));
  EXPECT_FALSE(IsBelowQuorum(absl::FailedPreconditionError("x")));
  EXPECT_TRUE(a.CheckQuorum(2, "model round 3").ok());

  // Model scope: participants are the workers in every slice's round.
  ClosedRound other = RoundOf({{1, 1}, {1, 1}, {1, 1}});
  std::vector<ClosedRound> rounds;
  rounds.push_back(std::move(r));
  rounds.push_back(std::move(other));
  EXPECT_EQ(a.Participants(rounds, 3), (std::vector<uint32_t>{0, 2}));
}

// The aggregate's buffer: the thread's own, reused and grown as slices need; a buffer made
// while the thread's is in use, and one on another thread, are others.
TEST(AggregateBufferTest, TheThreadsBufferIsReusedAndANestedOneIsItsOwn) {
  const float* first = nullptr;
  {
    const AggregateBuffer a(1000);
    first = a.values().data();
    ASSERT_EQ(a.values().size(), 1000u);
    a.values()[999] = 1.0f;
    const AggregateBuffer nested(1000);
    EXPECT_NE(nested.values().data(), first);
    EXPECT_EQ(nested.values().size(), 1000u);
    nested.values()[999] = 2.0f;
    EXPECT_EQ(a.values()[999], 1.0f);
    std::thread([&] {
      const AggregateBuffer other(1000);
      EXPECT_NE(other.values().data(), first);
      other.values()[0] = 3.0f;
    }).join();
  }
  {
    const AggregateBuffer again(500);
    EXPECT_EQ(again.values().data(), first);
    EXPECT_EQ(again.values().size(), 500u);
  }
  const AggregateBuffer larger(1 << 20);
  ASSERT_EQ(larger.values().size(), size_t{1} << 20);
  larger.values()[(1 << 20) - 1] = 4.0f;  // writable to the end (ASan would see past it)
}

// A slice below 2^20 coordinates is aggregated on the job that closed it alone; a larger
// one spreads its coordinates over the pool.
TEST(RoundAggregationTest, OnlyASliceOfAMillionCoordinatesIsSpreadOverThePool) {
  core::ThreadPool pool(2);
  aggregators::AggregatorOptions opts;
  opts.num_workers = 1;
  std::unique_ptr<aggregators::Aggregator> mean = aggregators::MakeAggregator("mean", opts).value();
  RoundAggregation a(mean.get(), &pool, SgdOptions{0.5f, 0.0f, 0.0f}, /*aggregate_only=*/false,
                     /*quorum=*/1);
  ClosedRound r;
  for (uint32_t numel : {uint32_t{1}, uint32_t{65536}, (uint32_t{1} << 20) - 1}) {
    r.info.numel = numel;
    EXPECT_EQ(a.OneSlicePool(r), nullptr) << numel;
  }
  for (uint32_t numel : {uint32_t{1} << 20, uint32_t{1} << 22}) {
    r.info.numel = numel;
    EXPECT_EQ(a.OneSlicePool(r), &pool) << numel;
  }
}

// The learning rate the round's pushes carried: their median, which one liar of three
// does not move; the tensor's optimizer (Adam here) steps with it and counts its steps.
TEST(RoundAggregationTest, TheTensorsOptimizerStepsWithTheMedianOfTheRatesPushed) {
  core::ThreadPool pool(1);
  aggregators::AggregatorOptions opts;
  opts.num_workers = 3;
  std::unique_ptr<aggregators::Aggregator> mean = aggregators::MakeAggregator("mean", opts).value();
  // The shard's own SGD would take lr 100: the tensor's optimizer must be used instead.
  RoundAggregation a(mean.get(), &pool, SgdOptions{100.0f, 0.0f, 0.0f}, /*aggregate_only=*/false,
                     /*quorum=*/2);
  ClosedRound r = RoundOf({{1, -2}, {1, -2}, {1, -2}});
  r.model.optimizer = std::make_shared<const Optimizer>(*Optimizer::Parse("adam(lr=0.5)"));
  r.model.second_moment.assign(2, 0.0f);
  r.inputs.lrs = {0.01f, 1e30f, 0.02f};  // worker 1 lies
  std::vector<float> out(2);
  AggregationCounts counts;
  ASSERT_TRUE(a.Aggregate(r, out, &counts).ok());
  absl::Status st;
  a.Step(r, out, st);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(r.model.steps, 1u);
  // Adam's first step moves each value by lr (times sign), here the median 0.02.
  EXPECT_NEAR(r.model.params[0], 1 - 0.02f, 1e-6);
  EXPECT_NEAR(r.model.params[1], 1 + 0.02f, 1e-6);
  // Without rates pushed: the spec's lr, 0.5 (Adam's later steps are near lr too).
  r.inputs.lrs.assign(3, std::numeric_limits<float>::quiet_NaN());
  a.Step(r, out, st);
  EXPECT_EQ(r.model.steps, 2u);
  EXPECT_NEAR(r.model.params[0], 1 - 0.02f - 0.5f, 1e-5);
  // The shard's SGD (no optimizer of the tensor's) takes the median too.
  ClosedRound plain = RoundOf({{1, 1}, {1, 1}, {1, 1}});
  plain.inputs.lrs = {0.25f, 0.25f, 7.0f};
  a.Step(plain, out = {1, 1}, st);
  EXPECT_EQ(plain.model.params, (std::vector<float>{0.75f, 0.75f}));
}

TEST(RoundAggregationTest, AggregateOnlyPublishesTheAggregateOrZeros) {
  core::ThreadPool pool(1);
  aggregators::AggregatorOptions opts;
  opts.num_workers = 2;
  std::unique_ptr<aggregators::Aggregator> mean = aggregators::MakeAggregator("mean", opts).value();
  RoundAggregation a(mean.get(), &pool, SgdOptions{}, /*aggregate_only=*/true, /*quorum=*/1);
  ClosedRound r = RoundOf({{1, 2}, {3, 4}});
  std::vector<float> out = {2, 3};
  absl::Status st;
  EXPECT_EQ(*a.Step(r, out, st).values, Fp32({2, 3}));
  absl::Status failed = absl::InvalidArgumentError("too few inputs");
  EXPECT_EQ(*a.Step(r, out, failed).values, Fp32({0, 0}));
}

// What a SliceTable of two workers needs around it.
struct TableRig {
  TableRig() {
    rules.num_workers = 2;
    rules.clock = &clock;
    rules.deadlines = &deadlines;
  }
  static SliceTable::Config Config(uint32_t shard_id, uint32_t num_shards, uint64_t max_shard_bytes,
                                   bool aggregate_only = false, bool priority_order = false) {
    return {shard_id, num_shards, /*num_workers=*/2, /*max_message_bytes=*/1 << 20,
            max_shard_bytes, /*state_rows=*/0, /*keep_published_model=*/false, aggregate_only,
            priority_order};
  }
  core::ManualClock clock;
  DeadlineQueue deadlines;
  RoundRules rules;
};

// The memory estimate counts the published versions a layout's slices keep: the snapshot
// pool's spare buffers with dense pulls; with --pull-codec one more copy of the
// parameters (what the workers hold) and each version's encoded change instead.
TEST(SliceTableTest, PublishedVersionsCountInTheMemoryEstimate) {
  // The summary core::ModelLayout makes of one tensor of 4096 in slices of 1024, one shard
  // (its bound on what a shard owns adds a slice).
  core::LayoutSummary sum;
  sum.num_slices = sum.max_owned_slices = 4;
  sum.total_elems = 4096;
  sum.max_owned_elems = 4096 + 1024;
  EXPECT_EQ(EstimateShardBytes(sum, 2, 0, false, 2),
            EstimateShardBytes(sum, 2, 0, false) + 2 * 5120 * sizeof(float));
  // Published versions beyond one: with dense pulls the snapshot pool's spare buffers;
  // with fp16 pulls what the workers hold and a version's change (2 bytes a value, in
  // fp32 copies rounded up: one). Each layout fits a bound of its estimate, not one less.
  for (const std::string codec : {"", "fp16"}) {
    const uint64_t need =
        EstimateShardBytes(sum, 2, 0, false, codec.empty() ? SnapshotPool::kMaxFree : 2);
    for (const uint64_t bound : {need - 1, need}) {
      TableRig rig;
      rig.rules.pull_codec = codec;
      SliceTable t(TableRig::Config(0, 1, /*max_shard_bytes=*/bound), &rig.rules);
      absl::StatusOr<std::vector<uint32_t>> owned = t.Register(0, {{"w", 4096, 0}}, 1024, 1);
      if (bound == need) {
        EXPECT_TRUE(owned.ok()) << "'" << codec << "': " << owned.status();
      } else {
        EXPECT_EQ(core::RefusalOf(owned.status()), core::Refusal::kOverLimit)
            << "'" << codec << "': " << owned.status();
      }
    }
  }
  const uint64_t dense = EstimateShardBytes(sum, 2, 0, false, SnapshotPool::kMaxFree);
  // So does Adam's second moment (SGD's buffer is the velocity every slice has).
  for (const std::string optimizer : {"sgd(lr=0.1, momentum=0.9)", "adam(lr=0.1)"}) {
    TableRig rig;
    SliceTable t(TableRig::Config(0, 1, /*max_shard_bytes=*/dense), &rig.rules);
    absl::StatusOr<std::vector<uint32_t>> owned =
        t.Register(0, {{"w", 4096, 0, 0, optimizer}}, 1024, 1);
    if (optimizer[0] == 's') {
      EXPECT_TRUE(owned.ok()) << owned.status();
    } else {
      EXPECT_EQ(core::RefusalOf(owned.status()), core::Refusal::kOverLimit) << owned.status();
    }
  }
}

// An --aggregate-only shard applies no optimizer: a layout naming one is refused (the
// workers step their own optimizers then), one without is taken.
TEST(SliceTableTest, AnAggregateOnlyShardRefusesATensorsOptimizer) {
  TableRig rig;
  SliceTable t(TableRig::Config(0, 1, 1 << 30, /*aggregate_only=*/true), &rig.rules);
  const absl::Status refused =
      t.Register(0, {{"w", 10, 0, 0, "adam(lr=0.001)"}}, 4, 1).status();
  EXPECT_EQ(core::RefusalOf(refused), core::Refusal::kBadLayout);
  EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("--aggregate-only"));
  EXPECT_TRUE(t.Register(0, {{"w", 10, 0}}, 4, 1).ok());
}

TEST(SliceTableTest, TheFirstLayoutWinsAndLookupsNameWhatIsWrong) {
  TableRig rig;
  SliceTable t(TableRig::Config(1, 2, 1 << 30, /*aggregate_only=*/false, /*priority_order=*/true),
               &rig.rules);
  EXPECT_FALSE(t.registered());
  EXPECT_EQ(t.layout(), nullptr);
  EXPECT_EQ(core::RefusalOf(t.Lookup(1, 0).status()), core::Refusal::kNoLayout);
  EXPECT_TRUE(t.CheckJoin(0, 1234).ok()) << "any layout may join before registration";

  EXPECT_EQ(core::RefusalOf(t.Register(0, {{"w", 10, 0}}, 4, /*num_shards=*/3).status()),
            core::Refusal::kBadLayout);
  EXPECT_EQ(core::RefusalOf(t.Register(0, {{"w", 10, 0}}, 1 << 20, 2).status()),
            core::Refusal::kBadLayout)
      << "slices larger than a message";
  EXPECT_EQ(core::RefusalOf(t.Register(0, {{"w", 1ull << 28, 0}}, 1 << 16, 2).status()),
            core::Refusal::kOverLimit);
  // An optimizer the shard cannot make is refused naming the tensor and the reason.
  const absl::Status bad_optimizer =
      t.Register(0, {{"w", 10, 0, 0, "rmsprop(lr=0.1)"}}, 4, 2).status();
  EXPECT_EQ(core::RefusalOf(bad_optimizer), core::Refusal::kBadLayout);
  EXPECT_THAT(std::string(bad_optimizer.message()),
              ::testing::HasSubstr("tensor 'w': optimizer 'rmsprop(lr=0.1)': unknown optimizer"));
  EXPECT_FALSE(t.registered()) << "nothing refused was installed";

  // Tensor b (priority 0) is more urgent than a (priority 5).
  const std::vector<core::TensorSpec> tensors = {{"a", 8, 5}, {"b", 8, 0}};
  absl::StatusOr<std::vector<uint32_t>> owned = t.Register(0, tensors, 4, 2);
  ASSERT_TRUE(owned.ok()) << owned.status();
  ASSERT_TRUE(t.registered());
  const uint64_t hash = t.hash();
  EXPECT_EQ(hash, core::ModelLayout::Hash(tensors, 4, 2));
  EXPECT_EQ(t.owned_count(), owned->size());
  std::vector<uint32_t> sorted = *owned;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(t.owned_ids(), sorted);
  EXPECT_EQ(t.publish_order(), *owned) << "priority order";
  EXPECT_EQ(t.layout()->slices()[owned->front()].tensor, 1u);

  EXPECT_EQ(t.Register(1, tensors, 4, 2).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(core::RefusalOf(t.Register(1, {{"c", 8, 0}}, 4, 2).status()),
            core::Refusal::kLayoutMismatch);
  EXPECT_EQ(core::RefusalOf(t.CheckJoin(1, hash + 1)), core::Refusal::kLayoutMismatch);
  EXPECT_TRUE(t.CheckJoin(1, hash).ok());

  EXPECT_EQ(core::RefusalOf(t.Lookup(hash + 1, owned->front()).status()),
            core::Refusal::kLayoutMismatch);
  EXPECT_EQ(core::RefusalOf(t.Lookup(hash, 99).status()), core::Refusal::kUnknownSlice);
  uint32_t other = 0;
  while (std::find(owned->begin(), owned->end(), other) != owned->end()) ++other;
  EXPECT_EQ(core::RefusalOf(t.Lookup(hash, other).status()), core::Refusal::kWrongShard);
  absl::StatusOr<SliceRound*> s = t.Lookup(hash, owned->front());
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, t.slice(owned->front()));

  EXPECT_FALSE(t.ready());
  for (size_t i = 0; i + 1 < owned->size(); ++i) EXPECT_FALSE(t.SliceInitialized());
  EXPECT_TRUE(t.SliceInitialized()) << "the last one makes the shard ready";
  EXPECT_TRUE(t.ready());
  EXPECT_EQ(t.Restore(*t.layout(), {}).status().code(), absl::StatusCode::kFailedPrecondition);

  // Queries over every owned slice.
  size_t visited = 0;
  t.ForEach([&](SliceRound&) { ++visited; });
  EXPECT_EQ(visited, owned->size());
  Wakeups wake;
  SliceRound& first = *t.slice(owned->front());
  ASSERT_TRUE(first.Initialize(Fp32({1, 2, 3, 4}), &wake).ok());
  ASSERT_TRUE(first.FastForward(3, &wake));
  EXPECT_EQ(t.MaxVersion(), 3u);
  EXPECT_EQ(t.MinVersion(), 0u) << "the other slices are at version 0";
  EXPECT_EQ(t.WatcherCount(), 0u);
  EXPECT_NE(first.Watch(4, [](bool) {}, /*id=*/1, /*draining=*/false), 0u);
  EXPECT_EQ(t.WatcherCount(), 1u);
}

}  // namespace
}  // namespace ps::server
