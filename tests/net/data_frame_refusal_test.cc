// The refusals of the TCP data plane's frames (net/data_frame.h): headers, what a
// connection's state and limits allow, metas and the encoders (the format and round
// trips: data_frame_test.cc).
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

using ::testing::HasSubstr;

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
