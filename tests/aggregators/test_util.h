// Helpers shared by the aggregator tests: owned input vectors, one-call aggregation and
// seeded random inputs.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "aggregators/aggregator.h"
#include "core/thread_pool.h"
#include "gtest/gtest.h"

namespace ps::aggregators::test {

using Vectors = std::vector<std::vector<float>>;

inline std::vector<const float*> Pointers(const Vectors& vectors) {
  std::vector<const float*> ptrs;
  for (const std::vector<float>& v : vectors) ptrs.push_back(v.data());
  return ptrs;
}

// Runs `rule` on `inputs` (all of the same length) into a fresh output.
inline absl::StatusOr<std::vector<float>> Run(const Aggregator& rule, const Vectors& inputs,
                                              core::ThreadPool* pool = nullptr) {
  std::vector<float> out(inputs.empty() ? 0 : inputs[0].size());
  const std::vector<const float*> ptrs = Pointers(inputs);
  AggregationContext ctx;
  ctx.pool = pool;
  absl::Status status = rule.Aggregate(ptrs, out, ctx);
  if (!status.ok()) return status;
  return out;
}

// Makes the rule and runs it; any error is a test failure and yields an empty vector.
inline std::vector<float> Aggregate(std::string_view name, const AggregatorOptions& options,
                                    const Vectors& inputs, core::ThreadPool* pool = nullptr) {
  absl::StatusOr<std::unique_ptr<Aggregator>> rule = MakeAggregator(name, options);
  if (!rule.ok()) {
    ADD_FAILURE() << "MakeAggregator(" << name << "): " << rule.status();
    return {};
  }
  absl::StatusOr<std::vector<float>> out = Run(**rule, inputs, pool);
  if (!out.ok()) {
    ADD_FAILURE() << name << " Aggregate: " << out.status();
    return {};
  }
  return *std::move(out);
}

inline AggregatorOptions Options(int n, int f) {
  AggregatorOptions options;
  options.num_workers = n;
  options.num_byzantine = f;
  return options;
}

// Transposes per-coordinate columns into per-input rows: FromColumns({{1, 2}, {3, 4}}) gives
// two inputs of two coordinates, input 0 = {1, 3}, input 1 = {2, 4}. Lets a test spell
// out each coordinate's values, which is how the coordinate-wise rules read them.
inline Vectors FromColumns(const Vectors& columns) {
  Vectors rows(columns.at(0).size(), std::vector<float>(columns.size()));
  for (size_t c = 0; c < columns.size(); ++c) {
    for (size_t i = 0; i < columns[c].size(); ++i) rows[i][c] = columns[c][i];
  }
  return rows;
}

// n vectors of d uniform values in [-1, 1), seeded.
inline Vectors RandomVectors(size_t n, size_t d, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Vectors vectors(n, std::vector<float>(d));
  for (std::vector<float>& v : vectors) {
    for (float& x : v) x = dist(rng);
  }
  return vectors;
}

}  // namespace ps::aggregators::test
