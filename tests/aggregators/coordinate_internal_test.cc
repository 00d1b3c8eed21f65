#include "aggregators/coordinate_internal.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/aggregators/test_util.h"

namespace ps::aggregators::internal {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatEq;

std::vector<int> ApplyNetwork(size_t k, std::vector<int> v) {
  for (const auto& [a, b] : SortingNetwork(k)) {
    if (v[b] < v[a]) std::swap(v[a], v[b]);
  }
  return v;
}

// By the 0-1 principle a comparator network that sorts every 0/1 sequence sorts all.
TEST(SortingNetworkTest, SortsEveryZeroOneSequenceUpToFourteen) {
  for (size_t k = 1; k <= 14; ++k) {
    for (uint32_t bits = 0; bits < (1u << k); ++bits) {
      std::vector<int> v(k);
      for (size_t i = 0; i < k; ++i) v[i] = static_cast<int>((bits >> i) & 1);
      const std::vector<int> sorted = ApplyNetwork(k, v);
      ASSERT_TRUE(std::is_sorted(sorted.begin(), sorted.end())) << "k " << k << " bits " << bits;
    }
  }
}

TEST(SortingNetworkTest, SortsRandomSequencesUpToTheNetworkLimit) {
  std::mt19937 rng(3);
  for (size_t k = 1; k <= kMaxNetworkInputs; ++k) {
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<int> v(k);
      for (int& x : v) x = static_cast<int>(rng() % 7);
      std::vector<int> want = v;
      std::sort(want.begin(), want.end());
      ASSERT_EQ(ApplyNetwork(k, v), want) << "k " << k;
    }
  }
}

TEST(SortingNetworkTest, ComparatorsStayInRange) {
  for (size_t k = 0; k <= 40; ++k) {
    for (const auto& [a, b] : SortingNetwork(k)) {
      ASSERT_LT(a, b);
      ASSERT_LT(b, k);
    }
  }
}

// Both ways of running the network (unrolled in registers for small k, streamed row
// against row beyond) sort every column, full tiles and stale columns alike.
TEST(SortTileColumnsTest, SortsEveryColumn) {
  std::mt19937 rng(5);
  std::vector<size_t> counts(70);
  std::iota(counts.begin(), counts.end(), size_t{1});
  counts.insert(counts.end(), {100, 128, 255, 256});  // coordinate_rules uses up to 256
  for (size_t k : counts) {
    std::vector<float> tile(k * kNetworkTile);
    for (float& x : tile) x = static_cast<float>(static_cast<int>(rng() % 9) - 4) * 0.25f;
    std::vector<float> want = tile;
    for (size_t c = 0; c < kNetworkTile; ++c) {
      std::vector<float> column(k);
      for (size_t r = 0; r < k; ++r) column[r] = want[r * kNetworkTile + c];
      std::sort(column.begin(), column.end());
      for (size_t r = 0; r < k; ++r) want[r * kNetworkTile + c] = column[r];
    }
    SortTileColumns(tile.data(), k, SortingNetwork(k));
    ASSERT_EQ(tile, want) << "k " << k;
  }
}

TEST(MeanOfRanksTest, AveragesTheRequestedRanksOnBothPaths) {
  for (size_t k : {size_t{5}, kMaxNetworkInputs + 3}) {
    // Coordinate c holds a rotation of 0..k-1, so rank r is r everywhere.
    const size_t d = 300;
    test::Vectors inputs(k, std::vector<float>(d));
    for (size_t i = 0; i < k; ++i) {
      for (size_t c = 0; c < d; ++c) inputs[i][c] = static_cast<float>((i + c) % k);
    }
    std::vector<float> out(d);
    MeanOfRanks(test::Pointers(inputs), 1, 3, out, nullptr);
    for (size_t c = 0; c < d; ++c) ASSERT_FLOAT_EQ(out[c], 2.0f) << "k " << k << " c " << c;
    MeanOfRanks(test::Pointers(inputs), k - 1, k - 1, out, nullptr);
    for (size_t c = 0; c < d; ++c) ASSERT_FLOAT_EQ(out[c], k - 1.0f) << "k " << k;
  }
}

