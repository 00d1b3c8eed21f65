#include "worker_lib/espresso_planner_internal.h"

#include <algorithm>
#include <numeric>
#include <queue>
#include <tuple>

namespace ps::internal {
namespace {

// A part of a tensor waiting for one server (a link or a shard's CPU).
struct Job {
  double avail = 0;  // when it may start
  double duration = 0;
  uint32_t priority = 0;  // P3 order; FIFO servers ignore it
  size_t tensor = 0;
  double numel = 0;           // of the part
  double start = 0, end = 0;  // set by the server
};

// Serves `jobs` one at a time: whenever the server is free it takes, among the jobs
// available by then, the one of lowest (priority, tensor); idle until the next job
// when none is.
void ServeByPriority(std::vector<Job>& jobs) {
  std::vector<size_t> by_avail(jobs.size());
  std::iota(by_avail.begin(), by_avail.end(), 0);
  std::stable_sort(by_avail.begin(), by_avail.end(),
                   [&jobs](size_t a, size_t b) { return jobs[a].avail < jobs[b].avail; });
  const auto later = [&jobs](size_t a, size_t b) {
    return std::tie(jobs[a].priority, jobs[a].tensor) > std::tie(jobs[b].priority, jobs[b].tensor);
  };
  std::priority_queue<size_t, std::vector<size_t>, decltype(later)> ready(later);
  double t = 0;
  size_t next = 0;
  for (size_t served = 0; served < jobs.size(); ++served) {
    if (ready.empty()) t = std::max(t, jobs[by_avail[next]].avail);
    while (next < by_avail.size() && jobs[by_avail[next]].avail <= t) ready.push(by_avail[next++]);
    Job& j = jobs[ready.top()];
    ready.pop();
    j.start = t;
    j.end = t + j.duration;
    t = j.end;
  }
}

// Serves `jobs` in the order they become available (ties: lower tensor first).
void ServeInArrivalOrder(std::vector<Job>& jobs) {
  std::vector<size_t> order(jobs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&jobs](size_t a, size_t b) {
    return std::tie(jobs[a].avail, jobs[a].tensor) < std::tie(jobs[b].avail, jobs[b].tensor);
  });
  double t = 0;
  for (size_t i : order) {
    Job& j = jobs[i];
    j.start = std::max(t, j.avail);
    j.end = j.start + j.duration;
    t = j.end;
  }
}

}  // namespace

RoundTimeline SimulateRound(const PlanInput& in, std::span<const size_t> choice) {
  const size_t m = in.tensors.size();
  const size_t shards = in.up.size();
  // Encodes: one queue per device, in ready order.
  std::vector<size_t> order(m);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&in](size_t a, size_t b) {
    return in.tensors[a].ready_seconds < in.tensors[b].ready_seconds;
  });
  std::vector<double> encoded(m);
  double cpu_free = 0, gpu_free = 0;
  for (size_t i : order) {
    const PlanTensor& t = in.tensors[i];
    const PlanOption& o = in.options[choice[i]];
    double& free = o.device == core::Device::kCuda ? gpu_free : cpu_free;
    const double start = std::max(t.ready_seconds, free);
    free = start + o.encode_seconds_per_value * static_cast<double>(t.numel);
    encoded[i] = free;
  }
  // Pushes, per shard: alpha + beta x the part's payload, in P3 order.
  std::vector<std::vector<Job>> up(shards);
  for (size_t i = 0; i < m; ++i) {
    const PlanOption& o = in.options[choice[i]];
    for (const PlanTensor::Part& p : in.tensors[i].parts) {
      const PlanLink& link = in.up[p.shard];
      const double n = static_cast<double>(p.numel);
      up[p.shard].push_back(
          {.avail = encoded[i],
           .duration = link.alpha_seconds + link.seconds_per_byte * o.bytes_per_value * n,
           .priority = in.tensors[i].priority,
           .tensor = i,
           .numel = n});
    }
  }
  RoundTimeline timeline;
  timeline.hidden.assign(m, true);
  timeline.pulled.assign(m, 0);
  for (size_t s = 0; s < shards; ++s) {
    ServeByPriority(up[s]);
    // A push followed by an idle uplink is off that link's critical path.
    std::vector<const Job*> by_start;
    for (const Job& j : up[s]) by_start.push_back(&j);
    std::sort(by_start.begin(), by_start.end(),
              [](const Job* a, const Job* b) { return a->start < b->start; });
    for (size_t k = 0; k < by_start.size(); ++k) {
      const bool idle_after = k + 1 < by_start.size() && by_start[k + 1]->start > by_start[k]->end;
      if (!idle_after) timeline.hidden[by_start[k]->tensor] = false;
    }
    // The shard decodes every worker's push of a part, then aggregates it.
    std::vector<Job> agg;
    for (const Job& j : up[s]) {
      const PlanOption& o = in.options[choice[j.tensor]];
      agg.push_back(
          {.avail = j.end,
           .duration =
               (in.workers * o.decode_seconds_per_value + in.aggregate_seconds_per_value) * j.numel,
           .priority = j.priority,
           .tensor = j.tensor,
           .numel = j.numel});
    }
    ServeInArrivalOrder(agg);
    // Pulls in P3 order.
    std::vector<Job> down;
    const PlanLink& link = in.down[s];
    for (const Job& j : agg) {
      down.push_back({.avail = j.end,
                      .duration = link.alpha_seconds +
                                  link.seconds_per_byte * in.pull_bytes_per_value * j.numel,
                      .priority = j.priority,
                      .tensor = j.tensor,
                      .numel = j.numel});
    }
    ServeByPriority(down);
    for (const Job& j : down) {
      timeline.pulled[j.tensor] = std::max(timeline.pulled[j.tensor], j.end);
      timeline.seconds = std::max(timeline.seconds, j.end);
    }
  }
  return timeline;
}

