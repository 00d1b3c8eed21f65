// The flag table of ps-server (flags.h, flags_internal.h): every flag with its group,
// type, default, help text and check, bound to its ServerOptions field or to a raw value
// that ApplyRawFlagValues stores once the flags are read. docs/configuration.md lists
// them; the parser, the help's layout and the blame of a bad value are in flags.cc.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "aggregators/aggregator.h"
#include "server/config_file.h"
#include "server/flags_internal.h"

namespace ps::server {
namespace {

// CLI11 reads integers with strtoull(base 0), so "010" would be 8 and "0x10" 16; an
// operator writing --workers=010 means ten. Only plain decimal is accepted.
CLI::Validator DecimalInteger() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        std::string_view digits = value;
        if (!digits.empty() && (digits.front() == '-' || digits.front() == '+')) {
          digits.remove_prefix(1);
        }
        const bool all_digits =
            !digits.empty() && std::all_of(digits.begin(), digits.end(), [](char c) {
              return std::isdigit(static_cast<unsigned char>(c)) != 0;
            });
        if (!all_digits) return absl::StrCat("'", value, "' is not a decimal integer");
        if (digits.size() > 1 && digits.front() == '0') {
          return absl::StrCat("'", value, "' has a leading zero (write a plain decimal number)");
        }
        return std::string();
      },
      /*validator_desc=*/"", /*validator_name=*/"DECIMAL");
}

}  // namespace

