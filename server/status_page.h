// StatusPage: the /status page of the metrics port (docs/metrics.md, "The status page"):
// one self-contained HTML document, no scripts and no external assets, that reloads
// itself every 5 seconds: the shard's state and one row per worker with what the shard
// saw of its pushes (ShardStats' WorkerCounts), the rows that need a look marked.
//
// A pure function of its input; the metrics endpoint renders it at each request.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "server/membership.h"
#include "server/shard_counters.h"

namespace ps::server {

struct StatusView {
  uint32_t shard_id = 0;
  uint32_t num_shards = 1;
  std::string aggregator;
  bool ready = false;
  uint64_t min_version = 0;
  uint64_t max_version = 0;
  uint32_t workers_expected = 0;
  uint64_t rounds_closed = 0;  // slice rounds
  uint64_t pushes_accepted = 0;
  uint64_t refusals = 0;
  std::vector<WorkerCounts> workers;
  std::vector<Membership::State> states;  // per worker id
};

// How a worker's row is marked: "suspect" after a malformed push or a quarantine,
// "absent" when it left, expired, never joined or missed more than half of the slice
// rounds, else "".
std::string WorkerMark(const WorkerCounts& w, Membership::State state, uint64_t rounds_closed);

std::string StatusPage(const StatusView& view);

}  // namespace ps::server
