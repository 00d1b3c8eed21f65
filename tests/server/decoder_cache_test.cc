#include "server/decoder_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "absl/strings/str_cat.h"

namespace ps::server {
namespace {

using ::testing::HasSubstr;

// The cache held 64 specs without eviction: once a client had sent 64 distinct ones,
// every other codec was refused ("too many distinct codecs").
TEST(DecoderCacheTest, ManyDistinctSpecsEvictInsteadOfLockingOthersOut) {
  DecoderCache cache(8);
  for (int k = 1; k <= 100; ++k) ASSERT_TRUE(cache.Get(absl::StrCat("qsgd(s=", k, ")")).ok());
  EXPECT_EQ(cache.size(), 8u);
  EXPECT_EQ(cache.evicted(), 92u);
  absl::StatusOr<std::shared_ptr<const codecs::Codec>> fp32 = cache.Get("fp32");
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  EXPECT_EQ((*fp32)->spec(), "fp32");
}

TEST(DecoderCacheTest, RecentlyUsedSpecsStayAndEvictedDecodersStayValid) {
  DecoderCache cache(2);
  std::shared_ptr<const codecs::Codec> fp16 = *cache.Get("fp16");
  ASSERT_TRUE(cache.Get("int8").ok());
  EXPECT_EQ(*cache.Get("fp16"), fp16);  // a hit, now the most recent
  ASSERT_TRUE(cache.Get("bf16").ok());  // evicts int8, the least recent
  EXPECT_EQ(*cache.Get("fp16"), fp16);
  const uint64_t made = cache.made();
  ASSERT_TRUE(cache.Get("int8").ok());  // made again
  EXPECT_EQ(cache.made(), made + 1);
  // fp16 is evicted by now, yet the pointer a push still holds works.
  ASSERT_TRUE(cache.Get("fp32").ok());
  std::string payload;
  ASSERT_TRUE((*codecs::MakeCodec("fp16"))->Encode(std::vector<float>{1, 2}, &payload).ok());
  std::vector<float> out(2);
  EXPECT_TRUE(fp16->Decode(payload, out).ok());
}

TEST(DecoderCacheTest, BadAndOversizedSpecsAreRefusedWithBoundedMessages) {
  DecoderCache cache(4);
  absl::StatusOr<std::shared_ptr<const codecs::Codec>> bad = cache.Get("nonsense(1)");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string huge(1 << 20, 'q');
  bad = cache.Get(huge);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("limit"));
  EXPECT_LT(bad.status().message().size(), 256u);
  EXPECT_EQ(cache.size(), 0u);
}

TEST(DecoderCacheTest, ConcurrentGetsAgree) {
  DecoderCache cache(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) {
        EXPECT_TRUE(cache.Get(absl::StrCat("qsgd(s=", (i + t) % 6 + 1, ")")).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_LE(cache.size(), 4u);
}

}  // namespace
}  // namespace ps::server
