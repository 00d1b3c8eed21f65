// The shard that the ShardFront and TCP backend tests stand on: two workers; tensor "w"
// of 8 values in two slices of 4 (ids 0 and 1); at most two pulls per worker; mean,
// aggregate-only, so the slices start at zero, ready without InitSlice. Both workers
// have joined and worker 0 has registered the layout.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <vector>

#include "aggregators/aggregator.h"
#include "core/clock.h"
#include "core/layout.h"
#include "core/thread_pool.h"
#include "server/options.h"
#include "server/shard.h"

namespace ps::testing {

struct TwoWorkerShard {
  std::unique_ptr<server::Shard> shard;
  uint64_t hash = 0;                // the layout's
  std::vector<server::JoinResult> joins;    // by worker id
};

// `o` as the tests set it (round deadline, data plane) over the shared settings.
// Fatal failures are the caller's to check (ASSERT_NO_FATAL_FAILURE).
inline void MakeTwoWorkerShard(server::ServerOptions o, core::Clock* clock, core::ThreadPool* pool,
                               TwoWorkerShard* out) {
  o.num_workers = 2;
  o.aggregator = "mean";
  o.aggregate_only = true;
  o.max_pulls_per_worker = 2;
  aggregators::AggregatorOptions a;
  a.num_workers = 2;
  out->shard = std::make_unique<server::Shard>(o, 0, *aggregators::MakeAggregator("mean", a), clock, pool);
  auto layout = core::ModelLayout::Create({{"w", 8, 0}}, 4, 1);
  ASSERT_TRUE(layout.ok()) << layout.status();
  out->hash = layout->hash();
  for (uint32_t w = 0; w < 2; ++w) {
    absl::StatusOr<server::JoinResult> joined = out->shard->Join(w, out->hash);
    ASSERT_TRUE(joined.ok()) << joined.status();
    out->joins.push_back(*joined);
  }
  ASSERT_TRUE(out->shard->RegisterLayout(0, *layout).ok());
}

}  // namespace ps::testing
