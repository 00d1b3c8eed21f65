// ps::Worker: the client side of ps-server, linked into training binaries.
//
// A Worker connects to every shard, joins with the model layout (registering it and
// uploading initial values when it is the first), pushes gradients slice by slice to
// the shards that own them, and pulls fresh parameters into the caller's buffers.
// The header carries no gRPC or protobuf types.
//
// Rounds: the gradient pushed for round t was computed on parameters of version t;
// once a shard closes round t of a slice it publishes version t + 1. A training loop
// therefore does: Pull(version t) -> forward/backward -> Push(round t) -> t + 1.
//
// Thread safety: every method may be called from any thread. Push() returns at once;
// WaitPushes() reports how the pushes went. Failures are absl::Status values whose
// message names the tensor, slice and shard involved.
//
// Priorities (P3, docs/transport.md): every slice waits in its shard's send queue, most
// urgent first (the tensor the next forward pass uses first), and at most
// `max_inflight_bytes` of pushes per shard (or what the link moves in `inflight_seconds`)
// are on the wire, so an urgent slice pushed late overtakes queued ones at slice
// boundaries. StartPullAll() tells per tensor when
// its fresh parameters have arrived, so a forward pass can start on the first layers.
//
// Reconnection: gRPC channels reconnect with exponential backoff by themselves; a
// call that fails with UNAVAILABLE, or whose session the shard no longer knows (the
// shard restarted), is retried after re-joining, up to `max_attempts` times with
// backoff between `initial_backoff` and `max_backoff`.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/credentials.h"
#include "core/data_plane.h"
#include "core/device.h"
#include "core/layout.h"
#include "net/shaper.h"

namespace ps {

// Which path a tensor's pushes take (PushOptions::path). Pulls always use the data plane.
enum class PushPath {
  // The reliable plane the shards run (gRPC): every push answered, retried, replayed
  // after a shard restart, and sent most urgent first within the credit window.
  kDataPlane,
  // The shard's lossy UDP path (docs/transport.md, "UDP"): slices cut into chunks of
  // UdpOptions::chunk_elems coordinates, one signed datagram each; the shard must run
  // with --udp-port. Lost datagrams lose their coordinate range for that round;
  // nothing is answered or retransmitted.
  kUdp,
};

// How one tensor's gradients are pushed (docs/codecs.md, "Worker side").
struct PushOptions {
  // Codec spec: "fp32", "int8", "3lc(s=1.9)", "topk(0.01)+varint+fp16", ...
  std::string codec = "fp32";
  // Error feedback: what the codec lost is added to the tensor's next push,
  //   v_t = u_t + e_{t-1},  push encode(v_t),  e_t = v_t - decode(encode(v_t)).
  // Biased codecs (sign, 3lc, topk, threshold, powersgd) need it to converge.
  bool error_feedback = false;
  // Worker momentum beta in [0, 1): u_t = beta * u_{t-1} + (1 - beta) * g_t is pushed
  // instead of the gradient g_t (0: u_t = g_t).
  double momentum = 0;
  // The tensor as a row-major matrix with this many columns (0: not a matrix). A slice
  // that is a whole number of rows is then encoded as a matrix (PowerSGD).
  uint32_t matrix_cols = 0;
  // The path this tensor's gradients take to the shards (PushPath).
  PushPath path = PushPath::kDataPlane;
  // Deprecated, kept for one release: true means path = PushPath::kUdp (whatever `path`
  // says). Set `path` instead.
  bool udp = false;
  // Where the codec encodes (CodecOptions::device): kCuda encodes on the CUDA device
  // into the same bytes (docs/gpu.md, "Encoding on the device"), or on the CPU when the
  // build, the machine or the codec has no GPU encoder; Worker::device_note() then says
  // why.
  core::Device device = core::Device::kCpu;
  // Borrowed pushes (docs/data_path.md, "Borrowed pushes"): this tensor's pushes send
  // the caller's buffer as it is, without the copy into a payload, so the buffer given to
  // Push must stay unchanged until WaitPushes() returns (horovod's *_async contract).
  // Taken where the push is fp32 (also when an adaptive strategy switches to fp32)
  // without momentum or error feedback, over the TCP data plane or the UDP path (each
  // chunk's datagram is signed and sent from the buffer); elsewhere (the gRPC plane
  // copies as the call starts) the push copies as without it, which changes only the
  // speed.
  bool borrow = false;