// Every rank window of every input count the register kernels take (2 to 16) and one past
// them, over a length with groups of 8 and a tail: the bits of the definition (the ranks'
// values summed in double from 0.0 in ascending order, divided, rounded once), with ties,
// signed zeros and a pool, and into an output that is one of the inputs.
TEST(MeanOfRanksTest, EveryRankWindowGivesTheDefinitionsBits) {
  std::mt19937 rng(11);
  core::ThreadPool pool(2);
  const size_t d = 8 * 7 + 5;
  for (size_t k = 1; k <= 17; ++k) {
    test::Vectors inputs(k, std::vector<float>(d));
    for (std::vector<float>& row : inputs) {
      for (float& x : row) {
        const uint32_t pick = rng() % 4;
        x = pick == 0   ? static_cast<float>(static_cast<int>(rng() % 5) - 2) * 0.5f
            : pick == 1 ? (rng() % 2 == 0 ? 0.0f : -0.0f)
                        : std::uniform_real_distribution<float>(-3.0f, 3.0f)(rng);
      }
    }
    for (size_t lo = 0; lo < k; ++lo) {
      for (size_t hi = lo; hi < k; ++hi) {
        std::vector<float> want(d);
        for (size_t c = 0; c < d; ++c) {
          std::vector<float> column(k);
          for (size_t i = 0; i < k; ++i) column[i] = inputs[i][c];
          std::sort(column.begin(), column.end());
          double sum = 0.0;
          for (size_t r = lo; r <= hi; ++r) sum += static_cast<double>(column[r]);
          want[c] = static_cast<float>(sum / static_cast<double>(hi - lo + 1));
        }
        for (core::ThreadPool* p : {static_cast<core::ThreadPool*>(nullptr), &pool}) {
          std::vector<float> out(d);
          MeanOfRanks(test::Pointers(inputs), lo, hi, out, p);
          ASSERT_EQ(0, std::memcmp(out.data(), want.data(), d * sizeof(float)))
              << "k " << k << " ranks " << lo << ".." << hi;
        }
        test::Vectors aliased = inputs;
        std::vector<const float*> pointers = test::Pointers(aliased);
        MeanOfRanks(pointers, lo, hi, std::span<float>(aliased[k / 2]), nullptr);
        ASSERT_EQ(0, std::memcmp(aliased[k / 2].data(), want.data(), d * sizeof(float)))
            << "into input " << k / 2 << ", k " << k << " ranks " << lo << ".." << hi;
      }
    }
  }
}

TEST(AverageInputsTest, SumsInInputOrder) {
  // In float, (1e8 + 1) - 1e8 = 0 while 1e8 + (1 - 1e8) = 1: order is visible.
  const test::Vectors inputs = {{1e8f}, {1.0f}, {-1e8f}};
  std::vector<float> out(1);
  AverageInputs(test::Pointers(inputs), out, nullptr);
  EXPECT_THAT(out, ElementsAre(FloatEq(0.0f)));
}

TEST(AverageInputsTest, EqualsTheSumInInputOrderForEveryTileWidth) {
  // Below 16 inputs the mean runs in narrow tiles, from 16 on in wide ones; d covers
  // whole coordinate blocks, whole tiles of either width and a partial tile, with and
  // without a pool. Each value must be the float sum in input order divided by k, bit
  // for bit.
  std::mt19937 rng(17);
  std::normal_distribution<float> value(0.0f, 1.0f);
  const size_t d = 2 * kCoordinateBlock + 3 * 4096 + 1024 + 7;
  core::ThreadPool pool(2);
  for (size_t k : {1, 2, 3, 8, 15, 16, 17, 32, 33}) {
    test::Vectors inputs(k, std::vector<float>(d));
    for (std::vector<float>& x : inputs) {
      for (float& v : x) v = value(rng) * 1000.0f;
    }
    std::vector<float> want(d);
    for (size_t c = 0; c < d; ++c) {
      float sum = inputs[0][c];
      for (size_t i = 1; i < k; ++i) sum += inputs[i][c];
      want[c] = sum / static_cast<float>(k);
    }
    for (core::ThreadPool* p : {static_cast<core::ThreadPool*>(nullptr), &pool}) {
      std::vector<float> out(d, -1.0f);
      AverageInputs(test::Pointers(inputs), out, p);
      ASSERT_EQ(0, std::memcmp(out.data(), want.data(), d * sizeof(float)))
          << "k " << k << (p != nullptr ? " with a pool" : "");
    }
  }
}

TEST(ForEachCoordinateBlockTest, CoversEveryCoordinateOnceInFixedBlocks) {
  const size_t d = 3 * kCoordinateBlock + 5;
  core::ThreadPool pool(3);
  for (core::ThreadPool* p : {static_cast<core::ThreadPool*>(nullptr), &pool}) {
    std::vector<int> hits(d, 0);
    ForEachCoordinateBlock(d, p, [&](size_t begin, size_t end) {
      EXPECT_EQ(begin % kCoordinateBlock, 0u);
      EXPECT_TRUE(end - begin == kCoordinateBlock || end == d);
      for (size_t c = begin; c < end; ++c) ++hits[c];
    });
    EXPECT_EQ(std::count(hits.begin(), hits.end(), 1), static_cast<ptrdiff_t>(d));
  }
}

}  // namespace
}  // namespace ps::aggregators::internal
