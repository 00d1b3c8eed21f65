// The metric families of server/metrics.cc built from what other parts count (the
// ports, the data backends, the metrics endpoint itself, the process, the per-worker
// counts), and the helpers that build a family. Internal to the metrics; not installed.
#pragma once

#include <prometheus/client_metric.h>
#include <prometheus/metric_family.h>

#include <span>
#include <string>
#include <vector>

#include "net/http_endpoint.h"
#include "server/membership.h"
#include "server/metrics.h"
#include "server/shard_counters.h"
#include "server/transport/backend.h"

namespace ps::server::internal {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily Family(std::string name, std::string help, MetricType type);
ClientMetric Labelled(std::vector<ClientMetric::Label> labels);
void AddCounter(MetricFamily* f, double value, std::vector<ClientMetric::Label> labels = {});
void AddGauge(MetricFamily* f, double value, std::vector<ClientMetric::Label> labels = {});
// A family of one unlabelled series.
MetricFamily Counter(std::string name, std::string help, double value);
MetricFamily Gauge(std::string name, std::string help, double value);

// Per worker id: pushes, refusals, slice rounds missed, quarantines, suspicion.
// `states`: each worker id's membership; spares that never joined have no series.
void AddWorkerFamilies(const ShardStats& st, std::span<const Membership::State> states,
                       std::vector<MetricFamily>* out);
void AddEndpointFamilies(const net::HttpEndpointStats& s, std::vector<MetricFamily>* out);
void AddPortFamilies(const std::vector<PortStats>& ports, std::vector<MetricFamily>* out);
void AddProcessFamilies(std::vector<MetricFamily>* out);
// A data backend's family (transport::BackendFamily) as Prometheus's.
MetricFamily FamilyOf(transport::BackendFamily f);

}  // namespace ps::server::internal
