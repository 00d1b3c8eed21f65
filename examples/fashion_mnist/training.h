// One Fashion-MNIST worker's training loop, alone (TrainLocal, plain SGD as a baseline)
// or against ps-server shards (TrainWithServer: pull version t, compute one batch's
// gradient, push it for round t), honest or Byzantine (docs/examples.md,
// docs/evaluation.md). An honest worker goes through the libtorch adapter
// (worker_lib/torch/torch_worker.h): each layer's forward waits only for its own
// freshly pulled parameters, and backward pushes each gradient as autograd produces it. Used by the
// ps-fashion-mnist binary (one worker per process) and by the in-process cluster (one worker per
// thread, cluster.h).
//
// A Byzantine worker pushes what its attack (worker_lib/attacks) makes of its own
// gradient and, for omniscient attacks, of the gradients on a GradientBoard: in one
// process the honest workers publish theirs there; across processes the Byzantine
// workers share their own through a directory (the side channel of docs/evaluation.md).
//
// Thread safety: the functions may run concurrently on different configurations (one
// thread per worker) sharing one TrainingData, which is only read. Models are built
// under a process-wide lock, so that torch's seeded generator gives every worker the
// same initial parameters. Callers call ConfigureTorchForWorkers(threads) (torch_cpu.h)
// for reproducible runs on a BLAS that threads may share.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/credentials.h"
#include "examples/fashion_mnist/experiment.h"
#include "examples/fashion_mnist/idx.h"
#include "worker_lib/attacks/attack.h"
#include "worker_lib/worker.h"

