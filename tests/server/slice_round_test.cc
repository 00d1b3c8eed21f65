// The round state machine of one slice (SliceRound) on its own: no Shard, no thread
// pool (model rounds: model_rounds_test.cc; aggregation: round_aggregation_test.cc; the
// table of slices: slice_table_test.cc).
#include "server/slice_round.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
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
#include "server/round_aggregation.h"

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
  std::vector<const float*> rows = r->Rows(two).value();
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
  EXPECT_EQ(r->Rows(first).value()[0][0], 3.0f);
  EXPECT_EQ(r->Rows(first).value()[0][1], 5.0f);
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

// A 3lc push (a codec that checks without decoding) is checked as it arrives and kept
// encoded: no row is written then. The closed round decodes it into a scratch row, or
// without one into the worker's own row for good; either way the values are the
// codec's decode, bit for bit. A malformed one is refused at arrival with the codec's
// message and nothing kept; the next round's fp32 push is the worker's row again.
TEST_F(SliceRoundTest, ThreeLcPushesAreKeptEncodedAndDecodedWhenTheRoundCloses) {
  for (const size_t numel : {size_t{5003}, size_t{7}}) {  // the fast decode and the short one
    SCOPED_TRACE(numel);
    info_.numel = static_cast<uint32_t>(numel);
    SliceRound s(info_, &rules_, /*aggregate_only=*/false);
    Wakeups wake;
    ASSERT_TRUE(s.Initialize(Fp32(std::vector<float>(numel, 0.0f)), &wake).ok());
    std::shared_ptr<const codecs::Codec> three_lc(codecs::MakeCodec("3lc").value());
    std::unique_ptr<codecs::Codec> encoder = codecs::MakeCodec("3lc").value();
    const auto decoder = [&] {
      return absl::StatusOr<std::shared_ptr<const codecs::Codec>>(three_lc);
    };
    std::vector<std::string> payloads(3);
    std::vector<std::vector<float>> want(3, std::vector<float>(numel));
    for (uint32_t w = 0; w < 3; ++w) {
      std::vector<float> g(numel);
      for (size_t i = 0; i < numel; ++i) g[i] = std::sin(0.37f * static_cast<float>(i * (w + 1)));
      ASSERT_TRUE(encoder->Encode(g, &payloads[w]).ok());
      ASSERT_TRUE(three_lc->Decode(payloads[w], want[w]).ok());
    }
    std::string truncated = payloads[1].substr(0, payloads[1].size() - 1);
    const absl::Status refused = s.AcceptPush(1, 0, "3lc", decoder, truncated).status();
    EXPECT_EQ(core::RefusalOf(refused), core::Refusal::kMalformed) << refused;
    EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("3lc: payload ends after"));
    for (uint32_t w = 0; w < 3; ++w) {
      ASSERT_TRUE(s.AcceptPush(w, 0, "3lc", decoder, payloads[w]).ok());
    }
    std::optional<ClosedRound> r = s.TakeClosed();
    ASSERT_TRUE(r.has_value());
    for (uint32_t w = 0; w < 3; ++w) {
      EXPECT_EQ(r->inputs.kept[w].payload, payloads[w]) << "worker " << w;
      EXPECT_EQ(r->inputs.rows[w], nullptr) << "no row written at arrival, worker " << w;
    }
    const std::vector<uint32_t> workers = r->Workers();
    {
      RowScratch scratch;
      const std::vector<const float*> rows = r->Rows(workers, &scratch).value();
      for (uint32_t w = 0; w < 3; ++w) {
        EXPECT_EQ(std::memcmp(rows[w], want[w].data(), numel * sizeof(float)), 0) << w;
        EXPECT_EQ(r->inputs.rows[w], nullptr) << "scratch rows leave the round's alone";
      }
    }
    const std::vector<const float*> own = r->Rows(workers).value();
    for (uint32_t w = 0; w < 3; ++w) {
      ASSERT_NE(r->inputs.rows[w], nullptr);
      EXPECT_EQ(own[w], r->inputs.rows[w].get());
      EXPECT_EQ(std::memcmp(own[w], want[w].data(), numel * sizeof(float)), 0) << w;
      EXPECT_TRUE(r->inputs.kept[w].payload.empty()) << "decoded into its row for good";
    }
    // Kept again (worker 0 in 3lc), then the next round: worker 0's fp32 push is its row.
    r->inputs.kept[0].payload = payloads[0];
    s.Publish(*std::move(r), core::SharedFp32(std::vector<float>(numel, 0.0f)), nullptr, &wake);
    ASSERT_TRUE(s.AcceptPush(0, 1, "fp32", Decoder(), Encoded(std::vector<float>(numel, 2.5f))).ok());
    ASSERT_TRUE(s.AcceptPush(1, 1, "3lc", decoder, payloads[1]).ok());
    ASSERT_TRUE(s.AcceptPush(2, 1, "3lc", decoder, payloads[2]).ok());
    std::optional<ClosedRound> next = s.TakeClosed();
    ASSERT_TRUE(next.has_value());
    RowScratch scratch;
    const std::vector<const float*> rows = next->Rows(next->Workers(), &scratch).value();
    EXPECT_EQ(rows[0][numel - 1], 2.5f);
    EXPECT_EQ(std::memcmp(rows[2], want[2].data(), numel * sizeof(float)), 0);
  }
}

