// `ps-bench aggregators`: seconds per Aggregate() call for each rule over a grid of n
// (inputs), d (coordinates) and thread counts, as input bytes per second and as a ratio
// against the single-thread memory read bandwidth measured in the same run
// (docs/bench.md). Only the public aggregators API is used, and the rules come from
// AggregatorNames() at run time.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "aggregators/aggregator.h"
#include "bench/aggregators_cuda_bench.h"
#include "bench/bench_util.h"
#include "bench/commands.h"

namespace ps::bench {
namespace {

namespace agg = ps::aggregators;

struct AggregatorsFlags {
  std::vector<std::string> n{"8,16,32,64"};
  std::vector<std::string> d{"2^20,2^24"};
  std::vector<std::string> threads{"1,all"};
  std::vector<std::string> rules;  // empty: AggregatorNames()
  int f = -1;                      // -1: the largest the rule allows up to n / 4
  int outliers = -1;               // -1: FillInputs' default, max(1, n / 8)
  int repeats = 3;
  double min_seconds = 0.1;
  std::string memread_bytes = "1G";
  std::string json;
  std::string dump_dir;
  uint64_t seed = 1;
  bool quick = false;
  bool list = false;
  std::string device = "cpu";
};

// Options whose count() tells whether the user gave them (--quick fills the rest).
struct GivenOptions {
  CLI::Option* n = nullptr;
  CLI::Option* d = nullptr;
  CLI::Option* threads = nullptr;
  CLI::Option* repeats = nullptr;
  CLI::Option* min_seconds = nullptr;
  CLI::Option* memread_bytes = nullptr;
};

struct Row {
  std::string rule;
  int n = 0;
  int f = 0;
  uint64_t d = 0;
  int threads = 0;
  Timing timing;
  std::string output_file;
};

// A rule made with the largest f that MakeAggregator accepts, from `f_max` down to 0
// (or exactly `f_fixed` when that is >= 0); else why not.
struct MadeRule {
  std::unique_ptr<agg::Aggregator> rule;
  int f = 0;
  std::string error;
};

MadeRule MakeRule(const std::string& spec, int n, int f_max, int f_fixed) {
  MadeRule made;
  const int hi = f_fixed >= 0 ? f_fixed : f_max;
  const int lo = f_fixed >= 0 ? f_fixed : 0;
  for (int f = hi; f >= lo; --f) {
    absl::StatusOr<std::unique_ptr<agg::Aggregator>> rule =
        agg::MakeAggregator(spec, agg::AggregatorOptions{.num_workers = n, .num_byzantine = f});
    if (rule.ok()) {
      made.rule = *std::move(rule);
      made.f = f;
      made.error.clear();
      return made;
    }
    // The message for the smallest f tried says why even that fails.
    made.error = std::string(rule.status().message());
  }
  return made;
}

std::string FileSafe(std::string_view text) {
  std::string out;
  for (char c : text) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    out += ok ? c : '_';
  }
  return out;
}

absl::Status WriteFloats(const std::string& path, std::span<const float> values) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(reinterpret_cast<const char*>(values.data()),
             static_cast<std::streamsize>(values.size_bytes()));
  file.close();
  if (!file) return absl::UnavailableError(absl::StrCat("cannot write '", path, "'"));
  return absl::OkStatus();
}

double PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<double>(pages) * static_cast<double>(page_size);
}