namespace {

// Espresso's order: largest first; among equals, nearer the output (its gradient is
// ready first).
std::vector<size_t> BySize(const PlanInput& in) {
  std::vector<size_t> order(in.tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&in](size_t a, size_t b) {
    const PlanTensor& x = in.tensors[a];
    const PlanTensor& y = in.tensors[b];
    return x.numel != y.numel ? x.numel > y.numel : x.priority > y.priority;
  });
  return order;
}

// Every tensor on options[0], where both searches start; *round gets its timeline.
Plan Baseline(const PlanInput& in, RoundTimeline* round) {
  Plan plan;
  plan.choice.assign(in.tensors.size(), 0);
  *round = SimulateRound(in, plan.choice);
  plan.simulations = 1;
  plan.baseline_seconds = round->seconds;
  return plan;
}

}  // namespace

Plan PlanGreedy(const PlanInput& in) {
  RoundTimeline best;
  Plan plan = Baseline(in, &best);
  for (size_t t : BySize(in)) {
    if (best.hidden[t]) continue;
    const size_t current = plan.choice[t];
    size_t chosen = current;
    for (size_t o = 0; o < in.options.size(); ++o) {
      if (o == current) continue;
      plan.choice[t] = o;
      RoundTimeline r = SimulateRound(in, plan.choice);
      ++plan.simulations;
      if (r.seconds < best.seconds) {
        best = std::move(r);
        chosen = o;
      }
    }
    plan.choice[t] = chosen;
  }
  plan.predicted_seconds = best.seconds;
  return plan;
}

Plan PlanFewestBytes(const PlanInput& in) {
  RoundTimeline current;
  Plan plan = Baseline(in, &current);
  // The options from the fewest bytes per value up (ties: the earlier option).
  std::vector<size_t> cheapest(in.options.size());
  std::iota(cheapest.begin(), cheapest.end(), 0);
  std::stable_sort(cheapest.begin(), cheapest.end(), [&in](size_t a, size_t b) {
    return in.options[a].bytes_per_value < in.options[b].bytes_per_value;
  });
  for (size_t t : BySize(in)) {
    const size_t before = plan.choice[t];
    for (size_t o : cheapest) {
      // Options sending as many bytes as the current one or more cannot save any.
      if (in.options[o].bytes_per_value >= in.options[before].bytes_per_value) break;
      plan.choice[t] = o;
      RoundTimeline r = SimulateRound(in, plan.choice);
      ++plan.simulations;
      if (r.seconds <= plan.baseline_seconds) {
        current = std::move(r);
        break;
      }
      plan.choice[t] = before;
    }
  }
  plan.predicted_seconds = current.seconds;
  return plan;
}

}  // namespace ps::internal
