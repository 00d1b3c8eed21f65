// The flags of `ps-bench e2e` (docs/bench.md, "End to end"), as the command's parts
// read them: the cluster runs (e2e_cluster.h), the comparison and the soak (e2e_bench.cc)
// and the report (e2e_report.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench/throwaway_cert.h"
#include "core/layout.h"
#include "server/options.h"
#include "worker_lib/worker.h"

namespace ps::bench {

struct E2eFlags {
  std::vector<std::string> workers = {"1", "4"};
  std::vector<std::string> shards = {"1", "2"};
  std::string params = "2^22";
  std::vector<std::string> codecs = {"fp32"};
  std::string pull_codec;  // ServerOptions::pull_codec ("": dense pulls)
  int rounds = 10;
  // Untimed rounds first. Two by default: the first timed round otherwise carries the
  // shards' first aggregation and publication (lazily sized buffers, the pool's first
  // jobs), about four times a steady round.
  int warmup = 2;
  double seconds = 0;  // > 0: run rounds until this long instead of --rounds
  uint32_t slice_elems = kJobSliceElems;  // Worker::Start's: the job's
  uint64_t inflight = 0;  // 0: WorkerOptions' default
  double inflight_seconds = WorkerOptions{}.inflight_seconds;
  uint32_t server_threads = 0;
  uint32_t data_threads = server::ServerOptions{}.data_threads;
  int tcp_rto_min_ms = -1;  // ServerOptions::tcp_rto_min (-1: auto)
  bool aggregate_only = false;
  // The workers push from the gradient buffer (PushOptions::borrow), which stays
  // unchanged over the run.
  bool borrow = false;
  // The workers keep what their encodings lose and add it to the next push
  // (PushOptions::error_feedback).
  bool error_feedback = false;
  // The shards' SGD momentum (ServerOptions::momentum); 0 keeps no velocity.
  double momentum = 0;
  // Aggregation rule specs (docs/aggregators.md; a '+' chain is one spec). `mean` is
  // added first when absent: it is the baseline the others are compared with.
  std::vector<std::string> aggregators = {"mean"};
  // f for every rule; -1: per rule, the largest f its bound admits (RulesFor).
  int byzantine = -1;
  std::string aggregation_scope = "model";  // ServerOptions::aggregation_scope
  int repeats = 1;  // cluster runs per rule and cell; the fastest counts
  // The shards' data planes (ServerOptions::data_plane), each measured on every cell.
  std::vector<std::string> data_planes = {"tcp"};
  bool tls = false;
  std::shared_ptr<const ThrowawayCerts> tls_files;  // made by RunE2e with --tls
  bool no_raw = false;  // skip the baseline (for profiling the cluster alone)
  bool soak = false;
  double soak_interval = 60;
  std::string json;
  bool quick = false;
  // Running shards (ps-server processes started with --insecure and --workers equal to
  // the one --workers count) instead of in-process ones: for comparing other clients
  // against the same shards (bench/python_e2e.py).
  std::vector<std::string> shards_at;
};

}  // namespace ps::bench
