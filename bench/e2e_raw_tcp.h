// The baselines of `ps-bench e2e` (docs/bench.md, "End to end"): the bytes of a round
// moved over plain loopback TCP connections with send and recv, with nothing else done
// to them, or with one copy in user space on each side (the least a parameter server
// does), timed in the same run as the cluster they are compared with.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace ps::bench {

struct RawResult {
  double seconds = 0;
  double cpu_seconds = 0;
};

// `workers` x `shard_bytes.size()` connections; per round, connection (w, s) sends
// shard_bytes[s] bytes of `source` one way and the same number back. One untimed round
// first; the CPU time is this whole process's. `one_copy`: each side also copies what it
// sends and what it receives once in user space. The first failing socket call, send or
// recv is the error (INTERNAL).
absl::StatusOr<RawResult> RunRawTcp(int workers, const std::vector<uint64_t>& shard_bytes,
                                    int rounds, const std::vector<char>& source, bool one_copy);

}  // namespace ps::bench
