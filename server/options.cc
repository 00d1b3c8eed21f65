#include "server/options.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codecs/codec.h"
#include "core/status.h"
#include "net/address.h"
#include "server/codec_policy.h"
#include "server/optimizer.h"

namespace ps::server {
namespace {

constexpr uint32_t kMaxShards = 1024;
constexpr uint32_t kMinMessageBytes = 64u << 10;
constexpr uint32_t kMaxMessageBytes = 1u << 30;
constexpr uint32_t kMaxThreads = 4096;

// Floats print in their shortest round-trip form so that the summary is the same on
// every shard for the same flag value ("0.1", not "0.100000001").
std::string ShortFloat(float value) {
  std::array<char, 64> buf{};
  auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), value);
  if (ec != std::errc()) return "?";
  return std::string(buf.data(), end);
}

absl::Status Invalid(absl::string_view field, absl::string_view flag, absl::string_view value,
                     absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", value, " (", field, "): ", why));
}

bool OneOf(std::string_view value, std::initializer_list<std::string_view> allowed) {
  for (std::string_view a : allowed) {
    if (value == a) return true;
  }
  return false;
}

absl::Status CheckPeer(size_t index, const std::string& peer) {
  const absl::StatusOr<net::HostPort> parsed = net::ParseHostPort(peer);
  if (parsed.ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--peers entry ", index, " \"", peer, "\": ",
                                                 parsed.status().message(), " (want host:port)"));
}