// A thread's scratch rows are kept from one aggregation to the next (the same memory,
// in its caches), a nested aggregation gets rows of its own, and rows beyond
// kKeptBytes are freed when the aggregation that needed them ends.
TEST(RowScratchTest, TheThreadKeepsItsRowsUpToItsBudget) {
  std::thread([] {
    float* first = nullptr;
    {
      RowScratch scratch;
      first = scratch.Take(0, 1000).data();
      RowScratch nested;
      EXPECT_NE(nested.Take(0, 1000).data(), first) << "in use further up: rows of its own";
    }
    EXPECT_EQ(RowScratch::ThreadKeptBytes(), 1000 * sizeof(float));
    {
      RowScratch scratch;
      EXPECT_EQ(scratch.Take(0, 500).data(), first) << "kept, and large enough";
    }
    const size_t half = RowScratch::kKeptBytes / sizeof(float) / 2;
    {
      RowScratch scratch;
      scratch.Take(0, half);
      scratch.Take(1, half);
      scratch.Take(2, 1000);
      EXPECT_EQ(RowScratch::ThreadKeptBytes(), 2 * half * sizeof(float) + 1000 * sizeof(float));
    }
    EXPECT_EQ(RowScratch::ThreadKeptBytes(), 2 * half * sizeof(float))
        << "the row past the budget is freed";
  }).join();
}

// A worker restarted mid-round sends again, under its new UDP session, the chunks its
// predecessor sent: a chunk the round holds is taken as the earlier copy (which counts
// and is not replaced), one it lacks fills its range, and a second copy under the new
// session is a replay.
TEST_F(SliceRoundTest, AChunkHeldFromAnEarlierSessionIsTakenAsThatCopy) {
  SliceRound s(info_, &rules_, /*aggregate_only=*/false);
  Init(s);
  const SliceRound::Chunk first{/*worker=*/0,      /*round=*/0, /*index=*/0,
                                /*count_in_push=*/2,
                                /*chunk_elems=*/1, /*first=*/0, /*count=*/1, /*session=*/7};
  ASSERT_TRUE(s.AcceptChunk(first, "fp32", Decoder(), Encoded({6})).ok());
  SliceRound::Chunk resent = first;
  resent.session = 8;
  absl::StatusOr<SliceRound::Progress> again =
      s.AcceptChunk(resent, "fp32", Decoder(), Encoded({9}));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->held_from_before);
  EXPECT_FALSE(again->closed);
  SliceRound::Chunk second = resent;
  second.index = 1;
  second.first = 1;
  absl::StatusOr<SliceRound::Progress> filled =
      s.AcceptChunk(second, "fp32", Decoder(), Encoded({5}));
  ASSERT_TRUE(filled.ok()) << filled.status();
  EXPECT_FALSE(filled->held_from_before);
  EXPECT_EQ(core::RefusalOf(s.AcceptChunk(second, "fp32", Decoder(), Encoded({5})).status()),
            core::Refusal::kDuplicate)
      << "a chunk replayed under the session that sent it";
  EXPECT_EQ(core::RefusalOf(s.AcceptChunk(first, "fp32", Decoder(), Encoded({6})).status()),
            core::Refusal::kDuplicate)
      << "the first copy replayed under its own session";
  ASSERT_TRUE(Push(s, 1, 0, {1, 1}).ok());
  absl::StatusOr<SliceRound::Progress> last = Push(s, 2, 0, {1, 1});
  ASSERT_TRUE(last.ok() && last->closed) << "every push whole: the round closes";
  std::optional<ClosedRound> closed = s.TakeClosed();
  ASSERT_TRUE(closed.has_value());
  const std::vector<uint32_t> worker0 = {0};
  const std::vector<const float*> rows = closed->Rows(worker0).value();
  EXPECT_EQ(rows[0][0], 6.0f) << "the earlier session's copy counts";
  EXPECT_EQ(rows[0][1], 5.0f);
}

