// Aggregation on a CUDA device against the CPU (docs/gpu.md, "Agreement with the CPU"):
// coordinate rules and plans applied bit for bit, Gram matrices within the documented
// tolerance, and inputs given in device memory. Skipped, saying why, where no device
// exists.
#include <cuda_runtime_api.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "aggregators/aggregator.h"
#include "core/device.h"
#include "gpu/cuda_device.h"
#include "gtest/gtest.h"
#include "tests/aggregators/test_util.h"

namespace ps::aggregators {
namespace {

using test::Vectors;

class OnCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::StatusOr<std::string> device = gpu::CudaDevice();
    if (!device.ok()) {
      GTEST_SKIP() << device.status().message() << ": GPU aggregation tests skipped";
    }
  }

  static std::unique_ptr<Aggregator> Make(const std::string& spec, int n, int f, core::Device device) {
    AggregatorOptions options = test::Options(n, f);
    options.device = device;
    options.clipping_tau = 2.0;
    absl::StatusOr<std::unique_ptr<Aggregator>> rule = MakeAggregator(spec, options);
    EXPECT_TRUE(rule.ok()) << rule.status();
    return rule.ok() ? *std::move(rule) : nullptr;
  }
};

// The aggregator made for kCuda runs on the device: a fallback to the CPU (cuBLAS not
// found, say) would otherwise compare the CPU with itself and pass.
#define PS_ASSERT_ON_DEVICE(gpu)  \
  ASSERT_TRUE((gpu) != nullptr);  \
  ASSERT_NE((gpu)->device(), "cpu") << (gpu)->device_note()

// Honest inputs near a centre and f far ones: every distance-based choice is clear.
Vectors Separated(size_t n, size_t f, size_t d, uint32_t seed) {
  Vectors v = test::RandomVectors(n, d, seed);
  for (size_t i = n - f; i < n; ++i) {
    for (float& x : v[i]) x = 40.0f + 3.0f * x;
  }
  return v;
}

size_t BitMismatches(const std::vector<float>& a, const std::vector<float>& b) {
  size_t m = 0;
  for (size_t c = 0; c < a.size(); ++c) m += std::bit_cast<uint32_t>(a[c]) != std::bit_cast<uint32_t>(b[c]);
  return m;
}

TEST_F(OnCuda, RulesMatchTheCpuBitForBit) {
  struct Case {
    const char* spec;
    int n;
    int f;
  };
  // 8/16/32/64 rows take the register kernels, 100 the general path.
  for (const Case& c : {Case{"mean", 16, 3}, Case{"median", 16, 3}, Case{"median", 100, 20},
                        Case{"trimmed_mean", 16, 3}, Case{"trimmed_mean", 64, 15},
                        Case{"meamed", 16, 3}, Case{"meamed", 100, 20}, Case{"phocas", 31, 7},
                        Case{"krum", 16, 3}, Case{"multi_krum", 64, 15}, Case{"bulyan", 19, 4},
                        Case{"nnm+trimmed_mean", 12, 2}, Case{"mda", 8, 2},
                        Case{"bucketing(s=2)+median", 20, 2}}) {
    const Vectors inputs = Separated(static_cast<size_t>(c.n), static_cast<size_t>(c.f), 100003, 11);
    auto cpu = Make(c.spec, c.n, c.f, core::Device::kCpu);
    auto gpu = Make(c.spec, c.n, c.f, core::Device::kCuda);
    ASSERT_TRUE(cpu != nullptr);
    PS_ASSERT_ON_DEVICE(gpu);
    const absl::StatusOr<std::vector<float>> want = test::Run(*cpu, inputs);
    const absl::StatusOr<std::vector<float>> got = test::Run(*gpu, inputs);
    ASSERT_TRUE(want.ok() && got.ok()) << c.spec;
    EXPECT_EQ(BitMismatches(*got, *want), 0u) << c.spec << " n=" << c.n;
  }
}

TEST_F(OnCuda, GramMatrixWithinTheDocumentedTolerance) {
  const size_t n = 24;
  const size_t d = 3 * 4096 + 1234;  // full chunks and a tail
  const Vectors inputs = test::RandomVectors(n, d, 5);
  auto cpu = Make("krum", static_cast<int>(n), 3, core::Device::kCpu);
  auto gpu = Make("krum", static_cast<int>(n), 3, core::Device::kCuda);
  ASSERT_TRUE(cpu != nullptr);
  PS_ASSERT_ON_DEVICE(gpu);
  const std::vector<const float*> ptrs = test::Pointers(inputs);
  std::vector<double> want(n * n, 0.0), got(n * n, 0.0);
  ASSERT_TRUE(cpu->AccumulateGram(ptrs, d, {}, want).ok());
  ASSERT_TRUE(gpu->AccumulateGram(ptrs, d, {}, got).ok());
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      const double scale = std::sqrt(want[i * n + i] * want[j * n + j]);
      EXPECT_LE(std::abs(got[i * n + j] - want[i * n + j]), 1e-5 * scale) << i << "," << j;
    }
  }
}