int RunAggregators(AggregatorsFlags flags, const GivenOptions& given) {
  const std::vector<std::string> known = agg::AggregatorNames();
  if (flags.list) {
    for (const std::string& name : known) std::printf("%s\n", name.c_str());
    return 0;
  }
  if (flags.quick) {
    if (given.n->count() == 0) flags.n = {"8"};
    if (given.d->count() == 0) flags.d = {"2^18"};
    if (given.repeats->count() == 0) flags.repeats = 1;
    if (given.min_seconds->count() == 0) flags.min_seconds = 0;
    if (given.memread_bytes->count() == 0) flags.memread_bytes = "256M";
  }
  auto fail = [](const absl::Status& st) {
    std::fprintf(stderr, "ps-bench aggregators: %s\n", std::string(st.message()).c_str());
    return 2;
  };
  absl::StatusOr<std::vector<uint64_t>> ns = ParseSizeList(flags.n);
  if (!ns.ok()) return fail(ns.status());
  for (uint64_t n : *ns) {
    if (flags.outliers > 0 && static_cast<uint64_t>(flags.outliers) > n) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("--outliers ", flags.outliers, " exceeds n = ", n)));
    }
  }
  absl::StatusOr<std::vector<uint64_t>> ds = ParseSizeList(flags.d);
  if (!ds.ok()) return fail(ds.status());
  absl::StatusOr<std::vector<int>> thread_counts = ParseThreadList(flags.threads);
  if (!thread_counts.ok()) return fail(thread_counts.status());
  absl::StatusOr<uint64_t> memread_bytes = ParseSize(flags.memread_bytes);
  if (!memread_bytes.ok()) return fail(memread_bytes.status());
  for (uint64_t n : *ns) {
    if (n < 1 || n > 4096) return fail(absl::InvalidArgumentError("--n must be in [1, 4096]"));
  }
  for (uint64_t d : *ds) {
    if (d < 1) return fail(absl::InvalidArgumentError("--d must be >= 1"));
  }
  std::vector<std::string> rules;
  for (const std::string& text : flags.rules) {
    for (std::string& spec : SplitList(text)) rules.push_back(std::move(spec));
  }
  if (rules.empty()) rules = known;
  if (flags.device == "cuda") {
    return RunAggregatorsCuda(CudaAggregatorsGrid{
        .ns = *ns,
        .ds = *ds,
        .rules = rules,
        .f = flags.f,
        .seed = flags.seed,
        .timing = TimingOptions{.repeats = flags.repeats, .min_seconds = flags.min_seconds},
        .json = flags.json});
  }

  // One input buffer for the whole grid, sized for the largest (n, d) that fits in
  // three quarters of physical memory; larger cells are skipped.
  const double memory_limit = 0.75 * PhysicalMemoryBytes();
  std::vector<std::string> skipped;
  uint64_t buffer_floats = 0, max_d = 0;
  for (uint64_t d : *ds) {
    for (uint64_t n : *ns) {
      const double bytes = (static_cast<double>(n) + 2) * static_cast<double>(d) * sizeof(float);
      if (memory_limit > 0 && bytes > memory_limit) continue;
      buffer_floats = std::max(buffer_floats, n * d);
      max_d = std::max(max_d, d);
    }
  }

  MemreadBaseline baseline(*memread_bytes);

  auto inputs = std::make_unique_for_overwrite<float[]>(std::max<uint64_t>(buffer_floats, 1));
  std::vector<float> out(max_d);
  std::vector<float> state;
  const int all_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::unique_ptr<core::ThreadPool> fill_pool = MakePool(all_threads);
  std::map<int, std::unique_ptr<core::ThreadPool>> pools;
  for (int t : *thread_counts) pools[t] = MakePool(t);

  TimingOptions timing_options{.repeats = flags.repeats, .min_seconds = flags.min_seconds};
  std::vector<Row> rows;
  int errors = 0;
  for (uint64_t d : *ds) {
    for (uint64_t n64 : *ns) {
      const int n = static_cast<int>(n64);
      if (n64 * d > buffer_floats || d > max_d) {
        skipped.push_back(absl::StrFormat("n=%d d=%s: %d x %s floats do not fit in memory", n,
                                          FormatSize(d), n, FormatSize(d)));
        continue;
      }
      std::vector<float*> row_ptrs(n);
      for (int i = 0; i < n; ++i) row_ptrs[i] = inputs.get() + static_cast<size_t>(i) * d;
      FillInputs(flags.seed, row_ptrs, d, fill_pool.get(), flags.outliers);
      const std::vector<const float*> input_ptrs(row_ptrs.begin(), row_ptrs.end());
      const std::span<float> output(out.data(), d);

      for (const std::string& spec : rules) {
        MadeRule made = MakeRule(spec, n, n / 4, flags.f);
        if (made.rule == nullptr) {
          skipped.push_back(
              absl::StrFormat("%s n=%d d=%s: %s", spec, n, FormatSize(d), made.error));
          std::fprintf(stderr, "skip %s n=%d: %s\n", spec.c_str(), n, made.error.c_str());
          continue;
        }
        const agg::Aggregator& rule = *made.rule;
        if (n < rule.MinInputs()) {
          skipped.push_back(absl::StrFormat("%s n=%d: needs %s", spec, n, rule.Bound()));
          continue;
        }
        state.assign(rule.StateRows() * d, 0.0f);
        std::string output_file;
        if (!flags.dump_dir.empty()) {
          // The output of one call from a zero state (a first round).
          std::fill(state.begin(), state.end(), 0.0f);
          agg::AggregationContext ctx{.pool = fill_pool.get(), .state = state};
          absl::Status st = rule.Aggregate(input_ptrs, output, ctx);
          if (st.ok()) {
            output_file = absl::StrFormat("%s/%s_n%d_f%d_d%d.f32", flags.dump_dir, FileSafe(spec),
                                          n, made.f, d);
            st = WriteFloats(output_file, output);
          }
          if (!st.ok()) {
            std::fprintf(stderr, "error %s n=%d d=%s: %s\n", spec.c_str(), n, FormatSize(d).c_str(),
                         std::string(st.message()).c_str());
            ++errors;
            continue;
          }
        }
        for (int t : *thread_counts) {
          agg::AggregationContext ctx{.pool = pools[t].get(), .state = state};
          absl::StatusOr<Timing> timing =
              TimeCalls([&] { return rule.Aggregate(input_ptrs, output, ctx); }, timing_options);
          if (!timing.ok()) {
            std::fprintf(stderr, "error %s n=%d f=%d d=%s threads=%d: %s\n", spec.c_str(), n,
                         made.f, FormatSize(d).c_str(), t,
                         std::string(timing.status().message()).c_str());
            ++errors;
            continue;
          }
          rows.push_back(Row{.rule = spec,
                             .n = n,
                             .f = made.f,
                             .d = d,
                             .threads = t,
                             .timing = *timing,
                             .output_file = output_file});
          const double gbps =
              static_cast<double>(n64 * d * sizeof(float)) / timing->best_seconds / 1e9;
          std::fprintf(stderr, "%s n=%d f=%d d=%s threads=%d: %s s (%.2f GB/s)\n", spec.c_str(), n,
                       made.f, FormatSize(d).c_str(), t, FormatG(timing->best_seconds, 4).c_str(),
                       gbps);
        }
      }
    }
  }
  inputs.reset();
  pools.clear();

  const double memread = baseline.Finish();

  Table table({"rule", "n", "f", "d", "threads", "seconds", "input GB/s", "ratio vs memread"});
  std::vector<cli::JsonObjectWriter> json_rows;
  for (const Row& row : rows) {
    const double input_bytes = static_cast<double>(row.n) * static_cast<double>(row.d) * 4.0;
    const double gbps = input_bytes / row.timing.best_seconds / 1e9;
    const double ratio = gbps / memread;
    table.AddRow({row.rule, absl::StrCat(row.n), absl::StrCat(row.f), FormatSize(row.d),
                  absl::StrCat(row.threads), FormatG(row.timing.best_seconds, 4),
                  absl::StrFormat("%.2f", gbps), absl::StrFormat("%.3f", ratio)});
    cli::JsonObjectWriter json;
    json.Add("rule", row.rule)
        .Add("n", row.n)
        .Add("f", row.f)
        .Add("d", row.d)
        .Add("threads", row.threads)
        .Add("seconds", row.timing.best_seconds)
        .Add("input_gbps", gbps)
        .Add("ratio_vs_memread", ratio)
        .Add("seconds_median", row.timing.median_seconds)
        .Add("calls_per_repeat", row.timing.calls_per_repeat)
        .Add("memread_gbps", memread);
    if (!row.output_file.empty()) json.Add("output_file", row.output_file);
    json_rows.push_back(std::move(json));
  }

  std::printf("%s\n", baseline.Describe().c_str());
  std::printf("seconds: per call, best of %d repeat(s); input GB/s = n * d * 4 bytes / seconds\n\n",
              std::max(flags.repeats, 1));
  return FinishReport("aggregators", table, "skipped", skipped, flags.json, json_rows, errors);
}

}  // namespace

