#include "bench/e2e_cluster.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <latch>
#include <limits>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "aggregators/aggregator.h"
#include "bench/bench_util.h"
#include "core/status.h"
#include "server/options.h"
#include "harness/process_stats.h"

namespace ps::bench {

// ---- This process ---------------------------------------------------------------------

Memory ReadMemory() {
  Memory m;
  m.rss_kib = harness::StatusBytes(::getpid(), "VmRSS:") / 1024;
  m.hwm_kib = harness::StatusBytes(::getpid(), "VmHWM:") / 1024;
#if defined(__GLIBC__)
  const struct mallinfo2 mi = mallinfo2();
  m.heap_in_use_kib = (mi.uordblks + mi.hblkhd) / 1024;
#endif
  return m;
}

// ---- Rules ------------------------------------------------------------------------------

absl::StatusOr<std::vector<Rule>> RulesFor(const std::vector<std::string>& specs, int workers,
                                           int byzantine, bool add_mean) {
  if (byzantine >= workers) {
    return absl::InvalidArgumentError(absl::StrCat("--byzantine ", byzantine, " needs more than ",
                                                   byzantine, " workers, got ", workers,
                                                   "; lower it or raise --workers"));
  }
  std::vector<Rule> rules;
  for (const std::string& spec : specs) {
    // A malformed or unknown spec is refused whatever the counts (MakeAggregator's message
    // names the stage; 1000 workers at f = 0 meet every bound); only then is a refusal the
    // bound's.
    PS_RETURN_IF_ERROR(aggregators::MakeAggregator(spec, {.num_workers = 1000}).status());
    const int most = byzantine >= 0 ? byzantine : (workers - 1) / 2;
    const int least = byzantine >= 0 ? byzantine : 0;
    absl::Status refused;
    std::optional<Rule> rule;
    for (int f = most; f >= least && !rule.has_value(); --f) {
      absl::StatusOr<std::unique_ptr<aggregators::Aggregator>> made =
          aggregators::MakeAggregator(spec, {.num_workers = workers, .num_byzantine = f});
      if (made.ok()) {
        rule = Rule{.spec = spec, .name = std::string((*made)->name()), .byzantine = uint32_t(f)};
      } else {
        refused = made.status();
      }
    }
    if (!rule.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          core::AsAbsl(spec), " at ", workers, " workers: ", refused.message(),
          byzantine >= 0 ? "; give a lower --byzantine or more --workers, or leave --byzantine "
                           "out (each rule then runs with the largest f its bound admits)"
                         : "; give more --workers or leave this rule out of --aggregator"));
    }
    if (byzantine < 0 && rule->name == "mean") rule->byzantine = 0;
    rules.push_back(std::move(*rule));
  }
  const auto is_mean = [](const Rule& r) { return r.name == "mean"; };
  if (add_mean && std::none_of(rules.begin(), rules.end(), is_mean)) {
    rules.insert(rules.begin(),
                 Rule{.spec = "mean", .name = "mean", .byzantine = uint32_t(std::max(byzantine, 0))});
  }
  return rules;
}

std::string RuleLabel(const Rule& rule) { return rule.spec.empty() ? "(theirs)" : rule.spec; }

// ---- The cluster ------------------------------------------------------------------------