std::vector<std::string> DefineFlags(CLI::App& app, ServerOptions& o, RawFlagValues& raw,
                                     bool with_env) {
  std::vector<std::string> names;
  auto finish = [&](CLI::Option* opt, const char* group, const std::string& name) {
    opt->group(group);
    if (with_env) opt->envname(EnvName(name));
    names.push_back(name);
    return opt;
  };
  auto add = [&](const char* group, const std::string& name, auto& var, const std::string& desc) {
    CLI::Option* opt = app.add_option("--" + name, var, desc)->capture_default_str();
    using T = std::remove_reference_t<decltype(var)>;
    if constexpr (std::is_integral_v<T>) opt->check(DecimalInteger());
    return finish(opt, group, name);
  };
  auto add_flag = [&](const char* group, const std::string& name, bool& var,
                      const std::string& desc) {
    CLI::Option* opt = app.add_flag("--" + name, var, desc);
    opt->default_str(var ? "true" : "false");
    return finish(opt, group, name);
  };

  raw.round_deadline_ms = o.round_deadline.count();
  raw.tcp_rto_min_ms = o.tcp_rto_min.count();
  raw.drain_timeout_ms = o.drain_timeout.count();
  raw.peer_timeout_ms = o.peer_timeout.count();
  raw.checkpoint_interval_s = o.checkpoint_interval.count();
  raw.max_connection_idle_ms = o.max_connection_idle.count();
  raw.connection_proof_timeout_ms = o.connection_proof_timeout.count();
  raw.request_read_timeout_ms = o.request_read_timeout.count();
  raw.refusal_hold_ms = o.refusal_hold.count();
  raw.quarantine_ms = o.quarantine.count();
  raw.worker_timeout_ms = o.worker_timeout.count();
  raw.schedule = std::string(ScheduleName(o.schedule));
  raw.data_plane = std::string(core::DataPlaneName(o.data_plane));
  raw.aggregation_scope = std::string(AggregationScopeName(o.aggregation_scope));
  raw.device = std::string(core::DeviceName(o.device));
  raw.krum_neighbours = std::string(aggregators::KrumNeighboursName(o.krum_neighbours));
  raw.even_median = std::string(aggregators::EvenMedianName(o.even_median));

  add("Network", "host", o.host,
      "Address to listen on. Anything but 127.0.0.0/8, ::1 or localhost needs "
      "--allow-insecure-remote")
      ->type_name("ADDRESS");
  add("Network", "port", o.port, "TCP port; 0 picks a free one (see --port-file)")
      ->check(CLI::Range(0, 65535).description(""));
  add("Network", "port-file", o.port_file,
      "Write the bound port to this file (atomically) once serving")
      ->type_name("PATH");
  add_flag("Network", "allow-insecure-remote", o.allow_insecure_remote,
           "Permit a non-loopback --host without TLS (insecure; explicit opt-in)");
  add("Network", "max-message-bytes", o.max_message_bytes,
      "Largest gRPC message accepted or sent, in bytes, in [65536, 1073741824]");
  add("Network", "udp-port", o.udp_port,
      "UDP port of the lossy gradient path on --host: -1 off, 0 a free one "
      "(docs/transport.md)");
  add("Network", "udp-receive-buffer", o.udp_receive_buffer,
      "Kernel receive buffer asked for on the UDP socket, in bytes (>= 65536)");
  add("Network", "udp-threads", o.udp_threads,
      "Threads receiving datagrams on the UDP socket, in [1, 64]");
  add("Network", "data-plane", raw.data_plane,
      "What carries pushes and pulls: tcp (the native plane on --data-port, under "
      "--port's TLS) or grpc (on --port, for links that pass only HTTP/2); workers asking "
      "for the other are refused (docs/data-plane.md)")
      ->check(CLI::IsMember({"grpc", "tcp"}));
  add("Network", "data-port", o.data_port,
      "TCP port of the data plane on --host with --data-plane tcp; 0 picks a free one (the "
      "Join answer names it)")
      ->check(CLI::Range(0, 65535).description(""));
  add("Network", "data-threads", o.data_threads,
      "Threads running the TCP data plane's connections, in [1, 64]");
  add("Network", "tcp-rto-min-ms", raw.tcp_rto_min_ms,
      "Least retransmission timeout of the TCP data plane's connections, at both ends (the "
      "Join answer tells the workers), in [-1, 200] ms: a loss then costs this instead of "
      "the kernel's 200 ms on a link whose round trip is shorter. -1 (auto): 10 where the "
      "kernel can set it (Linux 6.15 and later), else the kernel's; 0 keeps the kernel's; "
      "N > 0 needs such a kernel (docs/data-plane.md, \"Loss\")");
  add("Network", "schedule", raw.schedule,
      "Order of aggregation and pull streaming: priority (most urgent slice first, P3) or "
      "fifo (in the order slices become ready)")
      ->check(CLI::IsMember({"priority", "fifo"}));

  add("Security", "run-dir", o.run_dir,
      "Private directory (0700, the directory itself: no symbolic link) of the cluster "
      "secret, made on first start, and of the clients' token files (token-worker-N, "
      "token-admin). The default when no other authentication is given: "
      "$XDG_RUNTIME_DIR/ps-server, else $HOME/.ps-server")
      ->type_name("DIR");
  add("Security", "secret-file", o.secret_file,
      "Cluster secret (64 hex digits, `ps-admin secret`): clients authenticate with tokens "
      "derived from it (`ps-admin token`); shards sharing it accept each other")
      ->type_name("PATH");
  add_flag("Security", "insecure", o.insecure,
           "Run without client authentication: anybody who reaches the port may act as any "
           "worker or shard (loopback only unless --allow-insecure-remote)");
  add("Security", "tls-cert", o.tls_cert,
      "Server certificate (PEM): serve TLS, on --port and on the TCP data plane's "
      "--data-port; also this shard's client certificate toward its peers. Needs --tls-key")
      ->type_name("PATH");
  add("Security", "tls-key", o.tls_key, "Private key of --tls-cert (PEM)")->type_name("PATH");
  add("Security", "tls-ca", o.tls_ca,
      "CA bundle (PEM): clients must present a certificate it signed (mTLS); the common "
      "name is the identity (worker-N, shard-N, admin)")
      ->type_name("PATH");
  add("Security", "tokens", o.tokens_file,
      "Token file: one 'IDENTITY TOKEN' line per client (worker-N, shard-N, admin); clients "
      "prove their token by challenge and response (a bearer token is taken over TLS only)")
      ->type_name("PATH");
  add("Security", "rate-limit", o.rate_limit,
      "Requests per second allowed per client identity (per address without credentials); "
      "0: no limit");
  add("Security", "rate-burst", o.rate_burst,
      "Requests a client may send at once above --rate-limit; 0 means one second's worth");
  add("Security", "refusal-rate", o.refusal_rate,
      "Refused work per second a client may cause before the answers to its refusals are "
      "held (units: a request plus one per 64 KiB); 0: never hold");
  add("Security", "refusal-burst", o.refusal_burst,
      "Refused work a client may cause at once before --refusal-rate applies (units, >= 1)");
  add("Security", "refusal-hold-ms", raw.refusal_hold_ms,
      "How long an answer to a refusal over the client's budget is held (0 to 60000)");
  add("Security", "quarantine-ms", raw.quarantine_ms,
      "How long a worker that sent a malformed push sits out: its pushes are refused and "
      "rounds do not wait for it (0 to 3600000; 0: never)");
  add("Rounds", "worker-timeout-ms", raw.worker_timeout_ms,
      "A worker with no push taken for this long expires: rounds stop waiting for it until "
      "it pushes or joins again (0 to 86400000; 0: never)");
  add("Rounds", "suspicion-window", o.suspicion_window,
      "Rounds over which each worker's share of the rule's aggregates is scored (0 to "
      "100000; 0: no scores)");
  add("Rounds", "suspicion-threshold", o.suspicion_threshold,
      "The suspicion score (0: an equal share of the aggregates or more, 1: none) at which "
      "a worker is logged as suspected, in (0, 1]");

  add("Durability", "checkpoint-dir", o.checkpoint_dir,
      "Directory for this shard's checkpoints (in its subdirectory shard-<id>); restored at "
      "start. Empty: no checkpoints")
      ->type_name("PATH");
  add("Durability", "checkpoint-interval-s", raw.checkpoint_interval_s,
      "Seconds between checkpoints (0: only every --checkpoint-every-rounds, on demand and "
      "on SIGTERM)");
  add("Durability", "checkpoint-every-rounds", o.checkpoint_every_rounds,
      "Also write one whenever the model advanced this many rounds (0: off)");
  add("Durability", "checkpoint-keep", o.checkpoint_keep, "Checkpoints kept (>= 1)");

  add("Topology", "shard-id", o.shard_id,
      "This shard's index in [0, num-shards); -1 takes it from the host name's trailing "
      "-N (Kubernetes StatefulSet pod index; $HOSTNAME, else gethostname())");
  add("Topology", "num-shards", o.num_shards, "Number of shards, in [1, 1024]");
  add("Topology", "peers", o.peers,
      "host:port of every shard, comma-separated, indexed by shard id (empty with one "
      "shard)")
      ->delimiter(',')
      ->type_name("HOST:PORT,...");

  add("Rounds", "run-id", o.run_id,
      "The training run served (letters, digits, - _ .): workers must join with the same "
      "run id and a checkpoint of another run is not restored; empty: any")
      ->type_name("ID");
  add("Rounds", "workers", o.num_workers,
      "n: workers expected in every round from the start (waited for before they join)");
  add("Rounds", "max-workers", o.max_workers,
      absl::StrCat("Worker ids accepted, [0, max-workers): ids from n on are spares that "
                   "rounds wait for once they joined (elastic growth); 0 means n, at most ",
                   kMaxWorkerIds));
  add("Rounds", "byzantine", o.num_byzantine, "f: Byzantine workers tolerated (< n)");
  // --min-workers is the same bound under TorchElastic's name: rounds close only with
  // at least this many workers' inputs.
  finish(app.add_option("--quorum,--min-workers", o.quorum,
                        "Inputs every round is aggregated with, over gRPC and UDP, in [1, n]; "
                        "0 means n - f, raised to what the aggregator needs (bulyan: 4f + 3). "
                        "Also spelled --min-workers")
             ->capture_default_str()
             ->check(DecimalInteger()),
         "Rounds", "quorum");
  add("Rounds", "round-deadline-ms", raw.round_deadline_ms,
      "A slice's round closes this long after f + 1 workers (at least 2) pushed to it if the "
      "quorum is there");

  add("Aggregation", "aggregator", o.aggregator,
      absl::StrCat("Aggregation spec: pre-aggregators joined by '+' in front of a rule, "
                   "e.g. clip(2)+nnm+trimmed_mean. Rules: ",
                   absl::StrJoin(aggregators::AggregatorNames(), ", "),
                   "; pre-aggregators: ", absl::StrJoin(aggregators::PreAggregatorNames(), ", "),
                   " (docs/aggregators.md)"))
      ->type_name("SPEC");
  add("Aggregation", "multi-krum-m", o.multi_krum_m,
      "Multi-Krum: inputs averaged; 0 means inputs - f");
  add("Aggregation", "krum-neighbours", raw.krum_neighbours,
      "Krum neighbour count: paper (n - f - 2) or byzfl (n - f - 1)")
      ->check(CLI::IsMember({"paper", "byzfl"}));
  add("Aggregation", "even-median", raw.even_median, "Median of an even count")
      ->check(CLI::IsMember({"midpoint", "lower", "upper"}));
  add("Aggregation", "device", raw.device,
      "Where the rule computes: cpu, or cuda (falls back to the CPU, saying why, where no "
      "CUDA device is usable; docs/gpu.md)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  add("Aggregation", "aggregation-scope", raw.aggregation_scope,
      "Where distance-based rules measure distances: model (whole gradients, exact "
      "across shards) or slice (each slice on its own)")
      ->check(CLI::IsMember({"model", "slice"}));
  add("Aggregation", "peer-timeout-ms", raw.peer_timeout_ms,
      "Model scope: how long to wait for the other shards' share of a round before "
      "dropping the round");

  add_flag("Optimizer", "aggregate-only", o.aggregate_only,
           "Publish the aggregated gradient instead of applying SGD on the shard");
  add("Optimizer", "lr", o.learning_rate, "SGD learning rate (finite, > 0)");
  add("Optimizer", "momentum", o.momentum, "SGD momentum, in [0, 1)");
  add("Optimizer", "weight-decay", o.weight_decay, "L2 weight decay (finite, >= 0)");
  add("Optimizer", "lr-schedule", o.lr_schedule,
      "Step size over rounds t: constant, step(every=N, gamma=G) (lr x G^floor(t/N)), "
      "inv_sqrt(t0=T) (lr x sqrt(T/(T+t))) or cosine(steps=N, min=M)");
  add("Optimizer", "pull-codec", o.pull_codec,
      "Compress pulls: send each version's change of a slice encoded with this codec spec "
      "(fp16, 3lc(s=1.9), topk(0.01)+varint+fp16, ...), with error feedback on the shard; "
      "empty: dense fp32 (docs/data_path.md)");
  add("Optimizer", "allowed-codecs", o.allowed_codecs,
      "The codec stages pushes may use, separated by commas (fp32,fp16,topk,varint,raw); "
      "a push using another is refused as codec_not_allowed before decoding. Empty: every "
      "codec (docs/adaptive.md)");
  add("Optimizer", "max-decode-ms", o.max_decode_ms,
      "Decoding CPU time one worker's pushes of one round may take on this shard; its "
      "further pushes of the round are refused as decode_budget before decoding (a worker "
      "cannot stall a slice by choosing the slowest decoder). 0: unbounded");

  add("Resources", "threads", o.threads,
      "Aggregation threads; 0 means one per CPU the process may use (its cgroup's quota, "
      "rounded up, else the machine's cores)");
  add("Resources", "max-shard-bytes", o.max_shard_bytes,
      "Estimated memory the model state of this shard may take (parameters, optimizer state, "
      "every worker's pushes); a layout needing more is refused. 0: half the memory the "
      "process may use (its cgroup's limit, else the machine's)");
  add("Resources", "max-request-memory-bytes", o.max_request_memory_bytes,
      "Memory gRPC may take for requests and answers in flight, over all clients (a resource "
      "quota; >= 2 x --max-message-bytes)");
  add("Resources", "max-pulls-per-worker", o.max_pulls_per_worker,
      "Pull streams one worker may have open on this shard at once (>= 1)");
  add("Resources", "max-cached-decoders", o.max_cached_decoders,
      "Codec specs whose decoders are kept (least recently used dropped first; >= 1)");
  add("Resources", "max-connection-idle-ms", raw.max_connection_idle_ms,
      "Close a client connection after this long without a call (>= 1000)");
  add("Resources", "max-connections", o.max_connections,
      "Client connections the port keeps open; a quarter is reserved for connections that "
      "made an authenticated call. 0: from the open-file limit, at most 4096 "
      "(docs/connections.md)");
  add("Resources", "max-connections-per-source", o.max_connections_per_source,
      "Connections one address may hold before they make an authenticated call; a new one "
      "beyond it closes the oldest (>= 1)");
  add("Resources", "max-connections-per-client", o.max_connections_per_client,
      "Authenticated connections one identity may hold; a new one beyond it closes the "
      "oldest. 0: unbounded");
  add("Resources", "max-calls-per-client", o.max_calls_per_client,
      "Calls one client may have open on a port at once; more are RESOURCE_EXHAUSTED (>= 1)");
  add("Resources", "max-reads-per-client", o.max_reads_per_client,
      "Request bodies of one client received at once; its further calls wait, holding only "
      "their stream's initial window (>= 1)");
  add("Resources", "request-read-timeout-ms", raw.request_read_timeout_ms,
      "A request body not received this long after its reading started ends its call "
      "(refusal stalled; >= 100)");
  add("Resources", "max-streams-per-connection", o.max_streams_per_connection,
      "HTTP/2 streams a client connection may have open at once (> --max-pulls-per-worker)");
  add("Resources", "max-health-watches", o.max_health_watches,
      "grpc.health.v1 Watch streams open at once on each port (>= 1)");
  add("Resources", "max-object-bytes", o.max_object_bytes,
      "Bytes of objects each worker may keep on this shard for the others (PutObject: "
      "broadcast_object and the like; at most 16 keys; 0: none)");
  add("Resources", "connection-proof-timeout-ms", raw.connection_proof_timeout_ms,
      "Close a connection that made no authenticated call this long after its accept "
      "(>= 100)");
  add("Resources", "drain-timeout-ms", raw.drain_timeout_ms,
      "On SIGTERM, how long open rounds and pulls may take to finish before exit");

  add("Logging", "log-level", o.log_level, "Minimum level logged")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  add("Logging", "log-format", o.log_format, "plain (human-readable) or json (one object per line)")
      ->check(CLI::IsMember({"plain", "json"}));

  add("Observability", "metrics-port", o.metrics_port,
      "Port of the Prometheus metrics endpoint http://HOST:PORT/metrics on --host: -1 off, "
      "0 a free one (docs/metrics.md)");
  add("Observability", "health-port", o.health_port,
      "Port of a plaintext listener on --host serving only grpc.health.v1, for probes that "
      "cannot use TLS: -1 off, 0 a free one (docs/operations.md)");
  return names;
}