Command AddAggregatorsCommand(CLI::App& app) {
  auto flags = std::make_shared<AggregatorsFlags>();
  auto given = std::make_shared<GivenOptions>();
  CLI::App* sub = app.add_subcommand(
      "aggregators",
      "Seconds per Aggregate() call per rule over n x d x threads, as input GB/s and as a "
      "ratio against single-thread memory read bandwidth");
  given->n =
      sub->add_option("--n", flags->n, "Numbers of inputs, comma-separated")->capture_default_str();
  given->d = sub->add_option("--d", flags->d,
                             "Coordinates per input, comma-separated (1048576, 2^20, 1<<20, 1M)")
                 ->capture_default_str();
  given->threads = sub->add_option("--threads", flags->threads,
                                   "Thread counts, comma-separated; 'all' = hardware_concurrency()")
                       ->capture_default_str();
  sub->add_option("--rules", flags->rules,
                  "Aggregator specs, comma-separated (commas inside parentheses kept); "
                  "default: every name in AggregatorNames()");
  sub->add_option("--f", flags->f,
                  "Fixed f for every rule; default: the largest the rule accepts up to n/4");
  given->repeats = sub->add_option("--repeats", flags->repeats,
                                   "Timed repeats per cell (after one warm-up); the best is "
                                   "reported")
                       ->capture_default_str();
  given->min_seconds = sub->add_option("--min-seconds", flags->min_seconds,
                                       "Each repeat makes enough calls to last at least this long")
                           ->capture_default_str();
  given->memread_bytes = sub->add_option("--memread-bytes", flags->memread_bytes,
                                         "Buffer size of the memory read baseline")
                             ->capture_default_str();
  sub->add_option("--json", flags->json, "Also write the rows as a JSON array to FILE")
      ->option_text("FILE");
  sub->add_option("--dump-dir", flags->dump_dir,
                  "Write each rule's output (one call, zero state) as raw float32 to DIR "
                  "(for bench/compare_torch.py)")
      ->option_text("DIR");
  sub->add_option("--seed", flags->seed, "Seed of the input generator")->capture_default_str();
  sub->add_option("--outliers", flags->outliers,
                  "Inputs made outliers (the last ones; at most n); default max(1, n/8)")
      ->check(CLI::Range(0, 1 << 20));
  sub->add_flag("--quick", flags->quick,
                "Small grid for smoke tests: n=8, d=2^18, 1 repeat, no minimum time "
                "(flags given explicitly still win)");
  sub->add_flag("--list", flags->list, "Print the rule names and exit");
  sub->add_option("--device", flags->device,
                  "cpu, or cuda: inputs in device memory, ratio against a device-to-device copy "
                  "(docs/gpu.md; --threads is ignored)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  return Command{.app = sub, .run = [flags, given] { return RunAggregators(*flags, *given); }};
}

}  // namespace ps::bench