absl::StatusOr<Cluster> StartCluster(const E2eFlags& f, int workers, uint32_t shards,
                                     const std::string& codec, const Rule& rule,
                                     core::DataPlane plane, uint64_t params,
                                     std::span<const std::span<const float>> init) {
  Cluster c;
  server::ServerOptions so;
  so.insecure = true;  // the data path alone; docs/bench.md
  so.num_workers = uint32_t(workers);
  so.aggregate_only = f.aggregate_only;
  if (!rule.spec.empty()) so.aggregator = rule.spec;
  so.num_byzantine = rule.byzantine;
  // Validated in RunE2e.
  so.aggregation_scope =
      server::ParseAggregationScope(f.aggregation_scope).value_or(server::AggregationScope::kModel);
  so.learning_rate = 1e-6f;
  so.momentum = static_cast<float>(f.momentum);
  so.threads = f.server_threads;
  so.data_threads = f.data_threads;
  so.tcp_rto_min = std::chrono::milliseconds(f.tcp_rto_min_ms);
  so.log_level = "warn";
  // A round only closes early when every worker pushed; the deadline is a backstop
  // against a stalled worker, not part of the measurement.
  so.round_deadline = std::chrono::milliseconds(60000);
  so.pull_codec = f.pull_codec;
  so.data_plane = plane;
  WorkerOptions wo;
  if (f.tls_files != nullptr) {
    // Mutual TLS as deployed: identities from the certificates' common names.
    so.insecure = false;
    so.tls_ca = f.tls_files->Path("ca.pem");
    so.tls_cert = f.tls_files->Path("shard-{shard}.pem");
    so.tls_key = f.tls_files->Path("shard-{shard}.key");
    wo.credentials.tls_ca = so.tls_ca;
  }
  if (f.shards_at.empty()) {
    PS_ASSIGN_OR_RETURN(c.shards, server::LocalCluster::Start(shards, so));
    wo.shard_addresses = c.shards->addresses();
  } else {
    wo.shard_addresses = f.shards_at;
  }
  wo.push.codec = codec;
  wo.push.borrow = f.borrow;
  wo.push.error_feedback = f.error_feedback;
  if (f.inflight > 0) wo.max_inflight_bytes = f.inflight;
  wo.inflight_seconds = f.inflight_seconds;
  // Running shards (--shards-at) pick the plane; the workers follow their Join answers.
  if (f.shards_at.empty()) wo.data_plane = plane;
  wo.rpc_timeout = std::chrono::milliseconds(120000);
  for (int w = 0; w < workers; ++w) {
    wo.worker_id = uint32_t(w);
    if (f.tls_files != nullptr) {
      wo.credentials.tls_cert = f.tls_files->Path(absl::StrCat("worker-", w, ".pem"));
      wo.credentials.tls_key = f.tls_files->Path(absl::StrCat("worker-", w, ".key"));
    }
    PS_ASSIGN_OR_RETURN(std::unique_ptr<Worker> worker,
                        Worker::Start(wo, MakeTensors(params), f.slice_elems,
                                      f.aggregate_only ? decltype(init){} : init));
    c.workers.push_back(std::move(worker));
  }
  return c;
}

namespace {

// The q-quantile (0 <= q <= 1) of `v` by the nearest rank; 0 for none.
double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, size_t(std::ceil(q * double(v.size()))) - (q > 0 ? 1 : 0));
  std::nth_element(v.begin(), v.begin() + ptrdiff_t(k), v.end());
  return v[k];
}

}  // namespace

