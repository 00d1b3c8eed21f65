// ServerOptions: everything a ps-server shard is configured with. Filled from flags,
// PS_* environment variables and a TOML file by ParseServerFlags() (flags.h), or
// directly by tests and embedders. Plain data; Validate() says what is wrong.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "aggregators/aggregator.h"
#include "core/data_plane.h"
#include "core/device.h"

namespace ps::server {

// --schedule: the order in which closed slices are aggregated and ready slices streamed
// to pulls: most urgent first (P3), or in the order they became ready (the baseline).
enum class Schedule { kPriority, kFifo };
// --aggregation-scope: where rules that use distances measure them: whole gradients
// (exact on a sharded model: shards exchange Gram matrices every round), or each slice
// on its own (cheaper, weaker).
enum class AggregationScope { kModel, kSlice };
// "priority", "fifo"; "model", "slice": the flags' spelling.
std::string_view ScheduleName(Schedule s);
std::string_view AggregationScopeName(AggregationScope s);
absl::StatusOr<Schedule> ParseSchedule(std::string_view text);
absl::StatusOr<AggregationScope> ParseAggregationScope(std::string_view text);

// The most worker ids a shard accepts (--workers, --max-workers).
inline constexpr uint32_t kMaxWorkerIds = 65536;

// What --tcp-rto-min-ms -1 (auto) sets where the kernel can.
inline constexpr std::chrono::milliseconds kAutoTcpRtoMin{10};

struct ServerOptions {
  // --- network ---
  // Address to listen on. Without credentials only loopback addresses are allowed
  // unless allow_insecure_remote is set.
  std::string host = "127.0.0.1";
  // TCP port; 0 picks a free one (see port_file).
  uint16_t port = 7070;
  // When set, the bound port is written here (atomically) once serving.
  std::string port_file;
  // Permit a non-loopback listen address without TLS (insecure; explicit opt-in).
  bool allow_insecure_remote = false;
  // Largest gRPC message accepted or sent. Must hold one slice plus headers.
  uint32_t max_message_bytes = 8u << 20;
  // UDP port of the lossy gradient path (docs/transport.md) on `host`: -1 off, 0 a free
  // one (JoinResponse tells workers which).
  int32_t udp_port = -1;
  // Kernel receive buffer asked for on the UDP socket, in bytes.
  uint32_t udp_receive_buffer = 8u << 20;
  // Threads receiving and handling datagrams on the UDP socket, in [1, 64].
  uint32_t udp_threads = 2;
  // What carries pushes and pulls (docs/data-plane.md): the native TCP plane on
  // data_port (the default), or gRPC on `port`. Workers ask for one at Join; another is
  // refused.
  core::DataPlane data_plane = core::DataPlane::kTcp;
  // TCP port of the data plane on `host` when it is TCP; 0 picks a free one (the Join
  // answer names it).
  uint16_t data_port = 0;
  // Threads running the TCP data plane's connections, in [1, 64].
  uint32_t data_threads = 2;
  // The least retransmission timeout of the TCP data plane's connections, both ends (the
  // Join answer tells the workers), in [-1, 200] ms: -1 (auto) kAutoTcpRtoMin where the
  // kernel can set it (Linux 6.15 and later), else the kernel's, resolved as the server
  // starts (ResolveTcpRtoMin); 0 leaves the kernels' (200 ms); N > 0 needs such a kernel
  // or the shard does not start (net/tcp_options.h; docs/data-plane.md, "Loss").
  std::chrono::milliseconds tcp_rto_min{-1};
  // Order in which closed slices are aggregated and ready slices are streamed to
  // pulls (P3 by default).
  Schedule schedule = Schedule::kPriority;

