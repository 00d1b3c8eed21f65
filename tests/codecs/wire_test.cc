// The payload reader and writer every codec builds on (codecs/wire_internal.h).
#include <cstdint>
#include <random>
#include <string>

#include "codecs/wire_internal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::codecs::internal {
namespace {

using ::testing::HasSubstr;

TEST(CodecWireTest, VarintRoundTripsAndHasOneEncoding) {
  for (uint64_t v : {uint64_t{0}, uint64_t{1}, uint64_t{127}, uint64_t{128}, uint64_t{300},
                     uint64_t{1} << 35, UINT64_MAX}) {
    std::string out;
    PutVarint(&out, v);
    EXPECT_EQ(out.size(), VarintSize(v));
    WireReader r("t", out);
    uint64_t got = 0;
    ASSERT_TRUE(r.Varint(&got, "v").ok());
    EXPECT_EQ(got, v);
    EXPECT_TRUE(r.Finish("v").ok());
  }
  uint64_t got = 0;
  const std::string padded_bytes("\x80\x00", 2);
  WireReader padded("t", padded_bytes);
  EXPECT_THAT(std::string(padded.Varint(&got, "count").message()),
              HasSubstr("not minimally encoded"));
  const std::string overflow_bytes("\xff\xff\xff\xff\xff\xff\xff\xff\xff\x02", 10);
  WireReader overflow("t", overflow_bytes);
  EXPECT_THAT(std::string(overflow.Varint(&got, "count").message()),
              HasSubstr("overflows 64 bits"));
  const std::string cut_bytes("\xff\xff", 2);
  WireReader cut("t", cut_bytes);
  EXPECT_EQ(std::string(cut.Varint(&got, "count").message()),
            "t: payload ends inside count at byte 2 (needs 1, has 0)");
}

TEST(CodecWireTest, FixedWidthValuesAreLittleEndianAndBoundsChecked) {
  std::string out;
  PutU8(&out, 0xab);
  PutU16(&out, 0x1234);
  PutU32(&out, 0xdeadbeef);
  PutU64(&out, 0x0102030405060708ull);
  PutF32(&out, -2.5f);
  EXPECT_EQ(out.substr(0, 3), std::string("\xab\x34\x12", 3));
  WireReader r("t", out);
  uint8_t a = 0;
  uint16_t b = 0;
  uint32_t c = 0;
  uint64_t d = 0;
  float e = 0;
  ASSERT_TRUE(r.U8(&a, "a").ok());
  ASSERT_TRUE(r.U16(&b, "b").ok());
  ASSERT_TRUE(r.U32(&c, "c").ok());
  ASSERT_TRUE(r.U64(&d, "d").ok());
  ASSERT_TRUE(r.F32(&e, "e").ok());
  EXPECT_EQ(a, 0xab);
  EXPECT_EQ(b, 0x1234);
  EXPECT_EQ(c, 0xdeadbeefu);
  EXPECT_EQ(d, 0x0102030405060708ull);
  EXPECT_EQ(e, -2.5f);
  EXPECT_EQ(std::string(r.U32(&c, "the scale").message()),
            "t: payload ends inside the scale at byte 19 (needs 4, has 0)");
}

TEST(CodecWireTest, FormatAndTrailingBytes) {
  WireReader empty("int8", "");
  EXPECT_EQ(std::string(empty.Format(PayloadFormat::kInt8).message()), "int8: empty payload");
  const std::string fp16("\x02", 1);
  WireReader wrong("int8", fp16);
  EXPECT_EQ(std::string(wrong.Format(PayloadFormat::kInt8).message()),
            "int8: payload in the fp16 format (2), expected the int8 format (4)");
  const std::string unknown("\xee", 1);
  WireReader none("int8", unknown);
  EXPECT_EQ(std::string(none.Format(PayloadFormat::kInt8).message()),
            "int8: payload in format 238, which no codec writes, expected the int8 format (4)");
  const std::string three("\x04\x00\x00", 3);
  WireReader extra("int8", three);
  ASSERT_TRUE(extra.Format(PayloadFormat::kInt8).ok());
  EXPECT_EQ(std::string(extra.Finish("the levels").message()),
            "int8: 2 trailing bytes after the levels");
}

TEST(CodecWireTest, BitsAndEliasGammaRoundTrip) {
  std::mt19937_64 rng(7);
  std::vector<std::pair<uint64_t, int>> fields;
  std::vector<uint64_t> gammas;
  std::string out;
  BitWriter w(&out);
  for (int i = 0; i < 1000; ++i) {
    const int count = 1 + static_cast<int>(rng() % 57);
    const uint64_t bits = rng() & ((uint64_t{1} << count) - 1);
    fields.emplace_back(bits, count);
    w.Put(bits, count);
    const uint64_t g = 1 + (rng() >> (rng() % 64));
    gammas.push_back(g);
    w.PutEliasGamma(g);
  }
  w.Finish();
  BitReader r(out);
  for (size_t i = 0; i < fields.size(); ++i) {
    ASSERT_EQ(r.Get(fields[i].second), fields[i].first) << i;
    ASSERT_EQ(r.GetEliasGamma(), gammas[i]) << i;
  }
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(r.PaddingIsZero());
  EXPECT_EQ(r.bytes_touched(), out.size());
  r.Get(9);
  EXPECT_FALSE(r.ok());
}

TEST(CodecWireTest, EliasGammaRefusesTooLongPrefixAndOverrun) {
  const std::string twenty(20, '\0');
  BitReader zeros(twenty);
  EXPECT_EQ(zeros.GetEliasGamma(8), 0u);
  const std::string one(1, '\0');
  BitReader cut(one);
  EXPECT_EQ(cut.GetEliasGamma(), 0u);
  EXPECT_FALSE(cut.ok());
}

}  // namespace
}  // namespace ps::codecs::internal
