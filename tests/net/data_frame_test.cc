// The frames of the TCP data plane (net/data_frame.h): a fixed example of the format
// written out by hand, round trips of every type, and every refusal.
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

namespace ps::net {
namespace {

using ::testing::HasSubstr;

std::string Bytes(std::initializer_list<uint8_t> b) { return std::string(b.begin(), b.end()); }

template <size_t N>
std::array<char, N> Counting(int first) {
  std::array<char, N> out;
  for (size_t i = 0; i < N; ++i) out[i] = static_cast<char>(first + static_cast<int>(i));
  return out;
}

std::span<const char, kFrameHeaderBytes> HeaderOf(std::string_view frame) {
  return std::span<const char, kFrameHeaderBytes>(frame.data(), kFrameHeaderBytes);
}

// The meta bytes of a frame written by an Append* function (after its header). A copy:
// what is parsed from it borrows it, so keep it while the parsed meta is used.
std::string MetaOf(std::string_view frame) {
  auto h = ParseHeader(HeaderOf(frame));
  EXPECT_TRUE(h.ok()) << h.status();
  if (!h.ok()) return "";
  return std::string(frame.substr(kFrameHeaderBytes, h->meta_bytes));
}

// The header of `frame` with one field changed, as 16 bytes.
std::string Patched(std::string frame, size_t offset, std::initializer_list<uint8_t> bytes) {
  frame.resize(kFrameHeaderBytes);
  size_t i = offset;
  for (uint8_t b : bytes) frame[i++] = static_cast<char>(b);
  return frame;
}

void ExpectRefused(const absl::Status& s, std::string_view message,
                   absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(std::string(message)));
}

// A body over the receiver's bound is RESOURCE_EXHAUSTED, as gRPC answers a message over
// its limit.
void ExpectOverLimit(const absl::Status& s, std::string_view message) {
  ExpectRefused(s, message, absl::StatusCode::kResourceExhausted);
}

// A PUSHES of two pushes (tags 1 and 2) of 8 and 4 bytes.
PushesMeta TwoPushes() {
  PushesMeta m{.layout_hash = 7, .round = 3, .codec = "fp32", .count = 2};
  m.entries[0] = {.tag = 1, .slice_id = 4, .body_bytes = 8};
  m.entries[1] = {.tag = 2, .slice_id = 5, .body_bytes = 4};
  return m;
}

// A SLICES of two slices of 8 and 4 bytes, the second with a loss and queued.
SlicesMeta TwoSlices() {
  SlicesMeta m{.codec = "", .count = 2};
  m.entries[0] = {{.slice_id = 4, .version = 9, .epoch = 1}, 8};
  m.entries[1] = {{.slice_id = 5, .version = 9, .epoch = 1, .loss = 0.5f, .queued = true}, 4};
  return m;
}

constexpr FrameLimits kLimits{.max_body_bytes = 1 << 20, .max_pull_slices = 64};

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
  const std::string longest_message =
      std::string(kMaxStatusMessageBytes - 3, 'm') + "\xe2\x82\xac";
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

// ---- header refusals ----

// A valid header of each type, to patch.
struct Sample {
  FrameType type;
  std::string frame;
};

std::vector<Sample> Samples() {
  std::vector<Sample> out;
  auto add = [&](FrameType type, const std::function<absl::Status(std::string*)>& append) {
    std::string frame;
    const absl::Status s = append(&frame);
    EXPECT_TRUE(s.ok()) << s;
    out.push_back({type, std::move(frame)});
  };
  const uint32_t ids[] = {4, 5};
  add(FrameType::kHello, [](std::string* f) { return AppendHello({}, f); });
  add(FrameType::kChallenge, [](std::string* f) { return AppendChallenge({}, f); });
  add(FrameType::kProof, [](std::string* f) { return AppendProof({}, f); });
  add(FrameType::kAdmit, [](std::string* f) { return AppendAdmit({}, f); });
  add(FrameType::kPush, [](std::string* f) { return AppendPush(1, {.codec = "fp32"}, 8, f); });
  add(FrameType::kAnswer, [](std::string* f) {
    return AppendAnswer(1, {absl::StatusCode::kOutOfRange, "late", "x"}, f);
  });
  add(FrameType::kPull, [&](std::string* f) { return AppendPull(1, {.count = 2}, ids, {}, f); });
  add(FrameType::kSlice, [](std::string* f) { return AppendSlice(1, {}, 4, f); });
  add(FrameType::kPullEnd, [](std::string* f) { return AppendPullEnd(1, {}, f); });
  add(FrameType::kCancel, [](std::string* f) { return AppendCancel(1, f); });
  add(FrameType::kGoaway, [](std::string* f) {
    return AppendGoaway({absl::StatusCode::kInvalidArgument, "malformed", ""}, f);
  });
  add(FrameType::kPushes, [](std::string* f) { return AppendPushes(TwoPushes(), f); });
  add(FrameType::kSlices, [](std::string* f) { return AppendSlices(1, TwoSlices(), f); });
  return out;
}

TEST(DataFrameTest, ParseHeaderRefusesUnknownTypes) {
  std::set<int> known;
  for (const Sample& s : Samples()) known.insert(static_cast<int>(s.type));
  ASSERT_EQ(known.size(), 13u);
  const std::string cancel = Samples()[9].frame;
  for (int t = 0; t < 256; ++t) {
    if (known.contains(t)) continue;
    auto h = ParseHeader(HeaderOf(Patched(cancel, 0, {static_cast<uint8_t>(t)})));
    ASSERT_FALSE(h.ok()) << t;
    char hex[8];
    std::snprintf(hex, sizeof(hex), "0x%02x", t);
    ExpectRefused(h.status(), std::string("data frame: unknown type ") + hex);
  }
}

TEST(DataFrameTest, ParseHeaderRefusesUnknownFlagBits) {
  for (const Sample& s : Samples()) {
    // The bits each type defines: PUSH and PUSHES two, PULL one, SLICE three, the others
    // none.
    const int defined = s.type == FrameType::kPush || s.type == FrameType::kPushes ? 0x03
                        : s.type == FrameType::kPull  ? 0x01
                        : s.type == FrameType::kSlice ? 0x07
                                                      : 0x00;
    for (int bit = 0; bit < 8; ++bit) {
      if ((defined & (1 << bit)) != 0) continue;
      auto h = ParseHeader(HeaderOf(Patched(s.frame, 1, {static_cast<uint8_t>(1 << bit)})));
      ASSERT_FALSE(h.ok()) << FrameTypeName(s.type) << " bit " << bit;
      ExpectRefused(h.status(), "set bits this type does not define");
      EXPECT_THAT(std::string(h.status().message()), HasSubstr(std::string(FrameTypeName(s.type))));
    }
  }
}

TEST(DataFrameTest, ParseHeaderRefusesMetaLengthsOutsideTheTypesBounds) {
  const struct {
    FrameType type;
    uint8_t flags;
    int min, max;
  } bounds[] = {
      {FrameType::kHello, 0, 8, 1024},    {FrameType::kChallenge, 0, 68, 68},
      {FrameType::kProof, 0, 32, 32},     {FrameType::kAdmit, 0, 16, 16},
      {FrameType::kPush, 0, 21, 276},     {FrameType::kPush, 1, 25, 280},
      {FrameType::kAnswer, 0, 4, 580},    {FrameType::kPullEnd, 0, 4, 580},
      {FrameType::kGoaway, 0, 4, 580},    {FrameType::kPull, 0, 28, 28},
      {FrameType::kPull, 1, 28, 28},      {FrameType::kSlice, 0, 29, 284},
      {FrameType::kSlice, 1, 33, 288},    {FrameType::kSlice, 3, 37, 292},
      {FrameType::kSlice, 4, 29, 284},    {FrameType::kCancel, 0, 0, 0},
      // 18 fixed bytes, a codec of 0 to 255 bytes, 2 to 16 pushes of 16 bytes and 4 per flag.
      {FrameType::kPushes, 0, 50, 529},   {FrameType::kPushes, 3, 66, 657},
      // 2 fixed bytes, a codec of 0 to 255 bytes, 2 to 8 slices of 33 bytes and 4 per loss.
      {FrameType::kSlices, 0, 68, 585},
  };
  for (const auto& b : bounds) {
    const bool connection = b.type == FrameType::kHello || b.type == FrameType::kChallenge ||
                            b.type == FrameType::kProof || b.type == FrameType::kAdmit ||
                            b.type == FrameType::kGoaway;
    for (int m : {0, b.min - 1, b.min, b.max, b.max + 1, 0xffff}) {
      if (m < 0) continue;
      FrameHeader h{b.type, b.flags, static_cast<uint16_t>(m), 0, connection ? 0u : 1u};
      std::string bytes;
      const absl::Status encoded = EncodeHeader(h, &bytes);
      const bool inside = m >= b.min && m <= b.max;
      EXPECT_EQ(encoded.ok(), inside) << FrameTypeName(b.type) << " M " << m << ": " << encoded;
      if (!inside) {
        EXPECT_TRUE(bytes.empty());
        ExpectRefused(encoded, absl::StrCat("meta length ", m));
        // What ParseHeader reads from such bytes.
        std::string raw = Bytes({static_cast<uint8_t>(b.type), b.flags,
                                 static_cast<uint8_t>(m & 0xff), static_cast<uint8_t>(m >> 8), 0,
                                 0, 0, 0, connection ? uint8_t{0} : uint8_t{1}, 0, 0, 0, 0, 0, 0,
                                 0});
        auto parsed = ParseHeader(HeaderOf(raw));
        ASSERT_FALSE(parsed.ok());
        ExpectRefused(parsed.status(), absl::StrCat("meta length ", m));
      }
    }
  }
}

TEST(DataFrameTest, ParseHeaderRefusesBodiesOnFramesWithoutOne) {
  for (const Sample& s : Samples()) {
    const bool body = s.type == FrameType::kPush || s.type == FrameType::kPushes ||
                      s.type == FrameType::kPull || s.type == FrameType::kSlice ||
                      s.type == FrameType::kSlices;
    auto h = ParseHeader(HeaderOf(Patched(s.frame, 4, {0xff, 0xff, 0xff, 0xff})));
    EXPECT_EQ(h.ok(), body) << FrameTypeName(s.type);
    if (!body) ExpectRefused(h.status(), "body length 4294967295, where this type has no body");
  }
}

TEST(DataFrameTest, ParseHeaderRefusesTagsOfTheWrongKind) {
  for (const Sample& s : Samples()) {
    const bool connection = s.type == FrameType::kHello || s.type == FrameType::kChallenge ||
                            s.type == FrameType::kProof || s.type == FrameType::kAdmit ||
                            s.type == FrameType::kGoaway;
    auto h = ParseHeader(HeaderOf(Patched(s.frame, 8, {connection ? uint8_t{1} : uint8_t{0}})));
    ASSERT_FALSE(h.ok()) << FrameTypeName(s.type);
    ExpectRefused(h.status(), connection ? "tag 1 on a connection frame" : "tag 0");
    // A tag's top byte counts too.
    if (connection) {
      EXPECT_FALSE(ParseHeader(HeaderOf(Patched(s.frame, 15, {0x80}))).ok());
    }
  }
}

// ---- what the connection's state and limits allow ----

TEST(DataFrameTest, CheckHeaderAllowsOnlyTheFramesOfTheConnectionsState) {
  using T = FrameType;
  const struct {
    ConnectionState state;
    std::set<T> allowed;
  } states[] = {
      {ConnectionState::kShardAwaitsHello, {T::kHello}},
      {ConnectionState::kShardAwaitsProof, {T::kProof}},
      {ConnectionState::kShardAdmitted, {T::kPush, T::kPushes, T::kPull, T::kCancel, T::kGoaway}},
      {ConnectionState::kWorkerAwaitsChallenge, {T::kChallenge, T::kGoaway}},
      {ConnectionState::kWorkerAwaitsAdmit, {T::kAdmit, T::kGoaway}},
      {ConnectionState::kWorkerAdmitted,
       {T::kAnswer, T::kSlice, T::kSlices, T::kPullEnd, T::kGoaway}},
  };
  for (const auto& st : states) {
    for (const Sample& s : Samples()) {
      auto h = ParseHeader(HeaderOf(s.frame));
      ASSERT_TRUE(h.ok()) << h.status();
      const absl::Status checked = CheckHeader(*h, st.state, kLimits);
      const bool allowed = st.allowed.contains(s.type);
      EXPECT_EQ(checked.ok(), allowed)
          << FrameTypeName(s.type) << " in state " << static_cast<int>(st.state) << ": " << checked;
      if (!allowed) ExpectRefused(checked, "not allowed while");
    }
  }
  // Before ADMIT, a worker's PUSH or PULL is refused from its header.
  auto push = ParseHeader(HeaderOf(Samples()[4].frame));
  ASSERT_TRUE(push.ok());
  ExpectRefused(CheckHeader(*push, ConnectionState::kShardAwaitsHello, kLimits),
                "data frame PUSH: not allowed while the shard awaits HELLO");
  ExpectRefused(CheckHeader(*push, ConnectionState::kShardAwaitsProof, kLimits),
                "data frame PUSH: not allowed while the shard awaits PROOF");
}

TEST(DataFrameTest, CheckHeaderRefusesTheLargestClaimFromSixteenBytes) {
  // A PUSH claiming 2^32 - 1 bytes: the 16 bytes are all it takes to refuse it.
  const std::array<char, kFrameHeaderBytes> raw = {0x10, 0, 21, 0, '\xff', '\xff', '\xff', '\xff',
                                                   1,    0, 0,  0, 0,      0,      0,      0};
  auto h = ParseHeader(raw);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->body_bytes, 0xffffffffu);
  ExpectOverLimit(CheckHeader(*h, ConnectionState::kShardAdmitted, kLimits),
                  "data frame PUSH: body length 4294967295 is over the limit of 1048576 bytes");
  // At the limit and one above.
  FrameHeader at = *h;
  at.body_bytes = 1 << 20;
  EXPECT_TRUE(CheckHeader(at, ConnectionState::kShardAdmitted, kLimits).ok());
  at.body_bytes += 1;
  ExpectOverLimit(CheckHeader(at, ConnectionState::kShardAdmitted, kLimits), "over the limit");
  // A SLICE on the worker's side, the same.
  FrameHeader slice{FrameType::kSlice, 0, 29, 0xffffffffu, 1};
  ExpectOverLimit(CheckHeader(slice, ConnectionState::kWorkerAdmitted, kLimits),
                  "data frame SLICE: body length 4294967295 is over the limit");
}

