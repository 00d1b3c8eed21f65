#include "server/logging.h"

#include <grpc/support/log.h>
#include <time.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <string>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/stubs/logging.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace ps::server {
namespace {

absl::StatusOr<spdlog::level::level_enum> ParseLevel(const std::string& level) {
  if (level == "trace") return spdlog::level::trace;
  if (level == "debug") return spdlog::level::debug;
  if (level == "info") return spdlog::level::info;
  if (level == "warn") return spdlog::level::warn;
  if (level == "error") return spdlog::level::err;
  return absl::InvalidArgumentError(
      absl::StrCat("--log-level=", level, ": must be one of trace, debug, info, warn, error"));
}

// Our names rather than spdlog's ("warning" in 1.10, "warn" elsewhere) so that log
// queries do not depend on the spdlog version.
std::string_view LevelName(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::trace:
      return "trace";
    case spdlog::level::debug:
      return "debug";
    case spdlog::level::info:
      return "info";
    case spdlog::level::warn:
      return "warn";
    case spdlog::level::err:
      return "error";
    case spdlog::level::critical:
      return "critical";
    default:
      return "off";
  }
}

template <typename Buffer>
void Append(Buffer& out, std::string_view text) {
  out.append(text.data(), text.data() + text.size());
}

// 2024-05-01T12:00:00.123Z
template <typename Buffer>
void AppendTimestamp(Buffer& out, spdlog::log_clock::time_point time) {
  using std::chrono::duration_cast;
  using std::chrono::milliseconds;
  using std::chrono::seconds;
  const auto since_epoch = time.time_since_epoch();
  const auto secs = duration_cast<seconds>(since_epoch);
  int64_t millis = duration_cast<milliseconds>(since_epoch - secs).count();
  std::time_t t = static_cast<std::time_t>(secs.count());
  if (millis < 0) {  // before 1970: keep the fraction positive
    millis += 1000;
    --t;
  }
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  const size_t n = std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  Append(out, std::string_view(buf, n));
  const char frac[] = {'.', static_cast<char>('0' + millis / 100),
                       static_cast<char>('0' + millis / 10 % 10),
                       static_cast<char>('0' + millis % 10), 'Z'};
  Append(out, std::string_view(frac, sizeof(frac)));
}

// Length of the well-formed UTF-8 sequence at the start of `s`, or 0 when it is not
// one (stray continuation byte, truncated, overlong, surrogate, above U+10FFFF).
size_t Utf8SequenceLength(std::string_view s) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char b0 = byte(0);
  size_t len = 0;
  uint32_t cp = 0;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
    cp = b0 & 0x1Fu;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    cp = b0 & 0x0Fu;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    cp = b0 & 0x07u;
  } else {
    return 0;
  }
  if (s.size() < len) return 0;
  for (size_t i = 1; i < len; ++i) {
    if ((byte(i) & 0xC0u) != 0x80u) return 0;
    cp = (cp << 6) | (byte(i) & 0x3Fu);
  }
  if (len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return 0;
  if (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return 0;
  return len;
}

template <typename Buffer>
void EscapeJson(std::string_view text, Buffer& out) {
  static constexpr char kHex[] = "0123456789abcdef";
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x80) {
      const size_t len = Utf8SequenceLength(text.substr(i));
      if (len == 0) {
        Append(out, "\\ufffd");
        ++i;
      } else {
        Append(out, text.substr(i, len));
        i += len;
      }
      continue;
    }
    switch (c) {
      case '"':
        Append(out, "\\\"");
        break;
      case '\\':
        Append(out, "\\\\");
        break;
      case '\n':
        Append(out, "\\n");
        break;
      case '\r':
        Append(out, "\\r");
        break;
      case '\t':
        Append(out, "\\t");
        break;
      case '\b':
        Append(out, "\\b");
        break;
      case '\f':
        Append(out, "\\f");
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          const char esc[] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 0xF]};
          Append(out, std::string_view(esc, sizeof(esc)));
        } else {
          const char ch = static_cast<char>(c);
          Append(out, std::string_view(&ch, 1));
        }
    }
    ++i;
  }
}

// Plain lines stay one line per message: a newline or terminal escape carried in a
// message (say, from a peer's error text) cannot forge or hide lines.
template <typename Buffer>
void EscapeControl(std::string_view text, Buffer& out) {
  static constexpr char kHex[] = "0123456789abcdef";
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c != 0x7f) continue;
    if (c == '\t') continue;
    Append(out, text.substr(start, i - start));
    if (c == '\n') {
      Append(out, "\\n");
    } else if (c == '\r') {
      Append(out, "\\r");
    } else {
      const char esc[] = {'\\', 'x', kHex[c >> 4], kHex[c & 0xF]};
      Append(out, std::string_view(esc, sizeof(esc)));
    }
    start = i + 1;
  }
  Append(out, text.substr(start));
}

std::string_view View(spdlog::string_view_t s) { return std::string_view(s.data(), s.size()); }

