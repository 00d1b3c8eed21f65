// The frames of the TCP data plane (net/data_frame.h): a fixed example of the format
// written out by hand and round trips of every type (the refusals:
// data_frame_refusal_test.cc).
#include "net/data_frame.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cstdio>
#include <functional>
#include <limits>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/refusal.h"
#include "tests/net/data_frame_test_util.h"

namespace ps::net {
namespace {

// ---- the format, byte for byte ----

TEST(DataFrameTest, WritesTheGoldenPushByteForByte) {
  std::string frame;
  PushMeta meta;
  meta.layout_hash = 0x1122334455667788ull;
  meta.round = 1000;
  meta.slice_id = 42;
  meta.loss = 0.5f;
  meta.codec = "fp16";
  ASSERT_TRUE(AppendPush(0x0102030405060708ull, meta, 9, &frame).ok());
  const std::string header = Bytes({
      0x10,                                            // type PUSH
      0x01,                                            // flags: loss
      0x1d, 0x00,                                      // M = 29
      0x09, 0x00, 0x00, 0x00,                          // B = 9
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // tag
  });
  const std::string push_meta = Bytes({
      0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,  // layout hash
      0xe8, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // round 1000
      0x2a, 0x00, 0x00, 0x00,                          // slice id 42
      0x00, 0x00, 0x00, 0x3f,                          // loss 0.5f
      0x04, 'f', 'p', '1', '6',                        // codec
  });
  EXPECT_EQ(frame, header + push_meta);

  auto h = ParseHeader(HeaderOf(header));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(*h, (FrameHeader{FrameType::kPush, 0x01, 29, 9, 0x0102030405060708ull}));
  std::string again;
  ASSERT_TRUE(EncodeHeader(*h, &again).ok());
  EXPECT_EQ(again, header);
  auto parsed = ParsePushMeta(h->flags, push_meta);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->layout_hash, meta.layout_hash);
  EXPECT_EQ(parsed->round, 1000u);
  EXPECT_EQ(parsed->slice_id, 42u);
  EXPECT_EQ(parsed->loss, 0.5f);
  EXPECT_EQ(parsed->codec, "fp16");
}

TEST(DataFrameTest, WritesTheGoldenPushesByteForByte) {
  PushesMeta meta{.layout_hash = 0x1122334455667788ull, .round = 1000, .codec = "fp16", .count = 2};
  meta.entries[0] = {.tag = 0x0102030405060708ull, .slice_id = 42, .body_bytes = 9, .lr = 0.5f};
  meta.entries[1] = {.tag = 3, .slice_id = 43, .body_bytes = 7, .lr = 0.25f};
  std::string frame;
  ASSERT_TRUE(AppendPushes(meta, &frame).ok());
  const std::string header = Bytes({
      0x12,                                            // type PUSHES
      0x02,                                            // flags: learning rate
      0x3e, 0x00,                                      // M = 62
      0x10, 0x00, 0x00, 0x00,                          // B = 16, the bodies' sum
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // tag: the first push's
  });
  const std::string pushes_meta = Bytes({
      0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,  // layout hash
      0xe8, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // round 1000
      0x04, 'f', 'p', '1', '6',                        // codec
      0x02,                                            // count
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // push 0: tag
      0x2a, 0x00, 0x00, 0x00,                          //   slice id 42
      0x09, 0x00, 0x00, 0x00,                          //   body length 9
      0x00, 0x00, 0x00, 0x3f,                          //   learning rate 0.5f
      0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // push 1: tag 3
      0x2b, 0x00, 0x00, 0x00,                          //   slice id 43
      0x07, 0x00, 0x00, 0x00,                          //   body length 7
      0x00, 0x00, 0x80, 0x3e,                          //   learning rate 0.25f
  });
  EXPECT_EQ(frame, header + pushes_meta);
  auto h = ParseHeader(HeaderOf(header));
  ASSERT_TRUE(h.ok()) << h.status();
  auto parsed = ParsePushesMeta(*h, pushes_meta);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->layout_hash, meta.layout_hash);
  EXPECT_EQ(parsed->round, 1000u);
  EXPECT_EQ(parsed->codec, "fp16");
  ASSERT_EQ(parsed->count, 2u);
  EXPECT_EQ(parsed->entries[0], meta.entries[0]);
  EXPECT_EQ(parsed->entries[1], meta.entries[1]);
  const PushMeta second = parsed->push(1);
  EXPECT_EQ(second.slice_id, 43u);
  EXPECT_EQ(second.lr, 0.25f);
  EXPECT_EQ(second.codec, "fp16");
}

