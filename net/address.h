// Addresses of the sockets ps-server opens itself: the shard's UDP receiver and metrics
// endpoint, the worker's UDP sender and the shaping relay's upstream. gRPC resolves its
// own targets.
//
// Thread safety: plain functions; ResolveHost blocks while the system resolver works.
#pragma once

#include <boost/asio/ip/address.hpp>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ps::net {

// An address split into host and port.
struct HostPort {
  std::string host;
  uint16_t port = 0;
};

// Splits "host:port" or "[v6-address]:port" (port in [1, 65535]): the one parser of
// host:port for our sockets and flags. INVALID_ARGUMENT says only what is wrong
// ("expected host:port", "empty host", "port out of range (0); a port must be ...").
absl::StatusOr<HostPort> ParseHostPort(std::string_view address);

// ParseHostPort with the refusal naming `what` and the address: "upstream address 'x':
// expected host:port".
absl::StatusOr<HostPort> SplitHostPort(std::string_view address, std::string_view what);

// The address of `host`: an IP address (an IPv6 one with or without brackets) as
// written; "localhost" as 127.0.0.1, whatever the resolver says, so that a socket bound
// there and one sending there agree; any other name resolved now, its first IPv4
// address preferred (the shards listen on 127.0.0.1 by default). INVALID_ARGUMENT for an
// empty host; UNAVAILABLE, naming `what` and the host, when a name does not resolve.
absl::StatusOr<boost::asio::ip::address> ResolveHost(std::string_view host, std::string_view what);

}  // namespace ps::net
