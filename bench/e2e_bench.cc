// `ps-bench e2e`: end-to-end goodput of push plus pull with n workers and S shards on
// loopback, against raw loopback TCP measured in the same run (docs/bench.md, "End to
// end"). The shards are in-process ps::server::Server instances (SGD, or aggregate-only,
// with each rule of --aggregator in turn), the workers ps::Worker clients, one thread
// each. Every round, each worker pulls the whole model (version r), then pushes a gradient of the whole model
// (round r) and waits for the answers; the next pull can only complete once every
// worker's push of round r was aggregated. Goodput counts, per worker and timed round,
// the fp32 gradient bytes pushed (4 x params, whatever the codec) plus the fp32
// parameter bytes pulled (4 x params).
//
// The baseline opens the same number of loopback TCP connections (one per worker and
// shard) and moves the same bytes per round with plain send/recv: the worker side
// sends its share of the gradient, the shard side receives all of it and sends the
// same number of bytes back. It runs before and after the cluster (after it, --repeats
// times); the fastest counts. The one-copy baseline runs --repeats times after the
// cluster; the fastest counts.
//
// Several --aggregator rules are measured on the same configuration, each against `mean`
// of the same cell (vs_mean): the robust rules' overhead on the whole path. The rules run
// one after another between the baseline's two runs, --repeats times, forward and then
// backward, and each rule's fastest repetition counts, as the baseline's faster run does.
//
// Several --data-plane values measure the same cells on each plane (docs/data-plane.md),
// interleaved like the rules: each row then says its plane, vs_mean compares with mean on
// the same plane, and vs_grpc with the same rule over gRPC. `--tls` serves both ports of
// every shard with mutual TLS (throwaway certificates for every shard and worker,
// bench/throwaway_cert.h, instead of --insecure), so that TLS's cost shows on each plane;
// the baselines stay plaintext.
//
// `--soak` runs one configuration for --seconds and reports the resident memory of the
// process (servers and workers together) at start, every --soak-interval seconds and
//
// This file runs the comparison and the soak; its parts are the raw TCP baselines
// (e2e_raw_tcp.h), the cluster runs (e2e_cluster.h) and the comparison's rows
// (e2e_report.h).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/bench_util.h"
#include "bench/commands.h"
#include "bench/e2e_cluster.h"
#include "bench/e2e_flags.h"
#include "bench/e2e_raw_tcp.h"
#include "bench/e2e_report.h"
#include "bench/throwaway_cert.h"
#include "core/data_plane.h"
#include "core/layout.h"
#include "core/status.h"
#include "server/options.h"
#include "spdlog/spdlog.h"

