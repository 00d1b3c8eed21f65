#include "net/address.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <charconv>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace ps::net {

using core::AsAbsl;

absl::StatusOr<HostPort> ParseHostPort(std::string_view address) {
  std::string_view host;
  std::string_view port;
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find(']');
    if (close == std::string_view::npos || close + 1 >= address.size() ||
        address[close + 1] != ':') {
      return absl::InvalidArgumentError("expected [v6-address]:port");
    }
    host = address.substr(1, close - 1);
    port = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string_view::npos) return absl::InvalidArgumentError("expected host:port");
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return absl::InvalidArgumentError(
          "write IPv6 addresses as [addr]:port, the address in brackets");
    }
  }
  if (host.empty()) return absl::InvalidArgumentError("empty host");
  constexpr const char* kPorts = "; a port must be a number in [1, 65535]";
  if (port.empty()) return absl::InvalidArgumentError(absl::StrCat("empty port", kPorts));
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  const bool digits = end == port.data() + port.size();
  if (!digits || (ec != std::errc() && ec != std::errc::result_out_of_range)) {
    return absl::InvalidArgumentError(
        absl::StrCat("port is not a number ('", AsAbsl(port), "')", kPorts));
  }
  if (ec == std::errc::result_out_of_range || value == 0 || value > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("port out of range (", AsAbsl(port), ")", kPorts));
  }
  return HostPort{std::string(host), static_cast<uint16_t>(value)};
}

absl::StatusOr<HostPort> SplitHostPort(std::string_view address, std::string_view what) {
  absl::StatusOr<HostPort> parsed = ParseHostPort(address);
  if (parsed.ok()) return parsed;
  return absl::InvalidArgumentError(absl::StrCat(AsAbsl(what), " '", AsAbsl(address), "': ",
                                                 parsed.status().message()));
}

absl::StatusOr<boost::asio::ip::address> ResolveHost(std::string_view host, std::string_view what) {
  namespace asio = boost::asio;
  std::string_view name = host;
  if (name.size() >= 2 && name.front() == '[' && name.back() == ']') {
    name = name.substr(1, name.size() - 2);
  }
  if (name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(AsAbsl(what), " '", AsAbsl(host), "': empty host"));
  }
  if (absl::AsciiStrToLower(AsAbsl(name)) == "localhost") return asio::ip::address_v4::loopback();
  boost::system::error_code ec;
  const asio::ip::address literal = asio::ip::make_address(name, ec);
  if (!ec) return literal;
  asio::io_context io;
  asio::ip::tcp::resolver resolver(io);
  // No address_configured flag: a machine with only loopback still has ::1.
  const auto results = resolver.resolve(name, "0", asio::ip::tcp::resolver::numeric_service, ec);
  if (ec || results.empty()) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", AsAbsl(what), " '", AsAbsl(host),
                                               "': ", ec ? ec.message() : "no address"));
  }
  for (const auto& r : results) {
    if (r.endpoint().address().is_v4()) return r.endpoint().address();
  }
  return results.begin()->endpoint().address();
}

}  // namespace ps::net