TEST(DataFrameTest, CheckHeaderRefusesAPullBodyMoreSlicesThanAllowedNeed) {
  // 64 slices with held versions: 768 bytes at most.
  FrameHeader h{FrameType::kPull, 1, 28, 768, 1};
  EXPECT_TRUE(CheckHeader(h, ConnectionState::kShardAdmitted, kLimits).ok());
  h.body_bytes = 769;
  ExpectRefused(CheckHeader(h, ConnectionState::kShardAdmitted, kLimits),
                "data frame PULL: body length 769 is more than the 64 slices a pull may name "
                "need (768 bytes)");
  // The limit of 2^32 - 1 slices: 12 times that does not wrap.
  const FrameLimits huge{.max_body_bytes = 0xffffffffu, .max_pull_slices = 0xffffffffu};
  h.body_bytes = 0xffffffffu;
  EXPECT_TRUE(CheckHeader(h, ConnectionState::kShardAdmitted, huge).ok());
}

TEST(DataFrameTest, CheckPullBodyRefusesCountsAndLengthsThatDisagree) {
  const PullMeta plain{.count = 5};
  const PullMeta held{.count = 5, .held = true};
  FrameHeader h{FrameType::kPull, 0, 28, 20, 1};
  EXPECT_TRUE(CheckPullBody(h, plain, kLimits).ok());
  for (uint32_t b : {0u, 16u, 19u, 21u, 24u, 60u}) {
    h.body_bytes = b;
    ExpectRefused(CheckPullBody(h, plain, kLimits),
                  absl::StrCat("body length ", b, ", where 5 slice ids need 20 bytes"));
  }
  h.flags = 1;
  h.body_bytes = 60;
  EXPECT_TRUE(CheckPullBody(h, held, kLimits).ok());
  h.body_bytes = 20;  // the ids without the versions the flag announced
  ExpectRefused(CheckPullBody(h, held, kLimits),
                "body length 20, where 5 slice ids and held versions need 60 bytes");
  // A count over the shard's slices, whatever the body.
  const PullMeta many{.count = 65};
  h = FrameHeader{FrameType::kPull, 0, 28, 260, 1};
  ExpectRefused(CheckPullBody(h, many, kLimits), "count 65 is over the 64 slices a pull may name");
  // ParsePullBody refuses a body of another length too (a caller that skipped the check).
  ExpectRefused(ParsePullBody(plain, std::string(19, '\0')).status(),
                "body of 19 bytes, where 5 slice ids need 20 bytes");
  ExpectRefused(ParsePullBody(held, std::string(20, '\0')).status(),
                "body of 20 bytes, where 5 slice ids and held versions need 60 bytes");
}

