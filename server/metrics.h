// Metrics: a shard's Prometheus metrics (docs/metrics.md), rendered in the text
// exposition format and, once Serve() is called, served at http://HOST:PORT/metrics (and
// the operator's /status page, server/status_page.h) by
// an embedded HTTP server (net::HttpEndpoint, net/http_endpoint.h: one Asio thread, a
// deadline per connection, a cap on open connections).
//
// What the Shard and the data backends already count (ShardStats, each backend's
// Collect(), server/transport/backend.h) is read when scraped, never counted a second time; only what the gRPC service alone sees (push
// and pull latency, bytes in and out) and aggregation times are observed at the event,
// through the Observe* methods.
//
// The gRPC ports' connections, calls and health watches (docs/connections.md) are read
// the same way, through a source of PortStats that the server sets once its ports are
// up (SetPortSource); until then, and without one, those metrics are absent.
//
// Ownership: borrows the Shard and the Tarpit (which may be null); both must outlive the
// Metrics, or at least every Render() and scrape (Stop() ends the scrapes). What the port
// source reads, and the backends, must outlive every Render() (scrapes included) until
// replaced: SetPortSource(nullptr) and SetBackends({}) detach them, and return only once
// no Render() uses them any more (the server does so before its ports go).
// Thread safety: every method may be called concurrently from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/clock.h"
#include "server/port_stats.h"
#include "server/shard.h"
#include "server/tarpit.h"
#include "server/transport/backend.h"

namespace ps::server {

// What a scrape reads about one gRPC port: its Listener's, its GrpcFront's and its
// HealthState's counts.
struct PortStats {
  std::string port;  // the `port` label: "main", "health" (--health-port)
  ListenerStats listener;
  FrontStats front;
  uint32_t health_watches = 0;  // Watch streams open
};

class Metrics {
 public:
  // Returns every port's stats, called at each Render().
  using PortSource = std::function<std::vector<PortStats>()>;

  explicit Metrics(const Shard* shard, const Tarpit* tarpit = nullptr);
  // Stops serving first.
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Serves /metrics on `host`:`port` (0: a free port) until Stop(). UNAVAILABLE when the
  // address cannot be bound; FAILED_PRECONDITION when already serving.
  absl::Status Serve(const std::string& host, uint16_t port);
  // The bound port, 0 when not serving.
  uint16_t port() const;
  // Stops the HTTP server: closes every connection, waits for a Render() in progress.
  // Idempotent; Serve() may follow.
  void Stop();

  // The ports' stats are read from `source` from now on (empty: none). Called from any
  // thread; once no Render() is using the previous source, it returns.
  void SetPortSource(PortSource source);

  // The data backends with ports of their own (the UDP path, the TCP plane), each read
  // through DataBackend::Collect at every Render() from now on (empty: none, and their
  // families are absent). Called from any thread; once no Render() is using the previous
  // ones, it returns.
  void SetBackends(std::vector<const transport::DataBackend*> backends);

  // Every metric in the Prometheus text format, as a scrape returns it.
  std::string Render() const;
  // The /status page (server/status_page.h) the endpoint serves beside /metrics.
  std::string RenderStatus() const;

  // One push of an admitted session handled by the shard (accepted or refused): its time
  // and payload size (ShardFront::Push).
  void ObservePush(core::Duration elapsed, uint64_t payload_bytes);
  // Slice values written to a Pull stream.
  void ObservePullBytes(uint64_t bytes);
  // A Pull stream finished (any status), `elapsed` after its request arrived.
  void ObservePull(core::Duration elapsed);
  // One aggregation step (Shard::SetAggregationObserver).
  void ObserveAggregation(AggregationStage stage, core::Duration elapsed);
  // When the last checkpoint was written; ps_checkpoint_age_seconds is absent until the
  // first call.
  void SetCheckpointTime(std::chrono::system_clock::time_point when);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ps::server