void ApplyRawFlagValues(const RawFlagValues& raw, ServerOptions& o) {
  o.round_deadline = std::chrono::milliseconds(raw.round_deadline_ms);
  o.tcp_rto_min = std::chrono::milliseconds(raw.tcp_rto_min_ms);
  o.drain_timeout = std::chrono::milliseconds(raw.drain_timeout_ms);
  o.peer_timeout = std::chrono::milliseconds(raw.peer_timeout_ms);
  o.checkpoint_interval = std::chrono::seconds(raw.checkpoint_interval_s);
  o.max_connection_idle = std::chrono::milliseconds(raw.max_connection_idle_ms);
  o.connection_proof_timeout = std::chrono::milliseconds(raw.connection_proof_timeout_ms);
  o.request_read_timeout = std::chrono::milliseconds(raw.request_read_timeout_ms);
  o.refusal_hold = std::chrono::milliseconds(raw.refusal_hold_ms);
  o.quarantine = std::chrono::milliseconds(raw.quarantine_ms);
  o.worker_timeout = std::chrono::milliseconds(raw.worker_timeout_ms);
  // Each flag's IsMember check admitted only these spellings.
  o.schedule = ParseSchedule(raw.schedule).value_or(Schedule::kPriority);
  o.data_plane = core::ParseDataPlane(raw.data_plane).value_or(core::DataPlane::kTcp);
  o.aggregation_scope =
      ParseAggregationScope(raw.aggregation_scope).value_or(AggregationScope::kModel);
  o.device = core::ParseDevice(raw.device).value_or(core::Device::kCpu);
  o.krum_neighbours = aggregators::ParseKrumNeighbours(raw.krum_neighbours)
                          .value_or(aggregators::KrumNeighbours::kPaper);
  o.even_median =
      aggregators::ParseEvenMedian(raw.even_median).value_or(aggregators::EvenMedian::kMidpoint);
}

}  // namespace ps::server
