// Link shaping: the flag grammar and the token bucket on a hand-driven clock (the relay
// on real sockets: relay_test.cc).
#include "net/shaper.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "core/clock.h"

namespace ps::net {
namespace {

using core::ManualClock;
using core::SteadyTime;

using std::chrono::microseconds;
using std::chrono::milliseconds;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// ---------------------------------------------------------------------------------------
// ParseLinkShaping / DescribeLinkShaping.

LinkShaping MustParse(std::string_view spec) {
  auto shaping = ParseLinkShaping(spec);
  EXPECT_TRUE(shaping.ok()) << shaping.status();
  return shaping.ok() ? *shaping : LinkShaping{};
}

TEST(LinkShapingTest, EmptyAndOffAreDisabled) {
  for (std::string_view spec : {"", "off", "  off "}) {
    const LinkShaping shaping = MustParse(spec);
    EXPECT_FALSE(shaping.enabled()) << spec;
    EXPECT_EQ(shaping, LinkShaping{}) << spec;
  }
}

TEST(LinkShapingTest, RateAppliesToBothDirectionsAndUpDownOverride) {
  LinkShaping shaping = MustParse("rate=100mbps");
  EXPECT_EQ(shaping.up.mbps, 100);
  EXPECT_EQ(shaping.down.mbps, 100);
  EXPECT_EQ(shaping.up.latency, microseconds(0));
  EXPECT_EQ(shaping.up.burst_bytes, 64u * 1024);
  EXPECT_TRUE(shaping.enabled());

  shaping = MustParse("rate=1gbps,up=500kbps");
  EXPECT_EQ(shaping.up.mbps, 0.5);
  EXPECT_EQ(shaping.down.mbps, 1000);

  // One direction alone leaves the other unlimited.
  shaping = MustParse("down=1.5gbps");
  EXPECT_EQ(shaping.up.mbps, 0);
  EXPECT_FALSE(shaping.up.enabled());
  EXPECT_EQ(shaping.down.mbps, 1500);

  // Whitespace around items and case in units are forgiven.
  shaping = MustParse(" up = 100Mbps , down=2GBPS ");
  EXPECT_EQ(shaping.up.mbps, 100);
  EXPECT_EQ(shaping.down.mbps, 2000);
}

TEST(LinkShapingTest, LatencyUnits) {
  EXPECT_EQ(MustParse("latency=2ms").up.latency, microseconds(2000));
  EXPECT_EQ(MustParse("latency=2ms").down.latency, microseconds(2000));
  EXPECT_EQ(MustParse("latency=250us").up.latency, microseconds(250));
  EXPECT_EQ(MustParse("latency=1.5s").up.latency, microseconds(1'500'000));
  EXPECT_EQ(MustParse("latency=0.5ms").down.latency, microseconds(500));
  // Latency alone shapes the link without limiting its rate.
  const LinkShaping shaping = MustParse("latency=1ms");
  EXPECT_TRUE(shaping.enabled());
  EXPECT_EQ(shaping.up.mbps, 0);
}

TEST(LinkShapingTest, BurstSuffixes) {
  EXPECT_EQ(MustParse("rate=10mbps,burst=128k").up.burst_bytes, 128u * 1024);
  EXPECT_EQ(MustParse("rate=10mbps,burst=128k").down.burst_bytes, 128u * 1024);
  EXPECT_EQ(MustParse("up=10mbps,burst=1m").down.burst_bytes, 1024u * 1024);
  EXPECT_EQ(MustParse("rate=10mbps,burst=1000").up.burst_bytes, 1000u);
}

struct BadSpec {
  const char* spec;
  const char* fragment;
};

TEST(LinkShapingTest, RefusalsQuoteTheSpecAndNameTheProblem) {
  const BadSpec refusals[] = {
      {"rate", "'rate' is not key=value"},
      {"speed=1mbps", "unknown key 'speed'"},
      {"rate=1mbps,rate=2mbps", "duplicate key 'rate'"},
      {"latency=1ms,up=1mbps,latency=2ms", "duplicate key 'latency'"},
      {"rate=", "rate has no value"},
      {"rate=100", "rate '100': missing unit (kbps, mbps or gbps)"},
      {"up=100mb", "up '100mb': unknown unit 'mb'"},
      {"rate=fastmbps", "rate 'fastmbps': not a number with a unit"},
      {"rate=-5mbps", "rate must be positive"},
      {"down=0gbps", "down '0gbps': rate must be positive"},
      {"rate=nanmbps", "not a finite number"},
      {"up=infgbps", "not a finite number"},
      {"rate=1e999mbps", "number out of range"},
      {"rate=0.5kbps", "at least 1kbps"},
      {"rate=20000gbps", "at most 10000gbps"},
      {"latency=5", "latency '5': missing unit (us, ms or s)"},
      {"latency=2h", "unknown unit 'h' (us, ms or s)"},
      {"latency=-1ms", "latency must not be negative"},
      {"latency=61s", "latency must be at most 60s"},
      {"rate=1mbps,burst=64x", "burst '64x': unknown suffix 'x' (k or m)"},
      {"rate=1mbps,burst=1.5k", "unknown suffix '.5k'"},
      {"rate=1mbps,burst=0", "burst must be positive"},
      {"rate=1mbps,burst=-1k", "burst must be positive"},
      {"rate=1mbps,burst=2048m", "burst must be at most 1024m"},
      {"rate=1mbps,burst=k", "not an integer number of bytes"},
      {"burst=64k", "burst needs a rate"},
      {"latency=1ms,burst=64k", "burst needs a rate"},
      {"rate=1mbps,,latency=1ms", "empty item"},
      {"rate=1mbps,", "empty item"},
      {"off,rate=1mbps", "'off' is not key=value"},
  };
  for (const BadSpec& refusal : refusals) {
    const auto shaping = ParseLinkShaping(refusal.spec);
    ASSERT_FALSE(shaping.ok()) << refusal.spec;
    EXPECT_EQ(shaping.status().code(), absl::StatusCode::kInvalidArgument) << refusal.spec;
    const std::string message(shaping.status().message());
    EXPECT_THAT(message, StartsWith(std::string("link shaping '") + refusal.spec + "': "));
    EXPECT_THAT(message, HasSubstr(refusal.fragment));
  }
}

TEST(LinkShapingTest, DescribeReadsBackAsTheSameShaping) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "off"},
      {"rate=100mbps,latency=2ms", "up=100mbps,down=100mbps,latency=2ms"},
      {"rate=1000mbps", "up=1gbps,down=1gbps"},
      {"up=1.5gbps,down=500kbps,latency=1500us,burst=128k",
       "up=1.5gbps,down=500kbps,latency=1500us,burst=128k"},
      {"down=3mbps,burst=1000", "down=3mbps,burst=1000"},
      {"latency=1s", "latency=1s"},
      {"rate=12.5mbps,burst=2m", "up=12.5mbps,down=12.5mbps,burst=2m"},
      {"rate=10mbps,burst=64k", "up=10mbps,down=10mbps"},  // the default depth is implied
  };
  for (const auto& [spec, described] : cases) {
    const LinkShaping shaping = MustParse(spec);
    EXPECT_EQ(DescribeLinkShaping(shaping), described) << spec;
    EXPECT_EQ(MustParse(DescribeLinkShaping(shaping)), shaping) << spec;
  }
}

