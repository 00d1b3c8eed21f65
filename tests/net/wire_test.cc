#include "net/wire.h"

#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "ps/v1/ps.pb.h"

namespace ps::net {
namespace {

// `bytes` cut into pieces at the given offsets.
std::vector<std::string_view> Cut(const std::string& bytes, std::vector<size_t> cuts) {
  std::vector<std::string_view> pieces;
  size_t at = 0;
  for (size_t c : cuts) {
    pieces.push_back(std::string_view(bytes).substr(at, c - at));
    at = c;
  }
  pieces.push_back(std::string_view(bytes).substr(at));
  return pieces;
}

// Every way of cutting `bytes` into two pieces, and into single bytes.
std::vector<std::vector<std::string_view>> AllCuts(const std::string& bytes) {
  std::vector<std::vector<std::string_view>> out;
  for (size_t c = 0; c <= bytes.size(); ++c) out.push_back(Cut(bytes, {c}));
  std::vector<size_t> every;
  for (size_t c = 1; c < bytes.size(); ++c) every.push_back(c);
  out.push_back(Cut(bytes, every));
  return out;
}

TEST(WireTest, PullResponseFromProtobufParsesInAnyPieces) {
  v1::PullResponse m;
  m.set_slice_id(70000);
  m.set_version(1ull << 40);
  m.set_values(std::string("\x00\x01\x02\x03\x04\x05\x06\x07", 8));
  const std::string bytes = m.SerializeAsString();
  for (const auto& pieces : AllCuts(bytes)) {
    absl::StatusOr<PullFrame> f = ParsePullResponse(pieces);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(f->slice_id, 70000u);
    EXPECT_EQ(f->version, 1ull << 40);
    EXPECT_EQ(f->values.ToString(), m.values());
    std::string scratch;
    EXPECT_EQ(f->values.Contiguous(&scratch), m.values());
  }
}

TEST(WireTest, HeadersWrittenHereParseWithProtobuf) {
  const std::string values(12, 'v');
  v1::PullResponse pull;
  ASSERT_TRUE(pull.ParseFromString(
      PullResponseHeader({{.slice_id = 0, .version = 0}}, values.size()) + values));
  EXPECT_EQ(pull.slice_id(), 0u);
  EXPECT_EQ(pull.version(), 0u);
  EXPECT_EQ(pull.values(), values);

  const std::string payload("\x01payload", 8);
  v1::PushRequest push;
  ASSERT_TRUE(push.ParseFromString(
      PushRequestHeader("tok", 0xfeedfacecafebeefull, 7, 3, "fp16", payload.size()) + payload));
  EXPECT_EQ(push.session(), "tok");
  EXPECT_EQ(push.layout_hash(), 0xfeedfacecafebeefull);
  EXPECT_EQ(push.round(), 7u);
  EXPECT_EQ(push.slice_id(), 3u);
  EXPECT_EQ(push.codec(), "fp16");
  EXPECT_EQ(push.payload(), payload);
}

TEST(WireTest, CompressedPullFieldsGoBothWays) {
  const std::string payload(
      "\x01"
      "delta",
      6);
  const std::string bytes = PullResponseHeader({{.slice_id = 2,
                                                 .version = 8,
                                                 .base_version = 7,
                                                 .epoch = 0x8877665544332211ull},
                                                "3lc(s=1.9)"},
                                               payload.size()) +
                            payload;
  v1::PullResponse m;
  ASSERT_TRUE(m.ParseFromString(bytes));
  EXPECT_EQ(m.codec(), "3lc(s=1.9)");
  EXPECT_EQ(m.base_version(), 7u);
  EXPECT_EQ(m.epoch(), 0x8877665544332211ull);
  EXPECT_EQ(m.values(), payload);
  const std::string serialized = m.SerializeAsString();
  for (const auto& pieces : AllCuts(serialized)) {
    absl::StatusOr<PullFrame> f = ParsePullResponse(pieces);
    ASSERT_TRUE(f.ok()) << f.status() << " " << pieces.size() << " pieces, first "
                        << pieces[0].size();
    EXPECT_EQ(f->codec.ToString(), "3lc(s=1.9)");
    EXPECT_EQ(f->base_version, 7u);
    EXPECT_EQ(f->epoch, 0x8877665544332211ull);
    EXPECT_EQ(f->values.ToString(), payload);
  }
}

TEST(WireTest, TheQueuedMarkGoesBothWaysAndIsFalseWhenUnset) {
  const std::string payload("\x03values", 7);
  v1::PullResponse pull;
  ASSERT_TRUE(pull.ParseFromString(
      PullResponseHeader({{.slice_id = 5, .version = 3, .queued = true}}, payload.size()) +
      payload));
  EXPECT_TRUE(pull.queued());
  EXPECT_EQ(pull.values(), payload);
  const std::string serialized = pull.SerializeAsString();
  for (const auto& pieces : AllCuts(serialized)) {
    absl::StatusOr<PullFrame> f = ParsePullResponse(pieces);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_TRUE(f->queued);
    EXPECT_EQ(f->values.ToString(), payload);
  }
  pull.set_queued(false);
  const std::string cleared = pull.SerializeAsString();
  absl::StatusOr<PullFrame> unset = ParsePullResponse(Cut(cleared, {}));
  ASSERT_TRUE(unset.ok());
  EXPECT_FALSE(unset->queued);
  v1::PullResponse plain;
  ASSERT_TRUE(plain.ParseFromString(PullResponseHeader({{.slice_id = 5, .version = 3}}, 0)));
  EXPECT_FALSE(plain.queued());
}

TEST(WireTest, LossesGoBothWaysAndStayAbsentWhenUnset) {
  const std::string payload("\x02values", 7);
  v1::PullResponse pull;
  ASSERT_TRUE(pull.ParseFromString(
      PullResponseHeader({{.slice_id = 4, .version = 9, .loss = 0.75f, .first_loss = 2.25f}},
                         payload.size()) +
      payload));
  ASSERT_TRUE(pull.has_loss());
  EXPECT_EQ(pull.loss(), 0.75f);
  EXPECT_EQ(pull.first_loss(), 2.25f);
  const std::string pulled = pull.SerializeAsString();
  for (const auto& pieces : AllCuts(pulled)) {
    absl::StatusOr<PullFrame> f = ParsePullResponse(pieces);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(f->loss, 0.75f);
    EXPECT_EQ(f->first_loss, 2.25f);
    EXPECT_EQ(f->values.ToString(), payload);
  }
  const std::string plain = PullResponseHeader({{.slice_id = 4, .version = 9}}, 0);
  absl::StatusOr<PullFrame> without = ParsePullResponse(Cut(plain, {}));
  ASSERT_TRUE(without.ok());
  EXPECT_FALSE(without->loss.has_value());
  EXPECT_FALSE(without->first_loss.has_value());

  v1::PushRequest push;
  ASSERT_TRUE(push.ParseFromString(PushRequestHeader("t", 1, 2, 3, "fp16", payload.size(), 1.5f) +
                                   payload));
  ASSERT_TRUE(push.has_loss());
  EXPECT_EQ(push.loss(), 1.5f);
  EXPECT_FALSE(push.has_lr());
  v1::PushRequest with_lr;
  ASSERT_TRUE(with_lr.ParseFromString(
      PushRequestHeader("t", 1, 2, 3, "fp16", payload.size(), std::nullopt, 0.03f) + payload));
  ASSERT_TRUE(with_lr.has_lr());
  EXPECT_EQ(with_lr.lr(), 0.03f);
  EXPECT_FALSE(with_lr.has_loss());
  const std::string with_lr_bytes = with_lr.SerializeAsString();
  absl::StatusOr<PushFrame> lr_frame = ParsePushRequest(Cut(with_lr_bytes, {}));
  ASSERT_TRUE(lr_frame.ok()) << lr_frame.status();
  EXPECT_EQ(lr_frame->lr, 0.03f);
  EXPECT_EQ(push.payload(), payload);
  push.set_loss(-0.0f);  // present, and kept bit for bit
  const std::string pushed = push.SerializeAsString();
  for (const auto& pieces : AllCuts(pushed)) {
    absl::StatusOr<PushFrame> f = ParsePushRequest(pieces);
    ASSERT_TRUE(f.ok()) << f.status();
    ASSERT_TRUE(f->loss.has_value());
    EXPECT_TRUE(std::signbit(*f->loss));
  }
  push.clear_loss();
  const std::string unset = push.SerializeAsString();
  absl::StatusOr<PushFrame> none = ParsePushRequest(Cut(unset, {}));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->loss.has_value());
}

TEST(WireTest, PushRequestFromProtobufParsesInAnyPieces) {
  v1::PushRequest m;
  m.set_session("session-token");
  m.set_layout_hash(0x0123456789abcdefull);
  m.set_round(12345);
  m.set_slice_id(9);
  m.set_codec("topk(0.01)+varint+fp16");
  m.set_payload(std::string(300, '\x7f'));
  const std::string bytes = m.SerializeAsString();
  for (const auto& pieces : AllCuts(bytes)) {
    absl::StatusOr<PushFrame> f = ParsePushRequest(pieces);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(f->session.ToString(), m.session());
    EXPECT_EQ(f->layout_hash, m.layout_hash());
    EXPECT_EQ(f->round, m.round());
    EXPECT_EQ(f->slice_id, m.slice_id());
    EXPECT_EQ(f->codec.ToString(), m.codec());
    EXPECT_EQ(f->payload.ToString(), m.payload());
  }
}

TEST(WireTest, UnknownFieldsAreSkippedAndTheLastValueWins) {
  std::string bytes = PullResponseHeader({{.slice_id = 1, .version = 2}}, 0);
  bytes += std::string("\x08\x05", 2);                    // slice_id again: 5
  bytes += std::string("\x28\x96\x01", 3);                // field 5, varint 150
  bytes += std::string("\x31", 1) + std::string(8, 'x');  // field 6, fixed64
  bytes += std::string("\x3a\x02zz", 4);                  // field 7, 2 bytes
  bytes += std::string("\x4d", 1) + std::string(4, 'y');  // field 9, fixed32
  bytes += std::string("\x12\x00", 2);                    // field 2 with the wrong wire type
  absl::StatusOr<PullFrame> f = ParsePullResponse(Cut(bytes, {3, 9}));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->slice_id, 5u);
  EXPECT_EQ(f->version, 2u);
  EXPECT_TRUE(f->values.empty());
  v1::PullResponse m;
  ASSERT_TRUE(m.ParseFromString(bytes));  // protobuf agrees
  EXPECT_EQ(m.slice_id(), 5u);
  EXPECT_EQ(m.version(), 2u);
}