// ---- meta refusals ----

// One valid meta of each type (its longest strings where it has some) and its parser.
struct MetaSample {
  std::string name;
  std::string meta;
  std::function<absl::Status(std::string_view)> parse;
};

std::vector<MetaSample> MetaSamples() {
  std::vector<MetaSample> out;
  auto add = [&](std::string name, std::string frame,
                 std::function<absl::Status(uint8_t, std::string_view)> parse) {
    auto h = ParseHeader(HeaderOf(frame));
    EXPECT_TRUE(h.ok()) << name << ": " << h.status();
    const uint8_t flags = h.ok() ? h->flags : 0;
    out.push_back({std::move(name), MetaOf(frame),
                   [parse, flags](std::string_view m) { return parse(flags, m); }});
  };
  std::string f;
  EXPECT_TRUE(AppendHello({1, 2, Counting<32>(3)}, &f).ok());
  add("HELLO", f, [](uint8_t, std::string_view m) { return ParseHelloMeta(m).status(); });
  f.clear();
  EXPECT_TRUE(AppendChallenge({1, Counting<32>(3), Counting<32>(9)}, &f).ok());
  add("CHALLENGE", f, [](uint8_t, std::string_view m) { return ParseChallengeMeta(m).status(); });
  f.clear();
  EXPECT_TRUE(AppendProof({Counting<32>(5)}, &f).ok());
  add("PROOF", f, [](uint8_t, std::string_view m) { return ParseProofMeta(m).status(); });
  f.clear();
  EXPECT_TRUE(AppendAdmit({1, 2, 3, 4}, &f).ok());
  add("ADMIT", f, [](uint8_t, std::string_view m) { return ParseAdmitMeta(m).status(); });
  f.clear();
  EXPECT_TRUE(AppendPush(1, {1, 2, 3, 0.25f, "fp16"}, 0, &f).ok());
  add("PUSH", f, [](uint8_t fl, std::string_view m) { return ParsePushMeta(fl, m).status(); });
  f.clear();
  EXPECT_TRUE(AppendAnswer(1, {absl::StatusCode::kOutOfRange, "late", "too late"}, &f).ok());
  add("ANSWER", f, [](uint8_t, std::string_view m) {
    return ParseStatusMeta(FrameType::kAnswer, m).status();
  });
  f.clear();
  const uint32_t ids[] = {1};
  const uint64_t versions[] = {2};
  EXPECT_TRUE(AppendPull(1, {1, 2, 3, 1, true}, ids, versions, &f).ok());
  f.resize(kFrameHeaderBytes + 28);  // the meta; its body is another test's
  add("PULL", f, [](uint8_t fl, std::string_view m) { return ParsePullMeta(fl, m).status(); });
  f.clear();
  PullHeader slice{{1, 2, 3, 4, 0.5f, 0.75f, true}, "int8"};
  EXPECT_TRUE(AppendSlice(1, slice, 0, &f).ok());
  add("SLICE", f, [](uint8_t fl, std::string_view m) { return ParseSliceMeta(fl, m).status(); });
  f.clear();
  PushesMeta pushes = TwoPushes();
  pushes.entries[0].loss = 0.5f;
  pushes.entries[1].loss = 0.25f;
  EXPECT_TRUE(AppendPushes(pushes, &f).ok());
  add("PUSHES", f, [](uint8_t fl, std::string_view m) {
    return ParsePushesMeta(FrameHeader{FrameType::kPushes, fl, 0, 12, 1}, m).status();
  });
  f.clear();
  EXPECT_TRUE(AppendSlices(1, TwoSlices(), &f).ok());
  add("SLICES", f, [](uint8_t, std::string_view m) {
    return ParseSlicesMeta(FrameHeader{FrameType::kSlices, 0, 0, 12, 1}, m).status();
  });
  return out;
}