namespace ps::bench {
namespace {

absl::StatusOr<std::vector<int>> ParseInts(const std::vector<std::string>& texts, int lo, int hi,
                                           std::string_view what) {
  std::vector<int> out;
  for (const std::string& text : texts) {
    for (const std::string& item : SplitList(text)) {
      int v = 0;
      if (!absl::SimpleAtoi(item, &v) || v < lo || v > hi) {
        return absl::InvalidArgumentError(
            absl::StrCat("bad ", core::AsAbsl(what), " '", item, "' (want ", lo, "..", hi, ")"));
      }
      out.push_back(v);
    }
  }
  return out;
}

// ---- The comparison ---------------------------------------------------------------

int RunComparison(const E2eFlags& f, uint64_t params, const std::vector<int>& worker_counts,
                  const std::vector<int>& shard_counts, const std::vector<std::string>& codecs,
                  const std::vector<std::string>& specs, const std::vector<core::DataPlane>& planes) {
  const std::vector<float> grad = MakeGradient(params);
  std::vector<char> source(params * 4);
  std::memcpy(source.data(), grad.data(), source.size());
  const std::vector<float> init_values(params, 0.01f);
  const std::vector<std::span<const float>> init = {init_values};
  Table table = ComparisonTable();
  std::vector<cli::JsonObjectWriter> rows;
  int errors = 0;
  for (int workers : worker_counts) {
    // Checked for every worker count in RunE2e; --shards-at runs the shards' own rule.
    absl::StatusOr<std::vector<Rule>> rules =
        f.shards_at.empty() ? RulesFor(specs, workers, f.byzantine, /*add_mean=*/true)
                            : absl::StatusOr<std::vector<Rule>>(std::vector<Rule>{Rule{}});
    if (!rules.ok()) {
      std::fprintf(stderr, "ps-bench e2e: %s\n", std::string(rules.status().message()).c_str());
      return 2;
    }
    const auto is_mean = [](const Rule& r) { return r.name == "mean"; };
    // rules->size() when there is none (--shards-at).
    const size_t base_rule = size_t(std::find_if(rules->begin(), rules->end(), is_mean) - rules->begin());
    // What each cell measures: every rule on every plane, variant v = plane * rules + rule.
    const size_t variants = rules->size() * planes.size();
    const auto rule_of = [&](size_t v) -> const Rule& { return (*rules)[v % rules->size()]; };
    const auto plane_of = [&](size_t v) { return planes[v / rules->size()]; };
    const auto variant = [&](size_t plane_index, size_t rule) { return plane_index * rules->size() + rule; };
    for (int shards : shard_counts) {
      absl::StatusOr<core::ModelLayout> layout = MakeLayout(params, f.slice_elems, uint32_t(shards));
      if (!layout.ok()) {
        std::fprintf(stderr, "ps-bench e2e: layout: %s\n", std::string(layout.status().message()).c_str());
        return 2;
      }
      std::vector<uint64_t> shard_bytes;
      for (uint64_t load : layout->ShardLoads()) shard_bytes.push_back(load * 4);
      for (const std::string& codec : codecs) {
        const std::string cell = absl::StrCat(workers, " workers x ", shards, " shards, ", codec);
        const auto raw_once = [&](int rounds) -> absl::StatusOr<RawResult> {
          return RunRawTcp(workers, shard_bytes, rounds, source, /*one_copy=*/false);
        };
        // A baseline's fastest of `times` runs, as each rule's fastest repetition counts:
        // the baselines' own run-to-run spread would otherwise move every ratio.
        const auto fastest = [&](bool one_copy, int rounds, int times) -> absl::StatusOr<RawResult> {
          absl::StatusOr<RawResult> best = RunRawTcp(workers, shard_bytes, rounds, source, one_copy);
          for (int t = 1; best.ok() && t < times; ++t) {
            absl::StatusOr<RawResult> r = RunRawTcp(workers, shard_bytes, rounds, source, one_copy);
            if (!r.ok() || r->seconds < best->seconds) best = std::move(r);
          }
          return best;
        };
        // The cluster first when --seconds decides the round count, the baseline
        // moving the same rounds before (with --rounds) and after.
        absl::StatusOr<RawResult> raw_before =
            f.seconds > 0 || f.no_raw ? absl::StatusOr<RawResult>(RawResult{}) : raw_once(f.rounds);
        if (!raw_before.ok()) {
          std::fprintf(stderr, "ps-bench e2e: %s: raw TCP: %s\n", cell.c_str(),
                       std::string(raw_before.status().message()).c_str());
          ++errors;
          continue;
        }
        // Each rule's fastest repetition, and the resident memory of the whole process
        // with that cluster up, after its rounds.
        struct Measured {
          E2eResult e2e;
          uint64_t rss_kib = 0;
        };
        std::vector<std::optional<Measured>> best(variants);
        std::vector<bool> failed(variants, false);
        for (int rep = 0; rep < f.repeats; ++rep) {
          for (size_t k = 0; k < variants; ++k) {
            // Forward, then backward: a drift of the machine's speed over the repetitions
            // favours no rule and no plane.
            const size_t i = rep % 2 == 0 ? k : variants - 1 - k;
            if (failed[i]) continue;
            const Rule& rule = rule_of(i);
            uint64_t rss_kib = 0;
            absl::StatusOr<E2eResult> e2e = [&]() -> absl::StatusOr<E2eResult> {
              PS_ASSIGN_OR_RETURN(Cluster c, StartCluster(f, workers, uint32_t(shards), codec, rule,
                                                          plane_of(i), params, init));
              if (f.slice_elems == kJobSliceElems && rep == 0) {
                std::fprintf(stderr, "ps-bench e2e: %s, %s over %s: slices of %u (the job's)\n",
                             cell.c_str(), RuleLabel(rule).c_str(),
                             std::string(core::DataPlaneName(plane_of(i))).c_str(),
                             c.layout().slice_elems());
              }
              absl::StatusOr<E2eResult> r =
                  RunRounds(c, c.layout(), f.warmup, f.rounds, f.seconds, grad, {});
              rss_kib = ReadMemory().rss_kib;
              c.Shutdown();
              return r;
            }();
            if (!e2e.ok()) {
              std::fprintf(stderr, "ps-bench e2e: %s, %s over %s: %s\n", cell.c_str(),
                           RuleLabel(rule).c_str(), std::string(core::DataPlaneName(plane_of(i))).c_str(),
                           std::string(e2e.status().message()).c_str());
              ++errors;
              failed[i] = true;
              best[i].reset();
              continue;
            }
            const auto rate = [](const E2eResult& r) { return double(r.rounds) / r.seconds; };
            if (!best[i].has_value() || rate(*e2e) > rate(best[i]->e2e)) best[i] = Measured{*e2e, rss_kib};
          }
        }
        // The baseline moves the baseline rule's rounds (they differ between rules only
        // with --seconds); its rate is per round, so it compares with every rule.
        const auto measured = [&](size_t i) { return i < best.size() && best[i].has_value(); };
        size_t reference = base_rule < rules->size() ? variant(0, base_rule) : variants;
        for (size_t i = 0; !measured(reference) && i < best.size(); ++i) reference = i;
        if (!measured(reference)) continue;  // every rule failed, each reported
        const int raw_rounds = f.seconds > 0 ? best[reference]->e2e.rounds : f.rounds;
        absl::StatusOr<RawResult> raw_after =
            f.no_raw ? absl::StatusOr<RawResult>(RawResult{.seconds = 1, .cpu_seconds = 1})
                     : fastest(/*one_copy=*/false, raw_rounds, f.repeats);
        if (!raw_after.ok()) {
          std::fprintf(stderr, "ps-bench e2e: %s: raw TCP: %s\n", cell.c_str(),
                       std::string(raw_after.status().message()).c_str());
          ++errors;
          continue;
        }
        const RawResult raw = raw_before->seconds > 0 && raw_before->seconds < raw_after->seconds
                                  ? *raw_before
                                  : *raw_after;
        absl::StatusOr<RawResult> one_copy =
            f.no_raw ? absl::StatusOr<RawResult>(RawResult{.seconds = 1, .cpu_seconds = 1})
                     : fastest(/*one_copy=*/true, raw_rounds, f.repeats);
        if (!one_copy.ok()) {
          std::fprintf(stderr, "ps-bench e2e: %s: raw TCP with one copy: %s\n", cell.c_str(),
                       std::string(one_copy.status().message()).c_str());
          ++errors;
          continue;
        }
        const auto goodput_of = [&](const E2eResult& e2e) {
          return GoodputGbps(workers, params, e2e);
        };
        const size_t grpc_plane = size_t(
            std::find(planes.begin(), planes.end(), core::DataPlane::kGrpc) - planes.begin());
        for (size_t i = 0; i < variants; ++i) {
          if (!measured(i)) continue;
          const size_t plane_index = i / rules->size();
          ComparisonRow row{.workers = workers,
                            .shards = shards,
                            .params = params,
                            .codec = codec,
                            .rule = rule_of(i),
                            .plane = plane_of(i),
                            .e2e = best[i]->e2e,
                            .rss_kib = best[i]->rss_kib,
                            .raw = raw,
                            .one_copy = *one_copy,
                            .raw_rounds = raw_rounds};
          const double goodput = goodput_of(row.e2e);
          // Goodput relative to mean's in this cell on the same plane; none when mean failed.
          const size_t base = base_rule < rules->size() ? variant(plane_index, base_rule) : variants;
          if (measured(base)) row.vs_mean = goodput / goodput_of(best[base]->e2e);
          // Relative to the same rule over gRPC, when gRPC ran too and this is another plane.
          const size_t over_grpc =
              grpc_plane < planes.size() ? variant(grpc_plane, i % rules->size()) : variants;
          if (over_grpc != i && measured(over_grpc)) {
            row.vs_grpc = goodput / goodput_of(best[over_grpc]->e2e);
          }
          AddComparisonRow(f, row, table, rows);
        }
      }
    }
  }
  return FinishReport("e2e", table, "", {}, f.json, rows, errors);
}

// ---- Soak -------------------------------------------------------------------------

int RunSoak(const E2eFlags& f, uint64_t params, int workers, int shards, const std::string& codec,
            const Rule& rule, core::DataPlane plane) {
  std::vector<cli::JsonObjectWriter> rows;
  Table table({"phase", "elapsed s", "rounds", "VmRSS KiB", "VmHWM KiB", "heap in use KiB"});
  std::mutex mu;  // rows and table, from worker 0's thread and this one
  const double t_begin = NowSeconds();
  const auto sample = [&](std::string_view phase, int rounds) {
    const Memory m = ReadMemory();
    std::fprintf(stderr,
                 "ps-bench e2e --soak: %-8s t=%7.1f s rounds=%6d VmRSS=%8llu KiB VmHWM=%8llu KiB "
                 "heap in use=%8llu KiB\n",
                 std::string(phase).c_str(), NowSeconds() - t_begin, rounds,
                 (unsigned long long)m.rss_kib, (unsigned long long)m.hwm_kib,
                 (unsigned long long)m.heap_in_use_kib);
    std::lock_guard lock(mu);
    table.AddRow({std::string(phase), FormatG(NowSeconds() - t_begin, 4), absl::StrCat(rounds),
                  absl::StrCat(m.rss_kib), absl::StrCat(m.hwm_kib), absl::StrCat(m.heap_in_use_kib)});
    rows.push_back(cli::JsonObjectWriter()
                       .Add("phase", phase)
                       .Add("elapsed_seconds", NowSeconds() - t_begin)
                       .Add("rounds", rounds)
                       .Add("vm_rss_kib", m.rss_kib)
                       .Add("vm_hwm_kib", m.hwm_kib)
                       .Add("heap_in_use_kib", m.heap_in_use_kib)
                       .Add("workers", workers)
                       .Add("shards", shards)
                       .Add("model_params", params)
                       .Add("codec", codec)
                       .Add("data_plane", core::DataPlaneName(plane))
                       .Add("aggregator", rule.spec));
  };
  sample("start", 0);
  const std::vector<float> grad = MakeGradient(params);
  const std::vector<float> init_values(params, 0.01f);
  const std::vector<std::span<const float>> init = {init_values};
  absl::StatusOr<Cluster> c =
      StartCluster(f, workers, uint32_t(shards), codec, rule, plane, params, init);
  if (!c.ok()) {
    std::fprintf(stderr, "ps-bench e2e --soak: %s\n", std::string(c.status().message()).c_str());
    return 1;
  }
  sample("ready", 0);
  double next = NowSeconds() + f.soak_interval;
  int done = 0;
  absl::StatusOr<E2eResult> r = RunRounds(*c, c->layout(), f.warmup, f.rounds, f.seconds, grad, [&](int rounds) {
    done = rounds;
    if (NowSeconds() >= next) {
      next += f.soak_interval;
      sample("sample", rounds);
    }
  });
  sample("end", done);
  c->workers.clear();
  c->shards->Shutdown();
  c->shards->Stop();
  sample("stopped", done);
  if (!r.ok()) {
    std::fprintf(stderr, "ps-bench e2e --soak: %s\n", std::string(r.status().message()).c_str());
    return 1;
  }
  const double bytes = double(workers) * double(params) * 8 * r->rounds;
  std::fprintf(stderr, "ps-bench e2e --soak: %d rounds in %.1f s, goodput %.3f Gbit/s\n", r->rounds,
               r->seconds, bytes * 8 / 1e9 / r->seconds);
  return FinishReport("e2e", table, "", {}, f.json, rows, 0);
}

int RunE2e(E2eFlags f) {
  spdlog::set_level(spdlog::level::warn);
  if (f.quick) {
    f.workers = {"2"};
    f.shards = {"2"};
    f.params = "2^16";
    f.slice_elems = 4096;
    f.rounds = 3;
  }
  absl::StatusOr<uint64_t> params = ParseSize(f.params);
  absl::StatusOr<std::vector<int>> workers = ParseInts(f.workers, 1, 256, "worker count");
  absl::StatusOr<std::vector<int>> shards = ParseInts(f.shards, 1, 64, "shard count");
  for (const absl::Status& st : {params.status(), workers.status(), shards.status()}) {
    if (!st.ok()) {
      std::fprintf(stderr, "ps-bench e2e: %s\n", std::string(st.message()).c_str());
      return 2;
    }
  }
  std::vector<std::string> codecs;
  for (const std::string& text : f.codecs) {
    for (std::string& c : SplitList(text)) codecs.push_back(std::move(c));
  }
  std::vector<std::string> specs;
  for (const std::string& text : f.aggregators) {
    for (std::string& a : SplitList(text)) specs.push_back(std::move(a));
  }
  std::vector<core::DataPlane> planes;
  for (const std::string& text : f.data_planes) {
    for (const std::string& item : SplitList(text)) {
      absl::StatusOr<core::DataPlane> plane = core::ParseDataPlane(item);
      if (!plane.ok()) {
        std::fprintf(stderr, "ps-bench e2e: --data-plane: %s\n", std::string(plane.status().message()).c_str());
        return 2;
      }
      if (std::find(planes.begin(), planes.end(), *plane) == planes.end()) planes.push_back(*plane);
    }
  }
  if (*params == 0 || codecs.empty() || specs.empty() || workers->empty() || shards->empty() ||
      planes.empty()) {
    std::fprintf(stderr,
                 "ps-bench e2e: need --params > 0, a codec, an aggregator, a data plane, a worker "
                 "and a shard count\n");
    return 2;
  }
  if (!server::ParseAggregationScope(f.aggregation_scope).ok()) {
    std::fprintf(stderr, "ps-bench e2e: --aggregation-scope '%s': give model or slice\n",
                 f.aggregation_scope.c_str());
    return 2;
  }
  if (!f.shards_at.empty()) {
    if (workers->size() != 1 || codecs.size() != 1 || planes.size() != 1 || f.soak) {
      std::fprintf(stderr,
                   "ps-bench e2e --shards-at: give one --workers, --codec and --data-plane (the "
                   "running shards' plane decides), no --soak\n");
      return 2;
    }
    if (specs != std::vector<std::string>{"mean"} || f.byzantine >= 0) {
      std::fprintf(stderr,
                   "ps-bench e2e --shards-at: the running shards aggregate with their own "
                   "--aggregator and --byzantine; leave both out here\n");
      return 2;
    }
    *shards = {int(f.shards_at.size())};
  }
  if (f.tls) {
    if (!f.shards_at.empty()) {
      std::fprintf(stderr, "ps-bench e2e: --tls serves in-process shards; not with --shards-at\n");
      return 2;
    }
    absl::StatusOr<std::shared_ptr<const ThrowawayCerts>> cert = MakeThrowawayCerts(
        uint32_t(*std::max_element(shards->begin(), shards->end())),
        uint32_t(*std::max_element(workers->begin(), workers->end())));
    if (!cert.ok()) {
      std::fprintf(stderr, "ps-bench e2e --tls: %s\n", std::string(cert.status().message()).c_str());
      return 1;
    }
    f.tls_files = *std::move(cert);
  }
  // Every rule checked at every worker count before anything runs: a refusal costs no
  // measurement.
  for (int w : *workers) {
    if (!f.shards_at.empty()) break;
    if (absl::StatusOr<std::vector<Rule>> r = RulesFor(specs, w, f.byzantine, !f.soak); !r.ok()) {
      std::fprintf(stderr, "ps-bench e2e: %s\n", std::string(r.status().message()).c_str());
      return 2;
    }
  }
  if (f.soak) {
    if (workers->size() != 1 || shards->size() != 1 || codecs.size() != 1 || specs.size() != 1 ||
        planes.size() != 1) {
      std::fprintf(stderr,
                   "ps-bench e2e --soak: give one --workers, --shards, --codec, --aggregator and "
                   "--data-plane\n");
      return 2;
    }
    if (f.seconds <= 0) f.seconds = 300;
    std::fprintf(stderr,
                 "ps-bench e2e --soak: %d workers x %d shards, %llu parameters, %s, %s, %.0f s, "
                 "memory every %.0f s\n",
                 workers->front(), shards->front(), (unsigned long long)*params, codecs.front().c_str(),
                 specs.front().c_str(), f.seconds, f.soak_interval);
    return RunSoak(f, *params, workers->front(), shards->front(), codecs.front(),
                   RulesFor(specs, workers->front(), f.byzantine, /*add_mean=*/false)->front(),
                   planes.front());
  }
  const std::string rules =
      !f.shards_at.empty()
          ? std::string("their own rule")
          : absl::StrCat(absl::StrJoin(specs, ", "),
                         f.byzantine >= 0 ? absl::StrCat(", f = ", f.byzantine) : "", " (",
                         f.aggregation_scope, " scope)",
                         f.repeats > 1 ? absl::StrCat(", each the fastest of ", f.repeats, " interleaved runs")
                                       : "");
  std::fprintf(stderr,
               "ps-bench e2e: %llu parameters (%.1f MB fp32), slices of %s, %s, %s with %s%s; goodput = "
               "workers x (4 B pushed + 4 B pulled) x params x rounds / seconds\n",
               (unsigned long long)*params, double(*params) * 4 / 1e6,
               f.slice_elems == kJobSliceElems ? "the job's size (each cell's line below)"
                                               : absl::StrCat(f.slice_elems).c_str(),
               f.seconds > 0 ? absl::StrCat("timed rounds for ", f.seconds, " s").c_str()
                             : absl::StrCat(f.rounds, " timed rounds after ", f.warmup, " warm-up").c_str(),
               f.aggregate_only ? "aggregate-only shards"
                                : absl::StrCat("SGD shards (momentum ", f.momentum, ")").c_str(),
               rules.c_str(),
               absl::StrCat(f.borrow ? ", borrowed pushes" : "",
                            f.error_feedback ? ", error feedback" : "")
                   .c_str());
  return RunComparison(f, *params, *workers, *shards, codecs, specs, planes);
}

}  // namespace

Command AddE2eCommand(CLI::App& app) {
  auto f = std::make_shared<E2eFlags>();
  CLI::App* sub = app.add_subcommand(
      "e2e", "End-to-end push + pull goodput of n workers and S in-process shards on loopback, "
             "against raw loopback TCP in the same run; --soak: resident memory over minutes");
  sub->add_option("--workers", f->workers, "Worker counts (list)")->delimiter(',')->capture_default_str();
  sub->add_option("--shards", f->shards, "Shard counts (list)")->delimiter(',')->capture_default_str();
  sub->add_option("--params", f->params, "Model parameters (2^22, 4M, ...)")->capture_default_str();
  sub->add_option("--codec,--codecs", f->codecs, "Gradient codec specs (list)")->capture_default_str();
  sub->add_option("--pull-codec", f->pull_codec,
                  "The shards' --pull-codec: pulls as changes encoded with this spec (default: "
                  "dense fp32)");
  sub->add_option("--rounds", f->rounds, "Timed rounds after the warm-up rounds")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  sub->add_option("--warmup", f->warmup,
                  "Untimed rounds first (the first carries the shards' first aggregation)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  sub->add_option("--seconds", f->seconds,
                  "Run timed rounds for this long instead of --rounds (--soak: default 300)");
  sub->add_option("--slice-elems", f->slice_elems,
                  "Layout slice size (0: the job's, chosen from the measured link)")
      ->capture_default_str();
  sub->add_option("--inflight-seconds", f->inflight_seconds,
                  "WorkerOptions::inflight_seconds (0: the window stays at --inflight)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--inflight", f->inflight, "WorkerOptions::max_inflight_bytes (0: its default)")
      ->capture_default_str();
  sub->add_option("--server-threads", f->server_threads, "ServerOptions::threads (0: one per core)")
      ->capture_default_str();
  sub->add_option("--data-threads", f->data_threads,
                  "ServerOptions::data_threads: threads of each shard's TCP data plane")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));
  AddTcpRtoMinOption(sub, &f->tcp_rto_min_ms);
  sub->add_flag("--aggregate-only", f->aggregate_only, "Shards publish the aggregate instead of applying SGD");
  sub->add_flag("--borrow", f->borrow,
                "Workers push from the gradient buffer without copying it (PushOptions::borrow)");
  sub->add_flag("--error-feedback", f->error_feedback,
                "Workers add what each encoding lost to their next push (PushOptions::error_feedback)");
  sub->add_option("--momentum", f->momentum,
                  "The shards' SGD momentum (ServerOptions::momentum; ps-server's default is 0.9)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.999));
  sub->add_option("--aggregator,--aggregators", f->aggregators,
                  "Aggregation rule specs (list; docs/aggregators.md), each run on the same "
                  "configuration and compared with mean of the same run (added when absent)")
      ->capture_default_str();
  sub->add_option("--byzantine", f->byzantine,
                  "f for every rule (default: per rule, the largest f <= (n - 1) / 2 its bound "
                  "admits; mean 0)")
      ->check(CLI::Range(0, 255));
  sub->add_option("--aggregation-scope", f->aggregation_scope,
                  "model or slice: where distance rules measure (ServerOptions::aggregation_scope)")
      ->capture_default_str();
  sub->add_option("--repeats", f->repeats,
                  "Cluster runs per rule and cell, the rules interleaved (forward, then backward); "
                  "the fastest counts")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  sub->add_option("--data-plane,--data-planes", f->data_planes,
                  "The shards' data planes, grpc or tcp (list; docs/data-plane.md), each measured "
                  "on every cell, interleaved with the rules, and compared with grpc (vs grpc)")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_flag("--tls", f->tls,
                "Shards serve mutual TLS on every port with throwaway certificates for every "
                "shard and worker; the baselines stay plaintext");
  sub->add_flag("--no-raw", f->no_raw,
                "Skip the raw TCP baseline (its columns then mean nothing); for profiling the cluster");
  sub->add_flag("--soak", f->soak, "Memory over a long run (one configuration)");
  sub->add_option("--soak-interval", f->soak_interval, "Seconds between memory samples")->capture_default_str();
  sub->add_option("--json", f->json, "Also write the rows as a JSON array to FILE")->option_text("FILE");
  sub->add_flag("--quick", f->quick, "Tiny run for smoke tests");
  sub->add_option("--shards-at", f->shards_at,
                  "host:port of running shards (ps-server --insecure --workers N) to use instead "
                  "of in-process ones, by shard id (list; bench/python_e2e.py)")
      ->delimiter(',');
  return Command{.app = sub, .run = [f] { return RunE2e(*f); }};
}

}  // namespace ps::bench

