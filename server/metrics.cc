#include "server/metrics.h"

#include <prometheus/client_metric.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/data_plane.h"
#include "net/http_endpoint.h"
#include "server/status_page.h"

namespace ps::server {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// Handler time of a Push: decode and validation, well below a millisecond for a slice.
const prometheus::Histogram::BucketBoundaries& PushBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};
  return *b;
}

// A Pull waits for its round to close: up to the round deadline (5 s by default).
const prometheus::Histogram::BucketBoundaries& PullBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  return *b;
}

// One rule over one slice (or a Gram share over a shard's slices): microseconds for a
// mean, seconds for Krum or a geometric median over large slices.
const prometheus::Histogram::BucketBoundaries& AggregationBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
      0.025,   0.05,   0.1,     0.25,   0.5,   1,      2.5,    5,    10};
  return *b;
}

double Seconds(core::Duration d) { return std::chrono::duration<double>(d).count(); }

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

void AddCounter(MetricFamily* f, double value, std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric m = Labelled(std::move(labels));
  m.counter.value = value;
  f->metric.push_back(std::move(m));
}

void AddGauge(MetricFamily* f, double value, std::vector<ClientMetric::Label> labels = {}) {
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

void AddHistogram(MetricFamily* f, const prometheus::Histogram& h,
                  std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric m = h.Collect();
  m.label = std::move(labels);
  f->metric.push_back(std::move(m));
}

// Everything a scrape returns about the shard, built at scrape time.
class Collector final {
 public:
  Collector(const Shard* shard, const transport::udp::Receiver* udp, const Tarpit* tarpit)
      : shard_(shard),
        udp_(udp),
        tarpit_(tarpit),
        push_seconds_(PushBuckets()),
        pull_seconds_(PullBuckets()) {
    for (auto& h : aggregation_seconds_) {
      h = std::make_unique<prometheus::Histogram>(AggregationBuckets());
    }
  }

  std::vector<MetricFamily> Collect() const;

  void ObservePush(core::Duration elapsed, uint64_t payload_bytes) {
    push_seconds_.Observe(Seconds(elapsed));
    plane_received_bytes_.fetch_add(payload_bytes, std::memory_order_relaxed);
  }
  void ObservePullBytes(uint64_t bytes) {
    plane_sent_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  }
  void ObservePull(core::Duration elapsed) { pull_seconds_.Observe(Seconds(elapsed)); }
  void ObserveAggregation(AggregationStage stage, core::Duration elapsed) {
    const auto i = static_cast<size_t>(stage);
    if (i < aggregation_seconds_.size()) aggregation_seconds_[i]->Observe(Seconds(elapsed));
  }
  void SetCheckpointTime(std::chrono::system_clock::time_point when) {
    checkpoint_ns_.store(
        std::chrono::duration_cast<std::chrono::nanoseconds>(when.time_since_epoch()).count(),
        std::memory_order_relaxed);
  }

 private:
  static constexpr int64_t kNoCheckpoint = std::numeric_limits<int64_t>::min();

  const Shard* const shard_;
  const transport::udp::Receiver* const udp_;
  const Tarpit* const tarpit_;
  prometheus::Histogram push_seconds_;
  prometheus::Histogram pull_seconds_;
  std::array<std::unique_ptr<prometheus::Histogram>, static_cast<size_t>(AggregationStage::kCount)>
      aggregation_seconds_;
  // Push and pull bytes of the shard's data plane (gRPC or TCP; UDP counts its own).
  std::atomic<uint64_t> plane_received_bytes_{0};
  std::atomic<uint64_t> plane_sent_bytes_{0};
  std::atomic<int64_t> checkpoint_ns_{kNoCheckpoint};
};

// Per worker id (docs/metrics.md, "Per worker"): as many series as --workers; of the
// refusals, those of late, malformed, duplicate and quarantined pushes always, the other
// reasons once they occurred.
void AddWorkerFamilies(const ShardStats& st, bool has_udp, std::vector<MetricFamily>* out) {
  MetricFamily pushes = Family("ps_worker_pushes_total",
                               "Pushes of a worker taken into a round (gRPC or TCP)",
                               MetricType::Counter);
  MetricFamily chunks = Family("ps_worker_udp_chunks_total",
                               "UDP chunks of a worker taken into a round", MetricType::Counter);
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
  for (size_t w = 0; w < st.workers.size(); ++w) {
    const WorkerCounts& c = st.workers[w];
    const std::string id = absl::StrCat(w);
    AddCounter(&pushes, static_cast<double>(c.pushes_accepted), {{"worker", id}});
    AddCounter(&chunks, static_cast<double>(c.chunks_accepted), {{"worker", id}});
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
  if (has_udp) out->push_back(std::move(chunks));
  out->push_back(std::move(refused));
  out->push_back(std::move(missed));
  out->push_back(std::move(quarantines));
}

std::vector<MetricFamily> Collector::Collect() const {
  const ShardStats st = shard_->stats();
  const bool has_udp = udp_ != nullptr;
  const transport::udp::Stats udp = has_udp ? udp_->stats() : transport::udp::Stats{};
  const ServerOptions& o = shard_->options();
  std::vector<MetricFamily> out;

  // --- identity and state ---
  MetricFamily info = Family("ps_shard_info",
                             "This shard's id and configuration (the value is always 1)",
                             MetricType::Gauge);
  AddGauge(&info, 1,
           {{"shard", absl::StrCat(shard_->shard_id())},
            {"num_shards", absl::StrCat(o.num_shards)},
            {"aggregator", o.aggregator},
            {"scope", shard_->model_scope() ? "model" : "slice"}});
  out.push_back(std::move(info));
  out.push_back(Gauge("ps_ready",
                      "1 once a layout is registered and every owned slice has its initial value",
                      shard_->ready() ? 1 : 0));
  out.push_back(Gauge("ps_workers_expected", "n: workers expected in every round (--workers)",
                      o.num_workers));
  out.push_back(Gauge("ps_workers_joined", "Workers that joined this shard (have a session)",
                      shard_->workers_joined()));
  out.push_back(Gauge("ps_workers_absent",
                      "Workers that left or expired (--worker-timeout-ms): no round waits for them",
                      shard_->workers_absent()));
  out.push_back(Gauge("ps_round_quorum",
                      "Fewest inputs a round is aggregated with (n - f, or --quorum)",
                      shard_->quorum()));
  out.push_back(Gauge("ps_published_version",
                      "Lowest published version over the owned slices (0 before ready)",
                      static_cast<double>(shard_->MinVersion())));

  // --- latency ---
  MetricFamily push = Family("ps_push_duration_seconds",
                             "Time the gRPC Push handler took (decode and checks), refused "
                             "pushes included",
                             MetricType::Histogram);
  AddHistogram(&push, push_seconds_);
  out.push_back(std::move(push));
  MetricFamily pull = Family("ps_pull_duration_seconds",
                             "Time from a Pull request to the end of its stream, waiting for "
                             "the round included",
                             MetricType::Histogram);
  AddHistogram(&pull, pull_seconds_);
  out.push_back(std::move(pull));
  MetricFamily aggregation =
      Family("ps_aggregation_duration_seconds",
             "Time of one aggregation step: a slice's rule (slice), a model-scope Gram share "
             "(model_gram), a model-scope plan applied to a slice (model_apply)",
             MetricType::Histogram);
  for (size_t i = 0; i < aggregation_seconds_.size(); ++i) {
    AddHistogram(&aggregation, *aggregation_seconds_[i],
                 {{"stage", std::string(AggregationStageName(static_cast<AggregationStage>(i)))}});
  }
  out.push_back(std::move(aggregation));

  // --- bytes ---
  // The data plane's pushes and pulls under its name (--data-plane: grpc or tcp).
  const std::string plane(core::DataPlaneName(shard_->options().data_plane));
  MetricFamily received = Family("ps_received_bytes_total",
                                 "Gradient bytes received: push payloads of the data plane "
                                 "(grpc or tcp; refused ones included) and whole UDP datagrams",
                                 MetricType::Counter);
  AddCounter(&received, static_cast<double>(plane_received_bytes_.load(std::memory_order_relaxed)),
             {{"transport", plane}});
  if (has_udp) {
    AddCounter(&received, static_cast<double>(udp.bytes), {{"transport", "udp"}});
  }
  out.push_back(std::move(received));
  MetricFamily sent = Family("ps_sent_bytes_total",
                             "Parameter bytes written to pulls, by data plane (grpc or tcp)",
                             MetricType::Counter);
  AddCounter(&sent, static_cast<double>(plane_sent_bytes_.load(std::memory_order_relaxed)),
             {{"transport", plane}});
  out.push_back(std::move(sent));
  out.push_back(Counter("ps_push_wire_bytes_total",
                        "Encoded payload bytes of accepted pushes and UDP chunks",
                        static_cast<double>(st.push_bytes)));
  out.push_back(Counter("ps_push_decoded_bytes_total",
                        "fp32 bytes the accepted pushes and UDP chunks decoded to "
                        "(compression ratio: rate of this over rate of ps_push_wire_bytes_total)",
                        static_cast<double>(st.push_decoded_bytes)));

  // --- pushes and rounds ---
  out.push_back(Counter("ps_pushes_accepted_total", "Gradient slices accepted over gRPC",
                        static_cast<double>(st.pushes_accepted)));
  out.push_back(Counter("ps_rounds_closed_total", "Slice rounds aggregated and published",
                        static_cast<double>(st.rounds_closed)));
  out.push_back(Counter("ps_rounds_closed_at_deadline_total",
                        "Slice rounds closed at their deadline with the quorum, not all n",
                        static_cast<double>(st.rounds_closed_at_deadline)));
  out.push_back(Counter("ps_aggregation_errors_total",
                        "Slice rounds whose aggregation failed (parameters published unchanged)",
                        static_cast<double>(st.aggregation_errors)));
  MetricFamily dropped_rounds =
      Family("ps_rounds_dropped_total",
             "Slice rounds published unchanged without running the rule, by reason "
             "(below_quorum: fewer inputs than the quorum)",
             MetricType::Counter);
  AddCounter(&dropped_rounds, static_cast<double>(st.rounds_dropped_below_quorum),
             {{"reason", "below_quorum"}});
  out.push_back(std::move(dropped_rounds));
  out.push_back(Counter("ps_round_deadlines_below_quorum_total",
                        "Slice round deadlines that passed below the quorum (the round then "
                        "waits for it, or in a UDP round is dropped a deadline later)",
                        static_cast<double>(st.deadlines_below_quorum)));
  out.push_back(Counter("ps_model_rounds_total",
                        "Model-scope rounds aggregated from every shard's share",
                        static_cast<double>(st.model_rounds)));
  out.push_back(Counter("ps_model_rounds_dropped_total",
                        "Model-scope rounds dropped (a peer's share late, or no plan); "
                        "parameters published unchanged",
                        static_cast<double>(st.model_rounds_dropped)));
  out.push_back(Counter("ps_shares_refused_total", "Model-scope shares from peers refused",
                        static_cast<double>(st.shares_refused)));
  out.push_back(Counter("ps_quarantines_total",
                        "Workers quarantined after a malformed push or chunk (--quarantine-ms)",
                        static_cast<double>(st.quarantines)));

  MetricFamily refusals = Family("ps_refusals_total", "Requests refused, by reason",
                                 MetricType::Counter);
  for (size_t i = 0; i < st.refusals.size(); ++i) {
    AddCounter(&refusals, static_cast<double>(st.refusals[i]),
               {{"reason", std::string(RefusalName(static_cast<Refusal>(i)))}});
  }
  out.push_back(std::move(refusals));
  if (tarpit_ != nullptr) {
    const Tarpit::Stats held = tarpit_->stats();
    out.push_back(Counter("ps_refusals_held_total",
                          "Refusal answers the tarpit held (the client was over its budget)",
                          static_cast<double>(held.held_total)));
    out.push_back(Gauge("ps_refusals_in_tarpit", "Refusal answers the tarpit holds now",
                        static_cast<double>(held.held_now)));
  }
  AddWorkerFamilies(st, has_udp, &out);

  // --- UDP path ---
  if (has_udp) {
    out.push_back(Counter("ps_udp_chunks_accepted_total", "UDP chunks taken by the shard",
                          static_cast<double>(st.udp_chunks_accepted)));
    out.push_back(Counter("ps_udp_chunks_lost_total",
                          "UDP chunks missing when their round closed (masked in the aggregate)",
                          static_cast<double>(st.udp_chunks_lost)));
    MetricFamily dropped = Family("ps_udp_datagrams_dropped_total",
                                  "UDP datagrams dropped, by reason", MetricType::Counter);
    const std::pair<const char*, uint64_t> reasons[] = {
        {"malformed", udp.malformed}, {"unknown_session", udp.unknown_session},
        {"forged", udp.forged},       {"replayed", udp.replayed},
        {"stale", udp.stale},         {"refused", udp.refused}};
    for (const auto& [reason, count] : reasons) {
      AddCounter(&dropped, static_cast<double>(count), {{"reason", reason}});
    }
    out.push_back(std::move(dropped));
  }

  // --- durability ---
  const int64_t checkpoint_ns = checkpoint_ns_.load(std::memory_order_relaxed);
  if (checkpoint_ns != kNoCheckpoint) {
    const auto when = std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(
            std::chrono::nanoseconds(checkpoint_ns)));
    const double age =
        std::chrono::duration<double>(std::chrono::system_clock::now() - when).count();
    out.push_back(Gauge("ps_checkpoint_age_seconds",
                        "Seconds since the last successful checkpoint (absent before the first)",
                        std::max(age, 0.0)));
  }
  return out;
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

// The TCP data plane's connections (docs/metrics.md, "The data plane").
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
    out->push_back(Counter("process_cpu_seconds_total", "User and system CPU time in seconds",
                           static_cast<double>(cpu.tv_sec) + static_cast<double>(cpu.tv_nsec) * 1e-9));
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
    const std::string line((std::istreambuf_iterator<char>(self)), std::istreambuf_iterator<char>());
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

void AddDataPlaneFamilies(const transport::tcp::Stats& s, std::vector<MetricFamily>* out) {
  out->push_back(Counter("ps_data_connections_accepted_total",
                         "Connections the TCP data port took (within its bounds)",
                         static_cast<double>(s.accepted)));
  out->push_back(Counter("ps_data_connections_refused_total",
                         "Connections the TCP data port closed at accept (proven ones fill it; "
                         "over a source's or the port's unproven bound, the oldest unproven "
                         "connection is closed instead)",
                         static_cast<double>(s.refused)));
  out->push_back(Counter("ps_data_connections_admitted_total",
                         "Data connections whose handshake proved a worker's data session",
                         static_cast<double>(s.admitted)));
  out->push_back(Gauge("ps_data_connections_open", "Connections open on the TCP data port",
                       static_cast<double>(s.open)));
  MetricFamily closed = Family("ps_data_connections_closed_total",
                               "Connections the TCP data port closed or refused by its rules, by "
                               "reason (docs/connections.md)",
                               MetricType::Counter);
  for (size_t i = 0; i < s.closed.size(); ++i) {
    AddCounter(&closed, static_cast<double>(s.closed[i]),
               {{"reason", std::string(CloseReasonName(static_cast<CloseReason>(i)))}});
  }
  out->push_back(std::move(closed));
}

}  // namespace

class Metrics::Impl {
 public:
  Impl(const Shard* shard, const transport::udp::Receiver* udp, const Tarpit* tarpit)
      : collector(shard, udp, tarpit),
        shard(shard),
        endpoint(std::vector<net::HttpResource>{
            {"/metrics", "text/plain; version=0.0.4; charset=utf-8", [this] { return Render(); }},
            {"/status", "text/html; charset=utf-8", [this] { return RenderStatus(); }}}) {}

  std::string RenderStatus() const {
    const ShardStats st = shard->stats();
    const ServerOptions& o = shard->options();
    StatusView v;
    v.shard_id = shard->shard_id();
    v.num_shards = o.num_shards;
    v.aggregator = o.aggregator;
    v.ready = shard->ready();
    v.min_version = shard->MinVersion();
    v.max_version = shard->MaxVersion();
    v.workers_expected = o.num_workers;
    v.rounds_closed = st.rounds_closed;
    v.pushes_accepted = st.pushes_accepted;
    for (uint64_t n : st.refusals) v.refusals += n;
    v.workers = st.workers;
    for (uint32_t w = 0; w < st.workers.size(); ++w) v.states.push_back(shard->membership(w));
    return StatusPage(v);
  }

  std::string Render() const {
    std::vector<MetricFamily> families = collector.Collect();
    {
      absl::ReaderMutexLock lock(&port_mu);
      if (port_source) AddPortFamilies(port_source(), &families);
      if (data_plane_source) AddDataPlaneFamilies(data_plane_source(), &families);
    }
    AddEndpointFamilies(endpoint.stats(), &families);
    AddProcessFamilies(&families);
    std::ostringstream out;
    prometheus::TextSerializer().Serialize(out, families);
    return out.str();
  }

  Collector collector;
  const Shard* const shard;
  mutable absl::Mutex port_mu;
  PortSource port_source ABSL_GUARDED_BY(port_mu);
  DataPlaneSource data_plane_source ABSL_GUARDED_BY(port_mu);
  // After the collector: destroyed (its thread joined) before what it renders.
  net::HttpEndpoint endpoint;
};

Metrics::Metrics(const Shard* shard, const transport::udp::Receiver* udp, const Tarpit* tarpit)
    : impl_(std::make_unique<Impl>(shard, udp, tarpit)) {}

Metrics::~Metrics() { Stop(); }

absl::Status Metrics::Serve(const std::string& host, uint16_t port) {
  absl::StatusOr<uint16_t> bound = impl_->endpoint.Start(host, port);
  if (bound.ok()) return absl::OkStatus();
  if (bound.status().code() == absl::StatusCode::kFailedPrecondition) {
    return absl::FailedPreconditionError(
        absl::StrCat("metrics already served on port ", impl_->endpoint.port()));
  }
  return absl::UnavailableError(
      absl::StrCat("cannot serve metrics: ", bound.status().message()));
}

uint16_t Metrics::port() const { return impl_->endpoint.port(); }

void Metrics::Stop() { impl_->endpoint.Stop(); }

void Metrics::SetPortSource(PortSource source) {
  {
    absl::WriterMutexLock lock(&impl_->port_mu);
    std::swap(impl_->port_source, source);
  }
  // `source` (the old one) is destroyed here, outside the lock.
}

void Metrics::SetDataPlaneSource(DataPlaneSource source) {
  {
    absl::WriterMutexLock lock(&impl_->port_mu);
    std::swap(impl_->data_plane_source, source);
  }
  // The old source is destroyed here, outside the lock.
}

std::string Metrics::Render() const { return impl_->Render(); }

std::string Metrics::RenderStatus() const { return impl_->RenderStatus(); }

void Metrics::ObservePush(core::Duration elapsed, uint64_t payload_bytes) {
  impl_->collector.ObservePush(elapsed, payload_bytes);
}

void Metrics::ObservePullBytes(uint64_t bytes) { impl_->collector.ObservePullBytes(bytes); }

void Metrics::ObservePull(core::Duration elapsed) { impl_->collector.ObservePull(elapsed); }

void Metrics::ObserveAggregation(AggregationStage stage, core::Duration elapsed) {
  impl_->collector.ObserveAggregation(stage, elapsed);
}

void Metrics::SetCheckpointTime(std::chrono::system_clock::time_point when) {
  impl_->collector.SetCheckpointTime(when);
}

}  // namespace ps::server
