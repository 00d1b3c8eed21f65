#include "server/control_plane.h"

#include <string>
#include <utility>

#include "server/grpc_port.h"
#include "server/health.h"
#include "server/metadata_auth.h"
#include "server/metrics.h"
#include "server/server_settings.h"
#include "server/service_internal.h"
#include "server/transport/grpc/data_methods.h"

namespace ps::server {
namespace {

GrpcPortOptions PortOptions(const ServerOptions& o, std::string name, int port,
                            const ConnectionLimits& limits) {
  return GrpcPortOptions{.name = std::move(name),
                         .host = o.host,
                         .port = static_cast<uint16_t>(port),
                         .connections = limits,
                         .calls = CallBounds(o),
                         .max_streams_per_connection = o.max_streams_per_connection,
                         .max_connection_idle = o.max_connection_idle,
                         .max_receive_bytes = static_cast<int>(o.max_message_bytes)};
}

}  // namespace

ControlPlane::ControlPlane(const Parts& parts) : parts_(parts) {
  const uint32_t watches = static_cast<uint32_t>(parts.options->max_health_watches);
  health_ = std::make_unique<HealthState>(watches);
  health_port_state_ = std::make_unique<HealthState>(watches);
  serving_ = std::make_unique<ServingState>(
      std::vector<ServingState::Publish>{
          [h = health_.get()](const std::string& s, bool on) { h->Set(s, on); },
          [h = health_port_state_.get()](const std::string& s, bool on) { h->Set(s, on); }},
      [shard = parts.shard] { return shard->ready(); });
  const CallGate gate{parts.shard, parts.auth, parts.front, serving_->admitting()};
  worker_service_ = std::make_unique<WorkerServiceImpl>(
      gate, ObjectStore::Limits{.num_workers = parts.options->WorkerIds(),
                                .bytes_per_worker = parts.options->max_object_bytes});
  grpc_data_ = std::make_unique<transport::grpc::DataMethods>(gate);
  peer_service_ = std::make_unique<PeerServiceImpl>(PeerIdentityOf(*parts.options), gate);
  admin_service_ = std::make_unique<AdminServiceImpl>(gate, parts.options, parts.checkpointer,
                                                      [this] { return serving_->serving(); });
}

ControlPlane::~ControlPlane() {
  // The servers call into the services and the health states until they are gone.
  health_port_.reset();
  port_.reset();
  admin_service_.reset();
  peer_service_.reset();
  grpc_data_.reset();
  worker_service_.reset();
  serving_.reset();
  health_port_state_.reset();
  health_.reset();
}

absl::Status ControlPlane::Start(const ConnectionLimits& limits, uint16_t udp_port,
                                 uint16_t data_port) {
  const ServerOptions& o = *parts_.options;
  worker_service_->set_udp_port(udp_port);
  worker_service_->set_data_port(data_port);
  Shard* shard = parts_.shard;
  auto on_refused = [shard](Refusal kind, absl::string_view message) {
    (void)shard->Refuse(kind, message);
  };
  GrpcPortOptions main = PortOptions(o, "port", o.port, limits);
  main.max_send_bytes = main.max_receive_bytes;
  main.memory_quota_bytes = o.max_request_memory_bytes;
  main.close_idle_at_shutdown = true;
  auto credentials = ListeningCredentials(*parts_.auth, parts_.tarpit, [shard](const absl::Status& refused) {
    (void)shard->Refuse(Refusal::kUnauthenticated, refused.message());
  });
  absl::StatusOr<std::unique_ptr<GrpcPort>> port =
      GrpcPort::Start(main, parts_.auth, parts_.clock, credentials, on_refused, [this](GrpcFront* front) {
        worker_service_->AddTo(front);
        grpc_data_->AddTo(front);
        peer_service_->AddTo(front);
        admin_service_->AddTo(front);
        AddHealthMethods(front, health_.get(), /*anonymous=*/false);
      });
  if (!port.ok()) return port.status();
  port_ = *std::move(port);
  if (o.health_port < 0) return absl::OkStatus();
  // Only grpc.health.v1, without credentials, requests of at most 4 KiB; every other
  // method is UNIMPLEMENTED. The statuses are the main port's, the watches and calls
  // bounded on their own.
  GrpcPortOptions health = PortOptions(o, "health port", o.health_port, limits);
  health.max_receive_bytes = 4096;
  port = GrpcPort::Start(health, parts_.auth, parts_.clock, grpc::InsecureServerCredentials(),
                         on_refused, [this](GrpcFront* front) {
                           AddHealthMethods(front, health_port_state_.get(), /*anonymous=*/true);
                         });
  if (!port.ok()) return port.status();
  health_port_ = *std::move(port);
  return absl::OkStatus();
}

uint16_t ControlPlane::port() const { return port_ != nullptr ? port_->port() : 0; }
uint16_t ControlPlane::health_port() const {
  return health_port_ != nullptr ? health_port_->port() : 0;
}

std::vector<PortStats> ControlPlane::PortStatsNow() const {
  std::vector<PortStats> out;
  out.push_back(PortStats{"main", port_->listener_stats(), port_->front_stats(), health_->watches()});
  if (health_port_ != nullptr) {
    out.push_back(PortStats{"health", health_port_->listener_stats(), health_port_->front_stats(),
                            health_port_state_->watches()});
  }
  return out;
}

void ControlPlane::StopAccepting() {
  for (GrpcPort* p : {port_.get(), health_port_.get()}) {
    if (p != nullptr) p->StopAccepting();
  }
}

void ControlPlane::Shutdown(std::chrono::system_clock::time_point until) {
  if (port_ != nullptr) port_->Shutdown(until);
  if (health_port_ != nullptr) health_port_->Shutdown(std::chrono::system_clock::now());
}

void ControlPlane::StopFronts() {
  for (GrpcPort* p : {port_.get(), health_port_.get()}) {
    if (p != nullptr) p->StopFront();
  }
}

}  // namespace ps::server