  // The path in effect: kUdp when the deprecated `udp` is set, else `path`.
  PushPath push_path() const { return udp ? PushPath::kUdp : path; }
};

// The worker side of the UDP path.
struct UdpOptions {
  // Coordinates per datagram: chunk i of a slice covers [i * chunk_elems, (i + 1) *
  // chunk_elems). Each chunk is encoded on its own with the tensor's codec, so the
  // encoded chunk (plus about 120 bytes) must fit in one datagram (65507 bytes).
  // 0 (the default): per shard, as many fp32 values as fill one IP packet of this host's
  // route to it, so that no datagram is sent as IP fragments (one lost fragment loses
  // the whole datagram): 16,353 values on loopback (MTU 65,536), 345 on Ethernet (1,500),
  // 2,220 with jumbo frames (9,000); 8192 where the MTU cannot be read. Fewer where the
  // tensor's codec may encode a value in more than 4 bytes, so that its largest encoding
  // of a chunk still fits in one datagram.
  uint32_t chunk_elems = 0;
  // Pacing: the sender's rate in megabits per second (token bucket); 0 = unpaced.
  double rate_mbps = 0;
  // Seeded loss injection for tests and benchmarks: each datagram is dropped before
  // sending with this probability, decided by a hash of (seed, worker, round, slice,
  // chunk), so a run loses the same datagrams every time.
  double loss = 0;
  uint64_t loss_seed = 1;
  // After the last chunk of a tensor's push to a shard, this many copies of an end
  // datagram (one for all of the push's slices there), which tells the shard that every
  // chunk was sent: the round closes once every worker's push is whole or ended, instead
  // of waiting for its deadline when chunks were lost (each copy is lost on its own; 0:
  // none, every round with a lost chunk waits for its deadline).
  uint32_t end_copies = 2;
};

// Espresso in the worker (docs/adaptive.md, "Espresso"): each tensor's push codec is
// chosen among `candidates` by simulating one round with this worker's measured costs
// (its links to the shards, its gradients' ready times, the candidates' encode and
// decode speed profiled at Start, the bytes its pulls bring) and searching greedily,
// and chosen again when the measurements drift. The tensor's other PushOptions stay
// (error feedback, momentum: both carry over a change of codec); tensors pushed over
// UDP keep their codec. Until the first plan every tensor pushes with its own codec.
// The plan chooses the codec and where it encodes; the transport (gRPC or the lossy
// UDP path) and the send order (P3) stay as configured (docs/adaptive.md says why).
struct PlanOptions {
  bool enabled = false;
  // Codec specs; "fp32" (the baseline) is added first when missing. Biased codecs need
  // PushOptions::error_feedback; the shards' --allowed-codecs must allow them all.
  std::vector<std::string> candidates = {"fp32", "fp16", "topk(0.01)+varint+fp16",
                                         "3lc(s=1.9)"};
  // Rounds measured before the first plan (every shard's link must also be measured).
  uint32_t warmup_rounds = 3;
  // Plan again when a link's seconds per byte stayed more than `drift` (a fraction)
  // away from the one the plan used for `drift_rounds` rounds in a row, or after
  // `replan_rounds` rounds (0: never by count).
  double drift = 0.2;
  uint32_t drift_rounds = 3;
  uint32_t replan_rounds = 100;
  // Start-up time spent profiling each candidate.
  std::chrono::milliseconds profile_budget{50};
  // Also offer each candidate encoded on the CUDA device (a queue of its own in the
  // simulated round), where the build, the machine and the codec have a device encoder;
  // profiled there at Start like the CPU's. False: every planned tensor encodes where
  // its PushOptions::device says.
  bool device_encode = true;
};

// What the adaptive choices minimize (docs/adaptive.md, "One switch").
enum class Objective {
  // The round's wall-clock time: CAT's levels (`level=cat`) weigh the payload against
  // the measured link latency and round idle time, and the plan (PlanOptions) makes the
  // round end soonest.
  kTime,
  // The bytes sent: CAT's levels weigh the payload against the spec's `overhead` alone
  // (its payload-bit model), and the plan pushes each tensor with the fewest bytes that
  // do not make the round end later than fp32 everywhere would.
  kBytes,
};

struct WorkerOptions {
  // "host:port" of each shard, indexed by shard id.
  std::vector<std::string> shard_addresses;
  // This worker's rank in [0, num_workers) of the servers' configuration. Shards that
  // take credentials check it against the identity (worker-N) of `credentials`.
  uint32_t worker_id = 0;
  // TLS, client certificate and token toward the shards (docs/operations.md,
  // "Securing"; the token is proven, never sent); empty: plaintext without credentials.
  core::ClientCredentials credentials;
  // The data plane to move tensors over (docs/data-plane.md): unset, whatever the shards
  // run (each Join answer says); set, a shard on another plane refuses the Join
  // (FAILED_PRECONDITION, refusal data_plane) naming both planes and the fixes.
  std::optional<core::DataPlane> data_plane;
  // The training run this worker belongs to (docs/operations.md, "One model per run"):
  // shards started with --run-id refuse a worker of another run or of none
  // (FAILED_PRECONDITION, refusal wrong_run). Empty: none.
  std::string run_id;
  // How every tensor is pushed, and overrides by tensor name (an unknown name is an
  // error at Start()).
  PushOptions push;
  std::map<std::string, PushOptions, std::less<>> tensor_push;
  // Seed of the codecs' worker-side randomness (stochastic rounding, per-worker random-k),
  // mixed with the worker id, round and slice.
  uint64_t codec_seed = 0;
  // Deadline of one RPC attempt (a pull that waits for a version uses its own).
  std::chrono::milliseconds rpc_timeout{30000};
  // How long Start() keeps trying to reach every shard and see it ready.
  std::chrono::milliseconds connect_timeout{60000};
  // Whether this worker registers the layout and uploads its initial values on a shard
  // that has none. True: the first worker to join does (whichever it is). False: this
  // worker waits, rejoining with the backoff below up to connect_timeout, until another
  // worker (the root, Horovod's root_rank, which brings the values to start from: a
  // checkpoint, say) has registered the layout; then DEADLINE_EXCEEDED saying so.
  bool may_register = true;
  // Retry backoff: first wait, doubling up to the maximum.
  std::chrono::milliseconds initial_backoff{50};
  std::chrono::milliseconds max_backoff{2000};
  // Attempts per RPC before its failure is reported.
  int max_attempts = 6;
  // Send order (P3): true sends queued slices most urgent first (layout priority, then
  // round, then slice id), false in the order they were pushed (FIFO).
  bool priority_order = true;
  // Bytes of pushes sent to one shard and not yet answered; a slice that would exceed
  // it waits in the queue (one push is always let through). Small values let urgent
  // slices overtake sooner; the link needs about bandwidth x round-trip to stay busy.
  // The default holds two default slices: with one, the link idles while an answer
  // comes back behind the pull traffic (docs/transport.md, "`ps-bench p3`").
  uint64_t max_inflight_bytes = 512u << 10;
  // The window also grows to what the shard's link was measured to move in this many
  // seconds (its push busy periods, WorkerStats::push_links), up to 64 MiB: on a fast
  // link two slices are answered sooner than they are sent and the link idles between
  // answers; in time, an urgent slice still waits about this long at most. 0 keeps the
  // window at max_inflight_bytes.
  double inflight_seconds = core::kDefaultInflightSeconds;
  // HTTP/2 receive window of this worker's channels in bytes; 0 leaves gRPC's default,
  // which grows the window with the bandwidth-delay product. What a shard wrote into
  // the window is delivered in the order written, so a large window can hold an urgent
  // slice behind megabytes of later layers when a pull asks for slices that are all
  // ready at once; a fixed window bounds that, at some cost in throughput
  // (docs/transport.md, "P3: priority-ordered propagation").
  uint32_t receive_window_bytes = 0;
  // Bandwidth shaping of this worker's link to every shard (docs/transport.md): a
  // local relay per shard with a token bucket on each direction and added latency.
  // Disabled by default.
  net::LinkShaping shaping;
  UdpOptions udp;
  PlanOptions plan;
  Objective objective = Objective::kTime;
};

// What a shard told this worker at join time.
struct ShardInfo {
  uint32_t shard_id = 0;
  uint32_t num_workers = 0;
  std::string aggregator;
  bool aggregate_only = false;
  // The shard's SGD step on each round's aggregate (zeros with aggregate_only).
  // Local-update training needs 1, 0, 0: the aggregate of model changes added as it is.
  float learning_rate = 0;
  float momentum = 0;
  float weight_decay = 0;
  uint64_t version = 0;  // lowest published version of its slices at join
  // The data plane the shard's Join answer named: what this worker's pushes and pulls
  // to it travel over (WorkerOptions::data_plane, docs/data-plane.md).
  core::DataPlane data_plane = core::DataPlane::kGrpc;
  // Whether a restart of the shard restores it from a checkpoint (its --checkpoint-dir;
  // true for shards whose Join answer predates the field). Only then does a worker keep
  // copies of its borrowed pushes for the replay to the restored shard.
  bool restores_from_checkpoints = true;

