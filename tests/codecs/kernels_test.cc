// The shared codec kernels: each AVX2 kernel gives the same bits as its portable twin
// (on every size, including the scalar tails), and the portable kernels do what their
// contracts say.
#include "codecs/kernels_internal.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "tests/codecs/codec_test_util.h"

namespace ps::codecs::internal {
namespace {

using ::ps::codecs::testing::Gaussian;

// Runs f once on each kernel path and returns both results (AVX2 first); skips the
// comparison where the CPU has no AVX2.
template <typename F>
auto BothPaths(F f) {
  const bool have_avx2 = SetPortableKernelsForTesting(false);
  auto avx2 = f();
  SetPortableKernelsForTesting(true);
  auto portable = f();
  SetPortableKernelsForTesting(false);
  if (!have_avx2) avx2 = portable;
  return std::make_pair(avx2, portable);
}

const size_t kSizes[] = {0, 1, 3, 7, 8, 9, 31, 32, 33, 63, 64, 65, 100, 511, 4099};

std::vector<float> Data(size_t n, uint32_t seed) {
  std::vector<float> x = Gaussian(n, seed);
  // Values on every boundary the kernels compare against.
  const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, -0.5f};
  for (size_t i = 0; i < n && i < 6; ++i) x[i * 5 % n] = special[i];
  return x;
}

TEST(CodecKernelsTest, BothPathsAgreeOnEveryKernel) {
  for (size_t n : kSizes) {
    const std::vector<float> x = Data(n, static_cast<uint32_t>(n) + 1);
    SCOPED_TRACE(::testing::Message() << "n = " << n);
    {
      auto [a, b] = BothPaths([&] { return MaxAbsBits(x.data(), n); });
      EXPECT_EQ(a, b);
    }
    {
      const std::vector<float> y = Data(n, static_cast<uint32_t>(n) + 7);
      auto [a, b] = BothPaths([&] { return MaxAbsDiffBits(x.data(), y.data(), n); });
      EXPECT_EQ(a, b);
      std::vector<float> d(n);
      for (size_t i = 0; i < n; ++i) d[i] = x[i] - y[i];
      EXPECT_EQ(a, MaxAbsBits(d.data(), n));  // the differences' own maximum
    }
    {
      auto [a, b] = BothPaths([&] { return SumAbs(x.data(), n); });
      EXPECT_EQ(a, b);  // bit-identical: the same partial sums in the same order
    }
    {
      auto [a, b] = BothPaths([&] {
        std::vector<unsigned char> bits((n + 7) / 8, 0xff);
        PackSignBits(x.data(), n, bits.data());
        return bits;
      });
      EXPECT_EQ(a, b);
    }
    {
      auto [a, b] = BothPaths([&] {
        std::vector<uint8_t> d(n);
        TernaryDigits(x.data(), n, 0.5f, d.data());
        return d;
      });
      EXPECT_EQ(a, b);
    }
    {
      auto [a, b] = BothPaths([&] {
        std::vector<int8_t> q(n);
        QuantizeInt8(x.data(), n, 127.0f / 3.0f, 0x1234u, 77, q.data());
        return q;
      });
      EXPECT_EQ(a, b);
    }
    {
      auto [a, b] = BothPaths([&] {
        std::vector<uint8_t> c(n);
        TernarizeStochastic(x.data(), n, 1.0f / 3.0f, 0x9876u, 5, c.data());
        return c;
      });
      EXPECT_EQ(a, b);
    }
    std::vector<int8_t> q(n);
    for (size_t i = 0; i < n; ++i) q[i] = static_cast<int8_t>(static_cast<int>(i * 37 % 255) - 127);
    {
      auto [a, b] = BothPaths([&] {
        std::vector<float> out(n);
        DequantizeInt8(q.data(), n, 0.25f, out.data());
        return out;
      });
      EXPECT_EQ(a, b);
    }
    {
      std::vector<unsigned char> bits((n + 7) / 8);
      for (size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<unsigned char>(i * 91 + 7);
      auto [a, b] = BothPaths([&] {
        std::vector<float> out(n);
        UnpackSignBits(bits.data(), n, 2.0f, -2.0f, out.data());
        return out;
      });
      EXPECT_EQ(a, b);
    }
    {
      std::vector<unsigned char> packed((n + 3) / 4 + 1);
      for (size_t i = 0; i < packed.size(); ++i) {
        // Codes 0..2 only: three bases of 0 to 2 per byte, the fourth code 0 or 1.
        packed[i] = static_cast<unsigned char>((i % 3) | ((i * 7 % 3) << 2) | ((i * 5 % 3) << 4) |
                                               ((i % 2) << 6));
      }
      for (size_t begin : {size_t{0}, size_t{1}, size_t{3}}) {
        if (begin > n) continue;
        auto [a, b] = BothPaths([&] {
          std::vector<float> out(n, 7.0f);
          UnpackTernary2(packed.data(), begin, n, 1.5f, out.data());
          return out;
        });
        EXPECT_EQ(a, b) << "begin = " << begin;
      }
    }
  }
}

TEST(CodecKernelsTest, SignBitsAreLessThanZeroSoNegativeZeroIsPositive) {
  const std::vector<float> x = {-1.0f, -0.0f, 0.0f, 2.0f, -3.0f, 1e-30f, -1e-30f, 5.0f, -7.0f};
  for (bool portable : {false, true}) {
    SetPortableKernelsForTesting(portable);
    std::vector<unsigned char> bits(2, 0xff);
    PackSignBits(x.data(), x.size(), bits.data());
    EXPECT_EQ(bits[0], 0b01010001);
    EXPECT_EQ(bits[1], 0b1);  // padding bits zero
  }
  SetPortableKernelsForTesting(false);
}

TEST(CodecKernelsTest, StochasticInt8RoundsToANeighbourUnbiased) {
  // x * inv = 10.25: q is 10 or 11, 11 about a quarter of the time.
  const size_t n = 20000;
  const std::vector<float> x(n, 10.25f);
  std::vector<int8_t> q(n);
  QuantizeInt8(x.data(), n, 1.0f, 42, 0, q.data());
  size_t up = 0;
  for (int8_t v : q) {
    ASSERT_TRUE(v == 10 || v == 11) << int{v};
    up += v == 11;
  }
  // Binomial(20000, 0.25): sd 61; 6 sd.
  EXPECT_NEAR(static_cast<double>(up), 5000.0, 370.0);
}

TEST(CodecKernelsTest, Int8QuantizationClampsToTheSymmetricRange) {
  const std::vector<float> x = {127.9f, -127.9f, 200.0f, -200.0f};
  std::vector<int8_t> q(x.size());
  QuantizeInt8(x.data(), x.size(), 1.0f, 1, 0, q.data());
  EXPECT_EQ(q, (std::vector<int8_t>{127, -127, 127, -127}));
  EXPECT_FALSE(HasInt8Minimum(q.data(), q.size()));
  q[2] = -128;
  EXPECT_TRUE(HasInt8Minimum(q.data(), q.size()));
}

TEST(CodecKernelsTest, TernarizeKeepsWithProbabilityProportionalToMagnitude) {
  const size_t n = 20000;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = i % 2 ? -0.3f : 1.0f;  // inv = 1: keep 30% and 100%
  std::vector<uint8_t> c(n);
  TernarizeStochastic(x.data(), n, 1.0f, 3, 0, c.data());
  size_t kept_negative = 0;
  for (size_t i = 0; i < n; ++i) {
    if (i % 2 == 0) {
      ASSERT_EQ(c[i], 1) << i;
    } else {
      ASSERT_TRUE(c[i] == 0 || c[i] == 2) << i;
      kept_negative += c[i] == 2;
    }
  }
  EXPECT_NEAR(static_cast<double>(kept_negative), 3000.0, 6 * std::sqrt(10000 * 0.3 * 0.7));
}

TEST(CodecKernelsTest, RoundingUniformIsUniformAndDependsOnSeedAndIndex) {
  std::vector<int> histogram(16);
  for (uint32_t i = 0; i < 160000; ++i) {
    const float u = RoundingUniform(0xabcdef, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    ++histogram[static_cast<size_t>(u * 16)];
  }
  for (int count : histogram) EXPECT_NEAR(count, 10000, 600);  // sd 97
  EXPECT_NE(RoundingUniform(1, 5), RoundingUniform(2, 5));
  EXPECT_NE(RoundingUniform(1, 5), RoundingUniform(1, 6));
}

TEST(CodecKernelsTest, PackCodes2AndFindCode3) {
  const std::vector<uint8_t> codes = {1, 2, 0, 1, 2, 0, 0, 0};  // padded to 8
  std::vector<unsigned char> packed(2);
  PackCodes2(codes.data(), 5, packed.data());
  EXPECT_EQ(packed[0], 0x49);  // 1 | 2 << 2 | 0 << 4 | 1 << 6
  EXPECT_EQ(packed[1], 0x02);
  EXPECT_EQ(FindCode3(packed.data(), 5), -1);
  std::vector<unsigned char> big(40, 0x55);  // every code 1
  EXPECT_EQ(FindCode3(big.data(), 160), -1);
  big[33] = 0x3d;  // codes 1, 3, 3, 0 at values 132..135
  EXPECT_EQ(FindCode3(big.data(), 160), 133);
  // A 3 in the padding of the last byte is not a value's code (the padding check is
  // the codec's).
  std::vector<unsigned char> tail = {0x00, 0xc0};
  EXPECT_EQ(FindCode3(tail.data(), 7), -1);
  EXPECT_EQ(FindCode3(tail.data(), 8), 7);
}

}  // namespace
}  // namespace ps::codecs::internal