TEST(DataFrameTest, MetaParsersRefuseEveryTruncationAndATrailingByte) {
  for (const MetaSample& s : MetaSamples()) {
    ASSERT_TRUE(s.parse(s.meta).ok()) << s.name;
    for (size_t n = 0; n < s.meta.size(); ++n) {
      // A copy of exactly n bytes: a read past them is a read past the allocation.
      const std::string cut = s.meta.substr(0, n);
      const absl::Status st = s.parse(cut);
      ASSERT_FALSE(st.ok()) << s.name << " cut to " << n;
      ExpectRefused(st, "data frame " + s.name + " meta: ends inside");
    }
    ExpectRefused(s.parse(s.meta + '\0'),
                  "data frame " + s.name + " meta: 1 trailing bytes after the last field");
  }
}

TEST(DataFrameTest, HelloRefusesAnotherMagicOrVersionWhateverItsLength) {
  std::string frame;
  ASSERT_TRUE(AppendHello({}, &frame).ok());
  std::string meta = MetaOf(frame);
  meta[3] = '2';
  ExpectRefused(ParseHelloMeta(meta).status(), "data frame HELLO meta: bad magic (not PSD1)");
  meta[3] = '1';
  meta[4] = 4;
  ExpectRefused(ParseHelloMeta(meta).status(), "version 4; this shard speaks version 3");
  // A newer worker's longer HELLO passes the header and hears the version.
  meta.append(100, 'x');
  auto h = ParseHeader(HeaderOf(Patched(frame, 2, {static_cast<uint8_t>(meta.size())})));
  ASSERT_TRUE(h.ok()) << h.status();
  ExpectRefused(ParseHelloMeta(meta).status(), "version 4; this shard speaks version 3");
  meta[4] = 3;
  ExpectRefused(ParseHelloMeta(meta).status(), "100 trailing bytes");
  ExpectRefused(ParseHelloMeta(std::string(meta.data(), 8)).status(), "ends inside data session");
}

