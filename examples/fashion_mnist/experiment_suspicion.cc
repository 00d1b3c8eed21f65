// The suspicion scores of a grid's cells, ranked and tabulated (experiment.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "examples/fashion_mnist/experiment.h"

namespace ps::fashion_mnist {

SuspectRanking RankSuspects(const CellResult& r) {
  SuspectRanking out;
  double honest_sum = 0, byzantine_sum = 0;
  size_t honest_count = 0, byzantine_count = 0;
  for (const SuspicionWindow& w : r.suspicion) {
    const size_t n = w.scores.size();
    if (n == 0 || r.cell.byzantine >= n ||
        std::any_of(w.scores.begin(), w.scores.end(), [](double s) { return std::isnan(s); })) {
      continue;
    }
    const size_t honest = n - r.cell.byzantine;
    ++out.windows;
    double honest_max = -std::numeric_limits<double>::infinity();
    double byzantine_min = std::numeric_limits<double>::infinity();
    for (size_t id = 0; id < n; ++id) {
      if (id < honest) {
        honest_max = std::max(honest_max, w.scores[id]);
        honest_sum += w.scores[id];
        ++honest_count;
      } else {
        byzantine_min = std::min(byzantine_min, w.scores[id]);
        byzantine_sum += w.scores[id];
        ++byzantine_count;
      }
    }
    out.honest_max = std::max(out.honest_max, honest_max);
    if (r.cell.byzantine > 0 && byzantine_min > honest_max) ++out.ranked;
  }
  if (honest_count > 0) out.honest_mean = honest_sum / static_cast<double>(honest_count);
  if (byzantine_count > 0) {
    out.byzantine_mean = byzantine_sum / static_cast<double>(byzantine_count);
  }
  return out;
}

std::string SuspicionTable(const std::vector<CellResult>& results, double threshold) {
  std::string out = absl::StrCat(
      "| rule | attack | f | split | seed | windows | Byzantine ranked highest | honest max "
      "| honest mean | Byzantine mean |\n|---|---|---|---|---|---|---|---|---|---|\n");
  size_t rows = 0;
  for (const CellResult& r : results) {
    const SuspectRanking k = RankSuspects(r);
    if (k.windows == 0) continue;
    ++rows;
    const std::string ranked =
        r.cell.byzantine == 0
            ? "-"
            : absl::StrFormat("%.2f (%zu of %zu)", static_cast<double>(k.ranked) /
                                                       static_cast<double>(k.windows),
                              k.ranked, k.windows);
    const std::string honest_max =
        absl::StrFormat("%.3f%s", k.honest_max, k.honest_max >= threshold ? " (!)" : "");
    absl::StrAppend(&out, "| ", r.cell.rule, " | ", r.cell.attack, " | ", r.cell.byzantine, " | ",
                    r.cell.split, " | ", r.cell.seed, " | ", k.windows, " | ", ranked, " | ",
                    honest_max,
                    " | ", absl::StrFormat("%.3f", k.honest_mean), " | ",
                    r.cell.byzantine == 0 ? "-" : absl::StrFormat("%.3f", k.byzantine_mean),
                    " |\n");
  }
  if (rows == 0) return "";
  absl::StrAppend(&out, "\nScores per window of rounds and shard (0: an equal share of the "
                        "aggregates or more, 1: never used); (!) an honest worker at or above "
                        "the threshold ", threshold, ".\n");
  return out;
}

}  // namespace ps::fashion_mnist
