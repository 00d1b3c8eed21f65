#include "net/scratch_buffer.h"

#include <cstring>

#include <gtest/gtest.h>

namespace ps::net {
namespace {

constexpr size_t kLarge = 4 * ScratchBuffer::kKeepBytes;

TEST(ScratchBufferTest, GrowsToTheLargestTakeAndKeepsIt) {
  ScratchBuffer b;
  EXPECT_EQ(b.Take(0).size(), 0u);
  const std::span<char> first = b.Take(100);
  ASSERT_EQ(first.size(), 100u);
  std::memset(first.data(), 'x', first.size());
  const std::span<char> smaller = b.Take(60);
  EXPECT_EQ(smaller.data(), first.data());
  EXPECT_EQ(b.view(), std::string(60, 'x'));
  EXPECT_EQ(b.Take(kLarge).size(), kLarge);
  EXPECT_EQ(b.capacity(), kLarge);
  EXPECT_EQ(b.Take(kLarge / 2).size(), kLarge / 2);
  EXPECT_EQ(b.capacity(), kLarge);
}

TEST(ScratchBufferTest, GivesMemoryBackAfterARunOfSmallTakes) {
  ScratchBuffer b;
  b.Take(kLarge);
  for (uint32_t i = 1; i < ScratchBuffer::kReleaseAfter; ++i) {
    EXPECT_EQ(b.Take(1000).size(), 1000u);
    EXPECT_EQ(b.capacity(), kLarge) << "take " << i;
  }
  const std::span<char> last = b.Take(1000);
  EXPECT_EQ(last.size(), 1000u);
  EXPECT_EQ(b.capacity(), 1000u);
  std::memset(last.data(), 'y', last.size());  // the new buffer is whole (ASan's check)
  EXPECT_EQ(b.view(), std::string(1000, 'y'));
}

TEST(ScratchBufferTest, ATakeOfAQuarterOrMoreRestartsTheRun) {
  ScratchBuffer b;
  b.Take(kLarge);
  for (int round = 0; round < 3; ++round) {
    for (uint32_t i = 1; i < ScratchBuffer::kReleaseAfter; ++i) b.Take(10);
    b.Take(kLarge / 4);
  }
  EXPECT_EQ(b.capacity(), kLarge);
}

TEST(ScratchBufferTest, KeepsWhatIsWithinItsKeepBound) {
  ScratchBuffer b;
  b.Take(ScratchBuffer::kKeepBytes);
  for (uint32_t i = 0; i < 4 * ScratchBuffer::kReleaseAfter; ++i) b.Take(10);
  EXPECT_EQ(b.capacity(), ScratchBuffer::kKeepBytes);
}

}  // namespace
}  // namespace ps::net