// 127.0.0.0/8, ::1 (also bracketed and v4-mapped) and "localhost".
bool IsLoopbackHost(std::string_view host) {
  std::string bare(host);
  if (absl::AsciiStrToLower(bare) == "localhost") return true;
  if (bare.size() >= 2 && bare.front() == '[' && bare.back() == ']') {
    bare = bare.substr(1, bare.size() - 2);
  }
  in_addr v4{};
  if (inet_pton(AF_INET, bare.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  if (inet_pton(AF_INET6, bare.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    // ::ffff:127.x.y.z is the IPv4 loopback seen through an IPv6 socket.
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

}  // namespace

absl::Status ServerOptions::Validate() const {
  // --- network ---
  if (host.empty()) return Invalid("host", "host", "\"\"", "must not be empty");
  if (tls_cert.empty() != tls_key.empty()) {
    return Invalid(tls_cert.empty() ? "tls_cert" : "tls_key",
                   tls_cert.empty() ? "tls-cert" : "tls-key", "\"\"",
                   "--tls-cert and --tls-key go together");
  }
  if (!tls_ca.empty() && tls_cert.empty()) {
    return Invalid("tls_ca", "tls-ca", tls_ca,
                   "client certificates (mTLS) need TLS: give --tls-cert and --tls-key too");
  }
  if (insecure && ClientAuthRequired()) {
    return Invalid("insecure", "insecure", "true",
                   "contradicts the client authentication also given (--tls-ca, --tokens, "
                   "--secret-file or --run-dir): drop one");
  }
  if (!allow_insecure_remote && !IsLoopbackHost(host) &&
      (tls_cert.empty() || !ClientAuthRequired())) {
    return Invalid("host", "host", host,
                   tls_cert.empty()
                       ? "binding a non-loopback address without TLS needs --tls-cert and "
                         "--tls-key with --tls-ca or --tokens (or the explicit "
                         "--allow-insecure-remote)"
                       : "binding a non-loopback address needs client authentication: "
                         "--tls-ca (mTLS), --tokens or the cluster secret (or the explicit "
                         "--allow-insecure-remote)");
  }
  if (!tls_cert.empty() && tls_ca.empty() && num_shards > 1) {
    return Invalid("tls_ca", "tls-ca", "\"\"",
                   "shards verify each other's certificates against --tls-ca; give the CA "
                   "that signed them");
  }
  if (!(std::isfinite(rate_limit) && rate_limit >= 0)) {
    return Invalid("rate_limit", "rate-limit", absl::StrCat(rate_limit),
                   "must be a finite number of requests per second >= 0 (0: no limit)");
  }
  if (!(std::isfinite(refusal_rate) && refusal_rate >= 0)) {
    return Invalid("refusal_rate", "refusal-rate", absl::StrCat(refusal_rate),
                   "must be a finite number of units per second >= 0 (0: never hold)");
  }
  if (!(std::isfinite(refusal_burst) && refusal_burst >= 1)) {
    return Invalid("refusal_burst", "refusal-burst", absl::StrCat(refusal_burst),
                   "must be a finite number of units >= 1");
  }
  if (refusal_hold.count() < 0 || refusal_hold.count() > 60000) {
    return Invalid("refusal_hold", "refusal-hold-ms", absl::StrCat(refusal_hold.count()),
                   "must be in [0, 60000]");
  }
  if (quarantine.count() < 0 || quarantine.count() > 3600000) {
    return Invalid("quarantine", "quarantine-ms", absl::StrCat(quarantine.count()),
                   "must be in [0, 3600000]");
  }
  if (worker_timeout.count() < 0 || worker_timeout.count() > 86400000) {
    return Invalid("worker_timeout", "worker-timeout-ms", absl::StrCat(worker_timeout.count()),
                   "must be in [0, 86400000]");
  }
  if (suspicion_window > 100000) {
    return Invalid("suspicion_window", "suspicion-window", absl::StrCat(suspicion_window),
                   "must be in [0, 100000] rounds");
  }
  if (!(suspicion_threshold > 0.0 && suspicion_threshold <= 1.0)) {
    return Invalid("suspicion_threshold", "suspicion-threshold", absl::StrCat(suspicion_threshold),
                   "must be in (0, 1]");
  }
  if (max_message_bytes < kMinMessageBytes || max_message_bytes > kMaxMessageBytes) {
    return Invalid("max_message_bytes", "max-message-bytes", absl::StrCat(max_message_bytes),
                   absl::StrCat("must be in [", kMinMessageBytes, ", ", kMaxMessageBytes,
                                "] (64 KiB to 1 GiB)"));
  }

  // --- topology ---
  if (num_shards < 1 || num_shards > kMaxShards) {
    return Invalid("num_shards", "num-shards", absl::StrCat(num_shards),
                   absl::StrCat("must be in [1, ", kMaxShards, "]"));
  }
  if (shard_id < 0 || static_cast<uint32_t>(shard_id) >= num_shards) {
    return Invalid("shard_id", "shard-id", absl::StrCat(shard_id),
                   absl::StrCat("must be in [0, ", num_shards, ") for --num-shards=", num_shards,
                                shard_id == -1 ? " (-1 is resolved from the host name by the "
                                                 "flag parser, not here)"
                                               : ""));
  }
  if (peers.empty()) {
    if (num_shards != 1) {
      return Invalid("peers", "peers", "\"\"",
                     absl::StrCat("--num-shards=", num_shards,
                                  " needs one host:port per shard, indexed by shard id"));
    }
  } else {
    if (peers.size() != num_shards) {
      return Invalid("peers", "peers", absl::StrJoin(peers, ","),
                     absl::StrCat("has ", peers.size(), " entries but --num-shards=", num_shards,
                                  "; give one host:port per shard, indexed by shard id"));
    }
    for (size_t i = 0; i < peers.size(); ++i) PS_RETURN_IF_ERROR(CheckPeer(i, peers[i]));
  }

  // --- rounds ---
  if (num_workers < 1 || num_workers > kMaxWorkerIds) {
    return Invalid("num_workers", "workers", absl::StrCat(num_workers),
                   num_workers < 1 ? std::string("must be at least 1")
                                   : absl::StrCat("must be at most ", kMaxWorkerIds));
  }
  if (num_byzantine >= num_workers) {
    return Invalid("num_byzantine", "byzantine", absl::StrCat(num_byzantine),
                   absl::StrCat("must be less than --workers=", num_workers));
  }
  if (run_id.size() > 128 ||
      !std::all_of(run_id.begin(), run_id.end(), [](char ch) {
        return absl::ascii_isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' ||
               ch == '.';
      })) {
    return Invalid("run_id", "run-id", run_id,
                   "must be at most 128 letters, digits, '-', '_' or '.'");
  }
  if (max_workers != 0 && (max_workers < num_workers || max_workers > kMaxWorkerIds)) {
    return Invalid("max_workers", "max-workers", absl::StrCat(max_workers),
                   absl::StrCat("must be 0 (--workers) or in [--workers=", num_workers, ", ",
                                kMaxWorkerIds, "]"));
  }
  const uint32_t q = EffectiveQuorum();
  if (q < 1 || q > num_workers) {
    return Invalid("quorum", "quorum", absl::StrCat(quorum),
                   absl::StrCat("must be in [1, --workers=", num_workers, "]"));
  }
  if (round_deadline.count() <= 0) {
    return Invalid("round_deadline", "round-deadline-ms", absl::StrCat(round_deadline.count()),
                   "must be positive");
  }

  // --- aggregation ---
  if (aggregator.empty()) return Invalid("aggregator", "aggregator", "\"\"", "must not be empty");
  if (multi_krum_m > num_workers) {
    return Invalid(
        "multi_krum_m", "multi-krum-m", absl::StrCat(multi_krum_m),
        absl::StrCat("must be at most --workers=", num_workers, " (0 means inputs - f)"));
  }
  if (udp_port < -1 || udp_port > 65535) {
    return Invalid("udp_port", "udp-port", absl::StrCat(udp_port),
                   "must be -1 (off), 0 (a free port) or a port in [1, 65535]");
  }
  if (udp_receive_buffer < 65536) {
    return Invalid("udp_receive_buffer", "udp-receive-buffer", absl::StrCat(udp_receive_buffer),
                   "must be at least 65536 bytes");
  }
  if (udp_threads < 1 || udp_threads > 64) {
    return Invalid("udp_threads", "udp-threads", absl::StrCat(udp_threads), "must lie in [1, 64]");
  }
  if (data_plane == core::DataPlane::kTcp && data_port != 0 && data_port == port) {
    return Invalid("data_port", "data-port", absl::StrCat(data_port),
                   "must differ from --port (the data plane listens on its own port; 0 picks a "
                   "free one)");
  }
  if (data_threads < 1 || data_threads > 64) {
    return Invalid("data_threads", "data-threads", absl::StrCat(data_threads), "must lie in [1, 64]");
  }
  if (tcp_rto_min.count() < -1 || tcp_rto_min > std::chrono::milliseconds(200)) {
    return Invalid("tcp_rto_min", "tcp-rto-min-ms", absl::StrCat(tcp_rto_min.count()),
                   "must lie in [-1, 200] (-1: auto; 0 keeps the kernel's)");
  }
  if (peer_timeout.count() <= 0) {
    return Invalid("peer_timeout", "peer-timeout-ms", absl::StrCat(peer_timeout.count()),
                   "must be positive");
  }

  // --- optimizer ---
  if (!aggregate_only && !(std::isfinite(learning_rate) && learning_rate > 0.0f)) {
    return Invalid("learning_rate", "lr", ShortFloat(learning_rate),
                   "must be finite and positive (unless --aggregate-only)");
  }
  if (!(std::isfinite(momentum) && momentum >= 0.0f && momentum < 1.0f)) {
    return Invalid("momentum", "momentum", ShortFloat(momentum), "must be in [0, 1)");
  }
  if (!(std::isfinite(weight_decay) && weight_decay >= 0.0f)) {
    return Invalid("weight_decay", "weight-decay", ShortFloat(weight_decay),
                   "must be finite and non-negative");
  }
  if (absl::StatusOr<LrSchedule> schedule = LrSchedule::Parse(lr_schedule); !schedule.ok()) {
    return Invalid("lr_schedule", "lr-schedule", lr_schedule, schedule.status().message());
  }
  if (!pull_codec.empty()) {
    if (aggregate_only) {
      return Invalid("pull_codec", "pull-codec", pull_codec,
                     "compresses the change of the parameters from one version to the next; "
                     "with --aggregate-only the shard publishes gradients, not parameters");
    }
    if (absl::StatusOr<std::unique_ptr<codecs::Codec>> c = codecs::MakeCodec(pull_codec); !c.ok()) {
      return Invalid("pull_codec", "pull-codec", pull_codec, c.status().message());
    }
  }

  if (absl::StatusOr<CodecPolicy> policy = CodecPolicy::Parse(allowed_codecs); !policy.ok()) {
    return Invalid("allowed_codecs", "allowed-codecs", allowed_codecs, policy.status().message());
  }

  if (!std::isfinite(max_decode_ms) || max_decode_ms < 0) {
    return Invalid("max_decode_ms", "max-decode-ms", absl::StrCat(max_decode_ms),
                   "must be a finite number >= 0 (0: unbounded)");
  }

  // --- resources and lifecycle ---
  if (threads > kMaxThreads) {
    return Invalid("threads", "threads", absl::StrCat(threads),
                   absl::StrCat("must be at most ", kMaxThreads, " (0 means one per core)"));
  }
  if (max_request_memory_bytes < 2 * uint64_t{max_message_bytes}) {
    return Invalid("max_request_memory_bytes", "max-request-memory-bytes",
                   absl::StrCat(max_request_memory_bytes),
                   absl::StrCat("must be at least twice --max-message-bytes (",
                                2 * uint64_t{max_message_bytes}, ")"));
  }
  if (max_pulls_per_worker < 1) {
    return Invalid("max_pulls_per_worker", "max-pulls-per-worker",
                   absl::StrCat(max_pulls_per_worker), "must be at least 1");
  }
  if (max_cached_decoders < 1) {
    return Invalid("max_cached_decoders", "max-cached-decoders",
                   absl::StrCat(max_cached_decoders), "must be at least 1");
  }
  if (max_connections_per_source < 1) {
    return Invalid("max_connections_per_source", "max-connections-per-source",
                   absl::StrCat(max_connections_per_source), "must be at least 1");
  }
  if (max_connections != 0 && max_connections < 16) {
    return Invalid("max_connections", "max-connections", absl::StrCat(max_connections),
                   "must be 0 (automatic) or at least 16");
  }
  if (max_calls_per_client < 1) {
    return Invalid("max_calls_per_client", "max-calls-per-client",
                   absl::StrCat(max_calls_per_client), "must be at least 1");
  }
  if (max_reads_per_client < 1) {
    return Invalid("max_reads_per_client", "max-reads-per-client",
                   absl::StrCat(max_reads_per_client), "must be at least 1");
  }
  if (request_read_timeout.count() < 100) {
    return Invalid("request_read_timeout", "request-read-timeout-ms",
                   absl::StrCat(request_read_timeout.count()), "must be at least 100");
  }
  // gRPC takes the bound as an int (GRPC_ARG_MAX_CONCURRENT_STREAMS).
  if (max_streams_per_connection > static_cast<uint32_t>(std::numeric_limits<int>::max())) {
    return Invalid("max_streams_per_connection", "max-streams-per-connection",
                   absl::StrCat(max_streams_per_connection),
                   absl::StrCat("must be at most ", std::numeric_limits<int>::max()));
  }
  if (max_streams_per_connection <= max_pulls_per_worker) {
    return Invalid("max_streams_per_connection", "max-streams-per-connection",
                   absl::StrCat(max_streams_per_connection),
                   absl::StrCat("must exceed --max-pulls-per-worker (", max_pulls_per_worker,
                                "): a worker's pushes need streams beside its pulls"));
  }
  if (max_health_watches < 1) {
    return Invalid("max_health_watches", "max-health-watches",
                   absl::StrCat(max_health_watches), "must be at least 1");
  }
  if (connection_proof_timeout.count() < 100) {
    return Invalid("connection_proof_timeout", "connection-proof-timeout-ms",
                   absl::StrCat(connection_proof_timeout.count()), "must be at least 100");
  }
  if (max_connection_idle.count() < 1000) {
    return Invalid("max_connection_idle", "max-connection-idle-ms",
                   absl::StrCat(max_connection_idle.count()), "must be at least 1000");
  }
  if (drain_timeout.count() < 0) {
    return Invalid("drain_timeout", "drain-timeout-ms", absl::StrCat(drain_timeout.count()),
                   "must not be negative");
  }

  // --- durability ---
  if (checkpoint_interval.count() < 0) {
    return Invalid("checkpoint_interval", "checkpoint-interval-s",
                   absl::StrCat(checkpoint_interval.count()), "must not be negative");
  }
  if (checkpoint_keep < 1) {
    return Invalid("checkpoint_keep", "checkpoint-keep", absl::StrCat(checkpoint_keep),
                   "must be at least 1");
  }

  // --- logging ---
  if (!OneOf(log_level, {"trace", "debug", "info", "warn", "error"})) {
    return Invalid("log_level", "log-level", log_level,
                   "must be one of trace, debug, info, warn, error");
  }
  if (!OneOf(log_format, {"plain", "json"})) {
    return Invalid("log_format", "log-format", log_format, "must be \"plain\" or \"json\"");
  }

  // --- observability ---
  if (metrics_port < -1 || metrics_port > 65535) {
    return Invalid("metrics_port", "metrics-port", absl::StrCat(metrics_port),
                   "must be -1 (off), 0 (a free port) or a port in [1, 65535]");
  }
  if (metrics_port > 0 && metrics_port == port) {
    return Invalid("metrics_port", "metrics-port", absl::StrCat(metrics_port),
                   "must differ from --port");
  }
  if (health_port < -1 || health_port > 65535) {
    return Invalid("health_port", "health-port", absl::StrCat(health_port),
                   "must be -1 (off), 0 (a free port) or a port in [1, 65535]");
  }
  if (health_port > 0 && (health_port == port || health_port == metrics_port)) {
    return Invalid("health_port", "health-port", absl::StrCat(health_port),
                   "must differ from --port and --metrics-port");
  }
  // Last, so that every other mistake is named first.
  if (!insecure && !ClientAuthRequired()) {
    return Invalid("insecure", "insecure", "false",
                   "no client authentication is configured: give --run-dir or --secret-file "
                   "(the cluster secret), --tokens or --tls-ca, or run without any with the "
                   "explicit --insecure");
  }
  return absl::OkStatus();
}

std::string_view ScheduleName(Schedule s) { return s == Schedule::kFifo ? "fifo" : "priority"; }

std::string_view AggregationScopeName(AggregationScope s) {
  return s == AggregationScope::kSlice ? "slice" : "model";
}

absl::StatusOr<Schedule> ParseSchedule(std::string_view text) {
  if (text == "priority") return Schedule::kPriority;
  if (text == "fifo") return Schedule::kFifo;
  return absl::InvalidArgumentError(
      absl::StrCat("schedule '", core::AsAbsl(text), "': want priority or fifo"));
}

absl::StatusOr<AggregationScope> ParseAggregationScope(std::string_view text) {
  if (text == "model") return AggregationScope::kModel;
  if (text == "slice") return AggregationScope::kSlice;
  return absl::InvalidArgumentError(
      absl::StrCat("aggregation scope '", core::AsAbsl(text), "': want model or slice"));
}

std::string ServerOptions::ConsistencySummary() const {
  // Field order and spelling are part of the peer check: change them only together
  // with every shard (a mismatch makes shards refuse each other).
  return absl::StrCat(run_id.empty() ? "" : absl::StrCat("run_id=", run_id, " "),
                      "workers=", num_workers, " max_workers=", WorkerIds(), " f=", num_byzantine, " quorum=", EffectiveQuorum(),
                      " aggregator=", aggregator, " multi_krum_m=", multi_krum_m,
                      " krum_neighbours=", core::AsAbsl(aggregators::KrumNeighboursName(krum_neighbours)),
                      " even_median=", core::AsAbsl(aggregators::EvenMedianName(even_median)),
                      " aggregation_scope=", core::AsAbsl(AggregationScopeName(aggregation_scope)),
                      " aggregate_only=", aggregate_only ? "true" : "false",
                      " lr=", ShortFloat(learning_rate), " momentum=", ShortFloat(momentum),
                      " weight_decay=", ShortFloat(weight_decay), " num_shards=", num_shards,
                      " lr_schedule=", lr_schedule,
                      " pull_codec=", pull_codec.empty() ? "dense" : pull_codec,
                      // Only when not gRPC: shards agreeing on gRPC keep the summary (and
                      // fingerprint) of shards from before the field.
                      data_plane == core::DataPlane::kGrpc
                          ? ""
                          : absl::StrCat(" data_plane=", core::AsAbsl(core::DataPlaneName(data_plane))));
}

}  // namespace ps::server