// A worker restarted twice in one round: each chunk is told apart by the session that
// sent it, so the third session's resend of a chunk the second one sent is the held
// copy even after the third sent a chunk of its own (with one "later" session
// remembered, it was refused as a replay), and each session's own resend is a replay.
TEST_F(SliceRoundTest, AThirdSessionsResendsAreTakenAsTheCopiesHeld) {
  core::SliceInfo info = info_;
  info.numel = 3;
  SliceRound s(info, &rules_, /*aggregate_only=*/false);
  Wakeups wake;
  ASSERT_TRUE(s.Initialize(Fp32({1.0f, 2.0f, 3.0f}), &wake).ok());
  const auto chunk = [](uint32_t index, uint64_t session) {
    return SliceRound::Chunk{/*worker=*/0,      /*round=*/0,     /*index=*/index,
                             /*count_in_push=*/3, /*chunk_elems=*/1, /*first=*/index,
                             /*count=*/1,         /*session=*/session};
  };
  const auto take = [&](uint32_t index, uint64_t session, float value) {
    return s.AcceptChunk(chunk(index, session), "fp32", Decoder(), Encoded({value}));
  };
  ASSERT_TRUE(take(0, 7, 10).ok());
  ASSERT_TRUE(take(1, 8, 11).ok());  // the first successor's own chunk
  absl::StatusOr<SliceRound::Progress> own = take(2, 9, 12);  // the second successor's
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_FALSE(own->held_from_before);
  for (uint32_t index : {1u, 0u}) {
    absl::StatusOr<SliceRound::Progress> resent = take(index, 9, 99);
    ASSERT_TRUE(resent.ok()) << index << ": " << resent.status();
    EXPECT_TRUE(resent->held_from_before) << index;
  }
  for (const auto& [index, session] : {std::pair{0u, 7u}, std::pair{1u, 8u}, std::pair{2u, 9u}}) {
    EXPECT_EQ(core::RefusalOf(take(index, session, 99).status()), core::Refusal::kDuplicate)
        << "chunk " << index << " replayed under session " << session;
  }
  ASSERT_TRUE(Push(s, 1, 0, {1, 1, 1}).ok());
  absl::StatusOr<SliceRound::Progress> last = Push(s, 2, 0, {1, 1, 1});
  ASSERT_TRUE(last.ok() && last->closed);
  std::optional<ClosedRound> closed = s.TakeClosed();
  ASSERT_TRUE(closed.has_value());
  const std::vector<uint32_t> worker0 = {0};
  const std::vector<const float*> rows = closed->Rows(worker0).value();
  EXPECT_EQ(rows[0][0], 10.0f);
  EXPECT_EQ(rows[0][1], 11.0f);
  EXPECT_EQ(rows[0][2], 12.0f);
}

// A chunk under a session past ChunkedPush::kMaxSessions in one round is refused before
// its decode; the sessions already listed still send.
TEST_F(SliceRoundTest, AChunkUnderTooManySessionsInOneRoundIsRefused) {
  constexpr uint32_t kChunks = 300;
  core::SliceInfo info = info_;
  info.numel = kChunks;
  SliceRound s(info, &rules_, /*aggregate_only=*/false);
  Wakeups wake;
  ASSERT_TRUE(s.Initialize(Fp32(std::vector<float>(kChunks, 1.0f)), &wake).ok());
  const auto take = [&](uint32_t index, uint64_t session) {
    const SliceRound::Chunk c{/*worker=*/0, /*round=*/0,       /*index=*/index,
                              kChunks,      /*chunk_elems=*/1, /*first=*/index,
                              /*count=*/1,  /*session=*/session};
    return s.AcceptChunk(c, "fp32", Decoder(), Encoded({2.0f}));
  };
  for (uint32_t i = 0; i < ChunkedPush::kMaxSessions; ++i) {
    ASSERT_TRUE(take(i, 100 + i).ok()) << i;  // each chunk under a session of its own
  }
  const int decodes = decoder_calls_;
  const absl::Status refused = take(ChunkedPush::kMaxSessions, 1).status();
  EXPECT_EQ(core::RefusalOf(refused), core::Refusal::kMalformed) << refused;
  EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("at most 255"));
  EXPECT_EQ(decoder_calls_, decodes) << "refused before its decode";
  EXPECT_TRUE(take(ChunkedPush::kMaxSessions, 100).ok()) << "a session already listed";
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
  EXPECT_EQ(r->Rows(workers).value()[0][0], 6.0f);
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
    // The mean of one push: the aggregate is that push's row.
    absl::StatusOr<std::span<const float>> aggregate = a.Aggregate(*closed, out, nullptr);
    absl::Status st = aggregate.status();
    RoundAggregation::Publication p = a.Step(*closed, aggregate.value_or(out), st);
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

}  // namespace
}  // namespace ps::server