  bool AddsChangesAsTheyAre() const {
    return !aggregate_only && learning_rate == 1 && momentum == 0 && weight_decay == 0;
  }
};

// What moving bytes to or from one shard costs, as this worker measured it
// (docs/adaptive.md, "The cost model"): a transfer of B bytes takes about
// alpha_seconds + seconds_per_byte x B. Pushes: a transfer is a busy period of the
// shard's push window (from a push sent while none was in flight to the moment none
// is). Pulls: a run of messages the shard wrote back to back, from the arrival of the
// message before the run to that of its last (alpha then comes out near 0: the run
// pays no round trip). Zeros until a transfer was seen.
struct LinkStats {
  double alpha_seconds = 0;
  double seconds_per_byte = 0;
  uint64_t transfers = 0;  // transfers the estimate rests on (at most the last 64)
};

// The current plan (PlanOptions), as WorkerStats::plan reports it.
struct PlanStats {
  uint64_t plans = 0;        // plans made since Start (0: none yet)
  uint64_t planned_at = 0;   // the round the current plan was made at
  // The simulated round of the plan, from the pull of a version to the pull of the
  // next, and of every tensor on fp32; the measured one (a moving average).
  double predicted_seconds = 0;
  double baseline_seconds = 0;
  double measured_seconds = 0;
  std::vector<std::string> codecs;    // per tensor
  std::vector<core::Device> devices;  // per tensor: where its codec encodes
};

// Counters since Start(); read with Worker::stats().
struct WorkerStats {
  uint64_t slices_pushed = 0;    // accepted by a shard
  // Of slices_pushed: those sent from the caller's buffer (PushOptions::borrow).
  uint64_t slices_borrowed = 0;
  // Of slices_pushed: pushes of the round this process started at that the shard already
  // held from the process of this worker id it replaced (restarted mid-round), answered
  // "duplicate": that copy counted.
  uint64_t slices_held_from_before = 0;
  uint64_t slices_refused = 0;   // refused by a shard (late, duplicate, invalid, ...)
  uint64_t push_bytes = 0;       // encoded payload bytes accepted
  uint64_t slices_pulled = 0;
  uint64_t pull_bytes = 0;
  // Of slices_pulled: those a shard with --pull-codec sent as a compressed change (the
  // others came dense: the first pull, or after missed versions or a shard restart).
  uint64_t slices_pulled_as_change = 0;
  uint64_t retries = 0;          // RPC attempts repeated after UNAVAILABLE or re-join
  // Accepted pushes sent again to a shard that restarted from a checkpoint and still
  // had their rounds open (they were lost with the process).
  uint64_t pushes_replayed = 0;
  uint64_t udp_datagrams_sent = 0;
  uint64_t udp_datagrams_dropped = 0;  // by loss injection
  // Refused by the local kernel (a firewall's drop on output, no route): lost like the
  // network's losses; WaitPushes fails only where every datagram to a shard was.
  uint64_t udp_send_errors = 0;
  uint64_t udp_bytes = 0;              // datagram bytes sent
  // TCP data connections opened where the shard named a least retransmission timeout
  // (--tcp-rto-min-ms) that this worker's kernel could not set (before Linux 6.15): a
  // push's segment lost there waits the kernel's own timeout, 200 ms by default.
  uint64_t tcp_rto_min_unset = 0;
  std::vector<LinkStats> push_links;   // per shard id (gRPC pushes only)
  std::vector<LinkStats> pull_links;   // per shard id
  PlanStats plan;
};

// What the shards published about training progress with the last pulled version
// (local-update training, docs/adaptive.md "AdaComm"): every slice carries the median
// of the losses its round's pushes reported (Worker::ReportLoss) and the median of the
// first round that had any; these are the medians of those over the slices of the
// highest version pulled. A median of n reports moves past the honest range only when
// at least half of them lie.
struct PublishedLoss {
  uint64_t version = 0;
  double loss = 0;
  double first_loss = 0;
};

// Which push a failure that WaitPushes() reports was: its tensor, slice, round and
// shard, and the shard's refusal kind ("late", "duplicate", "malformed", ...: the names
// of core::RefusalName; empty for a failure that is no refusal, such as UNAVAILABLE
// after the last attempt). Read it with PushFailureOf.
struct PushFailure {
  std::string tensor;
  uint32_t slice = 0;
  uint64_t round = 0;
  uint32_t shard = 0;
  std::string reason;
};
// The push a status from WaitPushes() is about; nullopt for OK and for a status that is
// not about one push (a bad argument to Push itself).
std::optional<PushFailure> PushFailureOf(const absl::Status& status);

// A pull in progress (Worker::StartPullAll). The buffers it writes into must stay
// valid, and the Worker alive, until Wait() returned or the ticket is destroyed
// (the destructor waits). Thread-safe.
class PullTicket {
 public:
  virtual ~PullTicket() = default;
  // Blocks until every slice of tensor `tensor` is in its buffer (OK), or the pull
  // failed before that (its error). Tensors complete in the order the shards send
  // them: most urgent first.
  virtual absl::Status WaitTensor(size_t tensor) = 0;
  // Whether tensor `tensor` has fully arrived (never blocks).
  virtual bool TensorReady(size_t tensor) const = 0;
  // Waits for the whole pull; returns the lowest version received, as PullAll().
  virtual absl::StatusOr<uint64_t> Wait() = 0;
};

// Worker::Start's slice size that means "the job's".
inline constexpr uint32_t kJobSliceElems = 0;

class Worker {
 public:
  // Connects to every shard and joins with `layout` (whose num_shards must equal the
  // number of addresses). A shard without a layout gets it registered, and then
  // `initial` values, one span per tensor of the layout's sizes (leave `initial`
  // empty for an aggregate-only server). Waits until every shard is ready, up to
  // options.connect_timeout.
  static absl::StatusOr<std::unique_ptr<Worker>> Start(
      WorkerOptions options, core::ModelLayout layout,
      std::span<const std::span<const float>> initial = {});
  // The same with the layout cut from `tensors` for the shards of `options`, into
  // slices of `slice_elems` values, or, with kJobSliceElems, of the job's size: the one
  // registered on shard 0 when a worker registered a layout there, else chosen from the
  // link to shard 0 as measured at Start (slices of 262,144 values where it moves at
  // least 1 Gbit/s, core::kDefaultSliceElems below; docs/data-plane.md, "The job's slice
  // size"). layout() tells the size used. A worker that lost a race to register another
  // size joins with the registered one (once).
  static absl::StatusOr<std::unique_ptr<Worker>> Start(
      WorkerOptions options, std::vector<core::TensorSpec> tensors, uint32_t slice_elems,
      std::span<const std::span<const float>> initial = {});