// {"ts":"...","level":"info","logger":"shard-0","msg":"..."}
class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    Append(dest, "{\"ts\":\"");
    AppendTimestamp(dest, msg.time);
    Append(dest, "\",\"level\":\"");
    Append(dest, LevelName(msg.level));
    Append(dest, "\",\"logger\":\"");
    EscapeJson(View(msg.logger_name), dest);
    Append(dest, "\",\"msg\":\"");
    EscapeJson(View(msg.payload), dest);
    Append(dest, "\"}\n");
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }
};

// 2024-05-01T12:00:00.123Z info  [shard-0] message
class PlainFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    AppendTimestamp(dest, msg.time);
    Append(dest, " ");
    const std::string_view level = LevelName(msg.level);
    Append(dest, level);
    for (size_t pad = level.size(); pad < 5; ++pad) Append(dest, " ");
    Append(dest, " [");
    Append(dest, View(msg.logger_name));
    Append(dest, "] ");
    EscapeControl(View(msg.payload), dest);
    Append(dest, "\n");
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<PlainFormatter>();
  }
};

}  // namespace

void AppendJsonEscaped(std::string_view text, std::string& out) { EscapeJson(text, out); }

absl::StatusOr<std::unique_ptr<spdlog::formatter>> MakeLogFormatter(const std::string& format) {
  if (format == "plain") return std::make_unique<PlainFormatter>();
  if (format == "json") return std::make_unique<JsonFormatter>();
  return absl::InvalidArgumentError(
      absl::StrCat("--log-format=", format, ": must be \"plain\" or \"json\""));
}

absl::StatusOr<std::shared_ptr<spdlog::logger>> MakeLogger(const std::string& level,
                                                           const std::string& format,
                                                           const std::string& logger_name,
                                                           std::vector<spdlog::sink_ptr> sinks) {
  absl::StatusOr<spdlog::level::level_enum> parsed_level = ParseLevel(level);
  if (!parsed_level.ok()) return parsed_level.status();
  absl::StatusOr<std::unique_ptr<spdlog::formatter>> formatter = MakeLogFormatter(format);
  if (!formatter.ok()) return formatter.status();
  auto logger = std::make_shared<spdlog::logger>(logger_name, sinks.begin(), sinks.end());
  logger->set_formatter(std::move(formatter).value());
  logger->set_level(*parsed_level);
  // Warnings and errors reach the collector even if the process dies right after.
  logger->flush_on(spdlog::level::warn);
  return logger;
}

void RouteProtobufLogs() {
  // libprotobuf writes to stderr on its own, e.g. one line for every request body with
  // invalid UTF-8 in a string field: a client could fill the log with them. Its lines go
  // through spdlog instead, the 1st, 2nd, 4th, ... of them at warn, the others at debug.
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel level, const char* filename, int line,
         const std::string& message) {
        static std::atomic<uint64_t> count{0};
        const uint64_t n = count.fetch_add(1) + 1;
        const bool loud = std::has_single_bit(n) || level >= google::protobuf::LOGLEVEL_FATAL;
        spdlog::log(loud ? spdlog::level::warn : spdlog::level::debug,
                    "libprotobuf ({} lines so far) {}:{}: {}", n, filename, line,
                    message.substr(0, 512));
      });
}

namespace {

// gRPC's log lines go through spdlog, rate-limited per place in gRPC's code: a TLS
// handshake that fails (any client without a certificate) logs one line, so a flood of
// them must not reach stderr unthrottled. The 1st, 2nd, 4th, ... line of each place at
// its level (errors as warn: a client caused them), the others at debug.
void GrpcLog(gpr_log_func_args* args) {
  static absl::Mutex mu;
  static auto* counts = new absl::flat_hash_map<std::string, uint64_t>();
  const std::string where = absl::StrCat(args->file != nullptr ? args->file : "?", ":", args->line);
  uint64_t n;
  {
    absl::MutexLock lock(&mu);
    n = ++(*counts)[where];
  }
  spdlog::level::level_enum level = spdlog::level::debug;
  if (std::has_single_bit(n)) {
    level = args->severity == GPR_LOG_SEVERITY_ERROR  ? spdlog::level::warn
            : args->severity == GPR_LOG_SEVERITY_INFO ? spdlog::level::info
                                                      : spdlog::level::debug;
  }
  spdlog::log(level, "grpc ({} lines from here so far) {}: {}", n, where,
              std::string_view(args->message != nullptr ? args->message : "").substr(0, 512));
}

}  // namespace

void RouteGrpcLogs() { gpr_set_log_function(GrpcLog); }

absl::Status ConfigureLogging(const std::string& level, const std::string& format,
                              const std::string& logger_name) {
  absl::StatusOr<std::shared_ptr<spdlog::logger>> logger =
      MakeLogger(level, format, logger_name, {std::make_shared<spdlog::sinks::stderr_sink_mt>()});
  if (!logger.ok()) return logger.status();
  spdlog::set_default_logger(*std::move(logger));
  RouteProtobufLogs();
  RouteGrpcLogs();
  return absl::OkStatus();
}

absl::Status ConfigureLogging(const ServerOptions& options) {
  return ConfigureLogging(options.log_level, options.log_format,
                          absl::StrCat("shard-", options.shard_id));
}

}  // namespace ps::server