TEST(LinkShapingTest, DescribeSpellsOutDirectionsTheGrammarCannotTellApart) {
  LinkShaping shaping;
  shaping.up = {.mbps = 10, .latency = milliseconds(1), .burst_bytes = 1024};
  shaping.down = {.mbps = 20, .latency = milliseconds(2), .burst_bytes = 2048};
  EXPECT_EQ(DescribeLinkShaping(shaping),
            "up=10mbps,down=20mbps,up_latency=1ms,down_latency=2ms,up_burst=1k,down_burst=2k");
}

// ---------------------------------------------------------------------------------------
// TokenBucket.

TEST(ShaperBucketTest, FullBucketPassesBurstAtOnceThenChargesDebt) {
  ManualClock clock;
  TokenBucket bucket(/*bytes_per_second=*/1000, /*burst_bytes=*/1000, &clock);
  const SteadyTime t0 = clock.Now();
  EXPECT_EQ(bucket.Reserve(600), t0);
  EXPECT_EQ(bucket.Reserve(400), t0);
  EXPECT_EQ(bucket.Reserve(500), t0 + milliseconds(500));
  EXPECT_EQ(bucket.Reserve(250), t0 + milliseconds(750));
  // Once the debt is repaid the bucket is empty, not full.
  clock.Advance(milliseconds(750));
  EXPECT_EQ(bucket.Reserve(0), clock.Now());
  EXPECT_EQ(bucket.Reserve(100), clock.Now() + milliseconds(100));
}

TEST(ShaperBucketTest, ChunkLargerThanTheBucketPassesAtTheAverageRate) {
  ManualClock clock;
  TokenBucket bucket(1000, 1000, &clock);
  EXPECT_EQ(bucket.Reserve(3000), clock.Now() + std::chrono::seconds(2));
}

TEST(ShaperBucketTest, RefillIsCappedAtTheBurst) {
  ManualClock clock;
  TokenBucket bucket(1000, 500, &clock);
  EXPECT_EQ(bucket.Reserve(500), clock.Now());
  clock.Advance(std::chrono::hours(1));
  EXPECT_EQ(bucket.Reserve(500), clock.Now());
  EXPECT_EQ(bucket.Reserve(1), clock.Now() + milliseconds(1));
}

TEST(ShaperBucketTest, PartialRefillCountsElapsedTime) {
  ManualClock clock;
  TokenBucket bucket(2000, 1000, &clock);
  EXPECT_EQ(bucket.Reserve(1000), clock.Now());
  clock.Advance(milliseconds(250));  // 500 bytes back
  EXPECT_EQ(bucket.Reserve(500), clock.Now());
  EXPECT_EQ(bucket.Reserve(1000), clock.Now() + milliseconds(500));
}

TEST(ShaperBucketTest, ZeroRateIsUnlimited) {
  ManualClock clock;
  TokenBucket bucket(0, 0, &clock);
  EXPECT_EQ(bucket.Reserve(uint64_t{1} << 40), clock.Now());
}

TEST(ShaperBucketTest, ConcurrentReservesAddUp) {
  ManualClock clock;
  TokenBucket bucket(/*bytes_per_second=*/1000, /*burst_bytes=*/0, &clock);
  const SteadyTime t0 = clock.Now();
  constexpr int kThreads = 4;
  constexpr int kPerThread = 500;
  std::vector<std::vector<SteadyTime>> times(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) times[t].push_back(bucket.Reserve(1));
    });
  }
  for (auto& thread : threads) thread.join();
  std::vector<SteadyTime> all;
  for (const auto& per_thread : times) all.insert(all.end(), per_thread.begin(), per_thread.end());
  std::sort(all.begin(), all.end());
  // Every byte got its own millisecond: no reservation was lost or double-counted.
  ASSERT_EQ(all.size(), size_t{kThreads * kPerThread});
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(all[i], t0 + milliseconds(i + 1)) << i;
  }
}

}  // namespace
}  // namespace ps::net