  virtual ~Worker() = default;
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  virtual const core::ModelLayout& layout() const = 0;
  virtual const std::vector<ShardInfo>& shards() const = 0;
  // Lowest version published by any shard at join time: the round a (re)starting
  // worker resumes from.
  virtual uint64_t start_version() const = 0;

  // Queues the gradient of tensor `tensor` for `round`: each slice is encoded (the
  // data is copied before return) and sent to its shard. Returns an error at once
  // for a bad tensor index or size; RPC outcomes are reported by WaitPushes().
  virtual absl::Status Push(size_t tensor, uint64_t round, std::span<const float> grad) = 0;

  // The learning rate that tensor `tensor`'s pushes queued from now on ask their round's
  // step to take (a finite value >= 0; INVALID_ARGUMENT otherwise): the shards step a
  // tensor whose layout names an optimizer (core::TensorSpec::optimizer) with the median
  // of the rates its round's pushes carried, in place of the spec's (docs/optimizers.md).
  // UDP chunks carry none.
  virtual absl::Status SetLearningRate(size_t tensor, double lr) = 0;

  // Small values for the other workers (docs/objects.md), kept by shard 0 under this
  // worker's id and `key` (1 to 128 bytes of [A-Za-z0-9_.:/-]), each Put replacing the
  // last: returns the key's new version (1, 2, ...). RESOURCE_EXHAUSTED beyond the
  // shard's --max-object-bytes per worker or 16 keys.
  virtual absl::StatusOr<uint64_t> PutObject(std::string_view key, std::string_view value) = 0;
  struct StoredObject {
    uint64_t version = 0;
    std::string value;
  };
  // `owner`'s value under `key`, once it has a version >= min_version: asks again with
  // the retry backoff until `timeout`, then DEADLINE_EXCEEDED saying what it waited for.
  virtual absl::StatusOr<StoredObject> GetObject(uint32_t owner, std::string_view key,
                                                 uint64_t min_version,
                                                 std::chrono::milliseconds timeout) = 0;