TEST(DataFrameTest, WritesTheGoldenSlicesByteForByte) {
  SlicesMeta meta{.codec = "3lc", .count = 2};
  meta.entries[0] = {{.slice_id = 42, .version = 7, .base_version = 6, .epoch = 2,
                      .first_loss = 0.25f},
                     9};
  meta.entries[1] = {{.slice_id = 43, .version = 7, .base_version = 5, .epoch = 2, .loss = 0.5f,
                      .queued = true},
                     7};
  std::string frame;
  ASSERT_TRUE(AppendSlices(0x0102030405060708ull, meta, &frame).ok());
  const std::string header = Bytes({
      0x24,                                            // type SLICES
      0x00,                                            // flags: none (each slice has its own)
      0x4f, 0x00,                                      // M = 79
      0x10, 0x00, 0x00, 0x00,                          // B = 16, the bodies' sum
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // tag: the pull's
  });
  const std::string slices_meta = Bytes({
      0x03, '3', 'l', 'c',                             // codec
      0x02,                                            // count
      0x2a, 0x00, 0x00, 0x00,                          // slice 0: id 42
      0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  //   version 7
      0x06, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  //   base version 6
      0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  //   epoch 2
      0x02,                                            //   flags: first loss
      0x00, 0x00, 0x80, 0x3e,                          //   first loss 0.25f
      0x09, 0x00, 0x00, 0x00,                          //   body length 9
      0x2b, 0x00, 0x00, 0x00,                          // slice 1: id 43
      0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  //   version 7
      0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  //   base version 5
      0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  //   epoch 2
      0x05,                                            //   flags: loss, queued
      0x00, 0x00, 0x00, 0x3f,                          //   loss 0.5f
      0x07, 0x00, 0x00, 0x00,                          //   body length 7
  });
  EXPECT_EQ(frame, header + slices_meta);
  auto h = ParseHeader(HeaderOf(header));
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE(CheckHeader(*h, ConnectionState::kWorkerAdmitted, kLimits).ok());
  auto parsed = ParseSlicesMeta(*h, slices_meta);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->codec, "3lc");
  ASSERT_EQ(parsed->count, 2u);
  EXPECT_EQ(parsed->entries[0], meta.entries[0]);
  EXPECT_EQ(parsed->entries[1], meta.entries[1]);
  const PullHeader second = parsed->slice(1);
  EXPECT_EQ(second.slice_id, 43u);
  EXPECT_EQ(second.base_version, 5u);
  EXPECT_EQ(second.loss, 0.5f);
  EXPECT_FALSE(second.first_loss.has_value());
  EXPECT_TRUE(second.queued);
  EXPECT_EQ(second.codec, "3lc");
}

TEST(DataFrameTest, SlicesRefuseCountsFlagsAndLengthsThatDisagree) {
  std::string out;
  SlicesMeta one = TwoSlices();
  one.count = 1;
  ExpectRefused(AppendSlices(1, one, &out), "count 1 is outside [2, 8]");
  SlicesMeta many = TwoSlices();
  many.count = 9;
  ExpectRefused(AppendSlices(1, many, &out), "count 9 is outside [2, 8]");
  ExpectRefused(AppendSlices(0, TwoSlices(), &out), "tag 0");
  EXPECT_TRUE(out.empty());

  std::string frame;
  ASSERT_TRUE(AppendSlices(1, TwoSlices(), &frame).ok());
  auto h = ParseHeader(HeaderOf(frame));
  ASSERT_TRUE(h.ok()) << h.status();
  const std::string meta = MetaOf(frame);
  ASSERT_TRUE(ParseSlicesMeta(*h, meta).ok());
  for (int count : {0, 1, 9, 255}) {
    std::string bad = meta;
    bad[1] = static_cast<char>(count);  // after the empty codec's length
    ExpectRefused(ParseSlicesMeta(*h, bad).status(), absl::StrCat("count ", count, " is outside"));
  }
  std::string three = meta;
  three[1] = 3;
  ExpectRefused(ParseSlicesMeta(*h, three).status(), "ends inside slice id");
  FrameHeader longer = *h;
  longer.body_bytes = 13;
  ExpectRefused(ParseSlicesMeta(longer, meta).status(),
                "body lengths add up to 12 bytes, the header says 13");
  // A slice's flags byte: slice 0's is at 2 + 28.
  for (uint8_t bit : {0x08, 0x10, 0x80}) {
    std::string flagged = meta;
    flagged[2 + 28] = static_cast<char>(bit);
    ExpectRefused(ParseSlicesMeta(*h, flagged).status(), "slice 0's flags");
  }
}