namespace ps::fashion_mnist {

struct TrainerConfig {
  // Shard addresses host:port by shard id (TrainWithServer).
  std::vector<std::string> shards;
  uint32_t worker_id = 0;
  // TLS, client certificate and token toward the shards (docs/operations.md).
  core::ClientCredentials credentials;
  // The training run (WorkerOptions::run_id): shards with --run-id refuse another.
  std::string run_id;
  uint32_t workers = 1;
  uint64_t steps = 1000;
  uint32_t batch_size = 32;
  std::string model = "mlp";  // mlp or cnn
  uint32_t hidden = 128;      // the MLP's hidden width
  std::string split = "iid";  // partition.h: iid, dirichlet(alpha=A), gamma(G)
  // Same on all workers: identical initial parameters, the same split; batches use a
  // per-worker seed derived from it.
  uint64_t seed = 1;
  // A codec spec, or "auto": Espresso's plan (worker.h, PlanOptions) chooses each
  // tensor's codec among `codec_candidates` from this worker's measured costs.
  std::string codec = "fp32";
  std::vector<std::string> codec_candidates = {"fp32", "fp16", "topk(0.01)+varint+fp16",
                                               "3lc(s=1.9)"};
  // Where the push codec encodes: "cpu", or "cuda" (the CPU, with a warning saying why,
  // where no CUDA device can; docs/gpu.md).
  std::string push_device = "cpu";
  // Transport (docs/transport.md): pushes as datagrams on the shards' UDP path, with
  // this injected loss and chunk size; the worker's link shaped by this spec
  // (net::ParseLinkShaping, "" = none); FIFO instead of priority send order.
  bool udp = false;
  double udp_loss = 0;
  uint32_t udp_chunk_elems = 0;  // 0: UdpOptions' default, one packet of the route's MTU
  uint32_t udp_end_copies = 2;  // UdpOptions::end_copies
  std::string shaping;
  bool fifo = false;
  bool error_feedback = false;
  double worker_momentum = 0;
  // How workers communicate (docs/adaptive.md): "sync", one push of the gradient per
  // step; "auto", ResolveComm's; "adacomm", local-update training: tau steps of this worker's own
  // SGD (lr, momentum, weight_decay below) between pushes of the parameters' change, tau by
  // AdaComm's rule from the losses the shards publish, from tau0 within [1, tau_max].
  // The shards then apply the aggregated change as it is: --lr 1 --momentum 0.
  std::string comm = "sync";
  uint32_t tau0 = 8;
  uint32_t tau_max = 32;
  // What the adaptive choices minimize (WorkerOptions::objective): "time" or "bytes".
  std::string objective = "time";
  // A worker with a server serves Prometheus metrics (worker_lib/metrics.h and the
  // trainer's own ps_trainer_* series) on http://metrics_host:metrics_port/metrics;
  // -1: none, 0: a free port (the Metrics event says which).
  int32_t metrics_port = -1;
  std::string metrics_host = "127.0.0.1";
  // Worker 0 (and a local run) evaluates test accuracy every this many steps (0: only
  // at the end).
  uint64_t eval_every = 100;
  uint64_t log_every = 10;  // a Step event every this many steps (0: never)
  // This worker's attack (an attacks::MakeAttack spec) or "none".
  std::string attack = "none";
  // f, and the servers' aggregator spec: the attacks' context (z of ALIE, the rule the
  // optimized variants search against).
  uint32_t byzantine = 0;
  std::string rule = "mean";
  // --local: the optimizer the server would run; --comm adacomm: the worker's own.
  double lr = 0.1;
  double momentum = 0.9;
  double weight_decay = 0;
  std::chrono::milliseconds pull_timeout{120'000};
  std::chrono::milliseconds connect_timeout{60'000};
  // Stop ("diverged") once a parameter's magnitude exceeds this or is not finite.
  double divergence_limit = 1e6;
  // Gradients appended as raw fp32 every dump_every rounds (empty: none).
  std::string dump_gradients;
  uint64_t dump_every = 50;
  // The final parameters as raw little-endian fp32 in parameter order, written by a
  // local run and by worker 0 after the last round (empty: not saved).
  std::string save_parameters;
};

// Refuses inconsistent settings with a message naming the field.
absl::Status ValidateConfig(const TrainerConfig& config, bool local);

// comm "auto", the one switch (docs/adaptive.md), given the shards the worker joined:
// when every shard adds each round's aggregate as it is (ShardInfo::AddsChangesAsTheyAre,
// ps-server --lr 1 --momentum 0), local updates with AdaComm's period and fp16 pushes;
// otherwise (or with no shards known) synchronous rounds with --codec auto over fp32,
// fp16, top-k 1 %, 3LC and CAT. Error feedback on in both. Other configs unchanged.
TrainerConfig ResolveComm(TrainerConfig config, std::span<const ShardInfo> shards);

// Refuses comm "adacomm" against a shard that does not add changes as they are, saying
// which and how to start it.
absl::Status CheckShards(const TrainerConfig& config, std::span<const ShardInfo> shards);

// What a run reports. Every method has an empty default.
class TrainerEvents {
 public:
  virtual ~TrainerEvents() = default;
  virtual void Start(const TrainerConfig& config, bool local, uint64_t start_step,
                     int64_t parameters) {}
  virtual void Step(uint64_t step, double loss) {}
  virtual void Eval(uint64_t step, double accuracy) {}
  // The same evaluation with the seconds it took (TrainWithServer: the cluster waits
  // for it). By default passed on to Eval.
  virtual void Evaluated(uint64_t step, double accuracy, double seconds) { Eval(step, accuracy); }
  virtual void Warning(uint64_t step, std::string_view message) {}
  // Local-update training: from `step` (round `round`) on, `tau` local steps per round.
  virtual void Period(uint64_t step, uint64_t round, uint32_t tau) {}
  // --codec auto: a new plan of the push codecs (its tensors' names in `tensors`).
  virtual void Planned(uint64_t step, const PlanStats& plan,
                       const std::vector<std::string>& tensors) {}
  // Metrics are served at this URL (TrainerConfig::metrics_port).
  virtual void Metrics(std::string_view url) {}
  virtual void Diverged(uint64_t step) {}
  virtual void Done(uint64_t steps, std::optional<double> accuracy, double wall_seconds,
                    bool diverged, uint64_t late_pushes) {}
};

// Passes every event on to `next` (none when null); observers derive from it, override
// what they watch and call the base to pass the event on.
class ForwardingEvents : public TrainerEvents {
 public:
  explicit ForwardingEvents(TrainerEvents* next) : next_(next) {}
  void Start(const TrainerConfig& config, bool local, uint64_t start_step,
             int64_t parameters) override {
    if (next_ != nullptr) next_->Start(config, local, start_step, parameters);
  }
  void Step(uint64_t step, double loss) override {
    if (next_ != nullptr) next_->Step(step, loss);
  }
  void Eval(uint64_t step, double accuracy) override {
    if (next_ != nullptr) next_->Eval(step, accuracy);
  }
  void Evaluated(uint64_t step, double accuracy, double seconds) override {
    if (next_ != nullptr) next_->Evaluated(step, accuracy, seconds);
  }
  void Warning(uint64_t step, std::string_view message) override {
    if (next_ != nullptr) next_->Warning(step, message);
  }
  void Period(uint64_t step, uint64_t round, uint32_t tau) override {
    if (next_ != nullptr) next_->Period(step, round, tau);
  }
  void Planned(uint64_t step, const PlanStats& plan,
               const std::vector<std::string>& tensors) override {
    if (next_ != nullptr) next_->Planned(step, plan, tensors);
  }
  void Metrics(std::string_view url) override {
    if (next_ != nullptr) next_->Metrics(url);
  }
  void Diverged(uint64_t step) override {
    if (next_ != nullptr) next_->Diverged(step);
  }
  void Done(uint64_t steps, std::optional<double> accuracy, double wall_seconds, bool diverged,
            uint64_t late_pushes) override {
    if (next_ != nullptr) next_->Done(steps, accuracy, wall_seconds, diverged, late_pushes);
  }

 private:
  TrainerEvents* const next_;
};

// The data sets, loaded once and shared (read-only) by the workers of a process.
struct TrainingData {
  Dataset train;
  Dataset test;  // empty where nobody evaluates
};
absl::StatusOr<TrainingData> LoadTrainingData(const std::string& dir, bool with_test);

// Where omniscient attackers find the vectors they compute from, per round: the
// gradients (flattened in parameter order) of the workers that publish.
class GradientBoard {
 public:
  virtual ~GradientBoard() = default;
  // Whether a worker that is (not) Byzantine publishes its own gradient here.
  virtual bool Publishes(bool byzantine) const = 0;
  virtual absl::Status Publish(uint64_t round, uint32_t worker_id, std::vector<float> gradient) = 0;
  // The published gradients of `round` (by worker id) once all expected ones are in;
  // DEADLINE_EXCEEDED after `timeout`.
  virtual absl::StatusOr<std::vector<std::vector<float>>> Collect(
      uint64_t round, std::chrono::milliseconds timeout) = 0;
  // Where the attackers of this board share the optimized attacks' searches (one per
  // round instead of one per attacker); nullptr: each searches alone.
  virtual attacks::SharedSearch* shared_search() { return nullptr; }
};

// In one process: the honest workers publish, `expected` of them per round. Rounds
// older than the newest collected one minus 2 are dropped. The attackers share their
// searches.
class SharedGradientBoard final : public GradientBoard {
 public:
  explicit SharedGradientBoard(uint32_t expected) : expected_(expected) {}
  bool Publishes(bool byzantine) const override { return !byzantine; }
  absl::Status Publish(uint64_t round, uint32_t worker_id, std::vector<float> gradient) override;
  absl::StatusOr<std::vector<std::vector<float>>> Collect(
      uint64_t round, std::chrono::milliseconds timeout) override;
  attacks::SharedSearch* shared_search() override { return &search_; }

 private:
  attacks::SharedSearch search_;
  const uint32_t expected_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::map<uint64_t, std::map<uint32_t, std::vector<float>>> rounds_;  // guarded by mu_
};

// Across processes: the `expected` Byzantine workers publish their own gradients as
// files `<dir>/round-<t>-worker-<w>.f32` (raw little-endian fp32, written to a
// temporary name and renamed) and read each other's; files of rounds before t - 2 are
// removed by the worker that wrote them. The attack then computes from the attackers'
// own gradients, the only honest-looking data they have.
class DirectoryGradientBoard final : public GradientBoard {
 public:
  DirectoryGradientBoard(std::string dir, uint32_t expected)
      : dir_(std::move(dir)), expected_(expected) {}
  bool Publishes(bool byzantine) const override { return byzantine; }
  absl::Status Publish(uint64_t round, uint32_t worker_id, std::vector<float> gradient) override;
  absl::StatusOr<std::vector<std::vector<float>>> Collect(
      uint64_t round, std::chrono::milliseconds timeout) override;

 private:
  std::string Path(uint64_t round, uint32_t worker_id) const;
  const std::string dir_;
  const uint32_t expected_;
  std::vector<std::pair<uint64_t, uint32_t>> written_;  // (round, worker) files of this process
};

// Plain SGD in this process (the baseline). `data.test` must be loaded.
absl::Status TrainLocal(const TrainerConfig& config, const TrainingData& data,
                        TrainerEvents& events);

// One worker of a ps-server cluster. `board` may be null (no omniscient attack sees
// anything but the attacker's own gradient). `keep_worker` receives the Worker so that
// the caller decides when it is destroyed (see ps-fashion-mnist's main).
absl::Status TrainWithServer(const TrainerConfig& config, const TrainingData& data,
                             GradientBoard* board, TrainerEvents& events,
                             std::unique_ptr<Worker>* keep_worker);

}  // namespace ps::fashion_mnist