  // Tells every shard that this worker leaves (docs/operations.md, "Workers that come and
  // go"): no round waits for it until it pushes or joins again. Each shard is asked once,
  // within `timeout`; the first failure is returned (the others are still told). Pushes
  // not yet answered may be lost: call WaitPushes() first.
  virtual absl::Status Leave(std::chrono::milliseconds timeout) = 0;

  // Horovod's broadcast_parameters after training started (docs/python.md, "Starting and
  // resuming from rank 0's values"): every shard replaces its parameters with worker
  // `root`'s as version round + 1, where `round` is the version every worker pulled last
  // (none pushed since). A collective: a shard adopts only once its quorum of workers
  // (n - f at least, docs/protocol.md) asked for the same round and root, and then with
  // its optimizer state reset. Every worker calls it; this worker's vote goes to every
  // shard. On the root, `values` (one span per tensor, the layout's sizes) are uploaded to
  // each shard once its vote passed, waiting up to `timeout` for the others' votes
  // (DEADLINE_EXCEEDED naming the count); elsewhere `values` is empty and the call returns
  // after voting (a vote that finds the shard past `round` counts as done). The adopted
  // values are version round + 1: pull it.
  virtual absl::Status Adopt(uint64_t round, uint32_t root,
                             std::span<const std::span<const float>> values,
                             std::chrono::milliseconds timeout) = 0;

