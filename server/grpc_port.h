// GrpcPort: one of a shard's gRPC ports, the main one or --health-port: its own listening
// socket (Listener, which admits connections under the port's bounds), the front that
// every call goes through (GrpcFront, whose methods the caller adds), and the gRPC server
// they feed, built with the port's HTTP/2 and connection settings. The port is up when
// Start returns.
//
// Stopping is in three steps, for the server's shutdown order: StopAccepting (no new
// connections), Shutdown (gRPC answers what is in flight and sends every connection a
// GOAWAY; by `until`), StopFront (the front's stall checks end). The destructor does
// whatever of them is left, in that order.
//
// Thread safety: stats() from any thread once Start returned; the rest from the thread
// that owns the port.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "core/clock.h"
#include "core/refusal.h"
#include "server/connection_table.h"
#include "server/grpc_front.h"
#include "server/listener.h"

namespace ps::server {

struct GrpcPortOptions {
  std::string name;  // in log lines and errors: "port", "health port"
  std::string host;
  uint16_t port = 0;  // 0: a free port
  ConnectionLimits connections;
  CallLimits calls;
  uint32_t max_streams_per_connection = 100;
  std::chrono::milliseconds max_connection_idle{0};
  int max_receive_bytes = 4 << 20;
  int max_send_bytes = 0;             // 0: gRPC's default
  uint64_t memory_quota_bytes = 0;    // 0: none (gRPC's default)
  // After the sockets are closed at shutdown, whether connections left without a call
  // are closed by the port as soon as no call is open (the main port: workers whose
  // channels are idle read the GOAWAY late).
  bool close_idle_at_shutdown = false;
};

class GrpcPort {
 public:
  // `auth` and `clock` are borrowed. `credentials`: the listening credentials.
  // `add_methods` adds the port's methods to its front before it serves.
  static absl::StatusOr<std::unique_ptr<GrpcPort>> Start(
      const GrpcPortOptions& options, const Authenticator* auth, core::Clock* clock,
      std::shared_ptr<grpc::ServerCredentials> credentials,
      std::function<void(core::Refusal, absl::string_view)> on_refused,
      const std::function<void(GrpcFront*)>& add_methods);
  ~GrpcPort();
  GrpcPort(const GrpcPort&) = delete;
  GrpcPort& operator=(const GrpcPort&) = delete;

  uint16_t port() const { return listener_->port(); }
  ListenerStats listener_stats() const { return listener_->stats(); }
  FrontStats front_stats() const { return front_->stats(); }

  void StopAccepting();
  void Shutdown(std::chrono::system_clock::time_point until);
  void StopFront();

 private:
  GrpcPort() = default;

  std::string name_;
  bool close_idle_at_shutdown_ = false;
  std::unique_ptr<GrpcFront> front_;
  std::unique_ptr<Listener> listener_;
  std::unique_ptr<grpc::Server> server_;
  bool shut_down_ = false;
};

}  // namespace ps::server
