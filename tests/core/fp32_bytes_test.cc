#include "core/fp32_bytes.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
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

// CopyFindNonFinite copies every value bit for bit from bytes at any alignment, and
// StoreFindNonFinite to bytes at any alignment, over whole blocks and the tail; each
// finds the first NaN or Inf in a block or in the tail (the values after it copied too).
TEST(Fp32BytesTest, CopyAndStoreFindNonFiniteCopyEveryValueAndFindTheFirst) {
  for (size_t n : {0u, 1u, 1023u, 1024u, 1025u, 3000u}) {
    std::vector<float> in(n);
    for (size_t i = 0; i < n; ++i) {
      in[i] = i % 5 == 0 ? -0.0f : (i % 13 == 0 ? 1e-41f : std::sin(0.7f * static_cast<float>(i)));
    }
    for (size_t offset : {0u, 1u, 3u}) {
      std::vector<unsigned char> bytes(offset + sizeof(float) * n + 1);
      if (n > 0) std::memcpy(bytes.data() + offset, in.data(), sizeof(float) * n);
      std::vector<float> out(n, 42.0f);
      EXPECT_EQ(CopyFindNonFinite(bytes.data() + offset, out), -1) << n << " " << offset;
      EXPECT_EQ(n == 0 || std::memcmp(out.data(), in.data(), sizeof(float) * n) == 0, true)
          << n << " " << offset;
      // The other way: floats stored at a byte offset, nothing written past them.
      std::vector<unsigned char> stored(offset + sizeof(float) * n + 1, 0xab);
      EXPECT_EQ(StoreFindNonFinite(in, stored.data() + offset), -1) << n << " " << offset;
      EXPECT_EQ(n == 0 || std::memcmp(stored.data() + offset, in.data(), sizeof(float) * n) == 0,
                true)
          << n << " " << offset;
      EXPECT_EQ(stored.back(), 0xab);
      if (offset > 0) {
        EXPECT_EQ(stored[offset - 1], 0xab);
      }
    }
  }
  for (size_t bad_at : {0u, 1023u, 1500u, 2999u}) {
    std::vector<float> in(3000, 1.0f);
    in[bad_at] = std::numeric_limits<float>::infinity();
    if (bad_at + 1 < in.size()) in.back() = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> out(in.size(), 0.0f);
    EXPECT_EQ(CopyFindNonFinite(in.data(), out), static_cast<ptrdiff_t>(bad_at));
    EXPECT_EQ(out[2998], 1.0f) << bad_at;  // copied past the first bad value
    EXPECT_TRUE(std::isinf(out[bad_at]));
    std::vector<unsigned char> stored(1 + sizeof(float) * in.size());
    EXPECT_EQ(StoreFindNonFinite(in, stored.data() + 1), static_cast<ptrdiff_t>(bad_at));
    EXPECT_EQ(std::memcmp(stored.data() + 1, in.data(), sizeof(float) * in.size()), 0) << bad_at;
  }
}

// AddInto and Subtract: blocks of 1024 and a tail, each value the plain fp32 operation
// (the same bits as the scalar loop, signed zeros and subnormals included).
TEST(Fp32BytesTest, AddIntoAndSubtractAreElementwiseOverBlocksAndTails) {
  for (size_t n : {0u, 1u, 1023u, 1024u, 1025u, 3000u}) {
    std::vector<float> a(n), b(n);
    for (size_t i = 0; i < n; ++i) {
      a[i] = std::sin(0.1f * static_cast<float>(i)) * 1e3f;
      b[i] = i % 7 == 0 ? -0.0f : (i % 11 == 0 ? 1e-41f : std::cos(0.3f * static_cast<float>(i)));
    }
    std::vector<float> sum = a;
    AddInto(sum, b);
    std::vector<float> diff(n, 42.0f);
    Subtract(a, b, diff);
    for (size_t i = 0; i < n; ++i) {
      const float want_sum = a[i] + b[i];
      const float want_diff = a[i] - b[i];
      EXPECT_EQ(std::memcmp(&sum[i], &want_sum, sizeof(float)), 0) << n << " " << i;
      EXPECT_EQ(std::memcmp(&diff[i], &want_diff, sizeof(float)), 0) << n << " " << i;
    }
  }
}

// AddFiniteKeep and AddFiniteKeepBytes write every sum to what is held and to the copy,
// over whole blocks and the tail, and say false when any sum (in a block or in the tail)
// is not finite; the byte form reads the change at any alignment.
TEST(Fp32BytesTest, AddFiniteKeepWritesEverySumTwiceAndChecksThem) {
  for (size_t n : {0u, 1u, 1023u, 1024u, 1025u, 3000u}) {
    std::vector<float> base(n), change(n);
    for (size_t i = 0; i < n; ++i) {
      base[i] = std::sin(0.1f * static_cast<float>(i)) * 1e3f;
      change[i] = i % 7 == 0 ? -0.0f : std::cos(0.3f * static_cast<float>(i));
    }
    // Overflow at `bad` (none, in the first block, in the tail).
    for (size_t bad : {n, size_t{5}, n - 1}) {
      if (bad > n || (bad == 5 && n <= 5)) continue;
      std::vector<float> held = base, c = change;
      if (bad < n) {
        held[bad] = std::numeric_limits<float>::max();
        c[bad] = std::numeric_limits<float>::max();
      }
      const std::vector<float> before = held;
      for (int as_bytes = 0; as_bytes < 2; ++as_bytes) {
        std::vector<float> h = before, copy(n, 42.0f);
        std::vector<unsigned char> bytes(n * sizeof(float) + 1);
        if (n > 0) std::memcpy(bytes.data() + 1, c.data(), n * sizeof(float));
        const bool finite = as_bytes ? AddFiniteKeepBytes(h, bytes.data() + 1, copy)
                                     : AddFiniteKeep(h, c, copy);
        EXPECT_EQ(finite, bad == n) << n << " " << bad << " " << as_bytes;
        for (size_t i = 0; i < n; ++i) {
          const float want = before[i] + c[i];
          EXPECT_EQ(std::memcmp(&h[i], &want, sizeof(float)), 0) << n << " " << i;
          EXPECT_EQ(std::memcmp(&copy[i], &want, sizeof(float)), 0) << n << " " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace ps::core