  // Waits until every push queued so far is answered. Returns OK when all were
  // accepted, otherwise the first refusal or failure since the previous call, with
  // its code (OUT_OF_RANGE late, ALREADY_EXISTS duplicate, INVALID_ARGUMENT malformed,
  // ...) and a message naming tensor, slice, round and shard.
  virtual absl::Status WaitPushes() = 0;

  // Pulls tensor `tensor` once every slice reached at least `min_version` and copies
  // it into `out` (the tensor's size). Returns the lowest version among its slices.
  // DEADLINE_EXCEEDED after `timeout`.
  virtual absl::StatusOr<uint64_t> Pull(size_t tensor, uint64_t min_version, std::span<float> out,
                                        std::chrono::milliseconds timeout) = 0;

  // Pulls every tensor (outs[i] for tensor i) with one stream per shard.
  virtual absl::StatusOr<uint64_t> PullAll(uint64_t min_version, std::span<const std::span<float>> outs,
                                           std::chrono::milliseconds timeout) = 0;

  // Starts pulling every tensor (outs[i] for tensor i) and returns at once; the ticket
  // says per tensor when it has arrived.
  virtual absl::StatusOr<std::unique_ptr<PullTicket>> StartPullAll(
      uint64_t min_version, std::span<const std::span<float>> outs,
      std::chrono::milliseconds timeout) = 0;

  // Attaches `loss`, this worker's training loss over the steps that its pushes of
  // `round` sum up, to every push of `round` queued after the call (gRPC pushes; UDP
  // datagrams carry none). INVALID_ARGUMENT for a non-finite loss.
  virtual absl::Status ReportLoss(uint64_t round, double loss) = 0;
  // What the shards published with the slices pulled so far; nullopt until a pulled
  // slice carried a loss.
  virtual std::optional<PublishedLoss> published_loss() const = 0;

  virtual WorkerStats stats() const = 0;
  // stats().plan alone, without gathering the other counters (for a caller that polls
  // the plan every round).
  virtual PlanStats plan_stats() const = 0;

  // Why tensor `tensor`'s pushes encode on the CPU although its PushOptions::device
  // asked for CUDA, as a line to log, e.g. "device=cuda requested but unavailable (no
  // CUDA device: ...); encoding on the CPU". Empty when they encode where asked (and
  // for an index outside the layout).
  virtual std::string device_note(size_t tensor) const = 0;

 protected:
  Worker() = default;
};

}  // namespace ps
