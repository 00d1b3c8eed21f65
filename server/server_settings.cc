#include "server/server_settings.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "server/listener.h"
#include "spdlog/spdlog.h"

namespace ps::server {

aggregators::AggregatorOptions RuleOptions(const ServerOptions& o) {
  aggregators::AggregatorOptions a;
  a.num_workers = static_cast<int>(o.num_workers);
  a.num_byzantine = static_cast<int>(o.num_byzantine);
  a.multi_krum_m = static_cast<int>(o.multi_krum_m);
  a.krum_neighbours = o.krum_neighbours;
  a.even_median = o.even_median;
  a.device = o.device;
  return a;
}

absl::StatusOr<std::unique_ptr<aggregators::Aggregator>> MakeRule(const ServerOptions& o) {
  const aggregators::AggregatorOptions rule_options = RuleOptions(o);
  absl::StatusOr<std::unique_ptr<aggregators::Aggregator>> rule =
      aggregators::MakeAggregator(o.aggregator, rule_options);
  if (!rule.ok()) return rule.status();
  const aggregators::Aggregator& r = **rule;
  if (!r.device_note().empty()) {
    spdlog::warn("shard {}: aggregator: {}", o.shard_id, r.device_note());
  } else if (rule_options.device == core::Device::kCuda) {
    spdlog::info("shard {}: aggregating on {}", o.shard_id, r.device());
  }
  // An explicit quorum must meet the rule's bound; the default is raised to it (Shard).
  if (o.quorum != 0 && static_cast<int>(o.quorum) < r.MinInputs()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quorum ", o.quorum, " is below what ", core::AsAbsl(r.name()), " needs (",
        core::AsAbsl(r.Bound()), " = ", r.MinInputs(), " with f = ", o.num_byzantine,
        "): a round closed at its deadline could not be aggregated; raise --quorum or lower "
        "--byzantine"));
  }
  return rule;
}

ConnectionLimits ConnectionBounds(const ServerOptions& o, uint64_t fd_limit) {
  ConnectionLimits l;
  uint64_t max = o.max_connections;
  if (max == 0) {
    // What descriptors allow after the shard's own files, sockets and gRPC's internals.
    max = std::clamp<uint64_t>(fd_limit > 2048 ? fd_limit - 1024 : fd_limit / 2, 64, 4096);
  }
  l.max_connections = static_cast<uint32_t>(max);
  l.reserved_for_proven = l.max_connections / 4;
  l.max_unproven_per_source = o.max_connections_per_source;
  l.max_per_identity = o.max_connections_per_client;
  l.proof_timeout = std::chrono::duration_cast<core::Duration>(o.connection_proof_timeout);
  return l;
}

ConnectionLimits ConnectionBounds(const ServerOptions& o) {
  return ConnectionBounds(o, RaiseOpenFileLimit());
}

CallLimits CallBounds(const ServerOptions& o) {
  CallLimits l;
  l.max_calls_per_client = o.max_calls_per_client;
  l.max_reads_per_client = o.max_reads_per_client;
  l.max_reads = static_cast<uint32_t>(
      std::clamp<uint64_t>(o.max_request_memory_bytes / o.max_message_bytes, 2, 1u << 16));
  l.read_timeout = std::chrono::duration_cast<core::Duration>(o.request_read_timeout);
  return l;
}

TarpitOptions TarpitSettings(const ServerOptions& o) {
  TarpitOptions t;
  t.rate = o.refusal_rate;
  t.burst = o.refusal_burst;
  t.hold = o.refusal_hold;
  t.max_held = static_cast<uint32_t>(
      std::clamp<uint64_t>(o.max_request_memory_bytes / o.max_message_bytes, 8, 4096));
  t.max_held_per_client = std::min<uint32_t>(8, t.max_held);
  return t;
}

std::string SecuritySummary(const ServerOptions& o) {
  if (o.insecure) {
    return "--insecure: no client authentication, anyone who reaches the port may act as any "
           "worker or shard";
  }
  std::vector<std::string> parts;
  parts.push_back(o.tls_cert.empty() ? "plaintext" : "TLS");
  if (!o.tls_ca.empty()) parts.push_back("client certificates accepted");
  if (!o.tokens_file.empty()) parts.push_back("tokens of --tokens accepted");
  if (!o.secret_file.empty()) {
    parts.push_back(absl::StrCat("tokens derived from the secret ", o.secret_file));
  } else if (!o.run_dir.empty()) {
    parts.push_back(absl::StrCat("tokens derived from the secret in ", o.run_dir,
                                 " (clients' token files there: token-worker-N, token-admin)"));
  }
  return absl::StrJoin(parts, ", ");
}

std::string ServingLine(const ServerOptions& o, uint16_t port, uint32_t quorum, bool model_scope) {
  return absl::StrCat("shard ", o.shard_id, "/", o.num_shards, " serving on ", HostPort(o.host, port),
                      " (", SecuritySummary(o), "): ", o.num_workers, " workers, f = ",
                      o.num_byzantine, ", quorum ", quorum, ", aggregator ", o.aggregator, " (",
                      model_scope ? "model" : "slice", " scope)",
                      o.aggregate_only ? " (aggregate-only)" : "",
                      o.pull_codec.empty() ? ""
                                           : absl::StrCat(", pulls send each change as ", o.pull_codec),
                      o.run_id.empty() ? "" : absl::StrCat(", run ", o.run_id));
}

std::string HostPort(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos && host.front() != '[') {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

}  // namespace ps::server