TEST(WireTest, Uint32FieldsKeepTheLow32BitsAsProtobufDoes) {
  const std::string bytes("\x08\xff\xff\xff\xff\x1f", 6);  // 2^35 - 1
  absl::StatusOr<PullFrame> f = ParsePullResponse(Cut(bytes, {}));
  ASSERT_TRUE(f.ok());
  v1::PullResponse m;
  ASSERT_TRUE(m.ParseFromString(bytes));
  EXPECT_EQ(f->slice_id, m.slice_id());
  EXPECT_EQ(f->slice_id, 0xffffffffu);
}

TEST(WireTest, MalformedMessagesAreRefusedWithTheirCause) {
  const std::string header = PullResponseHeader({{.slice_id = 1, .version = 2}}, 10);
  struct Case {
    std::string bytes;
    std::string says;
  };
  const std::vector<Case> cases = {
      {header + "short", "field 3 is truncated"},
      {std::string("\x08", 1), "field 1 is truncated"},
      {std::string("\x80", 1), "truncated or overlong field tag"},
      {std::string("\x00\x01", 2), "invalid field number"},
      {std::string("\x0b", 1), "wire type 3"},
      {std::string("\x0c", 1), "wire type 4"},
      {std::string("\x0e", 1), "wire type 6"},
      {std::string("\x08") + std::string(10, '\xff') + "\x01", "field 1 is truncated"},
      {std::string("\x09\x01\x02", 3), "field 1 is truncated"},
      {std::string("\x1a\xff\xff\xff\xff\x0f", 6), "field 3 is truncated"},
      {std::string("\x80\x80\x80\x80\x80\x01", 6), "overlong field tag"},
      {std::string("\x88\x80\x80\x80\x80\x00\x01", 7), "overlong field tag"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<PullFrame> f = ParsePullResponse(Cut(c.bytes, {1}));
    ASSERT_FALSE(f.ok()) << c.says;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(f.status().message().find("malformed PullResponse"), absl::string_view::npos);
    EXPECT_NE(f.status().message().find(c.says), absl::string_view::npos)
        << f.status() << " should say " << c.says;
    // protobuf refuses these too, except the groups, which it would skip.
    v1::PullResponse m;
    if (c.says.find("wire type 3") == std::string::npos &&
        c.says.find("wire type 4") == std::string::npos) {
      EXPECT_FALSE(m.ParseFromString(c.bytes)) << c.says;
    }
  }
  absl::StatusOr<PushFrame> push = ParsePushRequest(Cut(std::string("\x32\x05", 2), {}));
  ASSERT_FALSE(push.ok());
  EXPECT_NE(push.status().message().find("malformed PushRequest: field 6 is truncated"),
            absl::string_view::npos)
      << push.status();
}

TEST(WireTest, EmptyMessagesAndEmptyPiecesParse) {
  absl::StatusOr<PullFrame> none = ParsePullResponse({});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->slice_id, 0u);
  const std::string bytes = PullResponseHeader({{.slice_id = 4, .version = 5}}, 2) + "ab";
  const std::vector<std::string_view> pieces = {"", std::string_view(bytes).substr(0, 4), "",
                                                "", std::string_view(bytes).substr(4),    ""};
  absl::StatusOr<PullFrame> f = ParsePullResponse(pieces);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->slice_id, 4u);
  EXPECT_EQ(f->values.ToString(), "ab");
  for (std::string_view part : f->values.parts()) EXPECT_FALSE(part.empty());
}