TEST(DataFrameTest, AppendPushesRefusesWhatItsParserWould) {
  std::string out;
  PushesMeta one = TwoPushes();
  one.count = 1;
  ExpectRefused(AppendPushes(one, &out), "count 1 is outside [2, 16]");
  PushesMeta many = TwoPushes();
  many.count = 17;
  ExpectRefused(AppendPushes(many, &out), "count 17 is outside [2, 16]");
  PushesMeta untagged = TwoPushes();
  untagged.entries[1].tag = 0;
  ExpectRefused(AppendPushes(untagged, &out), "push 1 has tag 0");
  PushesMeta mixed = TwoPushes();
  mixed.entries[1].loss = 1.0f;
  ExpectRefused(AppendPushes(mixed, &out), "differs from the first in carrying a loss");
  EXPECT_TRUE(out.empty());
}

// What the senders check when they queue a payload whose header is made at the write:
// exactly what AppendPush and AppendSlice refuse of its codec and length.
TEST(DataFrameTest, CheckPayloadRefusesWhatThePushAndSliceEncodersWould) {
  const std::string longest(kMaxFrameCodecBytes, 'c'), over(kMaxFrameCodecBytes + 1, 'c');
  const uint64_t most = std::numeric_limits<uint32_t>::max();
  for (const FrameType type : {FrameType::kPush, FrameType::kSlice}) {
    SCOPED_TRACE(FrameTypeName(type));
    for (const auto& [codec, bytes] : std::vector<std::pair<std::string, uint64_t>>{
             {"", 0}, {longest, most}, {over, 16}, {"fp32", most + 1}}) {
      std::string out;
      const absl::Status encoded =
          type == FrameType::kPush
              ? AppendPush(7, PushMeta{.codec = codec}, bytes, &out)
              : AppendSlice(7, PullHeader{.codec = codec}, bytes, &out);
      const absl::Status checked = CheckPayload(type, codec, bytes);
      EXPECT_EQ(checked.ok(), encoded.ok()) << codec.size() << " " << bytes << ": " << checked;
      EXPECT_EQ(checked.ok(), codec.size() <= kMaxFrameCodecBytes && bytes <= most) << checked;
    }
    ExpectRefused(CheckPayload(type, over, 16), "codec of 256 bytes is over the limit of 255");
    ExpectRefused(CheckPayload(type, "fp32", most + 1), "does not fit the 4-byte body length");
  }
}

TEST(DataFrameTest, ParsePushesMetaRefusesCountsTagsAndLengthsThatDisagree) {
  std::string frame;
  ASSERT_TRUE(AppendPushes(TwoPushes(), &frame).ok());
  auto h = ParseHeader(HeaderOf(frame));
  ASSERT_TRUE(h.ok()) << h.status();
  const std::string meta = MetaOf(frame);
  ASSERT_TRUE(ParsePushesMeta(*h, meta).ok());
  // The count is the byte after the codec (8 + 8 + 1 + 4).
  constexpr size_t kCount = 21;
  for (uint8_t count : {0, 1, 17, 255}) {
    std::string bad = meta;
    bad[kCount] = static_cast<char>(count);
    ExpectRefused(ParsePushesMeta(*h, bad).status(), absl::StrCat("count ", count, " is outside"));
  }
  std::string three = meta;  // a count of 3 over two pushes' fields
  three[kCount] = 3;
  ExpectRefused(ParsePushesMeta(*h, three).status(), "ends inside tag");
  FrameHeader other_tag = *h;
  other_tag.tag = 9;
  ExpectRefused(ParsePushesMeta(other_tag, meta).status(),
                "the first push's tag 1 is not the header's 9");
  FrameHeader longer = *h;
  longer.body_bytes = 13;
  ExpectRefused(ParsePushesMeta(longer, meta).status(),
                "body lengths add up to 12 bytes, the header says 13");
  std::string zero_tag = meta;  // push 1's tag, after push 0's 16 bytes
  for (size_t i = 0; i < 8; ++i) zero_tag[kCount + 1 + 16 + i] = 0;
  ExpectRefused(ParsePushesMeta(*h, zero_tag).status(), "push 1 has tag 0");
}

