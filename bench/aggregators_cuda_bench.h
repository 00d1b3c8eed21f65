// ps-bench aggregators --device cuda (aggregators_cuda_bench.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_util.h"

namespace ps::bench {

struct CudaAggregatorsGrid {
  std::vector<uint64_t> ns;
  std::vector<uint64_t> ds;
  std::vector<std::string> rules;
  int f = -1;  // -1: the largest the rule allows up to n / 4
  uint64_t seed = 1;
  TimingOptions timing;
  std::string json;
};

// Times every rule in the grid on a CUDA device. Exit status 2 (with the reason on
// stderr) where no CUDA device is usable.
int RunAggregatorsCuda(const CudaAggregatorsGrid& grid);

}  // namespace ps::bench
