#include "server/metrics.h"

#include <prometheus/client_metric.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <array>
#include <atomic>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/data_plane.h"
#include "net/http_endpoint.h"
#include "server/metrics_internal.h"
#include "server/status_page.h"

namespace ps::server {
namespace {

using internal::AddCounter;
using internal::AddGauge;
using internal::Counter;
using internal::Family;
using internal::Gauge;
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

void AddHistogram(MetricFamily* f, const prometheus::Histogram& h,
                  std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric m = h.Collect();
  m.label = std::move(labels);
  f->metric.push_back(std::move(m));
}

// Everything a scrape returns about the shard, built at scrape time.
class Collector final {
 public:
  Collector(const Shard* shard, const Tarpit* tarpit)
      : shard_(shard),
        tarpit_(tarpit),
        push_seconds_(PushBuckets()),
        pull_seconds_(PullBuckets()) {
    for (auto& h : aggregation_seconds_) {
      h = std::make_unique<prometheus::Histogram>(AggregationBuckets());
    }
  }

  // With what `backends` count (detached by the caller before they go).
  std::vector<MetricFamily> Collect(std::span<const transport::DataBackend* const> backends) const;

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

std::vector<MetricFamily> Collector::Collect(
    std::span<const transport::DataBackend* const> backends) const {
  const ShardStats st = shard_->stats();
  const std::vector<Membership::State> states = shard_->MembershipStates();
  std::vector<transport::BackendScrape> scrapes;
  for (const transport::DataBackend* b : backends) scrapes.push_back(b->Collect(st, states));
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
  out.push_back(Gauge("ps_workers_expected",
                      "n: workers expected in every round from the start (--workers)",
                      o.num_workers));
  out.push_back(Gauge("ps_workers_max",
                      "Worker ids accepted (--max-workers): expected workers and spares",
                      o.WorkerIds()));
  out.push_back(Gauge("ps_workers_waited",
                      "Workers the rounds wait for now: present, and expected ones not yet "
                      "joined",
                      shard_->workers_waited()));
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
                             "Time a push of the reliable data plane took in the shard (decode "
                             "and checks), refused pushes included",
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
             "(model_gram), a model-scope plan applied to a slice (model_apply), a slice's "
             "part of the Gram matrix as it closed (model_slice_gram)",
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
  for (size_t i = 0; i < backends.size(); ++i) {
    if (!scrapes[i].received_bytes.has_value()) continue;
    AddCounter(&received, static_cast<double>(*scrapes[i].received_bytes),
               {{"transport", std::string(backends[i]->name())}});
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
  out.push_back(Counter("ps_pushes_accepted_total",
                        "Gradient slices accepted on the data plane (grpc or tcp)",
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
  internal::AddWorkerFamilies(st, states, &out);

  // --- the data backends' own ---
  for (transport::BackendScrape& scrape : scrapes) {
    for (transport::BackendFamily& f : scrape.families) out.push_back(internal::FamilyOf(std::move(f)));
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

}  // namespace

class Metrics::Impl {
 public:
  Impl(const Shard* shard, const Tarpit* tarpit)
      : collector(shard, tarpit),
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
    v.states = shard->MembershipStates();
    return StatusPage(v);
  }

  std::string Render() const {
    std::vector<MetricFamily> families;
    {
      absl::ReaderMutexLock lock(&port_mu);
      families = collector.Collect(backends);
      if (port_source) internal::AddPortFamilies(port_source(), &families);
    }
    internal::AddEndpointFamilies(endpoint.stats(), &families);
    internal::AddProcessFamilies(&families);
    std::ostringstream out;
    prometheus::TextSerializer().Serialize(out, families);
    return out.str();
  }

  Collector collector;
  const Shard* const shard;
  mutable absl::Mutex port_mu;
  PortSource port_source ABSL_GUARDED_BY(port_mu);
  std::vector<const transport::DataBackend*> backends ABSL_GUARDED_BY(port_mu);
  // After the collector: destroyed (its thread joined) before what it renders.
  net::HttpEndpoint endpoint;
};

Metrics::Metrics(const Shard* shard, const Tarpit* tarpit)
    : impl_(std::make_unique<Impl>(shard, tarpit)) {}

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

void Metrics::SetBackends(std::vector<const transport::DataBackend*> backends) {
  absl::WriterMutexLock lock(&impl_->port_mu);
  impl_->backends = std::move(backends);
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