absl::StatusOr<E2eResult> RunRounds(Cluster& c, const core::ModelLayout& layout, int warmup,
                                    int rounds, double seconds, const std::vector<float>& grad,
                                    const std::function<void(int)>& on_round) {
  const size_t workers = c.workers.size();
  std::vector<absl::Status> errors(workers);
  std::vector<double> pull_time(workers, 0), push_time(workers, 0), end_time(workers, 0);
  std::vector<std::vector<double>> latencies(workers);
  std::vector<int> timed(workers, 0);
  // Round r is the last one once last_round <= r. Worker 0 sets it after its pull of
  // version r and before it pushes round r; every other worker reads it after its pull
  // of version r + 1, which needs that push, so all agree on the last round.
  constexpr uint64_t kNoLast = std::numeric_limits<uint64_t>::max();
  const uint64_t first_timed = uint64_t(std::max(1, warmup));
  std::atomic<uint64_t> last_round{seconds > 0 ? kNoLast : first_timed - 1 + uint64_t(rounds)};
  std::latch warm(std::ptrdiff_t(workers) + 1);
  std::atomic<double> t0{0};
  std::latch started(1);
  std::vector<std::thread> threads;
  for (size_t w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      Worker& worker = *c.workers[w];
      const size_t tensors = layout.tensors().size();
      std::vector<std::vector<float>> params;
      for (const core::TensorSpec& t : layout.tensors()) params.emplace_back(t.numel);
      std::vector<std::span<float>> outs(params.begin(), params.end());
      std::vector<std::span<const float>> grads;
      uint64_t at = 0;
      for (const core::TensorSpec& t : layout.tensors()) {
        grads.push_back(std::span<const float>(grad).subspan(at, t.numel));
        at += t.numel;
      }
      const auto fail = [&](absl::Status st) {
        errors[w] = std::move(st);
        // Unblock the others: they would wait for this worker's pushes until timeout.
        last_round.store(0);
      };
      const auto round = [&](uint64_t r, bool time_it) -> bool {
        const double a = NowSeconds();
        if (absl::StatusOr<uint64_t> v = worker.PullAll(r, outs, std::chrono::seconds(120)); !v.ok()) {
          fail(v.status());
          return false;
        }
        const double b = NowSeconds();
        if (w == 0 && time_it && seconds > 0 && last_round.load() == kNoLast &&
            b - t0.load() >= seconds) {
          last_round.store(r);
        }
        if (r > last_round.load()) return false;
        for (size_t t = 0; t < tensors; ++t) {
          if (absl::Status st = worker.Push(t, r, grads[t]); !st.ok()) {
            fail(st);
            return false;
          }
        }
        if (absl::Status st = worker.WaitPushes(); !st.ok()) {
          fail(st);
          return false;
        }
        if (time_it) {
          const double e = NowSeconds();
          pull_time[w] += b - a;
          push_time[w] += e - b;
          latencies[w].push_back(e - a);
          end_time[w] = e;
          ++timed[w];
        }
        return true;
      };
      bool ok = true;
      for (uint64_t r = 0; ok && r < first_timed; ++r) ok = round(r, false);
      warm.count_down();
      if (!ok) return;
      started.wait();
      for (uint64_t r = first_timed; round(r, true); ++r) {
        if (w == 0 && on_round) on_round(timed[0]);
      }
    });
  }
  warm.arrive_and_wait();
  const double cpu0 = ProcessCpuSeconds();
  t0.store(NowSeconds());
  started.count_down();
  for (std::thread& t : threads) t.join();
  const double cpu1 = ProcessCpuSeconds();
  for (const absl::Status& st : errors) PS_RETURN_IF_ERROR(st);
  E2eResult r;
  r.rounds = timed[0];
  for (size_t w = 0; w < workers; ++w) {
    if (timed[w] != r.rounds) {
      return absl::InternalError(absl::StrCat("worker ", w, " ran ", timed[w], " rounds, worker 0 ", r.rounds));
    }
    r.seconds = std::max(r.seconds, end_time[w] - t0.load());
    r.pull_seconds += pull_time[w] / double(workers) / std::max(1, r.rounds);
    r.push_seconds += push_time[w] / double(workers) / std::max(1, r.rounds);
  }
  r.cpu_seconds = cpu1 - cpu0;
  if (r.rounds == 0) return absl::InternalError("no timed round ran");
  std::vector<double> all;
  for (const std::vector<double>& l : latencies) all.insert(all.end(), l.begin(), l.end());
  r.round_p50 = Quantile(all, 0.5);
  r.round_p99 = Quantile(std::move(all), 0.99);
  return r;
}

std::vector<core::TensorSpec> MakeTensors(uint64_t params) { return {{"w", params, 0}}; }

absl::StatusOr<core::ModelLayout> MakeLayout(uint64_t params, uint32_t slice_elems, uint32_t shards) {
  return core::ModelLayout::Create(MakeTensors(params),
                                   slice_elems == 0 ? core::kDefaultSliceElems : slice_elems, shards);
}

std::vector<float> MakeGradient(uint64_t params) {
  std::vector<float> grad(params);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = GaussianAt(1, 0, i);
  return grad;
}

}  // namespace ps::bench
