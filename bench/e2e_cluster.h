// The cluster runs of `ps-bench e2e` (docs/bench.md, "End to end"): the aggregation
// rules a cell runs, its shards (in-process, or running ones with --shards-at) with one
// ps::Worker client per worker, the rounds timed on them, and the memory of this process
// (shards and workers together) while they run.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/e2e_flags.h"
#include "core/data_plane.h"
#include "core/layout.h"
#include "server/local_cluster.h"
#include "worker_lib/worker.h"

namespace ps::bench {

// ---- This process ---------------------------------------------------------------------

// VmRSS and VmHWM of this process in KiB (/proc/self/status), 0 when unreadable, and
// the bytes malloc has handed out and not taken back (glibc; 0 elsewhere): resident
// memory that rises while heap_in_use stays put is the heap's free space growing
// (fragmentation, the kept heap), not a leak.
struct Memory {
  uint64_t rss_kib = 0, hwm_kib = 0, heap_in_use_kib = 0;
};

Memory ReadMemory();

// ---- Rules ------------------------------------------------------------------------------

// One rule of --aggregator as the shards of a cell run it.
struct Rule {
  std::string spec;  // as given; "" with --shards-at: the running shards' own rule
  std::string name;  // canonical (Aggregator::name()): "mean" marks the baseline
  uint32_t byzantine = 0;  // f the shards are started with
};

// The rules of `specs` with the f each runs with at `workers` workers, and `mean` first
// when `add_mean` and it is absent. `byzantine` >= 0 applies to every rule, and a rule
// whose bound refuses it is an error naming the fix. -1: each rule gets the largest f up
// to (n - 1) / 2 (an honest majority) that its bound admits (at 4 workers trimmed_mean and
// caf f = 1, krum f = 0 as it needs n >= 2f + 3), and mean f = 0: it ignores f, which would
// only lower its quorum, and so runs as the bench always ran it.
absl::StatusOr<std::vector<Rule>> RulesFor(const std::vector<std::string>& specs, int workers,
                                           int byzantine, bool add_mean);

// The rule as the table shows it.
std::string RuleLabel(const Rule& rule);

// ---- The cluster ------------------------------------------------------------------------

// The shards (a server::LocalCluster, or none with --shards-at) and one worker client
// each.
struct Cluster {
  std::optional<server::LocalCluster> shards;
  std::vector<std::unique_ptr<Worker>> workers;  // destroyed before the shards

  const core::ModelLayout& layout() const { return workers.front()->layout(); }

  void Shutdown() {
    workers.clear();
    if (shards.has_value()) shards->Shutdown();
  }
};

// Starts `shards` shards with `rule` on data plane `plane` (unless the flags give running
// ones), as f says (TLS with f.tls_files), and `workers` workers that register one
// tensor of `params` values in slices of f.slice_elems (0: the job's, which the first
// worker chooses and the others adopt: Worker::Start) with `init` (none with
// --aggregate-only). The first error. Cluster::layout() is the layout they use.
absl::StatusOr<Cluster> StartCluster(const E2eFlags& f, int workers, uint32_t shards,
                                     const std::string& codec, const Rule& rule,
                                     core::DataPlane plane, uint64_t params,
                                     std::span<const std::span<const float>> init);

struct E2eResult {
  int rounds = 0;          // timed rounds
  double seconds = 0;      // from the start of the first timed round to the last push answered
  double cpu_seconds = 0;  // process CPU time over the same span
  double pull_seconds = 0;  // per round, mean over workers: waiting in PullAll
  double push_seconds = 0;  // per round, mean over workers: Push calls and WaitPushes
  // Round latency (pull start to pushes answered) over every worker's timed rounds.
  double round_p50 = 0, round_p99 = 0;
};

// Runs `warmup` untimed rounds and then `rounds` timed rounds, or timed rounds until
// `seconds` passed when that is positive. `on_round` (may be empty) is called by worker
// 0 after each round with the number of timed rounds done.
absl::StatusOr<E2eResult> RunRounds(Cluster& c, const core::ModelLayout& layout, int warmup,
                                    int rounds, double seconds, const std::vector<float>& grad,
                                    const std::function<void(int)>& on_round);

// One tensor of `params` values in slices of `slice_elems` over `shards` shards (0:
// core::kDefaultSliceElems): the baselines' loads per shard.
absl::StatusOr<core::ModelLayout> MakeLayout(uint64_t params, uint32_t slice_elems, uint32_t shards);
// The tensor list MakeLayout cuts.
std::vector<core::TensorSpec> MakeTensors(uint64_t params);
// The gradient every worker pushes: the seeded inputs of bench_util.h (GaussianAt).
std::vector<float> MakeGradient(uint64_t params);

}  // namespace ps::bench
