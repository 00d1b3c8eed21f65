// gpu::CudaDevice in every build: the same answer on every call, a device described for
// logs where there is one, and the reason where there is none (a build without CUDA, or
// a machine without a device).
#include "gpu/cuda_device.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ps::gpu {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(CudaDeviceTest, AnswersOnceAndSaysWhichDeviceOrWhyNone) {
  const absl::StatusOr<std::string> first = CudaDevice();
  EXPECT_EQ(CudaDevice().status(), first.status());
  if (first.ok()) {
    EXPECT_TRUE(BuiltWithCuda());
    EXPECT_EQ(*CudaDevice(), *first);
    EXPECT_THAT(*first, StartsWith("cuda:"));
    EXPECT_THAT(*first, HasSubstr(" GiB)"));
    return;
  }
  EXPECT_EQ(first.status().code(), absl::StatusCode::kUnavailable);
  const std::string reason(first.status().message());
  if (!BuiltWithCuda()) {
    EXPECT_THAT(reason, StartsWith("this build has no CUDA kernels"));
  } else {
    EXPECT_THAT(reason, HasSubstr("CUDA device"));
  }
}

}  // namespace
}  // namespace ps::gpu
