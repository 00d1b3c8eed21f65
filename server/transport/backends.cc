// The list of data backends with a port of their own (backend.h): each entry says when the
// options ask for it and how it starts. A new backend is a folder beside tcp/ and udp/
// and one entry here.
#include "server/transport/backend.h"

#include <algorithm>

#include "core/data_plane.h"
#include "server/transport/tcp/backend.h"
#include "server/transport/udp/receiver.h"

namespace ps::server::transport {
namespace {

using Started = absl::StatusOr<std::unique_ptr<DataBackend>>;

struct Entry {
  std::string_view name;
  bool (*wanted)(const ServerOptions&);
  Started (*start)(const BackendContext&);
};

Started StartUdp(const BackendContext& c) {
  const ServerOptions& o = *c.options;
  absl::StatusOr<std::unique_ptr<udp::Receiver>> r = udp::Receiver::Start(
      o.host, static_cast<uint16_t>(o.udp_port), o.udp_receive_buffer, o.udp_threads, c.front);
  if (!r.ok()) return r.status();
  return std::unique_ptr<DataBackend>(std::move(*r));
}

Started StartTcp(const BackendContext& c) {
  // TLS as on the control port, with the same certificate, key and client CA.
  tcp::Options data = tcp::OptionsFrom(*c.options, c.limits);
  data.tls_cert_pem = c.tls_cert_pem;
  data.tls_key_pem = c.tls_key_pem;
  data.tls_ca_pem = c.tls_ca_pem;
  absl::StatusOr<std::unique_ptr<tcp::Backend>> b =
      tcp::Backend::Start(data, c.front, c.clock);
  if (!b.ok()) return b.status();
  return std::unique_ptr<DataBackend>(std::move(*b));
}

constexpr Entry kBackends[] = {
    {"udp", [](const ServerOptions& o) { return o.udp_port >= 0; }, StartUdp},
    {"tcp", [](const ServerOptions& o) { return o.data_plane == core::DataPlane::kTcp; }, StartTcp},
};

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<DataBackend>>> StartDataBackends(
    const BackendContext& context) {
  std::vector<std::unique_ptr<DataBackend>> started;
  for (const Entry& e : kBackends) {
    if (!e.wanted(*context.options)) continue;
    Started b = e.start(context);
    if (!b.ok()) {
      for (const std::unique_ptr<DataBackend>& s : started) s->Stop();
      return b.status();
    }
    started.push_back(std::move(*b));
  }
  return started;
}

const DataBackend* FindBackend(std::span<const std::unique_ptr<DataBackend>> backends,
                               std::string_view name) {
  auto it = std::find_if(backends.begin(), backends.end(),
                         [name](const std::unique_ptr<DataBackend>& b) { return b->name() == name; });
  return it != backends.end() ? it->get() : nullptr;
}

}  // namespace ps::server::transport