  // --- security (docs/operations.md, "Securing") ---
  // Who may call is decided by one of: a cluster secret (secret_file, or the one in
  // run_dir), a token file (tokens_file), client certificates (tls_ca), or nothing at
  // all (insecure). Validate() refuses options that choose none: ps-server's flag
  // parser picks the run directory then, so that a shard is authenticated out of the
  // box.
  //
  // Run without client authentication: every caller is anonymous, anybody who reaches
  // the port may join as any worker or call as any shard. Only on loopback unless
  // allow_insecure_remote.
  bool insecure = false;
  // Cluster secret file (64 hex digits; `ps-admin secret` makes one): every identity's
  // token is derived from it (crypto/cluster_secret.h), so shards sharing the file accept
  // each other, and each client needs only its own token (`ps-admin token`).
  std::string secret_file;
  // Private run directory (0700): unless secret_file is set, the secret is RUN/secret,
  // made on first start. The shard writes the token of every worker and of the admin
  // there (RUN/token-worker-N, RUN/token-admin) for local launchers to hand out.
  std::string run_dir;
  // Server certificate and key (PEM files): serve TLS. Also this shard's client
  // certificate toward its peers.
  std::string tls_cert;
  std::string tls_key;
  // CA bundle (PEM file). Set: every client must present a certificate it signed
  // (mTLS), and peers' certificates are verified against it.
  std::string tls_ca;
  // Token file: one "IDENTITY TOKEN" line per client (identities worker-N, shard-N,
  // admin; '#' starts a comment). Clients prove their token without sending it
  // (crypto/auth_proof.h); "authorization: Bearer TOKEN" is taken over TLS only.
  std::string tokens_file;
  // Requests per second allowed per client identity (or per address without
  // credentials), with bursts of rate_burst; 0 = no limit.
  double rate_limit = 0;
  uint32_t rate_burst = 0;
  // The tarpit (server/tarpit.h): each client (identity, or "anonymous") may have refused
  // work of refusal_burst units, refilled at refusal_rate units per second (a refused
  // request is 1 unit plus 1 per 64 KiB); answers to refusals beyond it are held for
  // refusal_hold. refusal_rate 0: never held.
  double refusal_rate = 64;
  double refusal_burst = 256;
  std::chrono::milliseconds refusal_hold{1000};
  // A worker that sends a malformed push or chunk is quarantined this long
  // (server/quarantine.h): its pushes are refused and no round waits for it. 0: never.
  std::chrono::milliseconds quarantine{10000};
  // A worker with no push or chunk taken for this long expires (server/membership.h): no
  // round waits for it until it pushes or joins again. 0: never.
  std::chrono::milliseconds worker_timeout{300000};
  // Suspicion (server/suspicion.h): each worker's share of the rule's aggregates over
  // windows of this many rounds (0: not computed), and the score at which the shard
  // logs it as suspected.
  uint32_t suspicion_window = 50;
  double suspicion_threshold = 0.5;

  // --- durability (docs/operations.md, "Backing up and restoring") ---
  // Directory of this shard's checkpoints (a subdirectory shard-<id> is used); empty:
  // no checkpoints.
  std::string checkpoint_dir;
  // Write one this often (0: only on SIGTERM, on demand and every N rounds).
  std::chrono::seconds checkpoint_interval{300};
  // Write one whenever the model round advanced this many rounds (0: off).
  uint32_t checkpoint_every_rounds = 0;
  // Checkpoints kept (older ones are deleted after a new one is safely written).
  uint32_t checkpoint_keep = 3;

  // --- topology ---
  // This shard's index in [0, num_shards). -1: take it from the host name's
  // trailing "-N" (a Kubernetes StatefulSet pod index).
  int shard_id = 0;
  uint32_t num_shards = 1;
  // "host:port" of every shard, indexed by shard id (this shard's own entry is
  // ignored). Empty with one shard.
  std::vector<std::string> peers;

