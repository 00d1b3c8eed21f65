#include "bench/hostile_report.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/bench_util.h"
#include "cli/json_line.h"

namespace ps::bench {

// ---- Row --------------------------------------------------------------------------------

double Row::Mean(const std::vector<Phase>& phases) {
  double sum = 0;
  for (const Phase& p : phases) sum += p.rounds_per_s;
  return phases.empty() ? 0 : sum / double(phases.size());
}

double Row::MeanCpu(const std::vector<Phase>& phases) {
  double sum = 0;
  for (const Phase& p : phases) sum += p.server_cpu;
  return phases.empty() ? 0 : sum / double(phases.size());
}

std::vector<double> Row::Ratios() const {
  std::vector<double> r;
  for (size_t i = 0; i < std::min(base.size(), attack_phases.size()); ++i) {
    r.push_back(base[i].rounds_per_s > 0 ? attack_phases[i].rounds_per_s / base[i].rounds_per_s
                                         : 0);
  }
  return r;
}

double Row::Ratio() const {
  std::vector<double> r = Ratios();
  if (r.empty()) return 0;
  std::sort(r.begin(), r.end());
  return r.size() % 2 == 1 ? r[r.size() / 2] : (r[r.size() / 2 - 1] + r[r.size() / 2]) / 2;
}

double Row::PeakRss() const {
  return Max([](const Phase& p) { return p.peak_rss_mib; }, true);
}

double Row::BasePeakRss() const {
  double m = 0;
  for (const Phase& p : base) m = std::max(m, p.peak_rss_mib);
  return m;
}

uint64_t Row::LogBytes() const {
  uint64_t n = ran_prelude ? prelude.log_bytes : 0;
  for (const Phase& p : attack_phases) n += p.log_bytes;
  return n;
}

// ---- Table and JSON ------------------------------------------------------------------------

namespace {

// `a` and `b` (JSON objects) as one object, a's members first.
std::string MergeObjects(const std::string& a, const std::string& b) {
  if (a == "{}") return b;
  if (b == "{}") return a;
  return absl::StrCat(a.substr(0, a.size() - 1), ",", b.substr(1));
}

std::string JsonArray(const std::vector<double>& values) {
  std::vector<std::string> parts;
  for (double v : values) {
    std::string one = cli::JsonObjectWriter().Add("v", v).str();  // {"v":...}
    parts.push_back(one.substr(5, one.size() - 6));
  }
  return absl::StrCat("[", absl::StrJoin(parts, ","), "]");
}

}  // namespace

std::string RowJson(const Row& r, double bound_mib) {
  cli::JsonObjectWriter head, codes, tail, notes;
  head.Add("attack", r.attack)
      .Add("baseline_rounds_per_s", r.Mean(r.base))
      .Add("attack_rounds_per_s", r.Mean(r.attack_phases))
      .Add("ratio", r.Ratio())
      .Add("peak_rss_mib", r.PeakRss())
      .Add("rss_bound_mib", bound_mib)
      .Add("requests", r.requests);
  for (const auto& [code, n] : r.refusals) codes.Add(code, n);
  tail.Add("accepted", r.accepted)
      .Add("baseline_log_bytes", Row::Sum(r.base, [](const Phase& p) { return p.log_bytes; }))
      .Add("baseline_peak_rss_mib", r.BasePeakRss())
      .Add("peak_fds", r.Max([](const Phase& p) { return p.peak_fds; }, true))
      .Add("baseline_peak_fds",
           [&] {
             uint64_t m = 0;
             for (const Phase& p : r.base) m = std::max(m, p.peak_fds);
             return m;
           }())
      .Add("server_cpu_baseline", r.MeanCpu(r.base))
      .Add("server_cpu_attack", r.MeanCpu(r.attack_phases))
      .Add("bench_cpu_baseline",
           [&] {
             double s = 0;
             for (const Phase& p : r.base) s += p.bench_cpu / double(r.base.size());
             return s;
           }())
      .Add("bench_cpu_attack",
           [&] {
             double s = 0;
             for (const Phase& p : r.attack_phases)
               s += p.bench_cpu / double(r.attack_phases.size());
             return s;
           }())
      .Add("honest_errors_baseline",
           Row::Sum(r.base, [](const Phase& p) { return p.honest_errors; }))
      .Add("honest_errors_attack",
           Row::Sum(r.attack_phases, [](const Phase& p) { return p.honest_errors; }))
      .Add("prelayout_requests", r.ran_prelude ? r.prelude.requests : uint64_t{0})
      .Add("prelayout_peak_rss_mib", r.ran_prelude ? r.prelude.peak_rss_mib : 0.0)
      .Add("cover_pushes", r.cover_pushed)
      .Add("cover_refused", r.cover_refused)
      .Add("check", r.has_check ? r.check.text : "")
      .Add("check_ok", r.check.ok)
      .Add("notes", absl::StrJoin(r.notes, "; "))
      .Add("server_end", r.server_end)
      .Add("error", r.error);
  std::string json =
      MergeObjects(head.str(), absl::StrCat("{\"refusals_by_code\":", codes.str(), "}"));
  json = MergeObjects(json, cli::JsonObjectWriter().Add("log_bytes", r.LogBytes()).str());
  json =
      MergeObjects(json, absl::StrCat("{\"ratio_per_alternation\":", JsonArray(r.Ratios()), "}"));
  return MergeObjects(json, tail.str());
}

std::vector<std::string> ReportColumns() {
  return {"attack",    "base rounds/s", "attack rounds/s", "ratio", "server CPU", "peak RSS MiB",
          "bound MiB", "requests",      "log bytes",       "status codes", "check"};
}

std::vector<std::string> ReportCells(const Row& r, double bound_mib) {
  std::vector<std::string> codes;
  for (const auto& [code, n] : r.refusals) codes.push_back(absl::StrCat(code, " ", n));
  return {r.attack,
          FormatG(r.Mean(r.base), 4),
          FormatG(r.Mean(r.attack_phases), 4),
          FormatG(r.Ratio(), 3),
          absl::StrCat(FormatG(r.MeanCpu(r.base), 2), " -> ",
                       FormatG(r.MeanCpu(r.attack_phases), 2)),
          FormatG(r.PeakRss(), 4),
          FormatG(bound_mib, 4),
          absl::StrCat(r.requests),
          absl::StrCat(r.LogBytes()),
          codes.empty() ? "-" : absl::StrJoin(codes, ", "),
          r.has_check ? r.check.text : "-"};
}

std::vector<std::string> Findings(const Row& r, double bound_mib) {
  std::vector<std::string> out;
  if (!r.error.empty()) out.push_back(absl::StrCat("run failed: ", r.error));
  for (const Phase& p : r.base) {
    if (p.rounds_per_s <= 0) out.push_back("honest training made no round in a baseline phase");
  }
  for (const Phase& p : r.attack_phases) {
    if (p.rounds_per_s <= 0) out.push_back("honest training made no round in an attack phase");
  }
  if (r.PeakRss() > bound_mib) {
    out.push_back(absl::StrCat("peak VmRSS ", FormatG(r.PeakRss(), 4), " MiB above the bound ",
                               bound_mib, " MiB"));
  }
  if (r.accepted > 0) out.push_back(absl::StrCat(r.accepted, " requests not refused"));
  if (r.has_check && !r.check.ok) out.push_back(r.check.text);
  if (!r.server_end.empty() && r.server_end != "exit 0")
    out.push_back(absl::StrCat("server end: ", r.server_end));
  return out;
}

}  // namespace ps::bench
