#include "server/flags.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "aggregators/aggregator.h"
#include "core/cluster_secret.h"
#include "server/config_file.h"

// The build may pass the project version; the fallback keeps a plain compile working.
#ifndef PS_SERVER_VERSION
#define PS_SERVER_VERSION "0.1.0"
#endif

namespace ps::server {
namespace {

constexpr char kProgram[] = "ps-server";
constexpr int kUsageExitCode = 2;

// Fields that are stored with another type than the flag parses into.
struct RawValues {
  int64_t round_deadline_ms = 0;
  int64_t drain_timeout_ms = 0;
  int64_t peer_timeout_ms = 0;
  int64_t checkpoint_interval_s = 0;
  int64_t max_connection_idle_ms = 0;
  int64_t connection_proof_timeout_ms = 0;
  int64_t request_read_timeout_ms = 0;
  int64_t refusal_hold_ms = 0;
  int64_t quarantine_ms = 0;
  // Choices parsed into their enums once the flags are read (each checked by its flag).
  std::string schedule, aggregation_scope, device, krum_neighbours, even_median, data_plane;
};

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

// The help shows, for every option, its type, its default and its variable; CLI11's
// stock formatter leaves out the default of flags and of empty values.
class HelpFormatter final : public CLI::Formatter {
 public:
  HelpFormatter() { column_width(kNameWidth); }

  std::string make_option_opts(const CLI::Option* opt) const override {
    std::string out;
    if (opt->get_type_size() != 0 && !opt->get_type_name().empty()) {
      absl::StrAppend(&out, " ", opt->get_type_name());
    }
    return out;
  }

  std::string make_option_desc(const CLI::Option* opt) const override {
    // Words of the description, then the annotations, each kept on one line.
    std::vector<std::string> tokens;
    std::istringstream words(opt->get_description());
    for (std::string word; words >> word;) tokens.push_back(word);
    if (opt->get_configurable()) {
      std::string def = opt->get_default_str();
      if (opt->get_type_size() == 0) {
        def = def.empty() ? "false" : def;
      } else if (def.empty() || def == "[]") {
        def = "none";
      }
      tokens.push_back(absl::StrCat("[default: ", def, "]"));
    }
    if (!opt->get_envname().empty())
      tokens.push_back(absl::StrCat("[env: ", opt->get_envname(), "]"));
    return Wrap(tokens, kDescriptionWidth);
  }

 private:
  static constexpr size_t kNameWidth = 36;
  static constexpr size_t kDescriptionWidth = 100 - kNameWidth;

  // Joins tokens with spaces, breaking lines before `width`; CLI11 indents the lines
  // after each '\n' to the description column.
  static std::string Wrap(const std::vector<std::string>& tokens, size_t width) {
    std::string out;
    size_t line = 0;
    for (const std::string& token : tokens) {
      if (line > 0 && line + 1 + token.size() > width) {
        out += '\n';
        line = 0;
      } else if (line > 0) {
        out += ' ';
        ++line;
      }
      out += token;
      line += token.size();
    }
    return out;
  }
};

// Declares every flag of ps-server on `app`, bound to `options` and `raw`. Returns the
// long names of the configurable ones (= config keys; PS_ + upper snake = variables).
// `with_env` is off for the scratch parsers that check a single value.
std::vector<std::string> DefineFlags(CLI::App& app, ServerOptions& o, RawValues& raw,
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
  raw.drain_timeout_ms = o.drain_timeout.count();
  raw.peer_timeout_ms = o.peer_timeout.count();
  raw.checkpoint_interval_s = o.checkpoint_interval.count();
  raw.max_connection_idle_ms = o.max_connection_idle.count();
  raw.connection_proof_timeout_ms = o.connection_proof_timeout.count();
  raw.request_read_timeout_ms = o.request_read_timeout.count();
  raw.refusal_hold_ms = o.refusal_hold.count();
  raw.quarantine_ms = o.quarantine.count();
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
      "What carries pushes and pulls: grpc (on --port) or tcp (the native plane on "
      "--data-port, under --port's TLS); workers asking for the other are refused "
      "(docs/data-plane.md)")
      ->check(CLI::IsMember({"grpc", "tcp"}));
  add("Network", "data-port", o.data_port,
      "TCP port of the data plane on --host with --data-plane tcp; 0 picks a free one (the "
      "Join answer names it)")
      ->check(CLI::Range(0, 65535).description(""));
  add("Network", "data-threads", o.data_threads,
      "Threads running the TCP data plane's connections, in [1, 64]");
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

