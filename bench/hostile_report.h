// What `ps-bench hostile` reports for each attack (docs/bench.md, "Hostile clients"):
// the figures of its phases, the row of the table and of the JSON array, and the
// findings (what a row shows that the hardening promises otherwise).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "bench/hostile_attacks.h"

namespace ps::bench {

// One phase of an attack's run: a baseline, an attack phase, or the prelude before the
// honest layout exists.
struct Phase {
  double seconds = 0;
  double rounds_per_s = 0;
  uint64_t honest_errors = 0;
  double peak_rss_mib = 0;
  uint64_t peak_fds = 0;
  uint64_t log_bytes = 0;
  double server_cpu = 0;  // CPU seconds per second
  double bench_cpu = 0;   // of this process (honest workers, attacker, gRPC), the same
  uint64_t requests = 0;
};

// One attack's run against a fresh server.
struct Row {
  std::string attack;
  std::vector<Phase> base, attack_phases;
  Phase prelude;
  bool ran_prelude = false;
  uint64_t requests = 0, accepted = 0;
  std::map<std::string, uint64_t> refusals;
  uint64_t cover_pushed = 0, cover_refused = 0;
  std::string honest_last_error;
  AttackCheck check;
  bool has_check = false;
  std::vector<std::string> notes;
  std::string server_end;  // how the server ended
  std::string error;       // the run itself failed

  // Mean honest rounds per second, and mean server CPU, over `phases`.
  static double Mean(const std::vector<Phase>& phases);
  static double MeanCpu(const std::vector<Phase>& phases);
  // Attack over baseline rounds per second, per alternation; their median.
  std::vector<double> Ratios() const;
  double Ratio() const;
  // The largest `field` of the attack phases (and the prelude when `with_prelude`).
  template <typename F>
  auto Max(F field, bool with_prelude) const {
    decltype(field(Phase{})) m{};
    for (const Phase& p : attack_phases) m = std::max(m, field(p));
    if (with_prelude && ran_prelude) m = std::max(m, field(prelude));
    return m;
  }
  double PeakRss() const;
  double BasePeakRss() const;
  // The log's growth in the attack phases and the prelude.
  uint64_t LogBytes() const;
  template <typename F>
  static uint64_t Sum(const std::vector<Phase>& phases, F field) {
    uint64_t n = 0;
    for (const Phase& p : phases) n += field(p);
    return n;
  }
};

// The table's columns, and a row's cells in them; `bound_mib`: --max-shard-bytes.
std::vector<std::string> ReportColumns();
std::vector<std::string> ReportCells(const Row& r, double bound_mib);

// The row as one JSON object: the keys of smoke_hostile.py first, then the rest.
std::string RowJson(const Row& r, double bound_mib);

// What a row shows that the hardening promises otherwise; empty when nothing.
std::vector<std::string> Findings(const Row& r, double bound_mib);

}  // namespace ps::bench