TEST(DataFrameTest, MetaParsersRefuseOverlongStrings) {
  // PUSH: 20 bytes of fields, then a codec length of 255 (the most a frame carries; the
  // shard's codec lookup bounds specs at 128) with 10 bytes after it.
  std::string push(20, '\0');
  push += static_cast<char>(255);
  push += std::string(10, 'c');
  ExpectRefused(ParsePushMeta(0, push).status(),
                "data frame PUSH meta: ends inside codec at byte 21 (needs 255, has 10)");
  // SLICE: 28 bytes of fields, then the same length and nothing.
  std::string slice(28, '\0');
  slice += static_cast<char>(255);
  ExpectRefused(ParseSliceMeta(0, slice).status(),
                "data frame SLICE meta: ends inside codec at byte 29 (needs 255, has 0)");
  // ANSWER: a name of 65 bytes; a message of 513.
  std::string name = Bytes({3, 65}) + std::string(65, 'a') + Bytes({0, 0});
  ExpectRefused(ParseStatusMeta(FrameType::kAnswer, name).status(),
                "data frame ANSWER meta: refusal name of 65 bytes is over the limit of 64");
  std::string message = Bytes({3, 0, 0x01, 0x02}) + std::string(513, 'm');
  ExpectRefused(ParseStatusMeta(FrameType::kGoaway, message).status(),
                "data frame GOAWAY meta: message of 513 bytes is over the limit of 512");
  std::string message_claim = Bytes({3, 0, 0xff, 0xff});
  ExpectRefused(ParseStatusMeta(FrameType::kPullEnd, message_claim).status(),
                "message of 65535 bytes is over the limit of 512");
}

