#include "server/grpc_port.h"

#include <thread>
#include <utility>

#include <grpcpp/resource_quota.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "server/server_settings.h"
#include "spdlog/spdlog.h"

namespace ps::server {
namespace {

// The initial HTTP/2 window of a stream on the shard's ports: what a stream the front has
// not started to read can hold. HTTP/2's default; a larger one (320 KiB, 1 MiB, 4 MiB)
// measured no faster in ps-bench e2e (docs/bench.md).
constexpr int kStreamWindowBytes = 64 << 10;

// HTTP/2 and connection settings.
void ApplyTransportBounds(const GrpcPortOptions& o, grpc::ServerBuilder* builder) {
  // Streams a connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS).
  builder->AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                              static_cast<int>(o.max_streams_per_connection));
  // A stream the front has not started to read holds at most its initial window: a
  // fixed one, since the bandwidth-delay probe would grow it to megabytes per stream.
  // A read opens the window to the message's size, so throughput does not depend on it.
  builder->AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kStreamWindowBytes);
  // Idle and dead connections go away (each holds buffers and a slot): a connection
  // without calls for --max-connection-idle-ms is closed, and keepalive pings find
  // peers that vanished without closing theirs.
  builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                              static_cast<int>(o.max_connection_idle.count()));
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 60000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
}

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcPort>> GrpcPort::Start(
    const GrpcPortOptions& options, const Authenticator* auth, core::Clock* clock,
    std::shared_ptr<grpc::ServerCredentials> credentials,
    std::function<void(core::Refusal, absl::string_view)> on_refused,
    const std::function<void(GrpcFront*)>& add_methods) {
  std::unique_ptr<GrpcPort> p(new GrpcPort());
  p->name_ = options.name;
  p->close_idle_at_shutdown_ = options.close_idle_at_shutdown;
  // The port is this process's own (server/listener.h): gRPC gets each admitted
  // connection through an external acceptor, with the port's credentials, and every call
  // through the front (server/grpc_front.h), which reads request bodies under budgets.
  auto listener = Listener::Bind(options.host, options.port, options.connections, options.name, clock);
  if (!listener.ok()) return listener.status();
  p->listener_ = *std::move(listener);
  // An honest client has at most max_streams_per_connection calls open (HTTP/2's
  // SETTINGS_MAX_CONCURRENT_STREAMS), and each ends in the front as its stream ends.
  p->front_ = std::make_unique<GrpcFront>(auth, options.calls,
                                          ResetLimits::ForStreams(options.max_streams_per_connection),
                                          clock, std::move(on_refused));
  add_methods(p->front_.get());
  p->front_->set_listener(p->listener_.get());
  grpc::ServerBuilder builder;
  auto acceptor = builder.experimental().AddExternalConnectionAcceptor(
      grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
      std::move(credentials));
  builder.SetMaxReceiveMessageSize(options.max_receive_bytes);
  if (options.max_send_bytes > 0) builder.SetMaxSendMessageSize(options.max_send_bytes);
  ApplyTransportBounds(options, &builder);
  // Messages in flight are bounded in memory (the front bounds how many are read at
  // once; this is gRPC's own backstop).
  grpc::ResourceQuota quota(absl::StrCat("ps-server ", options.name));
  if (options.memory_quota_bytes > 0) {
    quota.Resize(static_cast<size_t>(options.memory_quota_bytes));
    builder.SetResourceQuota(quota);
  }
  builder.RegisterCallbackGenericService(p->front_.get());
  p->server_ = builder.BuildAndStart();
  if (p->server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot start the gRPC server of the ",
                                               options.name, " on ",
                                               HostPort(options.host, p->listener_->port())));
  }
  p->listener_->Start(std::move(acceptor));
  return p;
}

GrpcPort::~GrpcPort() {
  StopAccepting();
  Shutdown(std::chrono::system_clock::now());
  StopFront();
  // The server calls into the front and the listener until it is gone.
  server_.reset();
  listener_.reset();
  front_.reset();
}

void GrpcPort::StopAccepting() {
  if (listener_ != nullptr) listener_->Stop();
}

// gRPC's shutdown by `until`: it answers what is in flight and sends every connection a
// GOAWAY, then waits for each connection to go. A worker whose channel has no call open
// reads the GOAWAY only when gRPC next polls it (seconds; on the TCP data plane its
// control channel is idle between Joins), so once no call is open the listener closes
// what is left (Listener::CloseAll).
void GrpcPort::Shutdown(std::chrono::system_clock::time_point until) {
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  if (!close_idle_at_shutdown_) {
    server_->Shutdown(until);
    return;
  }
  absl::Notification done;
  std::thread closer([&] {
    while (!done.WaitForNotificationWithTimeout(absl::Milliseconds(20))) {
      if (front_->stats().budget.calls == 0) {
        const size_t closed = listener_->CloseAll();
        if (closed > 0) {
          spdlog::info("closed {} idle connection(s) of the {} at shutdown", closed, name_);
        }
        return;
      }
    }
  });
  server_->Shutdown(until);
  done.Notify();
  closer.join();
}

void GrpcPort::StopFront() {
  if (front_ != nullptr) front_->Stop();
}

}  // namespace ps::server
