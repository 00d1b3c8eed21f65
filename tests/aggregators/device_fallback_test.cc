// device = kCuda where no CUDA device can run (a build without CUDA, or a machine
// without a GPU): the rule runs on the CPU with the CPU's results and says why
// (docs/gpu.md). Skipped where a device exists; tests/aggregators/cuda/ covers that.
#include <bit>
#include <cstdint>

#include "aggregators/aggregator.h"
#include "core/device.h"
#include "gpu/cuda_device.h"
#include "gtest/gtest.h"
#include "tests/aggregators/test_util.h"

namespace ps::aggregators {
namespace {

TEST(DeviceFallback, CudaWithoutADeviceAggregatesOnTheCpuAndSaysWhy) {
  const absl::StatusOr<std::string> device = gpu::CudaDevice();
  if (device.ok()) GTEST_SKIP() << "a CUDA device is present (" << *device << "); no fallback to test";
  AggregatorOptions cpu_options = test::Options(9, 2);
  AggregatorOptions cuda_options = cpu_options;
  cuda_options.device = core::Device::kCuda;
  const test::Vectors inputs = test::RandomVectors(9, 100, 3);
  for (const char* spec : {"krum", "trimmed_mean", "nnm+median", "centered_clipping"}) {
    absl::StatusOr<std::unique_ptr<Aggregator>> on_cpu = MakeAggregator(spec, cpu_options);
    absl::StatusOr<std::unique_ptr<Aggregator>> asked_cuda = MakeAggregator(spec, cuda_options);
    ASSERT_TRUE(on_cpu.ok() && asked_cuda.ok());
    EXPECT_EQ((*on_cpu)->device(), "cpu");
    EXPECT_EQ((*on_cpu)->device_note(), "");
    EXPECT_EQ((*asked_cuda)->device(), "cpu");
    const std::string note((*asked_cuda)->device_note());
    EXPECT_NE(note.find("device=cuda requested but unavailable ("), std::string::npos) << note;
    EXPECT_NE(note.find(std::string(device.status().message())), std::string::npos) << note;
    EXPECT_NE(note.find("aggregating on the CPU"), std::string::npos) << note;

    const absl::StatusOr<std::vector<float>> want = test::Run(**on_cpu, inputs);
    const absl::StatusOr<std::vector<float>> got = test::Run(**asked_cuda, inputs);
    ASSERT_TRUE(want.ok() && got.ok());
    for (size_t c = 0; c < want->size(); ++c) {
      ASSERT_EQ(std::bit_cast<uint32_t>((*got)[c]), std::bit_cast<uint32_t>((*want)[c])) << spec;
    }
  }
}

TEST(DeviceFallback, DeviceMemoryIsRefusedOnTheCpu) {
  AggregatorOptions options = test::Options(5, 1);
  options.device = core::Device::kCuda;
  if (gpu::CudaDevice().ok()) GTEST_SKIP() << "a CUDA device is present; no fallback to test";
  absl::StatusOr<std::unique_ptr<Aggregator>> rule = MakeAggregator("median", options);
  ASSERT_TRUE(rule.ok());
  const test::Vectors inputs = test::RandomVectors(5, 10, 1);
  const std::vector<const float*> ptrs = test::Pointers(inputs);
  std::vector<float> out(10);
  AggregationContext ctx;
  ctx.device_memory = true;
  const absl::Status status = (*rule)->Aggregate(ptrs, out, ctx);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("device memory"), absl::string_view::npos) << status;
}

TEST(Device, ParsesCpuAndCudaOnly) {
  EXPECT_EQ(*core::ParseDevice("cpu"), core::Device::kCpu);
  EXPECT_EQ(*core::ParseDevice("cuda"), core::Device::kCuda);
  const absl::StatusOr<core::Device> bad = core::ParseDevice("gpu");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "unknown device 'gpu'; expected cpu or cuda");
}

}  // namespace
}  // namespace ps::aggregators