  add("Rounds", "workers", o.num_workers, "n: workers expected in every round");
  add("Rounds", "byzantine", o.num_byzantine, "f: Byzantine workers tolerated (< n)");
  add("Rounds", "quorum", o.quorum,
      "Inputs every round is aggregated with, over gRPC and UDP, in [1, n]; 0 means n - f, "
      "raised to what the aggregator needs (bulyan: 4f + 3)");
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

  add("Resources", "threads", o.threads, "Aggregation threads; 0 means one per core");
  add("Resources", "max-shard-bytes", o.max_shard_bytes,
      "Estimated memory the model state of this shard may take (parameters, optimizer state, "
      "every worker's pushes); a layout needing more is refused. 0: half the physical memory");
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

// Parses one value for one flag on a fresh parser, to find out whether that value is
// the one CLI11 choked on. Returns the error, or nothing when the value is fine.
std::optional<std::string> CheckAlone(const std::string& name,
                                      const std::vector<std::string>& values) {
  CLI::App app(kProgram);
  ServerOptions scratch;
  RawValues raw;
  DefineFlags(app, scratch, raw, /*with_env=*/false);
  const std::string arg = absl::StrCat("--", name, "=", absl::StrJoin(values, ","));
  const char* const argv[] = {kProgram, arg.c_str()};
  try {
    app.parse(2, argv);
  } catch (const CLI::ParseError& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

// After a failed parse: the first PS_* variable, then the first config key, whose
// value does not parse alone, as a message naming the variable or key.
std::optional<std::string> BlameSource(const std::vector<std::string>& names,
                                       const ServerConfigReader& reader,
                                       const std::string& config_file) {
  for (const std::string& name : names) {
    const std::string env = EnvName(name);
    const std::optional<std::string> value = GetEnv(env);
    if (!value.has_value()) continue;
    if (auto error = CheckAlone(name, {*value})) {
      return absl::StrCat("environment variable ", env, "=\"", *value, "\": ", *error);
    }
  }
  for (const CLI::ConfigItem& item : reader.used_items()) {
    if (auto error = CheckAlone(item.name, item.inputs)) {
      return absl::StrCat("config file ", config_file, ", key \"", item.name, "\": ", *error);
    }
  }
  return std::nullopt;
}

FlagsResult Exit(int code, std::string message) {
  FlagsResult result;
  result.exit_now = true;
  result.exit_code = code;
  result.message = std::move(message);
  return result;
}

FlagsResult UsageError(absl::string_view what) {
  return Exit(kUsageExitCode,
              absl::StrCat(kProgram, ": ", what, "\nRun with --help for the list of flags.\n"));
}

std::string LocalHostname() {
  if (std::optional<std::string> env = GetEnv("HOSTNAME")) return *env;
  char buf[HOST_NAME_MAX + 1] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return std::string();
  return std::string(buf);
}

bool HasFlag(int argc, const char* const* argv, std::string_view flag) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == flag || (arg.size() > flag.size() && arg.substr(0, flag.size()) == flag &&
                        arg[flag.size()] == '=')) {
      return true;
    }
  }
  return false;
}

FlagsResult ParseOrExit(int argc, const char* const* argv) {
  FlagsResult result;
  RawValues raw;
  CLI::App app(
      "ps-server: one shard of a parameter server with Byzantine-robust aggregation.\n"
      "Every flag can also be set by its PS_* environment variable or by its long name as\n"
      "a key in the --config TOML file; precedence is flag > environment > file > default.",
      kProgram);
  app.formatter(std::make_shared<HelpFormatter>());
  app.set_version_flag("--version", ServerVersionString(), "Print the version and exit");
  app.get_help_ptr()->description("Print this help and exit");

  const std::vector<std::string> names = DefineFlags(app, result.options, raw, /*with_env=*/true);
  auto reader =
      std::make_shared<ServerConfigReader>(std::set<std::string>(names.begin(), names.end()));
  app.config_formatter(reader);
  app.allow_config_extras(CLI::config_extras_mode::error);
  app.set_config("--config", "",
                 "TOML file with flag values (keys: long flag names); see docs/configuration.md")
      ->envname("PS_CONFIG")
      ->type_name("FILE");

  // CLI11 reads the config file before it looks at the environment, so it would never
  // see PS_CONFIG; passing it as the flag (when the flag is absent) keeps the same
  // precedence and makes a missing file an error, as with --config.
  std::vector<const char*> args(argv, argv + std::max(argc, 0));
  if (args.empty()) args.push_back(kProgram);
  const std::optional<std::string> env_config = GetEnv("PS_CONFIG");
  if (env_config.has_value() && !HasFlag(static_cast<int>(args.size()), args.data(), "--config")) {
    args.push_back("--config");
    args.push_back(env_config->c_str());
  }

  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::CallForHelp&) {
    return Exit(0, app.help());
  } catch (const CLI::CallForAllHelp&) {
    return Exit(0, app.help("", CLI::AppFormatMode::All));
  } catch (const CLI::CallForVersion& e) {
    return Exit(0, absl::StrCat(e.what(), "\n"));
  } catch (const CLI::ExtrasError&) {
    return UsageError(
        absl::StrCat("unknown flag or unexpected argument: ", absl::StrJoin(app.remaining(), " ")));
  } catch (const CLI::FileError& e) {
    return UsageError(absl::StrCat("--config: ", e.what()));
  } catch (const CLI::ParseError& e) {
    std::string config_file;
    if (const CLI::Option* config = app.get_config_ptr();
        config != nullptr && config->count() > 0) {
      config_file = config->as<std::string>();
    }
    if (dynamic_cast<const CLI::ConfigError*>(&e) != nullptr) {
      return UsageError(absl::StrCat("config file ", config_file, ": ", e.what()));
    }
    if (std::optional<std::string> blamed = BlameSource(names, *reader, config_file)) {
      return UsageError(*blamed);
    }
    return UsageError(e.what());
  }