TEST(WireTest, PullRequestFromProtobufParsesPackedOrNotInAnyPieces) {
  v1::PullRequest m;
  m.set_session("sess");
  m.set_layout_hash(0x1234567890abcdefull);
  for (uint32_t id : {7u, 300u, 70000u}) m.add_slice_ids(id);
  m.set_min_version(1ull << 40);
  for (uint64_t v : {1ull, 2ull, 1ull << 50}) m.add_held_versions(v);
  m.set_held_epoch(99);
  const std::string packed = m.SerializeAsString();  // proto3 packs repeated scalars
  // The same fields one entry at a time (wire type varint), as protobuf also accepts,
  // split between two runs of the packed form.
  std::string unpacked;
  {
    v1::PullRequest head;
    head.set_session("sess");
    head.set_layout_hash(m.layout_hash());
    head.add_slice_ids(7);
    unpacked = head.SerializeAsString();
    unpacked += std::string("\x18\xac\x02", 3);  // field 3, varint: 300
    v1::PullRequest tail;
    tail.add_slice_ids(70000);
    tail.set_min_version(m.min_version());
    for (uint64_t v : m.held_versions()) tail.add_held_versions(v);
    tail.set_held_epoch(99);
    unpacked += tail.SerializeAsString();
  }
  v1::PullRequest check;
  ASSERT_TRUE(check.ParseFromString(unpacked));
  ASSERT_EQ(check.SerializeAsString(), packed) << "the two forms say the same";
  for (const std::string& bytes : {packed, unpacked}) {
    for (const auto& pieces : AllCuts(bytes)) {
      absl::StatusOr<PullRequestFrame> f = ParsePullRequest(pieces, 3);
      ASSERT_TRUE(f.ok()) << f.status();
      EXPECT_EQ(f->session.ToString(), "sess");
      EXPECT_EQ(f->layout_hash, m.layout_hash());
      EXPECT_EQ(f->slice_ids, (std::vector<uint32_t>{7, 300, 70000}));
      EXPECT_EQ(f->min_version, 1ull << 40);
      EXPECT_EQ(f->held_versions, (std::vector<uint64_t>{1, 2, 1ull << 50}));
      EXPECT_EQ(f->held_epoch, 99u);
    }
  }
}