TEST(DataFrameTest, WritesTheGoldenHelloByteForByte) {
  HelloMeta meta;
  meta.data_session = 0x0807060504030201ull;
  meta.worker_id = 3;
  meta.client_nonce = Counting<32>(0xa0);
  std::string frame;
  ASSERT_TRUE(AppendHello(meta, &frame).ok());
  std::string expected = Bytes({
      0x01, 0x00, 0x34, 0x00, 0x00, 0x00, 0x00, 0x00,  // HELLO, no flags, M = 52, B = 0
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // tag 0
      'P', 'S', 'D', '1',                              // magic
      0x03, 0x00, 0x00, 0x00,                          // version 3
      0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,  // data session
      0x03, 0x00, 0x00, 0x00,                          // worker id
  });
  expected.append(meta.client_nonce.data(), meta.client_nonce.size());
  EXPECT_EQ(frame, expected);
}

// ---- round trips ----

TEST(DataFrameTest, RoundTripsTheHandshake) {
  const HelloMeta hello{0xffffffffffffffffull, 0xfffffffeu, Counting<32>(1)};
  const ChallengeMeta challenge{7, Counting<32>(2), Counting<32>(100)};
  const ProofMeta proof{Counting<32>(200)};
  const AdmitMeta admit{64 << 20, 1024, 0xffffffffu, 300000};
  std::string frames;
  ASSERT_TRUE(AppendHello(hello, &frames).ok());
  ASSERT_TRUE(AppendChallenge(challenge, &frames).ok());
  ASSERT_TRUE(AppendProof(proof, &frames).ok());
  ASSERT_TRUE(AppendAdmit(admit, &frames).ok());
  // Appended one after the other, as a connection writes them.
  std::string_view rest = frames;
  auto next = [&](FrameType type, size_t meta_bytes) {
    auto h = ParseHeader(HeaderOf(rest));
    EXPECT_TRUE(h.ok()) << h.status();
    if (!h.ok()) return std::string_view();
    EXPECT_EQ(h->type, type);
    EXPECT_EQ(h->meta_bytes, meta_bytes);
    EXPECT_EQ(h->body_bytes, 0u);
    EXPECT_EQ(h->tag, 0u);
    const std::string_view meta = rest.substr(kFrameHeaderBytes, h->meta_bytes);
    rest.remove_prefix(kFrameHeaderBytes + h->meta_bytes);
    return meta;
  };
  auto h = ParseHelloMeta(next(FrameType::kHello, 52));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(*h, hello);
  auto c = ParseChallengeMeta(next(FrameType::kChallenge, 68));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c, challenge);
  auto p = ParseProofMeta(next(FrameType::kProof, 32));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, proof);
  auto a = ParseAdmitMeta(next(FrameType::kAdmit, 16));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, admit);
  EXPECT_TRUE(rest.empty());
}

TEST(DataFrameTest, RoundTripsPushesWithALearningRate) {
  for (const std::optional<float>& loss : {std::optional<float>(), std::optional<float>(2.5f)}) {
    PushMeta meta{7, 8, 9, loss, "fp16"};
    meta.lr = 0.125f;
    std::string frame;
    ASSERT_TRUE(AppendPush(3, meta, 10, &frame).ok());
    auto h = ParseHeader(HeaderOf(frame));
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->flags, loss.has_value() ? 3 : 2);
    const std::string meta_bytes = MetaOf(frame);
    auto m = ParsePushMeta(h->flags, meta_bytes);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->loss, loss);
    EXPECT_EQ(m->lr, 0.125f);
    EXPECT_EQ(m->codec, "fp16");
    // The flag without its four bytes, or the bytes without the flag, is refused.
    EXPECT_FALSE(ParsePushMeta(h->flags & ~2, meta_bytes).ok());
  }
}