  ServerOptions& o = result.options;
  o.round_deadline = std::chrono::milliseconds(raw.round_deadline_ms);
  o.drain_timeout = std::chrono::milliseconds(raw.drain_timeout_ms);
  o.peer_timeout = std::chrono::milliseconds(raw.peer_timeout_ms);
  o.checkpoint_interval = std::chrono::seconds(raw.checkpoint_interval_s);
  o.max_connection_idle = std::chrono::milliseconds(raw.max_connection_idle_ms);
  o.connection_proof_timeout = std::chrono::milliseconds(raw.connection_proof_timeout_ms);
  o.request_read_timeout = std::chrono::milliseconds(raw.request_read_timeout_ms);
  o.refusal_hold = std::chrono::milliseconds(raw.refusal_hold_ms);
  o.quarantine = std::chrono::milliseconds(raw.quarantine_ms);
  // Each flag's IsMember check admitted only these spellings.
  o.schedule = ParseSchedule(raw.schedule).value_or(Schedule::kPriority);
  o.data_plane = core::ParseDataPlane(raw.data_plane).value_or(core::DataPlane::kGrpc);
  o.aggregation_scope =
      ParseAggregationScope(raw.aggregation_scope).value_or(AggregationScope::kModel);
  o.device = core::ParseDevice(raw.device).value_or(core::Device::kCpu);
  o.krum_neighbours = aggregators::ParseKrumNeighbours(raw.krum_neighbours)
                          .value_or(aggregators::KrumNeighbours::kPaper);
  o.even_median =
      aggregators::ParseEvenMedian(raw.even_median).value_or(aggregators::EvenMedian::kMidpoint);

