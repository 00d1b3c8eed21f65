// The GPU encoders (codecs/device_encoder.h) against the CPU codecs on a CUDA
// device: the same bytes over sizes at every kernel boundary, seeds and rounds (sign's
// scale within one float ulp), the CPU's refusals, and error feedback's residual on
// the device against worker_lib's host formula. Skipped where there is no device.
#include "codecs/device_encoder.h"

#include <cuda_runtime_api.h>

#include <cfloat>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gpu/cuda_device.h"
#include "gtest/gtest.h"
#include "tests/codecs/codec_test_util.h"

namespace ps::codecs {
namespace {

using ::ps::codecs::testing::ExpectSameSignPayload;
using ::ps::codecs::testing::Gaussian;
using ::ps::codecs::testing::Hex;
using ::testing::HasSubstr;

#define PS_SKIP_WITHOUT_DEVICE()                                                              \
  if (const absl::StatusOr<std::string> device = gpu::CudaDevice(); !device.ok()) {          \
    GTEST_SKIP() << "no CUDA device (" << device.status().message()                           \
                 << "): GPU codec tests skipped";                                             \
  }

// Device memory holding a copy of host values.
class DeviceValues {
 public:
  explicit DeviceValues(const std::vector<float>& v) : n_(v.size()) {
    EXPECT_EQ(cudaMalloc(&p_, std::max<size_t>(4, 4 * n_)), cudaSuccess);
    if (n_ > 0) {
      EXPECT_EQ(cudaMemcpy(p_, v.data(), 4 * n_, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~DeviceValues() { cudaFree(p_); }
  const float* get() const { return static_cast<const float*>(p_); }

 private:
  void* p_ = nullptr;
  size_t n_;
};

std::vector<float> ToHost(const float* device, size_t n) {
  std::vector<float> out(n);
  if (n > 0) {
    EXPECT_EQ(cudaMemcpy(out.data(), device, 4 * n, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return out;
}

const std::vector<size_t> kSizes = {1, 2, 3, 4, 5, 7, 8, 31, 32, 33, 70, 71, 511, 512, 513,
                                    4095, 4096, 4097, 65537, (size_t{1} << 20) + 3};

const char* const kSpecs[] = {"fp16", "bf16", "sign", "terngrad", "terngrad(bucket=3)",
                              "terngrad(bucket=100000)", "3lc", "3lc(s=1.9)", "topk(0.01)",
                              "topk(0.001)+varint+fp16", "topk(0.3)+bitmap+raw",
                              "topk(0.01, method=sampled)+raw+raw", "topk(0.02)+bloom(p0)+raw",
                              "topk(0.01)+rle+polyfit", "threshold(0.5)+varint+raw", "topk(1)"};

std::vector<float> Values(size_t n, uint32_t seed) {
  std::vector<float> v = Gaussian(n, seed);
  std::mt19937 rng(seed);
  for (float& x : v) {
    if (rng() % 7 == 0) x = 0.0f;
    if (rng() % 5 == 0) x = std::round(x * 4) / 4;  // ties
  }
  return v;
}

TEST(DeviceEncoderTest, WritesTheCpuBytes) {
  PS_SKIP_WITHOUT_DEVICE();
  for (const char* spec : kSpecs) {
    for (size_t n : kSizes) {
      for (uint32_t seed : {1u, 2u}) {
        const std::vector<float> v = Values(n, seed + static_cast<uint32_t>(n));
        const DeviceValues x(v);
        const CodecOptions options{.seed = seed};
        auto encoder = DeviceEncoder::Make(spec, options, n, false);
        ASSERT_TRUE(encoder.ok()) << encoder.status();
        auto cpu = MakeCodec(spec, options);
        ASSERT_TRUE(cpu.ok());
        for (uint64_t round : {0, 5}) {
          const EncodeContext ctx{.round = round, .slice_id = 2, .worker_id = 3};
          std::string device_bytes, cpu_bytes;
          ASSERT_TRUE((*encoder)->Encode(x.get(), n, ctx, &device_bytes).ok()) << spec << " n " << n;
          ASSERT_TRUE((*cpu)->Encode(v, ctx, &cpu_bytes).ok());
          if (std::string_view(spec) == "sign") {
            ExpectSameSignPayload(device_bytes, cpu_bytes, n);
          } else {
            ASSERT_EQ(Hex(device_bytes), Hex(cpu_bytes)) << spec << " n " << n << " round " << round;
          }
        }
      }
    }
  }
}

// With and without error feedback: the CPU codec's own status (the position and the
// value), *out unchanged, and with error feedback the residual kept (the kernels write
// it over v = g + e, which the refusal must rebuild before it reads v).
TEST(DeviceEncoderTest, RefusesNonFiniteValuesAsTheCpuDoes) {
  PS_SKIP_WITHOUT_DEVICE();
  for (const bool error_feedback : {false, true}) {
    for (const char* spec : kSpecs) {
      for (const float bad : {std::numeric_limits<float>::infinity(), std::nanf("")}) {
        std::vector<float> v = Values(1000, 3);
        v[617] = bad;
        const DeviceValues x(v);
        auto encoder = DeviceEncoder::Make(spec, {}, v.size(), error_feedback);
        ASSERT_TRUE(encoder.ok()) << encoder.status();
        auto cpu = MakeCodec(spec, {});
        ASSERT_TRUE(cpu.ok());
        std::string cpu_out;
        const absl::Status expected = (*cpu)->Encode(v, {}, &cpu_out);
        ASSERT_EQ(expected.code(), absl::StatusCode::kInvalidArgument) << spec;
        std::string out = "unchanged";
        const absl::Status s = (*encoder)->Encode(x.get(), v.size(), {}, &out);
        EXPECT_EQ(s, expected) << spec << " error_feedback=" << error_feedback;
        EXPECT_THAT(s.message(), HasSubstr("value 617")) << spec;
        EXPECT_EQ(out, "unchanged");
        if (error_feedback) {
          EXPECT_EQ(ToHost((*encoder)->residual(), v.size()), std::vector<float>(v.size(), 0.0f))
              << spec << ": the residual changed";
        }
      }
    }
  }
}

// v = g + e, payload = encode(v), e = v - decode(payload), with the CPU codec on the
// host as worker_lib's TensorEncoder does it.
TEST(DeviceEncoderTest, ErrorFeedbackKeepsTheHostResidual) {
  PS_SKIP_WITHOUT_DEVICE();
  for (const char* spec : kSpecs) {
    for (size_t n : {size_t{1}, size_t{513}, size_t{70001}}) {
      const CodecOptions options{.seed = 4};
      auto encoder = DeviceEncoder::Make(spec, options, n, true);
      ASSERT_TRUE(encoder.ok()) << encoder.status();
      auto cpu = MakeCodec(spec, options);
      ASSERT_TRUE(cpu.ok());
      std::vector<float> e(n, 0.0f);
      for (uint64_t round = 0; round < 4; ++round) {
        const std::vector<float> g = Values(n, static_cast<uint32_t>(round + 10));
        const DeviceValues x(g);
        const EncodeContext ctx{.round = round};
        std::string device_bytes, cpu_bytes;
        ASSERT_TRUE((*encoder)->Encode(x.get(), n, ctx, &device_bytes).ok());
        std::vector<float> v(n);
        for (size_t i = 0; i < n; ++i) v[i] = g[i] + e[i];
        ASSERT_TRUE((*cpu)->Encode(v, ctx, &cpu_bytes).ok());
        if (std::string_view(spec) != "sign") {
          ASSERT_EQ(Hex(device_bytes), Hex(cpu_bytes)) << spec << " round " << round;
        }
        // The residual follows the device's own payload (sign: its scale).
        std::vector<float> decoded(n);
        ASSERT_TRUE((*cpu)->Decode(device_bytes, decoded).ok());
        for (size_t i = 0; i < n; ++i) e[i] = v[i] - decoded[i];
        const std::vector<float> residual = ToHost((*encoder)->residual(), n);
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(std::bit_cast<uint32_t>(residual[i]), std::bit_cast<uint32_t>(e[i]))
              << spec << " n " << n << " round " << round << " value " << i;
        }
      }
    }
  }
}

TEST(DeviceEncoderTest, RefusesSpecsWithoutAGpuEncoder) {
  PS_SKIP_WITHOUT_DEVICE();
  auto encoder = DeviceEncoder::Make("int8", {}, 10, false);
  EXPECT_EQ(encoder.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(encoder.status().message(), HasSubstr("no GPU encoder for 'int8(bucket=512)'"));
}

}  // namespace
}  // namespace ps::codecs
