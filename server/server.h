// Server: one running ps-server shard. Start() validates the options, makes the
// aggregation rule (refusing an n/f outside its bound), binds the gRPC port and
// starts serving WorkerService, PeerService and the standard gRPC health service;
// background threads close rounds at their deadlines and check the peers.
//
// Shutdown() is the SIGTERM path: health NOT_SERVING, refuse new work, let running
// aggregations finish and open pulls end, stop gRPC within the drain timeout. It is
// idempotent and thread-safe. The destructor calls it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "server/metrics.h"
#include "server/options.h"
#include "server/shard.h"
#include "server/transport/udp/receiver.h"

namespace ps::server {

class Server {
 public:
  // `clock` may be null for the real clock; a test passes its own.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options,
                                                       core::Clock* clock = nullptr);
  virtual ~Server() = default;
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The bound TCP port (useful with port 0).
  virtual uint16_t port() const = 0;
  // The bound UDP port of the lossy gradient path, 0 without one (--udp-port -1).
  virtual uint16_t udp_port() const = 0;
  virtual std::optional<transport::udp::Stats> udp_stats() const = 0;
  // The bound port of the TCP data plane, 0 without one (--data-plane grpc).
  virtual uint16_t data_port() const = 0;
  // The bound port of the metrics endpoint (/metrics), 0 without one (--metrics-port -1).
  virtual uint16_t metrics_port() const = 0;
  // The bound port of the plaintext health-only listener, 0 without one (--health-port -1).
  virtual uint16_t health_port() const = 0;
  // The shard's metrics, null without --metrics-port; lives as long as the Server.
  virtual Metrics* metrics() = 0;
  virtual Shard& shard() = 0;
  // True while the health service reports SERVING (peers agree, not draining).
  virtual bool serving() const = 0;
  virtual void Shutdown() = 0;

 protected:
  Server() = default;
};

}  // namespace ps::server