TEST(DataFrameTest, StatusMetaRefusesCodesAndTextItCannotShow) {
  auto meta = [](uint8_t code, std::string_view name, std::string_view message) {
    std::string m = Bytes({code, static_cast<uint8_t>(name.size())});
    m.append(name);
    m += static_cast<char>(message.size() & 0xff);
    m += static_cast<char>(message.size() >> 8);
    m.append(message);
    return m;
  };
  ASSERT_TRUE(ParseStatusMeta(FrameType::kAnswer, meta(16, "unauthenticated", "x")).ok());
  for (int code : {17, 100, 255}) {
    ExpectRefused(ParseStatusMeta(FrameType::kAnswer, meta(static_cast<uint8_t>(code), "", ""))
                      .status(),
                  absl::StrCat("data frame ANSWER: status code ", code,
                               " is not a canonical code (0-16)"));
  }
  for (std::string_view bad : {"Late", "late-ish", "late ", "l\xc3\xa9te"}) {
    ExpectRefused(ParseStatusMeta(FrameType::kAnswer, meta(10, bad, "")).status(),
                  "is not in [a-z0-9_]");
  }
  ExpectRefused(ParseStatusMeta(FrameType::kAnswer, meta(10, std::string_view("a\0b", 3), ""))
                    .status(),
                "refusal name byte 1 (0x00) is not in [a-z0-9_]");
  for (std::string_view bad : {"\xff", "caf\xc3", "\xed\xa0\x80", "\xc0\x80"}) {
    ExpectRefused(ParseStatusMeta(FrameType::kGoaway, meta(14, "", bad)).status(),
                  "data frame GOAWAY: message is not valid UTF-8");
  }
}

