// powersgd: raw mode, the factor wire format, exact recovery of low-rank matrices,
// warm-start convergence, per-slice state, every decode refusal, arguments.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codecs/codec.h"
#include "codecs/wire_internal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/codecs/codec_test_util.h"

namespace ps::codecs {
namespace {

using ::ps::codecs::testing::Gaussian;
using ::ps::codecs::testing::ExpectRefused;
using ::ps::codecs::testing::MakeOk;

using ::testing::HasSubstr;

std::unique_ptr<Codec> MakePowerSgd(std::string_view spec, uint64_t seed = 7) {
  return MakeOk(spec, seed);
}

EncodeContext Matrix(uint32_t cols, uint32_t slice = 0, uint64_t round = 0) {
  EncodeContext ctx;
  ctx.matrix_cols = cols;
  ctx.slice_id = slice;
  ctx.round = round;
  return ctx;
}

std::string Encode(Codec& codec, const std::vector<float>& values, const EncodeContext& ctx) {
  std::string bytes;
  const absl::Status s = codec.Encode(values, ctx, &bytes);
  EXPECT_TRUE(s.ok()) << s;
  return bytes;
}

std::vector<float> Decoded(const Codec& codec, const std::string& bytes, size_t n) {
  std::vector<float> out(n, NAN);
  const absl::Status s = codec.Decode(bytes, out);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

double RelError(const std::vector<float>& x, const std::vector<float>& y) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (double{x[i]} - y[i]) * (double{x[i]} - y[i]);
    den += double{x[i]} * x[i];
  }
  return std::sqrt(num / den);
}

// rows x cols, sum_k sigma[k] u_k v_k^T with orthonormal u_k, v_k (Gram-Schmidt on
// Gaussian vectors), so the best rank-r error is known.
std::vector<float> SpectralMatrix(size_t rows, size_t cols, const std::vector<double>& sigma,
                                  uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  auto basis = [&](size_t dim) {
    std::vector<std::vector<double>> b;
    for (size_t k = 0; k < sigma.size(); ++k) {
      std::vector<double> v(dim);
      for (double& x : v) x = normal(rng);
      for (const auto& u : b) {
        double d = 0;
        for (size_t i = 0; i < dim; ++i) d += u[i] * v[i];
        for (size_t i = 0; i < dim; ++i) v[i] -= d * u[i];
      }
      double norm = 0;
      for (double x : v) norm += x * x;
      for (double& x : v) x /= std::sqrt(norm);
      b.push_back(v);
    }
    return b;
  };
  const auto u = basis(rows);
  const auto v = basis(cols);
  std::vector<float> m(rows * cols);
  for (size_t i = 0; i < rows; ++i) {
    for (size_t j = 0; j < cols; ++j) {
      double x = 0;
      for (size_t k = 0; k < sigma.size(); ++k) x += sigma[k] * u[k][i] * v[k][j];
      m[i * cols + j] = static_cast<float>(x);
    }
  }
  return m;
}

float F32At(const std::string& bytes, size_t offset) {
  float v;
  std::memcpy(&v, bytes.data() + offset, 4);
  return v;
}

TEST(PowerSgdTest, SendsVectorsRaw) {
  auto codec = MakePowerSgd("powersgd");
  const std::vector<float> values = {1.0f, -2.5f};
  const std::string bytes = Encode(*codec, values, EncodeContext{});
  EXPECT_EQ(bytes, std::string("\x09\x00\x02\x00\x00\x80\x3f\x00\x00\x20\xc0", 11));
  EXPECT_EQ(Decoded(*codec, bytes, 2), values);
}

TEST(PowerSgdTest, SendsRawWhenTheShapeDoesNotFitOrFactorsAreNotSmaller) {
  auto codec = MakePowerSgd("powersgd(rank=4)");
  const std::vector<float> values = Gaussian(64, 1);
  for (uint32_t cols : {0u, 7u, 64u, 8u}) {
    // 7 does not divide 64; 1 x 64 needs 1 * 65 > 64 values; 8 x 8 at rank 4 needs 64.
    const std::string bytes = Encode(*codec, values, Matrix(cols));
    EXPECT_EQ(bytes[1], 0) << cols;
    EXPECT_EQ(Decoded(*codec, bytes, values.size()), values) << cols;
  }
  // 16 x 4 at rank 4 would be 80 values; rank 2 (2 * 20 = 40 < 64) is sent as factors.
  EXPECT_EQ(Encode(*codec, values, Matrix(4))[1], 0);
  EXPECT_EQ(Encode(*MakePowerSgd("powersgd(rank=2)"), values, Matrix(4))[1], 1);
}

TEST(PowerSgdTest, FactorWireFormatDecodesToPTimesQTransposed) {
  auto codec = MakePowerSgd("powersgd(rank=2)");
  const size_t rows = 6, cols = 5;
  const std::vector<float> m = Gaussian(rows * cols, 2);
  const std::string bytes = Encode(*codec, m, Matrix(cols));
  // version, mode 1, numel 30, rows 6, cols 5, rank 2, P (6 x 2), Q (5 x 2).
  ASSERT_EQ(bytes.size(), 6 + 4 * 2 * (rows + cols));
  EXPECT_EQ(bytes.substr(0, 6), std::string("\x09\x01\x1e\x06\x05\x02", 6));
  const std::vector<float> out = Decoded(*codec, bytes, m.size());
  for (size_t i = 0; i < rows; ++i) {
    for (size_t j = 0; j < cols; ++j) {
      float x = F32At(bytes, 6 + 4 * (2 * i)) * F32At(bytes, 6 + 48 + 4 * (2 * j));
      x += F32At(bytes, 6 + 4 * (2 * i + 1)) * F32At(bytes, 6 + 48 + 4 * (2 * j + 1));
      EXPECT_EQ(out[i * cols + j], x) << i << " " << j;
    }
  }
  // P has orthonormal columns.
  double dot = 0, n0 = 0, n1 = 0;
  for (size_t i = 0; i < rows; ++i) {
    const float a = F32At(bytes, 6 + 4 * (2 * i)), b = F32At(bytes, 6 + 4 * (2 * i + 1));
    dot += a * b;
    n0 += a * a;
    n1 += b * b;
  }
  EXPECT_NEAR(dot, 0, 1e-6);
  EXPECT_NEAR(n0, 1, 1e-6);
  EXPECT_NEAR(n1, 1, 1e-6);
}

TEST(PowerSgdTest, RecoversALowRankMatrixExactly) {
  for (const auto& [spec, true_rank] : std::vector<std::pair<std::string, size_t>>{
           {"powersgd(rank=3)", 3}, {"powersgd(rank=4)", 2}}) {
    // rank 4 on a rank-2 matrix: two columns of P are re-drawn (M Q has rank 2).
    auto codec = MakePowerSgd(spec);
    const std::vector<double> sigma = true_rank == 3 ? std::vector<double>{5, 2, 0.5}
                                                     : std::vector<double>{3, 1};
    const std::vector<float> m = SpectralMatrix(40, 30, sigma, 3);
    const std::string bytes = Encode(*codec, m, Matrix(30));
    ASSERT_EQ(bytes[1], 1);
    EXPECT_LT(RelError(m, Decoded(*codec, bytes, m.size())), 1e-5) << spec;
  }
}

TEST(PowerSgdTest, WarmStartConvergesToTheBestRankRApproximation) {
  auto codec = MakePowerSgd("powersgd(rank=2)");
  const std::vector<double> sigma = {10, 6, 4, 3.5, 1, 0.5};
  const std::vector<float> m = SpectralMatrix(50, 40, sigma, 4);
  double total = 0, tail = 0;
  for (size_t k = 0; k < sigma.size(); ++k) total += sigma[k] * sigma[k];
  for (size_t k = 2; k < sigma.size(); ++k) tail += sigma[k] * sigma[k];
  const double best = std::sqrt(tail / total);
  std::vector<double> errors;
  for (uint64_t round = 0; round < 30; ++round) {
    const std::string bytes = Encode(*codec, m, Matrix(40, 0, round));
    errors.push_back(RelError(m, Decoded(*codec, bytes, m.size())));
  }
  EXPECT_GT(errors.front(), best * 1.05);  // a random start is not yet optimal
  for (size_t i = 1; i < errors.size(); ++i) EXPECT_LE(errors[i], errors[i - 1] + 1e-6) << i;
  EXPECT_NEAR(errors.back(), best, best * 1e-3);
  // Without the warm start (a fresh codec per round) the error does not fall.
  EXPECT_GT(
      RelError(m, Decoded(*codec, Encode(*MakePowerSgd("powersgd(rank=2)"), m, Matrix(40, 0, 29)),
                          m.size())),
      best * 1.05);
}

TEST(PowerSgdTest, KeepsStatePerSliceAndRestartsOnShapeChange) {
  const std::vector<float> a = Gaussian(12 * 10, 5);
  const std::vector<float> b = Gaussian(8 * 16, 6);
  auto shared = MakePowerSgd("powersgd(rank=2)");
  auto only_a = MakePowerSgd("powersgd(rank=2)");
  auto only_b = MakePowerSgd("powersgd(rank=2)");
  for (uint64_t round = 0; round < 3; ++round) {
    EXPECT_EQ(Encode(*shared, a, Matrix(10, 1, round)), Encode(*only_a, a, Matrix(10, 1, round)));
    EXPECT_EQ(Encode(*shared, b, Matrix(16, 2, round)), Encode(*only_b, b, Matrix(16, 2, round)));
  }
  // Slice 1 now arrives as 6 x 20: a fresh start, as in a new codec.
  EXPECT_EQ(Encode(*shared, a, Matrix(20, 1, 3)),
            Encode(*MakePowerSgd("powersgd(rank=2)"), a, Matrix(20, 1, 3)));
  // Slice 2 keeps its state: the same bytes as the codec that only saw slice 2.
  EXPECT_EQ(Encode(*shared, b, Matrix(16, 2, 3)), Encode(*only_b, b, Matrix(16, 2, 3)));
}

TEST(PowerSgdTest, SeedChoosesTheInitialQ) {
  const std::vector<float> m = Gaussian(20 * 20, 8);
  EXPECT_EQ(Encode(*MakePowerSgd("powersgd", 1), m, Matrix(20)),
            Encode(*MakePowerSgd("powersgd", 1), m, Matrix(20)));
  EXPECT_NE(Encode(*MakePowerSgd("powersgd", 1), m, Matrix(20)),
            Encode(*MakePowerSgd("powersgd", 2), m, Matrix(20)));
}

TEST(PowerSgdTest, ZeroMatrixDecodesToZeros) {
  auto codec = MakePowerSgd("powersgd");
  const std::vector<float> zeros(30 * 20, 0.0f);
  for (uint64_t round = 0; round < 2; ++round) {
    const std::string bytes = Encode(*codec, zeros, Matrix(20, 0, round));
    ASSERT_EQ(bytes[1], 1);
    for (float v : Decoded(*codec, bytes, zeros.size())) EXPECT_EQ(v, 0.0f);
  }
}

TEST(PowerSgdTest, FallsBackToRawWhenTheProductWouldOverflow) {
  auto codec = MakePowerSgd("powersgd(rank=1)");
  std::vector<float> m(16 * 16, 3e38f);
  m[5] = -FLT_MAX;
  const std::string bytes = Encode(*codec, m, Matrix(16));
  EXPECT_EQ(bytes[1], 0);
  EXPECT_EQ(Decoded(*codec, bytes, m.size()), m);
}

// ---- decode refusals ----

std::string FactorPayload(uint64_t numel, uint64_t rows, uint64_t cols, uint64_t rank,
                          size_t floats, float value = 0.5f) {
  std::string out = "\x09\x01";
  internal::PutVarint(&out, numel);
  internal::PutVarint(&out, rows);
  internal::PutVarint(&out, cols);
  internal::PutVarint(&out, rank);
  for (size_t i = 0; i < floats; ++i) internal::PutF32(&out, value);
  return out;
}

TEST(PowerSgdDecodeTest, RefusesBadHeaders) {
  auto codec = MakePowerSgd("powersgd");
  ExpectRefused(*codec, "", 4, "powersgd: empty payload");
  ExpectRefused(*codec, "\x02", 4,
                "powersgd: payload in the fp16 format (2), expected the powersgd format (9)");
  ExpectRefused(*codec, std::string("\x09\x02\x04", 3), 4,
                "powersgd: unknown mode 2 (0: raw, 1: factors)");
  ExpectRefused(*codec, std::string("\x09\x00\x05", 3), 4,
                "powersgd: payload is for 5 values, the slice has 4");
  ExpectRefused(*codec, FactorPayload(100, 9, 11, 1, 20), 100,
                "powersgd: a 9 x 11 matrix does not have 100 values");
  ExpectRefused(*codec, FactorPayload(100, 0, 11, 1, 20), 100,
                "powersgd: a 0 x 11 matrix does not have 100 values");
  ExpectRefused(*codec, FactorPayload(100, 10, 10, 0, 20), 100,
                "powersgd: rank 0 outside [1, 10] for a 10 x 10 matrix");
  ExpectRefused(*codec, FactorPayload(100, 50, 2, 3, 20), 100,
                "powersgd: rank 3 outside [1, 2] for a 50 x 2 matrix");
  ExpectRefused(*codec, FactorPayload(10000, 100, 100, 65, 20), 10000,
                "powersgd: rank 65 outside [1, 64] for a 100 x 100 matrix");
  ExpectRefused(*codec, FactorPayload(100, 10, 10, 5, 100), 100,
                "powersgd: rank 5 factors of a 10 x 10 matrix are not smaller than the matrix");
}

TEST(PowerSgdDecodeTest, RefusesWrongSizes) {
  auto codec = MakePowerSgd("powersgd");
  ExpectRefused(*codec, std::string("\x09\x00\x02\x00\x00\x80\x3f", 7), 2,
                "powersgd: payload ends inside raw values at byte 3 (needs 8, has 4)");
  ExpectRefused(*codec, std::string("\x09\x00\x01\x00\x00\x80\x3f\x00", 8), 1,
                "powersgd: 1 trailing bytes after raw values");
  ExpectRefused(*codec, FactorPayload(100, 10, 10, 2, 39), 100,
                "powersgd: payload ends inside Q at byte 86 (needs 80, has 76)");
  ExpectRefused(*codec, FactorPayload(100, 10, 10, 2, 41), 100,
                "powersgd: 4 trailing bytes after Q");
  std::vector<float> out(100);
  EXPECT_TRUE(codec->Decode(FactorPayload(100, 10, 10, 2, 40), out).ok());
  for (float v : out) EXPECT_EQ(v, 0.5f);  // 2 * 0.5 * 0.5
}

TEST(PowerSgdDecodeTest, RefusesNonFiniteValuesAndOverflowingProducts) {
  auto codec = MakePowerSgd("powersgd");
  ExpectRefused(*codec, std::string("\x09\x00\x01\x00\x00\x80\x7f", 7), 1,
                "powersgd: raw value 0 is not finite (inf)");
  std::string p_bad = FactorPayload(100, 10, 10, 2, 40);  // 6-byte header, P, Q
  const float nan = NAN;
  std::memcpy(&p_bad[6 + 4 * 3], &nan, 4);
  ExpectRefused(*codec, p_bad, 100, "powersgd: P[1, 1] is not finite (nan)");
  std::string q_bad = FactorPayload(100, 10, 10, 2, 40);
  const float inf = -INFINITY;
  std::memcpy(&q_bad[6 + 80 + 4 * 4], &inf, 4);
  ExpectRefused(*codec, q_bad, 100, "powersgd: Q[2, 0] is not finite (-inf)");
  // Every factor finite (1e30), every product 2e60: not a float.
  ExpectRefused(*codec, FactorPayload(100, 10, 10, 2, 40, 1e30f), 100,
                "powersgd: P Q^T overflows at [0, 0] (inf)");
}

// ---- arguments ----

TEST(PowerSgdArgsTest, CanonicalSpecAndRankRange) {
  EXPECT_EQ(MakePowerSgd("powersgd")->spec(), "powersgd(rank=4)");
  EXPECT_EQ(MakePowerSgd("powersgd(2)")->spec(), "powersgd(rank=2)");
  EXPECT_EQ(MakePowerSgd("powersgd(rank=64)")->spec(), "powersgd(rank=64)");
  EXPECT_EQ(MakeCodec("powersgd(rank=0)").status().message(),
            "codec spec 'powersgd(rank=0)': powersgd: rank must lie in [1, 64], got 0");
  EXPECT_EQ(MakeCodec("powersgd(rank=65)").status().message(),
            "codec spec 'powersgd(rank=65)': powersgd: rank must lie in [1, 64], got 65");
  EXPECT_THAT(std::string(MakeCodec("powersgd(rank=1.5)").status().message()),
              HasSubstr("rank = '1.5' is not an integer"));
  EXPECT_THAT(std::string(MakeCodec("powersgd+fp16").status().message()),
              HasSubstr("powersgd is a whole codec"));
}

}  // namespace
}  // namespace ps::codecs
