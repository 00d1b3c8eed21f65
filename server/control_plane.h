// ControlPlane: a shard's gRPC side. The services (ps.v1.WorkerService, the gRPC data
// methods, PeerService, AdminService and grpc.health.v1), the health the shard reports
// (ServingState over one HealthState per port), and the ports that serve them: the main
// port with the listening credentials, and --health-port (health only, plaintext).
//
// Start() opens the ports once the data ports are known (a Join answer names them); the
// stop is in the three steps of GrpcPort, each for both ports, so that the server can
// put the tarpit and the TCP data plane between them.
//
// Thread safety: serving() and PortStatsNow() from any thread once started; the rest
// from the server's thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "core/clock.h"
#include "server/connection_table.h"
#include "server/options.h"
#include "server/serving_state.h"

namespace ps::server {

class Authenticator;
class Checkpointer;
class GrpcPort;
class HealthState;
class Shard;
class ShardFront;
class Tarpit;
class WorkerServiceImpl;
class PeerServiceImpl;
class AdminServiceImpl;
struct PortStats;
namespace transport::grpc {
class DataMethods;
}  // namespace transport::grpc

class ControlPlane {
 public:
  // Borrowed, for the control plane's life.
  struct Parts {
    const ServerOptions* options = nullptr;
    core::Clock* clock = nullptr;
    const Authenticator* auth = nullptr;
    Shard* shard = nullptr;
    ShardFront* front = nullptr;
    Tarpit* tarpit = nullptr;
    Checkpointer* checkpointer = nullptr;  // null without --checkpoint-dir
  };
  explicit ControlPlane(const Parts& parts);
  ~ControlPlane();  // the ports first, then the services, then the health
  ControlPlane(const ControlPlane&) = delete;
  ControlPlane& operator=(const ControlPlane&) = delete;

  ServingState& serving() { return *serving_; }
  const ServingState& serving() const { return *serving_; }

  // Opens the ports. `udp_port`, `data_port`: what Join answers name (0: none).
  absl::Status Start(const ConnectionLimits& limits, uint16_t udp_port, uint16_t data_port);
  uint16_t port() const;
  uint16_t health_port() const;  // 0 without --health-port
  bool started() const { return port_ != nullptr; }
  // The main port, and --health-port when set (for the metrics).
  std::vector<PortStats> PortStatsNow() const;

  void StopAccepting();
  void Shutdown(std::chrono::system_clock::time_point until);
  void StopFronts();

 private:
  const Parts parts_;
  std::unique_ptr<HealthState> health_, health_port_state_;
  std::unique_ptr<ServingState> serving_;
  std::unique_ptr<WorkerServiceImpl> worker_service_;
  std::unique_ptr<transport::grpc::DataMethods> grpc_data_;
  std::unique_ptr<PeerServiceImpl> peer_service_;
  std::unique_ptr<AdminServiceImpl> admin_service_;
  std::unique_ptr<GrpcPort> port_, health_port_;
};

}  // namespace ps::server
