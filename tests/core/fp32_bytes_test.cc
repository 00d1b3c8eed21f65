#include "core/fp32_bytes.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace ps::core {
namespace {

using ::testing::HasSubstr;

TEST(Fp32BytesTest, RoundTripsExactly) {
  std::vector<float> in = {0.0f, -1.5f, 3.25e-20f, 1e30f, std::numeric_limits<float>::denorm_min()};
  std::string bytes;
  AppendFp32(in, &bytes);
  ASSERT_EQ(bytes.size(), in.size() * 4);
  std::vector<float> out(in.size());
  ASSERT_TRUE(ParseFp32(bytes, out, "test").ok());
  EXPECT_EQ(out, in);
}

TEST(Fp32BytesTest, RefusesWrongSize) {
  std::vector<float> out(3);
  absl::Status s = ParseFp32(std::string(11, '\0'), out, "slice 7");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("slice 7: expected 12 bytes"));
}

TEST(Fp32BytesTest, RefusesNonFiniteValuesAndSaysWhere) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> in(3000, 1.0f);
    in[2500] = bad;
    std::string bytes;
    AppendFp32(in, &bytes);
    std::vector<float> out(in.size());
    absl::Status s = ParseFp32(bytes, out, "x");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("value 2500 is not finite"));
  }
}

TEST(Fp32BytesTest, FindNonFiniteFindsTheFirst) {
  std::vector<float> v(5000, 2.0f);
  EXPECT_EQ(FindNonFinite(v), -1);
  v[4999] = std::numeric_limits<float>::infinity();
  v[1025] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(FindNonFinite(v), 1025);
}

}  // namespace
}  // namespace ps::core