TEST_F(OnCuda, ContinuousRulesWithinTolerance) {
  for (const char* spec : {"geometric_median", "centered_clipping"}) {
    const Vectors inputs = Separated(9, 2, 50000, 3);
    auto cpu = Make(spec, 9, 2, core::Device::kCpu);
    auto gpu = Make(spec, 9, 2, core::Device::kCuda);
    ASSERT_TRUE(cpu != nullptr);
    PS_ASSERT_ON_DEVICE(gpu);
    const absl::StatusOr<std::vector<float>> want = test::Run(*cpu, inputs);
    const absl::StatusOr<std::vector<float>> got = test::Run(*gpu, inputs);
    ASSERT_TRUE(want.ok() && got.ok());
    for (size_t c = 0; c < want->size(); ++c) {
      ASSERT_NEAR((*got)[c], (*want)[c], 1e-4f * (1.0f + std::abs((*want)[c]))) << spec << " at " << c;
    }
  }
}

TEST_F(OnCuda, SignMajorityWithinOneUlpOfTheScale) {
  const Vectors inputs = test::RandomVectors(7, 70001, 8);
  auto cpu = Make("sign_majority", 7, 1, core::Device::kCpu);
  auto gpu = Make("sign_majority", 7, 1, core::Device::kCuda);
  ASSERT_TRUE(cpu != nullptr);
  PS_ASSERT_ON_DEVICE(gpu);
  const absl::StatusOr<std::vector<float>> want = test::Run(*cpu, inputs);
  const absl::StatusOr<std::vector<float>> got = test::Run(*gpu, inputs);
  ASSERT_TRUE(want.ok() && got.ok());
  for (size_t c = 0; c < want->size(); ++c) {
    ASSERT_EQ(std::signbit((*got)[c]), std::signbit((*want)[c])) << c;
    ASSERT_LE(std::abs((*got)[c] - (*want)[c]), std::abs((*want)[c]) * 2e-7f) << c;
  }
}

// Inputs already on the device, as one allocation (no staging copy) and as separate
// ones, with the output there too.
TEST_F(OnCuda, DeviceMemoryGivesTheHostResult) {
  const size_t n = 16;
  const size_t d = 65537;
  const Vectors inputs = Separated(n, 3, d, 21);
  for (const char* spec : {"krum", "trimmed_mean"}) {
    auto gpu = Make(spec, static_cast<int>(n), 3, core::Device::kCuda);
    PS_ASSERT_ON_DEVICE(gpu);
    const absl::StatusOr<std::vector<float>> want = test::Run(*gpu, inputs);
    ASSERT_TRUE(want.ok());
    for (bool one_allocation : {true, false}) {
      std::vector<float*> owned;
      std::vector<const float*> rows(n);
      float* block = nullptr;
      if (one_allocation) {
        ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&block), n * d * sizeof(float)), cudaSuccess);
        for (size_t i = 0; i < n; ++i) rows[i] = block + i * d;
      } else {
        for (size_t i = 0; i < n; ++i) {
          float* p = nullptr;
          ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), d * sizeof(float)), cudaSuccess);
          owned.push_back(p);
          rows[i] = p;
        }
      }
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(cudaMemcpy(const_cast<float*>(rows[i]), inputs[i].data(), d * sizeof(float),
                             cudaMemcpyHostToDevice),
                  cudaSuccess);
      }
      float* out = nullptr;
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&out), d * sizeof(float)), cudaSuccess);
      AggregationContext ctx;
      ctx.device_memory = true;
      ASSERT_TRUE(gpu->Aggregate(rows, std::span<float>(out, d), ctx).ok());
      std::vector<float> got(d);
      ASSERT_EQ(cudaMemcpy(got.data(), out, d * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(BitMismatches(got, *want), 0u) << spec << (one_allocation ? " (one allocation)" : "");
      cudaFree(out);
      cudaFree(block);
      for (float* p : owned) cudaFree(p);
    }
  }
}

// Masked rounds (lossy UDP): the coordinate rules read the masks natively and give the
// CPU's bits; distance-based rules fill the missing coordinates with the median first
// and pick what the CPU picks on these separated inputs.
TEST_F(OnCuda, MaskedRoundsGiveTheCpuResult) {
  const size_t d = 100003;
  for (const char* spec : {"median", "trimmed_mean", "meamed", "mean", "krum", "nnm+median",
                           "bulyan"}) {
    const int n = std::string(spec) == "bulyan" ? 19 : 16;
    const Vectors inputs = Separated(static_cast<size_t>(n), 3, d, 31);
    std::vector<std::vector<uint8_t>> bits(static_cast<size_t>(n));
    std::vector<const uint8_t*> masks;
    std::mt19937 rng(7);
    std::bernoulli_distribution present(0.8);
    for (size_t i = 0; i < bits.size(); ++i) {
      if (i % 4 == 0) {
        masks.push_back(nullptr);
        continue;
      }
      bits[i].assign((d + 7) / 8, 0);
      for (size_t c = 0; c < d; ++c) {
        if (present(rng)) bits[i][c / 8] |= static_cast<uint8_t>(1u << (c % 8));
      }
      masks.push_back(bits[i].data());
    }
    auto cpu = Make(spec, n, 3, core::Device::kCpu);
    auto gpu = Make(spec, n, 3, core::Device::kCuda);
    ASSERT_TRUE(cpu != nullptr);
    PS_ASSERT_ON_DEVICE(gpu);
    const std::vector<const float*> ptrs = test::Pointers(inputs);
    AggregationContext ctx;
    ctx.masks = masks;
    std::vector<float> want(d), got(d);
    ASSERT_TRUE(cpu->Aggregate(ptrs, want, ctx).ok());
    ASSERT_TRUE(gpu->Aggregate(ptrs, got, ctx).ok());
    EXPECT_EQ(BitMismatches(got, want), 0u) << spec << " with masks";
  }
}

}  // namespace
}  // namespace ps::aggregators
