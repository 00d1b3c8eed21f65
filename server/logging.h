// Logging of the ps-server daemon: spdlog, to stderr, in one of two formats.
//   plain: 2024-05-01T12:00:00.123Z info  [shard-3] message
//   json:  {"ts":"2024-05-01T12:00:00.123Z","level":"info","logger":"shard-3","msg":"message"}
// Timestamps are UTC. In JSON every line is one object and the message is escaped
// (quotes, backslashes, control characters; invalid UTF-8 becomes U+FFFD), so a log
// collector can parse any message. Levels: trace, debug, info, warn, error (critical
// is written as "critical").
//
// ConfigureLogging replaces spdlog's default logger: call it once at start-up, before
// other threads log. The loggers themselves are thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/options.h"
#include "spdlog/formatter.h"
#include "spdlog/logger.h"

namespace ps::server {

// Makes spdlog's default logger write `format` ("plain" or "json") lines at `level`
// and above to stderr; the logger's name (the "shard tag") is `logger_name`.
absl::Status ConfigureLogging(const std::string& level, const std::string& format,
                              const std::string& logger_name = "ps-server");

// Sends libprotobuf's own log lines through spdlog, rate-limited (ConfigureLogging does
// this; a line per malformed request body must not reach stderr unthrottled).
void RouteProtobufLogs();

// Sends gRPC's own log lines through spdlog, rate-limited per place in gRPC's code
// (ConfigureLogging does this: a failed TLS handshake logs a line, and any client can
// make one).
void RouteGrpcLogs();

// The same, from the options; the logger is named "shard-<shard_id>".
absl::Status ConfigureLogging(const ServerOptions& options);

// A logger in the given level and format writing to `sinks` (tests pass an ostream
// sink). InvalidArgument names a bad level or format.
absl::StatusOr<std::shared_ptr<spdlog::logger>> MakeLogger(const std::string& level,
                                                           const std::string& format,
                                                           const std::string& logger_name,
                                                           std::vector<spdlog::sink_ptr> sinks);

// The formatter behind each format; InvalidArgument for an unknown format.
absl::StatusOr<std::unique_ptr<spdlog::formatter>> MakeLogFormatter(const std::string& format);

// Appends `text` to `out` as the inside of a JSON string (without the quotes).
void AppendJsonEscaped(std::string_view text, std::string& out);

}  // namespace ps::server