  // Secure by default: without any way of telling clients apart, and unless told to run
  // insecure, the shard uses (and on first start makes) the secret of its run directory.
  if (!o.insecure && !o.ClientAuthRequired()) {
    absl::StatusOr<std::string> dir = core::DefaultRunDirectory();
    if (!dir.ok()) return UsageError(dir.status().message());
    o.run_dir = *dir;
  }

  std::string resolved_from;
  if (o.shard_id == -1) {
    const std::string hostname = LocalHostname();
    absl::StatusOr<int> id = ShardIdFromHostname(hostname);
    if (!id.ok()) return UsageError(absl::StrCat("--shard-id=-1: ", id.status().message()));
    o.shard_id = *id;
    resolved_from = absl::StrCat("taken from host name \"", hostname, "\"");
  }

  if (absl::Status status = o.Validate(); !status.ok()) {
    // Validate names the flag ("--momentum=1.5 ..."); say where the value came from,
    // since with a ConfigMap and a Deployment's env the operator may not know.
    const std::string message(status.message());
    std::string source;
    if (absl::StartsWith(message, "--")) {
      const std::string name = message.substr(2, message.find_first_of("= ") - 2);
      const bool from_reader =
          std::any_of(reader->used_items().begin(), reader->used_items().end(),
                      [&](const CLI::ConfigItem& item) { return item.name == name; });
      if (name == "shard-id" && !resolved_from.empty()) {
        source = resolved_from;
      } else if (HasFlag(argc, argv, "--" + name)) {
        source = "";  // on the command line: the user just typed it
      } else if (GetEnv(EnvName(name)).has_value()) {
        source = absl::StrCat("from environment variable ", EnvName(name));
      } else if (from_reader && app.get_config_ptr()->count() > 0) {
        source = absl::StrCat("from config file ", app.get_config_ptr()->as<std::string>());
      } else {
        source = "the default";
      }
    }
    return UsageError(absl::StrCat("invalid configuration: ", message,
                                   source.empty() ? "" : absl::StrCat(" [", source, "]")));
  }
  return result;
}

}  // namespace

absl::StatusOr<int> ShardIdFromHostname(std::string_view hostname) {
  // A pod's FQDN is <pod>.<service>.<namespace>...; the index is on the first label.
  const std::string_view label = hostname.substr(0, hostname.find('.'));
  const size_t dash = label.rfind('-');
  const std::string_view suffix =
      dash == std::string_view::npos ? std::string_view() : label.substr(dash + 1);
  int id = 0;
  const bool numeric =
      !suffix.empty() && suffix.size() <= 9 &&
      std::all_of(suffix.begin(), suffix.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
      absl::SimpleAtoi(absl::string_view(suffix.data(), suffix.size()), &id);
  if (!numeric) {
    return absl::InvalidArgumentError(
        absl::StrCat("host name \"", std::string(hostname),
                     "\" does not end in -N (a StatefulSet pod index such as ps-server-3); pass "
                     "--shard-id explicitly"));
  }
  return id;
}

std::string ServerVersionString() { return absl::StrCat(kProgram, " ", PS_SERVER_VERSION); }

FlagsResult ParseServerFlags(int argc, const char* const* argv) {
  try {
    return ParseOrExit(argc, argv);
  } catch (const std::exception& e) {
    // CLI11 construction errors and allocation failures: report, never propagate.
    return UsageError(absl::StrCat("internal error while parsing flags: ", e.what()));
  }
}

}  // namespace ps::server
