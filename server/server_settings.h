// What a shard's options say for each of its parts: pure functions of ServerOptions (and
// of the open-file limit), kept apart from the server's wiring so that each rule is
// tested on its own (docs/connections.md for the bounds).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "aggregators/aggregator.h"
#include "server/call_budget.h"
#include "server/connection_table.h"
#include "server/options.h"
#include "server/tarpit.h"

namespace ps::server {

aggregators::AggregatorOptions RuleOptions(const ServerOptions& o);

// The aggregation rule the options name, refused when an explicit --quorum is below what
// the rule needs (a round closed at its deadline could not be aggregated); logs where it
// aggregates.
absl::StatusOr<std::unique_ptr<aggregators::Aggregator>> MakeRule(const ServerOptions& o);

// A port's connection bounds. `fd_limit`: the process's open-file limit
// (RaiseOpenFileLimit): --max-connections 0 takes what descriptors allow after the
// shard's own files, between 64 and 4096.
ConnectionLimits ConnectionBounds(const ServerOptions& o, uint64_t fd_limit);
// The same with this process's open-file limit, raised to its hard limit first.
ConnectionLimits ConnectionBounds(const ServerOptions& o);

// The front's call budgets: a body being received costs up to --max-message-bytes, so
// --max-request-memory-bytes / --max-message-bytes of them at once (2 to 65536).
CallLimits CallBounds(const ServerOptions& o);

// The tarpit: a held answer keeps its request alive, so in all at most the request
// memory quota's worth of the largest messages (8 to 4096), 8 per client.
TarpitOptions TarpitSettings(const ServerOptions& o);

// One line for the start-up log: plaintext or TLS, and whose credentials are accepted.
std::string SecuritySummary(const ServerOptions& o);

// The start-up log's line: where the shard serves, how, and what it aggregates.
std::string ServingLine(const ServerOptions& o, uint16_t port, uint32_t quorum, bool model_scope);

// "host:port", "[v6]:port".
std::string HostPort(const std::string& host, uint16_t port);

}  // namespace ps::server