  // --- rounds ---
  // The training run these shards serve (docs/operations.md, "One model per run"): when
  // set, a worker joins only with the same run id, and a checkpoint of another run is
  // not restored. Empty: any worker, any checkpoint (as before).
  std::string run_id;
  // n: workers expected in every round from the start (waited for before they join).
  uint32_t num_workers = 1;
  // Worker ids the shards accept, [0, max_workers): ids at or above n are spares, not
  // waited for until they join, then members like the others (docs/operations.md,
  // "Workers that come and go"). 0 means n. Bounds every per-worker table and label set.
  uint32_t max_workers = 0;
  // f: Byzantine workers tolerated.
  uint32_t num_byzantine = 0;
  // Inputs every round is aggregated with (gRPC and UDP, slice and model scope): a
  // round closes at its deadline with at least this many, and one below it is never
  // aggregated; 0 means n - f, raised to the aggregation rule's least input count
  // (Bulyan: 4f + 3).
  uint32_t quorum = 0;
  // A round of a slice closes this long after f + 1 distinct workers (at least 2, at most
  // the quorum) pushed to it if the quorum is there (otherwise as soon as it is; in a UDP
  // round one more deadline later it is dropped: docs/transport.md).
  std::chrono::milliseconds round_deadline{5000};

  // --- aggregation ---
  std::string aggregator = "mean";
  // Multi-Krum: inputs averaged; 0 means k - f.
  uint32_t multi_krum_m = 0;
  // Krum neighbour count: paper (n - f - 2) or byzfl (n - f - 1).
  aggregators::KrumNeighbours krum_neighbours = aggregators::KrumNeighbours::kPaper;
  // Median of an even count: midpoint, lower or upper.
  aggregators::EvenMedian even_median = aggregators::EvenMedian::kMidpoint;
  // Where rules that use distances (krum, bulyan, nnm, clip, ...) measure them.
  AggregationScope aggregation_scope = AggregationScope::kModel;
  // Where the aggregation rule computes (docs/gpu.md). Without a usable CUDA device the
  // shard aggregates on the CPU and logs why once at start.
  core::Device device = core::Device::kCpu;
  // Model scope: how long a shard waits for its peers' shares of a round before it
  // drops the round (publishing unchanged parameters).
  std::chrono::milliseconds peer_timeout{10000};

  // --- optimizer ---
  // Publish the aggregated gradient instead of applying SGD on the shard.
  bool aggregate_only = false;
  float learning_rate = 0.1f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;
  // Step-size schedule over rounds (server/optimizer.h, LrSchedule): constant,
  // step(every=N, gamma=G), inv_sqrt(t0=T) or cosine(steps=N, min=M).
  std::string lr_schedule = "constant";
  // Compressed pulls (docs/data_path.md): each version's change of a slice, encoded
  // once with this codec spec and sent to every worker that holds the version before;
  // the others get dense values. Empty: dense fp32 pulls only. Not with aggregate_only.
  std::string pull_codec;
  // The codec stages pushes may use (CodecPolicy, docs/adaptive.md "Shard-side
  // policy"): names separated by commas, "fp32,fp16,topk,varint,raw"; empty: every
  // codec. A push using another is refused as codec_not_allowed before decoding.
  std::string allowed_codecs;
  // Per worker and round: the decoding CPU time its pushes may take on this shard (its
  // further pushes of the round are refused as decode_budget before decoding once they
  // took it; docs/adaptive.md "Shard-side policy"). 0: unbounded.
  double max_decode_ms = 1000;

