// The report of `ps-bench e2e`'s comparison (docs/bench.md, "End to end"): a row of the
// table and of the JSON array for each rule on each data plane of each cell, with its
// goodput against the raw TCP baselines of the same cell (e2e_raw_tcp.h) and against
// `mean` and gRPC of the same cell.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/e2e_cluster.h"
#include "bench/e2e_flags.h"
#include "bench/e2e_raw_tcp.h"
#include "cli/json_line.h"

namespace ps::bench {

// Goodput in Gbit/s: per worker and timed round, the fp32 gradient bytes pushed plus the
// fp32 parameter bytes pulled (4 x params each), over the rounds' seconds.
double GoodputGbps(int workers, uint64_t params, const E2eResult& e2e);

// What one row says: a rule on a data plane in a cell, and what it is compared with.
struct ComparisonRow {
  int workers = 0;
  int shards = 0;
  uint64_t params = 0;
  std::string codec;
  Rule rule;
  core::DataPlane plane = core::DataPlane::kGrpc;
  E2eResult e2e;          // the rule's fastest repetition
  uint64_t rss_kib = 0;   // this process's VmRSS with that cluster up, after its rounds
  RawResult raw;          // the faster raw TCP run
  RawResult one_copy;     // the fastest run with one copy
  int raw_rounds = 0;     // the rounds both baselines moved
  std::optional<double> vs_mean;  // goodput over mean's on the same plane, when it ran
  std::optional<double> vs_grpc;  // goodput over the same rule's over gRPC, when it ran
};

// The table the rows go into.
Table ComparisonTable();

// Adds `r` to `table` and to `json` (with the flags of the run, `f`).
void AddComparisonRow(const E2eFlags& f, const ComparisonRow& r, Table& table,
                      std::vector<cli::JsonObjectWriter>& json);

}  // namespace ps::bench