TEST(DataFrameTest, RoundTripsPushesWithAndWithoutLoss) {
  const std::string longest(kMaxFrameCodecBytes, 'c');
  for (const std::optional<float>& loss : {std::optional<float>(), std::optional<float>(-1.25f)}) {
    for (std::string_view codec : {std::string_view(), std::string_view("topk(0.01)+fp16"),
                                   std::string_view(longest)}) {
      PushMeta meta{0xfedcba9876543210ull, 0xffffffffffffffffull, 0xffffffffu, loss, codec};
      std::string frame;
      ASSERT_TRUE(AppendPush(1, meta, 0xffffffffu, &frame).ok());
      auto h = ParseHeader(HeaderOf(frame));
      ASSERT_TRUE(h.ok()) << h.status();
      EXPECT_EQ(h->flags, loss.has_value() ? 1 : 0);
      EXPECT_EQ(h->body_bytes, 0xffffffffu);
      EXPECT_EQ(frame.size(), kFrameHeaderBytes + h->meta_bytes);
      const std::string meta_bytes = MetaOf(frame);  // the parsed views point into it
      auto m = ParsePushMeta(h->flags, meta_bytes);
      ASSERT_TRUE(m.ok()) << m.status();
      EXPECT_EQ(m->layout_hash, meta.layout_hash);
      EXPECT_EQ(m->round, meta.round);
      EXPECT_EQ(m->slice_id, meta.slice_id);
      EXPECT_EQ(m->loss, loss);
      EXPECT_EQ(m->codec, codec);
    }
  }
}

// A loss's bits cross unchanged, a NaN's payload included: the shard decides what a
// loss may be, not the frame.
TEST(DataFrameTest, CarriesTheExactBitsOfLosses) {
  const float nan = std::bit_cast<float>(0x7fc12345u);
  PullHeader meta;
  meta.slice_id = 1;
  meta.loss = nan;
  meta.first_loss = -0.0f;
  std::string frame;
  ASSERT_TRUE(AppendSlice(1, meta, 0, &frame).ok());
  auto h = ParseHeader(HeaderOf(frame));
  ASSERT_TRUE(h.ok());
  const std::string meta_bytes = MetaOf(frame);  // the parsed views point into it
  auto m = ParseSliceMeta(h->flags, meta_bytes);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(std::bit_cast<uint32_t>(*m->loss), 0x7fc12345u);
  EXPECT_EQ(std::bit_cast<uint32_t>(*m->first_loss), 0x80000000u);
}

TEST(DataFrameTest, RoundTripsSlicesWithEveryFlag) {
  for (int flags = 0; flags < 8; ++flags) {
    PullHeader meta;
    meta.slice_id = 0x80000001u;
    meta.version = 12;
    meta.base_version = 11;
    meta.epoch = 0xabcdef0123456789ull;
    if ((flags & 1) != 0) meta.loss = 2.5f;
    if ((flags & 2) != 0) meta.first_loss = 9.0f;
    meta.queued = (flags & 4) != 0;
    meta.codec = (flags & 1) != 0 ? "int8" : "";
    std::string frame;
    ASSERT_TRUE(AppendSlice(77, meta, 4096, &frame).ok()) << flags;
    auto h = ParseHeader(HeaderOf(frame));
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->type, FrameType::kSlice);
    EXPECT_EQ(h->flags, flags);
    EXPECT_EQ(h->tag, 77u);
    EXPECT_EQ(h->body_bytes, 4096u);
    const std::string meta_bytes = MetaOf(frame);  // the parsed views point into it
    auto m = ParseSliceMeta(h->flags, meta_bytes);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->slice_id, meta.slice_id);
    EXPECT_EQ(m->version, 12u);
    EXPECT_EQ(m->base_version, 11u);
    EXPECT_EQ(m->epoch, meta.epoch);
    EXPECT_EQ(m->loss, meta.loss);
    EXPECT_EQ(m->first_loss, meta.first_loss);
    EXPECT_EQ(m->queued, meta.queued);
    EXPECT_EQ(m->codec, meta.codec);
  }
}