  // --- resources and lifecycle ---
  // Aggregation threads; 0 means one per core.
  uint32_t threads = 0;
  // Per-client and total bounds (docs/operations.md, "Threat model and limits").
  // Estimated memory of the model state this shard may hold (parameters, optimizer
  // state, the pushes of every worker, published copies, the layout's tables); a layout
  // needing more is refused. 0: half of the machine's physical memory.
  uint64_t max_shard_bytes = 0;
  // Memory gRPC may take for the requests it is receiving and the answers it is sending,
  // over all clients (a gRPC resource quota): messages in flight are outside
  // max_shard_bytes, and a flood of large ones (even unauthenticated: the message is read
  // before its credentials are checked) would grow without it. Near the quota gRPC reads
  // more slowly and refuses new calls. At least twice max_message_bytes.
  // Refusal answers held by the tarpit keep their requests alive too: at most
  // max_request_memory_bytes / max_message_bytes of them in all, 8 per client.
  uint64_t max_request_memory_bytes = 256ull << 20;
  // Pull streams one worker may have open on this shard at once (more are
  // RESOURCE_EXHAUSTED); so at most workers x this many in all.
  uint32_t max_pulls_per_worker = 16;
  // Codec specs whose decoders are kept; the least recently used one is dropped for a
  // new one (a client cannot fill the cache and lock others out).
  uint32_t max_cached_decoders = 64;
  // A client connection without any call for this long is closed (gRPC GOAWAY); it
  // reconnects on its next call. Keepalive pings every 60 s also close dead ones.
  std::chrono::milliseconds max_connection_idle{60000};
  // Connections (docs/connections.md): at most max_connections open on the port (0:
  // derived from the open-file limit, at most 4096); connections that have not yet made
  // an authenticated call may use all but a quarter of them, at most
  // max_connections_per_source from one address, and are closed connection_proof_timeout
  // after their accept; at most max_connections_per_client authenticated connections per
  // identity (0: no bound). The health port has the same bounds of its own.
  uint32_t max_connections = 0;
  uint32_t max_connections_per_source = 256;
  uint32_t max_connections_per_client = 4;
  std::chrono::milliseconds connection_proof_timeout{10000};
  // Calls (docs/connections.md): at most max_calls_per_client calls of one client open on
  // a port; at most max_reads_per_client of its request bodies received at once, and
  // max_request_memory_bytes / max_message_bytes in all; a body not received
  // request_read_timeout after its reading started ends its call. At most
  // max_streams_per_connection HTTP/2 streams per connection, max_health_watches health
  // Watch streams per port.
  uint32_t max_calls_per_client = 128;
  uint32_t max_reads_per_client = 4;
  std::chrono::milliseconds request_read_timeout{10000};
  uint32_t max_streams_per_connection = 32;
  uint32_t max_health_watches = 64;
  // Bytes of objects each worker may keep on this shard (PutObject: ps_server.torch's
  // broadcast_object and the like, docs/objects.md), in at most 16 keys; 0: none.
  uint64_t max_object_bytes = 16u << 20;
  // On SIGTERM: how long to let open rounds close and pulls finish before exit.
  std::chrono::milliseconds drain_timeout{10000};

  // --- logging ---
  std::string log_level = "info";   // trace, debug, info, warn, error
  std::string log_format = "plain";  // plain or json

  // --- observability ---
  // Port of the Prometheus metrics endpoint, http://host:port/metrics (docs/metrics.md):
  // -1 off, 0 a free one (Server::metrics_port() says which).
  int32_t metrics_port = -1;
  // Port of a plaintext listener that serves only grpc.health.v1 (the same statuses as
  // the main port), for probes that cannot speak TLS (Kubernetes' kubelet): -1 off, 0 a
  // free one (Server::health_port() says which).
  int32_t health_port = -1;

  // Whether clients must authenticate (mTLS, a token file or the cluster secret); without
  // it (insecure) the worker id is taken from the request.
  bool ClientAuthRequired() const {
    return !tls_ca.empty() || !tokens_file.empty() || !secret_file.empty() || !run_dir.empty();
  }

  // Pushes that close a round at its deadline: quorum, or n - f when 0.
  uint32_t EffectiveQuorum() const { return quorum != 0 ? quorum : num_workers - num_byzantine; }
  // The size of the worker id space: --max-workers, or n.
  uint32_t WorkerIds() const { return max_workers != 0 ? max_workers : num_workers; }

  // Checks ranges and consistency (not the aggregation rule's bound, which
  // MakeAggregator checks); the message names the offending field and value.
  absl::Status Validate() const;

  // One line listing what every shard must agree on (workers, f, quorum, rule and
  // its switches, mode, optimizer), used by the peer check.
  std::string ConsistencySummary() const;
};

}  // namespace ps::server
