#include "server/metrics_internal.h"

#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/refusal.h"

namespace ps::server::internal {

using core::Refusal;
using core::RefusalName;

MetricFamily Family(std::string name, std::string help, MetricType type) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

ClientMetric Labelled(std::vector<ClientMetric::Label> labels) {
  ClientMetric m;
  m.label = std::move(labels);
  return m;
}

void AddCounter(MetricFamily* f, double value, std::vector<ClientMetric::Label> labels) {
  ClientMetric m = Labelled(std::move(labels));
  m.counter.value = value;
  f->metric.push_back(std::move(m));
}

void AddGauge(MetricFamily* f, double value, std::vector<ClientMetric::Label> labels) {
  ClientMetric m = Labelled(std::move(labels));
  m.gauge.value = value;
  f->metric.push_back(std::move(m));
}

MetricFamily Counter(std::string name, std::string help, double value) {
  MetricFamily f = Family(std::move(name), std::move(help), MetricType::Counter);
  AddCounter(&f, value);
  return f;
}

MetricFamily Gauge(std::string name, std::string help, double value) {
  MetricFamily f = Family(std::move(name), std::move(help), MetricType::Gauge);
  AddGauge(&f, value);
  return f;
}

// Per worker id (docs/metrics.md, "Per worker"): one series per id of --workers and per
// spare id (--max-workers) once it joined; of the refusals, those of late, malformed,
// duplicate and quarantined pushes always, the other reasons once they occurred.
void AddWorkerFamilies(const ShardStats& st, std::span<const Membership::State> states,
                       std::vector<MetricFamily>* out) {
  MetricFamily pushes = Family("ps_worker_pushes_total",
                               "Pushes of a worker taken into a round (gRPC or TCP)",
                               MetricType::Counter);
  MetricFamily refused = Family("ps_worker_push_refusals_total",
                                "Pushes and UDP chunks of a worker refused, by reason (late, "
                                "duplicate, malformed, quarantined, ...)",
                                MetricType::Counter);
  MetricFamily missed = Family("ps_worker_slice_rounds_missed_total",
                               "Slice rounds published without anything from the worker "
                               "(missed, or too late)",
                               MetricType::Counter);
  MetricFamily quarantines = Family("ps_worker_quarantines_total",
                                    "Times the worker was quarantined (--quarantine-ms)",
                                    MetricType::Counter);
  MetricFamily suspicion = Family(
      "ps_worker_suspicion",
      "How little the rule used the worker's pushes over the last --suspicion-window rounds, "
      "or how much they pointed against the aggregates: 0 used at an equal share or more and "
      "pointing with them, 1 never used or pointing exactly against (NaN before a window)",
      MetricType::Gauge);
  MetricFamily suspected = Family(
      "ps_worker_suspected",
      "1 while the worker's suspicion score is at or above --suspicion-threshold",
      MetricType::Gauge);
  MetricFamily alignment = Family(
      "ps_worker_alignment",
      "Mean cosine between the worker's pushes and the aggregates over the last "
      "--suspicion-window rounds (NaN before a window or when undefined)",
      MetricType::Gauge);
  MetricFamily share = Family("ps_worker_aggregate_share_total",
                              "Sum over the slice rounds the worker's push was aggregated in of "
                              "its share of the aggregate (1 each at an equal share)",
                              MetricType::Counter);
  MetricFamily latency = Family(
      "ps_worker_push_latency_seconds",
      "Time from a round's opening (its version's publication) to the arrival of the worker's "
      "push for it: its pull, compute and push (sum and count over its accepted pushes)",
      MetricType::Summary);
  MetricFamily weighed = Family("ps_worker_slice_rounds_aggregated_total",
                                "Slice rounds the worker's push was aggregated in (and weighed)",
                                MetricType::Counter);
  for (size_t w = 0; w < st.workers.size(); ++w) {
    if (w < states.size() && states[w] == Membership::State::kSpare) continue;
    const WorkerCounts& c = st.workers[w];
    const std::string id = absl::StrCat(w);
    AddGauge(&suspicion, c.suspicion.score, {{"worker", id}});
    AddGauge(&suspected, c.suspicion.suspected ? 1.0 : 0.0, {{"worker", id}});
    AddGauge(&alignment, c.suspicion.alignment, {{"worker", id}});
    AddCounter(&share, c.suspicion.share_sum, {{"worker", id}});
    AddCounter(&weighed, static_cast<double>(c.suspicion.slice_rounds_weighed), {{"worker", id}});
    AddCounter(&pushes, static_cast<double>(c.pushes_accepted), {{"worker", id}});
    {
      ClientMetric m = Labelled({{"worker", id}});
      m.summary.sample_count = c.pushes_accepted;
      m.summary.sample_sum = c.push_latency_seconds;
      latency.metric.push_back(std::move(m));
    }
    for (size_t r = 0; r < c.refusals.size(); ++r) {
      // The reasons alerts watch start at 0 (so that increase() sees the first one);
      // the others appear with their first refusal.
      const Refusal reason = static_cast<Refusal>(r);
      const bool watched = reason == Refusal::kLate || reason == Refusal::kMalformed ||
                           reason == Refusal::kDuplicate || reason == Refusal::kQuarantined;
      if (c.refusals[r] == 0 && !watched) continue;
      AddCounter(&refused, static_cast<double>(c.refusals[r]),
                 {{"worker", id}, {"reason", std::string(RefusalName(static_cast<Refusal>(r)))}});
    }
    AddCounter(&missed, static_cast<double>(c.slice_rounds_missed), {{"worker", id}});
    AddCounter(&quarantines, static_cast<double>(c.quarantines), {{"worker", id}});
  }
  out->push_back(std::move(pushes));
  out->push_back(std::move(latency));
  out->push_back(std::move(refused));
  out->push_back(std::move(missed));
  out->push_back(std::move(quarantines));
  out->push_back(std::move(suspicion));
  out->push_back(std::move(suspected));
  out->push_back(std::move(alignment));
  out->push_back(std::move(share));
  out->push_back(std::move(weighed));
}

// The metrics endpoint's own counters (docs/metrics.md, "The metrics endpoint itself").
void AddEndpointFamilies(const net::HttpEndpointStats& s, std::vector<MetricFamily>* out) {
  out->push_back(Counter("ps_metrics_http_connections_total",
                         "Connections accepted by the metrics endpoint",
                         static_cast<double>(s.accepted)));
  MetricFamily closed = Family("ps_metrics_http_connections_closed_total",
                               "Metrics endpoint connections closed by the server: evicted "
                               "(connection cap reached) or timed_out (no whole request and "
                               "response within the deadline)",
                               MetricType::Counter);
  AddCounter(&closed, static_cast<double>(s.evicted), {{"reason", "evicted"}});
  AddCounter(&closed, static_cast<double>(s.timed_out), {{"reason", "timed_out"}});
  out->push_back(std::move(closed));
  MetricFamily requests = Family("ps_metrics_http_requests_total",
                                 "Requests answered by the metrics endpoint: served (200) or "
                                 "refused (an error status)",
                                 MetricType::Counter);
  AddCounter(&requests, static_cast<double>(s.served), {{"result", "served"}});
  AddCounter(&requests, static_cast<double>(s.refused), {{"result", "refused"}});
  out->push_back(std::move(requests));
  out->push_back(Gauge("ps_metrics_http_open_connections",
                       "Connections open on the metrics endpoint", static_cast<double>(s.open)));
}

// The gRPC ports' families with one series per port: a gauge or counter of one field.
struct PortSeries {
  const char* name;
  const char* help;
  MetricType type;
  double (*value)(const PortStats&);
};
constexpr PortSeries kPortSeries[] = {
    {"ps_connections_accepted_total", "Connections a gRPC port admitted and handed to gRPC",
     MetricType::Counter,
     [](const PortStats& p) { return static_cast<double>(p.listener.accepted); }},
    {"ps_calls_open", "Calls open on a gRPC port", MetricType::Gauge,
     [](const PortStats& p) { return static_cast<double>(p.front.budget.calls); }},
    {"ps_request_bodies_receiving", "Calls whose request body a gRPC port is receiving",
     MetricType::Gauge,
     [](const PortStats& p) { return static_cast<double>(p.front.budget.reading); }},
    {"ps_request_bodies_waiting",
     "Calls waiting for a place to receive their request body (their client or the port at its "
     "bound)",
     MetricType::Gauge,
     [](const PortStats& p) { return static_cast<double>(p.front.budget.waiting); }},
    {"ps_health_watches_open", "grpc.health.v1 Watch streams open on a gRPC port",
     MetricType::Gauge, [](const PortStats& p) { return static_cast<double>(p.health_watches); }},
};

// The gRPC ports' connections, calls and health watches (docs/metrics.md, "Connections
// and calls"), one series per port (and state or reason) of each; refusals of the front
// are also in ps_refusals_total, the rapid-reset closes only in
// ps_connections_closed_total.
void AddPortFamilies(const std::vector<PortStats>& ports, std::vector<MetricFamily>* out) {
  for (const PortSeries& series : kPortSeries) {
    MetricFamily f = Family(series.name, series.help, series.type);
    for (const PortStats& p : ports) {
      if (series.type == MetricType::Counter) {
        AddCounter(&f, series.value(p), {{"port", p.port}});
      } else {
        AddGauge(&f, series.value(p), {{"port", p.port}});
      }
    }
    out->push_back(std::move(f));
  }
  MetricFamily open = Family("ps_connections_open",
                             "Connections open on a gRPC port, by state: unproven (no "
                             "authenticated call yet) or proven",
                             MetricType::Gauge);
  MetricFamily closed = Family("ps_connections_closed_total",
                               "Connections a gRPC port's listener closed or refused, by reason "
                               "(docs/connections.md)",
                               MetricType::Counter);
  MetricFamily refused = Family("ps_calls_refused_total",
                                "Calls a gRPC port's front ended itself, by reason: over_limit "
                                "(the client had --max-calls-per-client open), stalled (request "
                                "body not received within --request-read-timeout-ms); also in "
                                "ps_refusals_total",
                                MetricType::Counter);
  for (const PortStats& p : ports) {
    const ClientMetric::Label port{"port", p.port};
    AddGauge(&open, p.listener.table.unproven - p.listener.table.probation,
             {port, {"state", "unproven"}});
    AddGauge(&open, p.listener.table.probation, {port, {"state", "probation"}});
    AddGauge(&open, p.listener.table.proven, {port, {"state", "proven"}});
    for (size_t i = 0; i < p.listener.closed.size(); ++i) {
      AddCounter(&closed, static_cast<double>(p.listener.closed[i]),
                 {port, {"reason", std::string(CloseReasonName(static_cast<CloseReason>(i)))}});
    }
    AddCounter(&refused, static_cast<double>(p.front.refused_calls),
               {port, {"reason", std::string(RefusalName(Refusal::kOverLimit))}});
    AddCounter(&refused, static_cast<double>(p.front.stalled),
               {port, {"reason", std::string(RefusalName(Refusal::kStalled))}});
  }
  out->push_back(std::move(open));
  out->push_back(std::move(closed));
  out->push_back(std::move(refused));
}

// The process families every Prometheus client library exports (the names Grafana's
// stock panels use), read from the kernel at each scrape: resident memory (statm), CPU
// time, open descriptors and their limit, and the start time.
void AddProcessFamilies(std::vector<MetricFamily>* out) {
  const long page = ::sysconf(_SC_PAGESIZE);
  std::ifstream statm("/proc/self/statm");
  uint64_t size_pages = 0, resident_pages = 0;
  if (statm >> size_pages >> resident_pages) {
    out->push_back(Gauge("process_resident_memory_bytes", "Resident memory size in bytes",
                         static_cast<double>(resident_pages) * static_cast<double>(page)));
    out->push_back(Gauge("process_virtual_memory_bytes", "Virtual memory size in bytes",
                         static_cast<double>(size_pages) * static_cast<double>(page)));
  }
  timespec cpu{};
  if (::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu) == 0) {
    const double seconds =
        static_cast<double>(cpu.tv_sec) + static_cast<double>(cpu.tv_nsec) * 1e-9;
    out->push_back(Counter("process_cpu_seconds_total", "User and system CPU time in seconds",
                           seconds));
  }
  std::error_code ec;
  double fds = 0;
  for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end;
       it.increment(ec)) {
    ++fds;
  }
  if (!ec) out->push_back(Gauge("process_open_fds", "Open file descriptors", fds));
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    out->push_back(Gauge("process_max_fds", "Limit of open file descriptors",
                         static_cast<double>(limit.rlim_cur)));
  }
  // Boot time (/proc/stat's btime) plus the process's start in clock ticks after boot
  // (field 22 of /proc/self/stat, counted after the command name's closing parenthesis).
  static const std::optional<double> start_s = []() -> std::optional<double> {
    std::ifstream stat_file("/proc/stat");
    std::string key;
    double boot = -1;
    while (stat_file >> key) {
      if (key == "btime") {
        stat_file >> boot;
        break;
      }
      stat_file.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
    }
    std::ifstream self("/proc/self/stat");
    const std::string line((std::istreambuf_iterator<char>(self)),
                           std::istreambuf_iterator<char>());
    const size_t paren = line.rfind(')');
    if (boot < 0 || paren == std::string::npos) return std::nullopt;
    std::istringstream fields(line.substr(paren + 2));  // field 3 (state) onwards
    std::string field;
    for (int i = 3; i < 22 && fields >> field; ++i) {
    }
    double ticks = 0;
    if (!(fields >> ticks)) return std::nullopt;
    return boot + ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
  }();
  if (start_s.has_value()) {
    out->push_back(Gauge("process_start_time_seconds",
                         "Start time of the process since the epoch, in seconds", *start_s));
  }
}

// The TCP data plane's connections (docs/metrics.md, "The data plane").
MetricFamily FamilyOf(transport::BackendFamily f) {
  const bool counter = f.type == transport::BackendFamily::Type::kCounter;
  MetricFamily out = Family(std::move(f.name), std::move(f.help),
                            counter ? MetricType::Counter : MetricType::Gauge);
  for (transport::MetricSeries& s : f.series) {
    std::vector<ClientMetric::Label> labels;
    for (auto& [name, value] : s.labels) labels.push_back({std::move(name), std::move(value)});
    if (counter) {
      AddCounter(&out, s.value, std::move(labels));
    } else {
      AddGauge(&out, s.value, std::move(labels));
    }
  }
  return out;
}

}  // namespace ps::server::internal