TEST(DataFrameTest, PullMetaRefusesTheHeldFlagOnAPullOfNoSlices) {
  std::string meta(28, '\0');
  EXPECT_TRUE(ParsePullMeta(0, meta).ok());
  ExpectRefused(ParsePullMeta(1, meta).status(),
                "data frame PULL meta: held flag on a pull of no slices");
}

// ---- encoders ----

TEST(DataFrameTest, EncodersRefuseWhatParsersWouldAndLeaveTheOutputAlone) {
  const std::string before = "earlier frames";
  std::string out = before;
  const std::string long_codec(kMaxFrameCodecBytes + 1, 'c');
  const std::string long_name(kMaxRefusalNameBytes + 1, 'n');
  const std::string long_message(kMaxStatusMessageBytes + 1, 'm');
  const uint32_t ids[] = {1, 2};
  const uint64_t versions[] = {3};
  const struct {
    const char* name;
    absl::Status status;
    const char* message;
  } cases[] = {
      {"push tag 0", AppendPush(0, {}, 0, &out), "data frame PUSH: tag 0"},
      {"push body 2^32", AppendPush(1, {}, size_t{1} << 32, &out),
       "body of 4294967296 bytes does not fit the 4-byte body length"},
      {"push codec", AppendPush(1, {.codec = long_codec}, 0, &out),
       "data frame PUSH: codec of 256 bytes is over the limit of 255"},
      {"slice codec", AppendSlice(1, {.codec = long_codec}, 0, &out),
       "data frame SLICE: codec of 256 bytes"},
      {"slice tag 0", AppendSlice(0, {}, 0, &out), "data frame SLICE: tag 0"},
      {"answer name", AppendAnswer(1, {absl::StatusCode::kInternal, long_name, ""}, &out),
       "refusal name of 65 bytes is over the limit of 64"},
      {"answer name chars", AppendAnswer(1, {absl::StatusCode::kInternal, "Late", ""}, &out),
       "refusal name byte 0 (0x4c) is not in [a-z0-9_]"},
      {"pull-end message", AppendPullEnd(1, {absl::StatusCode::kInternal, "", long_message}, &out),
       "message of 513 bytes is over the limit of 512"},
      {"goaway utf-8", AppendGoaway({absl::StatusCode::kInternal, "", "\xc3"}, &out),
       "message is not valid UTF-8"},
      {"goaway code", AppendGoaway({static_cast<absl::StatusCode>(17), "", ""}, &out),
       "status code 17 is not a canonical code"},
      {"answer tag 0", AppendAnswer(0, {}, &out), "data frame ANSWER: tag 0"},
      {"pull count", AppendPull(1, {.count = 3}, ids, {}, &out), "count 3 for 2 slice ids"},
      {"pull held", AppendPull(1, {.count = 2, .held = true}, ids, versions, &out),
       "1 held versions for 2 slice ids with the held flag set"},
      {"pull unflagged versions", AppendPull(1, {.count = 2}, ids, versions, &out),
       "1 held versions for 2 slice ids with the held flag clear"},
      {"pull held of none", AppendPull(1, {.held = true}, {}, {}, &out),
       "held flag on a pull of no slices"},
      {"cancel tag 0", AppendCancel(0, &out), "data frame CANCEL: tag 0"},
      {"header", EncodeHeader({static_cast<FrameType>(0x05), 0, 0, 0, 0}, &out),
       "data frame: unknown type 0x05"},
  };
  for (const auto& c : cases) {
    ASSERT_FALSE(c.status.ok()) << c.name;
    EXPECT_EQ(c.status.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(std::string(c.status.message()), HasSubstr(c.message)) << c.name;
  }
  EXPECT_EQ(out, before);
}

TEST(DataFrameTest, NamesEveryType) {
  std::set<std::string_view> names;
  for (const Sample& s : Samples()) {
    EXPECT_NE(FrameTypeName(s.type), "unknown");
    names.insert(FrameTypeName(s.type));
  }
  EXPECT_EQ(names.size(), 13u);
  EXPECT_EQ(FrameTypeName(FrameType::kPullEnd), "PULL_END");
  EXPECT_EQ(FrameTypeName(static_cast<FrameType>(0x05)), "unknown");
}

}  // namespace
}  // namespace ps::net
