// sign: wire format, scale, refusals, and the packed majority vote against the dense
// rule's definition.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "aggregators/aggregator.h"
#include "codecs/codec.h"
#include "codecs/compressed.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/codecs/codec_test_util.h"

namespace ps::codecs {
namespace {

using ::ps::codecs::testing::Hex;

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<Codec> Sign() { return *MakeCodec("sign"); }

TEST(SignCodecTest, WireFormatAndDecode) {
  std::string bytes;
  ASSERT_TRUE(Sign()->Encode(std::vector<float>{1, -2, 0, -1, 3, 1, 1, 1, -1}, &bytes).ok());
  // version, numel 9, scale 11/9 = 1.2222222 (0x3f9c71c7), bits 0b00001010 then 0b1.
  EXPECT_EQ(Hex(bytes), "07 09 c7 71 9c 3f 0a 01");
  std::vector<float> out(9);
  ASSERT_TRUE(Sign()->Decode(bytes, out).ok());
  const float s = 11.0f / 9.0f;
  EXPECT_THAT(out, ElementsAre(s, -s, s, -s, s, s, s, s, -s));
}

TEST(SignCodecTest, RefusesBadScaleCountAndPadding) {
  std::vector<float> out(9);
  std::string bytes;
  ASSERT_TRUE(Sign()->Encode(std::vector<float>(9, 1.0f), &bytes).ok());
  std::string bad = bytes;
  bad[7] = 0x02;  // padding bit after value 8
  EXPECT_THAT(std::string(Sign()->Decode(bad, out).message()), HasSubstr("padding bits"));
  bad = bytes;
  bad[5] = static_cast<char>(0xbf);  // scale -1
  EXPECT_THAT(std::string(Sign()->Decode(bad, out).message()), HasSubstr("non-negative"));
  bad = bytes;
  bad[5] = 0x7f;
  bad[4] = static_cast<char>(0x80);  // Inf
  bad[3] = 0;
  bad[2] = 0;
  EXPECT_THAT(std::string(Sign()->Decode(bad, out).message()), HasSubstr("not a finite"));
  std::vector<float> ten(10);
  EXPECT_EQ(std::string(Sign()->Decode(bytes, ten).message()),
            "sign: payload is for 9 values, the slice has 10");
}

// The packed vote equals sign_majority on the decoded rows, bit for bit.
TEST(SignMajorityVoteTest, EqualsTheDenseRuleOnDecodedPushes) {
  std::mt19937 rng(5);
  for (size_t n : {1, 2, 3, 4, 7, 16, 63, 64, 65, 130}) {
    for (size_t d : {1, 63, 64, 65, 1000}) {
      std::vector<std::string> payloads(n);
      std::vector<std::vector<float>> rows(n, std::vector<float>(d));
      std::normal_distribution<float> normal;
      for (size_t i = 0; i < n; ++i) {
        std::vector<float> g(d);
        // A shared direction makes votes lopsided; some rows are all zero (scale 0).
        const bool zero = i % 5 == 4;
        for (size_t c = 0; c < d; ++c) {
          g[c] = zero ? 0.0f : normal(rng) * (1 + static_cast<float>(i)) + (c % 3 == 0 ? 0.5f : 0.0f);
        }
        ASSERT_TRUE(Sign()->Encode(g, &payloads[i]).ok());
        ASSERT_TRUE(Sign()->Decode(payloads[i], rows[i]).ok());
      }
      aggregators::AggregatorOptions o;
      o.num_workers = static_cast<int>(n);
      auto rule = aggregators::MakeAggregator("sign_majority", o);
      ASSERT_TRUE(rule.ok()) << rule.status();
      std::vector<const float*> ptrs;
      for (const auto& r : rows) ptrs.push_back(r.data());
      std::vector<float> dense(d), packed(d, 9.0f);
      ASSERT_TRUE((*rule)->Aggregate(ptrs, dense, {}).ok());
      std::vector<std::string_view> views(payloads.begin(), payloads.end());
      ASSERT_TRUE(SignMajorityVote(views, packed).ok());
      for (size_t c = 0; c < d; ++c) {
        ASSERT_EQ(packed[c], dense[c]) << "n " << n << " d " << d << " at " << c;
      }
    }
  }
}

TEST(SignMajorityVoteTest, RefusesPayloadsOfAnotherSizeOrCodec) {
  std::string a, b;
  ASSERT_TRUE(Sign()->Encode(std::vector<float>(10, 1.0f), &a).ok());
  ASSERT_TRUE(Sign()->Encode(std::vector<float>(11, 1.0f), &b).ok());
  std::vector<std::string_view> views = {a, b};
  std::vector<float> out(10);
  EXPECT_THAT(std::string(SignMajorityVote(views, out).message()),
              HasSubstr("payload 1: sign: payload is for 11 values"));
}

}  // namespace
}  // namespace ps::codecs
