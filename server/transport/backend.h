// DataBackend: what the server sees of a data backend with a port of its own (the TCP data
// plane, the UDP gradient path), and the list of them (backends.cc). The server starts the
// list before its control port (whose Join answers name the backends' ports), logs what
// each serves, reads each at every metrics scrape, and stops each in its shutdown; it
// never names a backend's type (docs/data-plane.md, "The shard: one folder per backend").
//
// gRPC's data methods are not in the list: they are two methods on the control port's
// GrpcFront (server/transport/grpc/), whose listening, draining and metrics are the
// control plane's.
//
// This header has no Asio, gRPC or Prometheus type: a backend reports its metrics as
// plain families, which server/metrics.cc renders.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/clock.h"
#include "server/connection_table.h"
#include "server/membership.h"
#include "server/options.h"
#include "server/shard_counters.h"
#include "server/shard_front.h"

namespace ps::server::transport {

// One metric family a backend reports: a name unique to it, its help text, and a series
// per label set.
struct MetricSeries {
  std::vector<std::pair<std::string, std::string>> labels;
  double value = 0;
};
struct BackendFamily {
  enum class Type { kCounter, kGauge };
  std::string name;
  std::string help;
  Type type = Type::kCounter;
  std::vector<MetricSeries> series;

  // A family of one unlabelled series.
  static BackendFamily One(std::string name, std::string help, Type type, double value) {
    return BackendFamily{std::move(name), std::move(help), type, {{{}, value}}};
  }
};

// What a backend adds to a scrape.
struct BackendScrape {
  // Bytes it received that the front does not count (UDP's whole datagrams), a series of
  // ps_received_bytes_total under the backend's name; nullopt: the front's count is its
  // count (a backend carrying the data plane: ps_received_bytes_total{transport=plane}).
  std::optional<uint64_t> received_bytes;
  std::vector<BackendFamily> families;
};

class DataBackend {
 public:
  virtual ~DataBackend() = default;

  // The backend's name, its `transport` label: "tcp", "udp".
  virtual std::string_view name() const = 0;
  // The bound port (the Join answer names it).
  virtual uint16_t port() const = 0;
  // What the serving shard logs about it once its ports are up, after "shard N: ".
  virtual std::string ServingLine() const = 0;
  // Its counts at a scrape; `shard`: the shard's at the same scrape, `states` each worker
  // id's membership (spares that never joined have no per-worker series).
  virtual BackendScrape Collect(const ShardStats& shard,
                                std::span<const Membership::State> states) const = 0;
  // What the stopping shard logs about it after "shard N: " (empty: nothing).
  virtual std::string TotalsLine(const ShardStats& shard) const = 0;
  // Stops receiving: every connection closed (freeing its pulls, watches and buffers),
  // every thread joined. Idempotent; the destructor stops too. After it, port(),
  // Collect() and TotalsLine() still answer.
  virtual void Stop() = 0;

 protected:
  DataBackend() = default;
};

// What every backend is started from.
struct BackendContext {
  const ServerOptions* options = nullptr;
  // The control port's connection bounds (server_settings.h, ConnectionBounds), which a
  // backend with connections keeps too.
  ConnectionLimits limits;
  ShardFront* front = nullptr;
  core::Clock* clock = nullptr;
  // The control port's TLS material (PEM text; empty: plaintext; a CA: client
  // certificates required), which a backend with connections uses too.
  std::string tls_cert_pem, tls_key_pem, tls_ca_pem;
};

// Starts each backend `context.options` asks for, in the list's order (udp: --udp-port
// >= 0; tcp: --data-plane tcp), each before the control port. The first that fails to
// start fails the whole (those started are stopped), its error naming the address.
// Borrowed: the front and the clock outlive the backends.
absl::StatusOr<std::vector<std::unique_ptr<DataBackend>>> StartDataBackends(
    const BackendContext& context);

// The backend named `name` in `backends`, null without one.
const DataBackend* FindBackend(std::span<const std::unique_ptr<DataBackend>> backends,
                               std::string_view name);

}  // namespace ps::server::transport