TEST(DataFrameTest, RoundTripsStatusFrames) {
  const std::string longest_name(kMaxRefusalNameBytes, 'z');
  // The longest message, ending in a three-byte character.
  std::string longest_message(kMaxStatusMessageBytes - 3, 'm');
  longest_message.append("\xe2\x82\xac");
  const StatusMeta metas[] = {
      {absl::StatusCode::kOk, "", ""},
      {absl::StatusCode::kOutOfRange, "late", "push for round 3 of slice 7 came after it closed"},
      {absl::StatusCode::kUnauthenticated, longest_name, longest_message},
      {absl::StatusCode::kUnavailable, "idle", std::string_view("nul \0 and \n", 11)},
  };
  for (const StatusMeta& meta : metas) {
    std::string frames;
    ASSERT_TRUE(AppendAnswer(5, meta, &frames).ok());
    ASSERT_TRUE(AppendPullEnd(6, meta, &frames).ok());
    ASSERT_TRUE(AppendGoaway(meta, &frames).ok());
    std::string_view rest = frames;
    for (auto [type, tag] : {std::pair{FrameType::kAnswer, 5}, std::pair{FrameType::kPullEnd, 6},
                             std::pair{FrameType::kGoaway, 0}}) {
      auto h = ParseHeader(HeaderOf(rest));
      ASSERT_TRUE(h.ok()) << h.status();
      EXPECT_EQ(h->type, type);
      EXPECT_EQ(h->tag, static_cast<uint64_t>(tag));
      auto m = ParseStatusMeta(type, rest.substr(kFrameHeaderBytes, h->meta_bytes));
      ASSERT_TRUE(m.ok()) << m.status();
      EXPECT_EQ(m->code, meta.code);
      EXPECT_EQ(m->refusal_name, meta.refusal_name);
      EXPECT_EQ(m->message, meta.message);
      rest.remove_prefix(kFrameHeaderBytes + h->meta_bytes);
    }
    EXPECT_TRUE(rest.empty());
  }
}

// Every refusal the shard counts crosses by its name, which the worker reads back.
TEST(DataFrameTest, EveryRefusalNameCrossesTheWire) {
  for (int i = 0; i < static_cast<int>(core::Refusal::kCount); ++i) {
    const auto r = static_cast<core::Refusal>(i);
    std::string frame;
    ASSERT_TRUE(AppendAnswer(1, {core::RefusalCode(r), core::RefusalName(r), "why"}, &frame).ok())
        << core::RefusalName(r);
    const std::string meta_bytes = MetaOf(frame);  // the parsed views point into it
    auto m = ParseStatusMeta(FrameType::kAnswer, meta_bytes);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(core::ParseRefusal(m->refusal_name), r);
    EXPECT_EQ(m->code, core::RefusalCode(r));
  }
}

TEST(DataFrameTest, RoundTripsPullsAndTheirBodies) {
  const std::vector<uint32_t> ids = {0, 7, 0xffffffffu};
  const std::vector<uint64_t> held = {0, 3, 0xffffffffffffffffull};
  for (bool with_held : {false, true}) {
    const PullMeta meta{0x1111, 5, with_held ? 0x2222u : 0u, 3, with_held};
    std::string frame;
    ASSERT_TRUE(AppendPull(9, meta, ids, with_held ? std::span<const uint64_t>(held)
                                                   : std::span<const uint64_t>(),
                           &frame)
                    .ok());
    auto h = ParseHeader(HeaderOf(frame));
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->flags, with_held ? 1 : 0);
    EXPECT_EQ(h->body_bytes, with_held ? 36u : 12u);
    EXPECT_EQ(frame.size(), kFrameHeaderBytes + h->meta_bytes + h->body_bytes);
    EXPECT_TRUE(CheckHeader(*h, ConnectionState::kShardAdmitted, kLimits).ok());
    auto m = ParsePullMeta(h->flags, MetaOf(frame));
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(*m, meta);
    EXPECT_TRUE(CheckPullBody(*h, *m, kLimits).ok());
    auto body =
        ParsePullBody(*m, std::string_view(frame).substr(kFrameHeaderBytes + h->meta_bytes));
    ASSERT_TRUE(body.ok()) << body.status();
    EXPECT_EQ(body->slice_ids, ids);
    EXPECT_EQ(body->held_versions, with_held ? held : std::vector<uint64_t>());
  }
  // A pull of no slices is a frame (the shard refuses it as it does on gRPC: "pull names
  // no slices").
  std::string empty;
  ASSERT_TRUE(AppendPull(9, PullMeta{}, {}, {}, &empty).ok());
  auto h = ParseHeader(HeaderOf(empty));
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->body_bytes, 0u);
  auto body = ParsePullBody(PullMeta{}, "");
  ASSERT_TRUE(body.ok());
  EXPECT_TRUE(body->slice_ids.empty());
}

TEST(DataFrameTest, CancelIsAHeaderAlone) {
  std::string frame;
  ASSERT_TRUE(AppendCancel(0x42, &frame).ok());
  EXPECT_EQ(frame, Bytes({0x23, 0, 0, 0, 0, 0, 0, 0, 0x42, 0, 0, 0, 0, 0, 0, 0}));
  auto h = ParseHeader(HeaderOf(frame));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(*h, (FrameHeader{FrameType::kCancel, 0, 0, 0, 0x42}));
}

}  // namespace
}  // namespace ps::net