// Issue 45, finding 6: a 7.6 MB PullRequest naming 8 million slice ids cost 0.28 s of a
// shard's CPU before it was refused. The parser takes a bound and refuses the first id
// beyond it where it reads it: the cost is what was read, not what the request names.
TEST(WireTest, APullRequestNamingMoreSlicesThanTheBoundIsRefusedWhereItIsRead) {
  v1::PullRequest m;
  m.set_session("s");
  for (uint32_t i = 0; i < 8'000'000; ++i) m.add_slice_ids(i % 4096);
  const std::string bytes = m.SerializeAsString();
  ASSERT_GT(bytes.size(), 7'000'000u);
  const std::vector<std::string_view> pieces = {bytes};
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<PullRequestFrame> f = ParsePullRequest(pieces, 16);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(f.status().message().find("more than 16 slice ids"), absl::string_view::npos)
      << f.status();
  // Reading 17 varints: microseconds. (Reading them all took 30 ms or more here.)
  EXPECT_LT(took, std::chrono::milliseconds(5));
  // At the bound it parses; one past it, in the unpacked form too, and in held_versions.
  v1::PullRequest at;
  for (uint32_t i = 0; i < 16; ++i) at.add_slice_ids(i);
  for (uint32_t i = 0; i < 16; ++i) at.add_held_versions(i);
  const std::string at_bytes = at.SerializeAsString();
  ASSERT_TRUE(ParsePullRequest(std::vector<std::string_view>{at_bytes}, 16).ok());
  const std::string one_more = at_bytes + std::string("\x18\x05", 2);
  EXPECT_FALSE(ParsePullRequest(std::vector<std::string_view>{one_more}, 16).ok());
  const std::string held_more = at_bytes + std::string("\x28\x05", 2);
  absl::StatusOr<PullRequestFrame> held = ParsePullRequest(std::vector<std::string_view>{held_more}, 16);
  ASSERT_FALSE(held.ok());
  EXPECT_NE(held.status().message().find("held versions"), absl::string_view::npos);
  // A packed run cut inside a varint is malformed, as protobuf says.
  const std::string cut = std::string("\x1a\x02\x05\x80", 4);
  v1::PullRequest pb;
  EXPECT_FALSE(pb.ParseFromString(cut));
  EXPECT_FALSE(ParsePullRequest(std::vector<std::string_view>{cut}, 16).ok());
}

}  // namespace
}  // namespace ps::net
