#include "examples/fashion_mnist/training.h"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <map>
#include <span>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "aggregators/aggregator.h"
#include "core/device.h"
#include "core/layout.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "examples/fashion_mnist/model.h"
#include "examples/fashion_mnist/partition.h"
#include "examples/fashion_mnist/trainer_model_internal.h"
#include "net/http_endpoint.h"
#include "net/shaper.h"
#include "worker_lib/adacomm.h"
#include "worker_lib/attacks/attack.h"
#include "worker_lib/metrics.h"
#include "worker_lib/torch/torch_worker.h"

namespace ps::fashion_mnist {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

AdaCommOptions AdaCommOf(const TrainerConfig& c) {
  return AdaCommOptions{.tau0 = c.tau0, .tau_min = 1, .tau_max = c.tau_max};
}

// How a training loop ended.
struct LoopEnd {
  uint64_t round = 0;  // the next round: the version to pull for the final parameters
  uint64_t steps = 0;  // SGD steps taken
  bool diverged = false;
  uint64_t late_pushes = 0;
};

// Evaluates on worker 0 at the first synchronization at or past every eval_every steps.
class EvalSchedule {
 public:
  explicit EvalSchedule(uint64_t every) : every_(every) {}
  bool Due(uint64_t step) {
    if (every_ == 0 || step < next_) return false;
    next_ = (step / every_ + 1) * every_;
    return true;
  }

 private:
  const uint64_t every_;
  uint64_t next_ = 0;
};

void Evaluate(const Setup& s, const TrainingData& data, uint64_t step, TrainerEvents& events) {
  const auto eval_start = Clock::now();
  const double accuracy = Accuracy(*s.model, data.test);
  events.Evaluated(step, accuracy, SecondsSince(eval_start));
}

// Pushes `flat` (parameter order) for `round`, last layer first as backward produces
// gradients (the send queue orders by priority), and waits for the answers. An error
// only for a refusal an honest worker must not see.
absl::Status PushFlat(const Setup& s, Worker& worker, uint64_t round,
                      const std::vector<float>& flat, TrainerEvents& events,
                      uint64_t& late_pushes) {
  size_t end = flat.size();
  for (size_t i = s.params.size(); i-- > 0;) {
    const auto numel = static_cast<size_t>(s.params[i].numel());
    end -= numel;
    absl::Status status = worker.Push(i, round, std::span<const float>(flat.data() + end, numel));
    if (status.ok()) continue;
    // The worker library refuses to encode Inf/NaN: a nan or inf attacker sends nothing.
    events.Warning(round, absl::StrCat("push not sent: ", status.message()));
    break;
  }
  absl::Status answered = worker.WaitPushes();
  if (answered.ok()) return answered;
  // A Byzantine vector the shards refuse (nan, inf) is the attack working as meant.
  if (answered.code() != absl::StatusCode::kOutOfRange && s.attack == nullptr) return answered;
  ++late_pushes;
  events.Warning(round, absl::StrCat("push refused: ", answered.message()));
  return absl::OkStatus();
}

// --codec auto: reports the worker's plan when it is a new one.
class PlanWatch {
 public:
  void Check(const Worker& worker, uint64_t step, TrainerEvents& events) {
    const PlanStats plan = worker.plan_stats();
    if (plan.plans == seen_) return;
    seen_ = plan.plans;
    std::vector<std::string> names;
    for (const core::TensorSpec& t : worker.layout().tensors()) names.push_back(t.name);
    events.Planned(step, plan, names);
  }

 private:
  uint64_t seen_ = 0;
};

// Local-update training (--comm adacomm): per round, pull version t, take tau steps of
// this worker's own SGD, push the change x_pulled - x_local (what its attack makes of
// it for a Byzantine worker) with the mean loss of those steps; the shards aggregate
// the changes with their rule and apply the aggregate with step 1. tau comes from
// AdaComm's rule on the losses the shards published with version t, so every worker
// (honest or not, all run this loop) takes the same number of rounds.
absl::StatusOr<LoopEnd> LocalUpdates(const TrainerConfig& c, const TrainingData& data,
                                     GradientBoard* board, TrainerEvents& events, Setup& s,
                                     const aggregators::Aggregator* rule, Worker& worker,
                                     std::span<const std::span<float>> outs, GradientDump& dump) {
  torch::optim::SGD optimizer(
      s.model->parameters(),
      torch::optim::SGDOptions(c.lr).momentum(c.momentum).weight_decay(c.weight_decay));
  const AdaCommOptions adacomm = AdaCommOf(c);
  EvalSchedule evals(c.eval_every);
  PlanWatch plans;
  LoopEnd end;
  end.round = worker.start_version();
  std::vector<uint32_t> indices;
  uint32_t last_period = 0;
  while (end.steps < c.steps) {
    PS_ASSIGN_OR_RETURN(const uint64_t version, worker.PullAll(end.round, outs, c.pull_timeout));
    if (version > end.round) {
      events.Warning(end.round, absl::StrCat("pulled version ", version, " while at round ",
                                             end.round, "; skipping ahead"));
      end.round = version;
    }
    if (Diverged(s.params, c.divergence_limit)) {
      end.diverged = true;
      events.Diverged(end.steps);
      return end;
    }
    if (s.evaluates && evals.Due(end.steps)) Evaluate(s, data, end.steps, events);
    const uint32_t period = AdaCommPeriod(adacomm, worker.published_loss());
    if (period != last_period) events.Period(end.steps, end.round, period);
    last_period = period;
    // The last round takes only the steps left.
    const auto tau = static_cast<uint32_t>(std::min<uint64_t>(period, c.steps - end.steps));
    const std::vector<float> pulled = Flat(s, /*gradients=*/false);
    double loss_sum = 0;
    for (uint32_t k = 0; k < tau; ++k) {
      loss_sum += ComputeGradients(s, data.train, c.batch_size, indices);
      optimizer.step();
    }
    std::vector<float> change = Flat(s, /*gradients=*/false);
    for (size_t i = 0; i < change.size(); ++i) change[i] = pulled[i] - change[i];
    const double loss = loss_sum / tau;
    PS_RETURN_IF_ERROR(worker.ReportLoss(end.round, loss));
    PS_ASSIGN_OR_RETURN(std::vector<float> pushed,
                        Contribution(c, s, board, rule, end.round, std::move(change)));
    if (end.round % c.dump_every == 0) PS_RETURN_IF_ERROR(dump.Write(pushed));
    PS_RETURN_IF_ERROR(PushFlat(s, worker, end.round, pushed, events, end.late_pushes));
    const uint64_t before = end.steps;
    end.steps += tau;
    ++end.round;
    if (c.codec == "auto") plans.Check(worker, end.steps, events);
    if (c.log_every > 0 &&
        (end.steps / c.log_every != before / c.log_every || end.steps >= c.steps)) {
      events.Step(end.steps, loss);
    }
  }
  return end;
}

}  // namespace

TrainerConfig ResolveComm(TrainerConfig c, std::span<const ShardInfo> shards) {
  if (c.comm != "auto") return c;
  c.error_feedback = true;
  const bool as_they_are =
      !shards.empty() && std::all_of(shards.begin(), shards.end(), [](const ShardInfo& s) {
        return s.AddsChangesAsTheyAre();
      });
  if (as_they_are) {
    c.comm = "adacomm";
    c.codec = "fp16";
    return c;
  }
  c.comm = "sync";
  c.codec = "auto";
  c.codec_candidates = {"fp32", "fp16", "topk(0.01)+varint+fp16", "3lc(s=1.9)", kCatSpec};
  return c;
}

absl::Status CheckShards(const TrainerConfig& c, std::span<const ShardInfo> shards) {
  if (c.comm != "adacomm") return absl::OkStatus();
  for (const ShardInfo& s : shards) {
    if (s.AddsChangesAsTheyAre()) continue;
    const std::string what =
        s.aggregate_only
            ? std::string("only aggregates (--aggregate-only)")
            : absl::StrCat("applies SGD with lr ", s.learning_rate, ", momentum ", s.momentum,
                           ", weight decay ", s.weight_decay);
    return absl::FailedPreconditionError(absl::StrCat(
        "--comm adacomm pushes the change of each worker's local steps, which the shards "
        "must add as it is; shard ",
        s.shard_id, " ", what, " (start ps-server with --lr 1 --momentum 0 --weight-decay 0)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateConfig(const TrainerConfig& c, bool local) {
  if (c.workers == 0 || c.worker_id >= c.workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker id ", c.worker_id, " must be below the worker count ", c.workers));
  }
  if (c.batch_size == 0 || c.hidden == 0) {
    return absl::InvalidArgumentError("batch size and hidden width must be positive");
  }
  if (!local && c.shards.empty())
    return absl::InvalidArgumentError("shard addresses are required unless local");
  if (c.byzantine >= c.workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("f = ", c.byzantine, " must be below n = ", c.workers));
  }
  if (c.attack != "none") PS_RETURN_IF_ERROR(attacks::MakeAttack(c.attack).status());
  PS_RETURN_IF_ERROR(ParseSplit(c.split).status());
  PS_RETURN_IF_ERROR(net::ParseLinkShaping(c.shaping).status());
  if (!(c.udp_loss >= 0 && c.udp_loss < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("UDP loss ", c.udp_loss, " is not in [0, 1)"));
  }
  if (c.udp_loss > 0 && !c.udp) return absl::InvalidArgumentError("a UDP loss needs --udp");
  if (c.comm != "sync" && c.comm != "adacomm" && c.comm != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("communication '", c.comm, "' is not one of: sync, adacomm, auto"));
  }
  if (c.metrics_port < -1 || c.metrics_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics port ", c.metrics_port, " is not -1 (none), 0 (any) or a port"));
  }
  if (c.objective != "time" && c.objective != "bytes") {
    return absl::InvalidArgumentError(
        absl::StrCat("objective '", c.objective, "' is not one of: time, bytes"));
  }
  if (c.codec == "auto" && c.codec_candidates.empty()) {
    return absl::InvalidArgumentError("--codec auto needs at least one candidate codec");
  }
  if (c.comm == "adacomm") {
    PS_RETURN_IF_ERROR(ValidateAdaComm(AdaCommOf(c)));
    if (c.udp) {
      return absl::InvalidArgumentError(
          "--comm adacomm reports losses with gRPC pushes; UDP datagrams carry none");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TrainingData> LoadTrainingData(const std::string& dir, bool with_test) {
  TrainingData data;
  PS_ASSIGN_OR_RETURN(data.train, LoadFashionMnist(dir, Split::kTrain));
  if (with_test) {
    PS_ASSIGN_OR_RETURN(data.test, LoadFashionMnist(dir, Split::kTest));
  }
  return data;
}

// ---- the loops ----

absl::Status TrainLocal(const TrainerConfig& c, const TrainingData& data, TrainerEvents& events) {
  PS_RETURN_IF_ERROR(ValidateConfig(c, /*local=*/true));
  PS_ASSIGN_OR_RETURN(Setup s, Prepare(c, data, /*local=*/true));
  PS_ASSIGN_OR_RETURN(GradientDump dump, GradientDump::Open(c.dump_gradients));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<aggregators::Aggregator> rule, AttackRule(c, s));
  torch::optim::SGD optimizer(
      s.model->parameters(),
      torch::optim::SGDOptions(c.lr).momentum(c.momentum).weight_decay(c.weight_decay));
  events.Start(c, /*local=*/true, 0, CountParameters(s));
  const auto start = Clock::now();
  std::vector<uint32_t> indices;
  bool diverged = false;
  uint64_t step = 0;
  for (; step < c.steps; ++step) {
    if (c.eval_every > 0 && step % c.eval_every == 0)
      events.Eval(step, Accuracy(*s.model, data.test));
    const double loss = ComputeGradients(s, data.train, c.batch_size, indices);
    std::vector<float> own = FlatGradient(s);
    if (step % c.dump_every == 0) PS_RETURN_IF_ERROR(dump.Write(own));
    if (s.attack != nullptr) {
      PS_ASSIGN_OR_RETURN(std::vector<float> pushed,
                          Contribution(c, s, nullptr, rule.get(), step, std::move(own)));
      SetGradients(s, pushed);
    }
    optimizer.step();
    if (c.log_every > 0 && ((step + 1) % c.log_every == 0 || step + 1 == c.steps)) {
      events.Step(step + 1, loss);
    }
    if (Diverged(s.params, c.divergence_limit)) {
      diverged = true;
      events.Diverged(step + 1);
      ++step;
      break;
    }
  }
  PS_RETURN_IF_ERROR(dump.Close());
  PS_RETURN_IF_ERROR(SaveParameters(s, c.save_parameters));
  const double accuracy = Accuracy(*s.model, data.test);
  events.Eval(step, accuracy);
  events.Done(step, accuracy, SecondsSince(start), diverged, 0);
  return absl::OkStatus();
}

// What the trainer adds to the worker's metrics: the latest step, loss, test accuracy and
// AdaComm period, recorded from the events it passes on.
class MetricsEvents final : public ForwardingEvents {
 public:
  explicit MetricsEvents(TrainerEvents& next) : ForwardingEvents(&next) {}

  std::string Text() const {
    std::string out;
    auto gauge = [&out](std::string_view name, std::string_view help, double value) {
      for (std::string_view part : std::initializer_list<std::string_view>{
               "# HELP ", name, " ", help, "\n# TYPE ", name, " gauge\n", name}) {
        out.append(part);
      }
      out.append(absl::StrFormat(" %.17g\n", value));
    };
    gauge("ps_trainer_step", "The latest step reported", static_cast<double>(step_.load()));
    gauge("ps_trainer_loss", "The training loss at that step", loss_.load());
    gauge("ps_trainer_test_accuracy", "The latest test accuracy (worker 0; NaN before)",
          accuracy_.load());
    gauge("ps_trainer_adacomm_period", "Local steps per round (--comm adacomm; 1 otherwise)",
          static_cast<double>(tau_.load()));
    return out;
  }

  void Step(uint64_t step, double loss) override {
    step_ = step;
    loss_ = loss;
    ForwardingEvents::Step(step, loss);
  }
  void Eval(uint64_t step, double accuracy) override {
    accuracy_ = accuracy;
    ForwardingEvents::Eval(step, accuracy);
  }
  void Evaluated(uint64_t step, double accuracy, double seconds) override {
    accuracy_ = accuracy;
    ForwardingEvents::Evaluated(step, accuracy, seconds);
  }
  void Period(uint64_t step, uint64_t round, uint32_t tau) override {
    tau_ = tau;
    ForwardingEvents::Period(step, round, tau);
  }

 private:
  std::atomic<uint64_t> step_{0};
  std::atomic<double> loss_{std::numeric_limits<double>::quiet_NaN()};
  std::atomic<double> accuracy_{std::numeric_limits<double>::quiet_NaN()};
  std::atomic<uint32_t> tau_{1};
};

namespace {

// The worker library's options for config `c` (comm resolved) and model `s`.
absl::StatusOr<WorkerOptions> MakeWorkerOptions(const TrainerConfig& c, const Setup& s) {
  WorkerOptions options;
  options.shard_addresses = c.shards;
  options.worker_id = c.worker_id;
  options.credentials = c.credentials;
  options.run_id = c.run_id;
  options.push.codec = c.codec == "auto" ? "fp32" : c.codec;
  options.plan.enabled = c.codec == "auto";
  options.plan.candidates = c.codec_candidates;
  options.objective = c.objective == "bytes" ? Objective::kBytes : Objective::kTime;
  PS_ASSIGN_OR_RETURN(options.push.device, core::ParseDevice(c.push_device));
  options.push.error_feedback = c.error_feedback;
  options.push.momentum = c.worker_momentum;
  options.codec_seed = c.seed;
  options.push.path = c.udp ? PushPath::kUdp : PushPath::kDataPlane;
  // Every push of this trainer is answered before its buffer is written again (the
  // adapter's FinishStep, PushFlat's WaitPushes): fp32 pushes leave from it, uncopied.
  options.push.borrow = true;
  options.udp.loss = c.udp_loss;
  options.udp.loss_seed = c.seed * 1000003 + c.worker_id;
  options.udp.chunk_elems = c.udp_chunk_elems;
  options.udp.end_copies = c.udp_end_copies;
  options.priority_order = !c.fifo;
  PS_ASSIGN_OR_RETURN(options.shaping, net::ParseLinkShaping(c.shaping));
  for (size_t i = 0; i < s.params.size(); ++i) {
    if (s.params[i].dim() < 2) continue;
    // Weights: out rows of in (x kh x kw) values, row-major; the layout cuts their
    // slices at whole rows (worker_torch::MakeLayout).
    PushOptions matrix = options.push;
    matrix.matrix_cols = static_cast<uint32_t>(s.params[i].numel() / s.params[i].size(0));
    options.tensor_push.emplace(s.names[i], matrix);
  }
  options.connect_timeout = c.connect_timeout;
  return options;
}

}  // namespace

absl::Status TrainWithServer(const TrainerConfig& config, const TrainingData& data,
                             GradientBoard* board, TrainerEvents& outer_events,
                             std::unique_ptr<Worker>* keep_worker) {
  MetricsEvents events(outer_events);
  PS_RETURN_IF_ERROR(ValidateConfig(config, /*local=*/false));
  // --comm auto: as if no shard added changes as they are until the worker has joined
  // them and knows (ShardInfo).
  TrainerConfig c = ResolveComm(config, {});
  PS_ASSIGN_OR_RETURN(Setup s, Prepare(c, data, /*local=*/false));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<aggregators::Aggregator> rule, AttackRule(c, s));

  // One tensor per parameter, in forward order, which is also the priority order.
  PS_ASSIGN_OR_RETURN(core::ModelLayout layout,
                      worker_torch::MakeLayout(*s.model, static_cast<uint32_t>(c.shards.size())));
  std::vector<std::span<const float>> initial;
  std::vector<std::span<float>> outs;
  for (torch::Tensor& p : s.params) {
    initial.emplace_back(p.data_ptr<float>(), static_cast<size_t>(p.numel()));
    outs.emplace_back(p.data_ptr<float>(), static_cast<size_t>(p.numel()));
  }
  PS_ASSIGN_OR_RETURN(GradientDump dump, GradientDump::Open(c.dump_gradients));
  std::unique_ptr<Worker> owned;
  std::unique_ptr<Worker>& holder = keep_worker != nullptr ? *keep_worker : owned;
  PS_ASSIGN_OR_RETURN(WorkerOptions options, MakeWorkerOptions(c, s));
  PS_ASSIGN_OR_RETURN(holder, Worker::Start(std::move(options), layout, initial));
  if (config.comm == "auto") {
    const TrainerConfig resolved = ResolveComm(config, holder->shards());
    if (resolved.comm != c.comm) {
      // The shards add changes as they are: local updates. The worker starts again
      // with their options (joining again replaces the first session).
      PS_RETURN_IF_ERROR(ValidateConfig(resolved, /*local=*/false));
      c = resolved;
      holder.reset();
      PS_ASSIGN_OR_RETURN(options, MakeWorkerOptions(c, s));
      PS_ASSIGN_OR_RETURN(holder, Worker::Start(std::move(options), layout, initial));
    }
  }
  PS_RETURN_IF_ERROR(CheckShards(c, holder->shards()));
  Worker* worker = holder.get();
  // Declared after the worker (and `events`): stopped before either goes.
  std::unique_ptr<net::HttpEndpoint> metrics;
  if (c.metrics_port >= 0) {
    std::vector<std::string> names;
    for (const core::TensorSpec& spec : worker->layout().tensors()) names.push_back(spec.name);
    metrics = std::make_unique<net::HttpEndpoint>([worker, &events, names] {
      return WorkerMetricsText(worker->stats(), names) + events.Text();
    });
    PS_ASSIGN_OR_RETURN(const uint16_t port,
                        metrics->Start(c.metrics_host, static_cast<uint16_t>(c.metrics_port)));
    events.Metrics(absl::StrCat("http://", c.metrics_host, ":", port, "/metrics"));
  }

  // An honest worker goes through the libtorch adapter (P3): the pull writes into the
  // parameters while the forward pass waits layer by layer for its own, and backward
  // pushes each gradient from its hook as soon as autograd produces it. A Byzantine
  // worker needs its whole gradient to craft the attack: it pulls everything, then
  // pushes the flattened result.
  std::unique_ptr<worker_torch::TorchWorker> adapter;
  const bool local_updates = c.comm == "adacomm";
  if (s.attack == nullptr && !local_updates) {
    PS_ASSIGN_OR_RETURN(adapter, worker_torch::TorchWorker::Attach(*worker, *s.model));
    // A failed pull comes out of AwaitAll() after the forward pass.
    s.model->set_before_forward(
        [tw = adapter.get()](torch::nn::Module& layer) { tw->AwaitModule(layer).IgnoreError(); });
  }

  uint64_t t = worker->start_version();
  events.Start(c, /*local=*/false, t, CountParameters(s));
  // Tensors whose pushes encode on the CPU although --push-device asked for CUDA: one
  // warning per reason.
  std::map<std::string, std::vector<std::string>> on_cpu;
  for (size_t i = 0; i < worker->layout().tensors().size(); ++i) {
    std::string note = worker->device_note(i);
    if (!note.empty()) on_cpu[std::move(note)].push_back(worker->layout().tensors()[i].name);
  }
  for (const auto& [note, names] : on_cpu) {
    events.Warning(t, absl::StrCat("push encoder: ", note, " (", absl::StrJoin(names, ", "), ")"));
  }
  const auto start = Clock::now();
  LoopEnd end;
  if (local_updates) {
    PS_ASSIGN_OR_RETURN(end,
                        LocalUpdates(c, data, board, events, s, rule.get(), *worker, outs, dump));
  }
  std::vector<uint32_t> indices;
  PlanWatch plans;
  while (!local_updates && t < c.steps) {
    torch::Tensor loss;
    uint64_t version = t;
    if (adapter != nullptr) {
      PS_RETURN_IF_ERROR(adapter->StartPull(t, c.pull_timeout));
      loss = Forward(s, data.train, c.batch_size, indices);
      PS_ASSIGN_OR_RETURN(version, adapter->AwaitAll());
    } else {
      PS_ASSIGN_OR_RETURN(version, worker->PullAll(t, outs, c.pull_timeout));
    }
    if (version > t) {
      // The others closed rounds without us (quorum at the deadline): catch up. The
      // adapter's forward pass above already ran on version `version`.
      events.Warning(
          t, absl::StrCat("pulled version ", version, " while at round ", t, "; skipping ahead"));
      t = version;
      if (t >= c.steps) break;
    }
    if (Diverged(s.params, c.divergence_limit)) {
      end.diverged = true;
      events.Diverged(t);
      break;
    }
    if (s.evaluates && c.eval_every > 0 && t % c.eval_every == 0) Evaluate(s, data, t, events);
    if (adapter != nullptr) {
      PS_RETURN_IF_ERROR(adapter->BeginStep(t));
      loss.backward();  // pushes each gradient, last layer first
      if (board != nullptr && board->Publishes(/*byzantine=*/false)) {
        PS_RETURN_IF_ERROR(board->Publish(t, c.worker_id, FlatGradient(s)));
      }
      if (dump.enabled() && t % c.dump_every == 0) PS_RETURN_IF_ERROR(dump.Write(FlatGradient(s)));
      absl::Status answered = adapter->FinishStep();
      if (!answered.ok()) {
        if (answered.code() != absl::StatusCode::kOutOfRange) return answered;
        ++end.late_pushes;
        events.Warning(t, absl::StrCat("push refused: ", answered.message()));
      }
    } else {
      loss = Forward(s, data.train, c.batch_size, indices);
      loss.backward();
      PS_ASSIGN_OR_RETURN(std::vector<float> pushed,
                          Contribution(c, s, board, rule.get(), t, FlatGradient(s)));
      if (t % c.dump_every == 0) PS_RETURN_IF_ERROR(dump.Write(pushed));
      PS_RETURN_IF_ERROR(PushFlat(s, *worker, t, pushed, events, end.late_pushes));
    }
    ++t;
    if (c.codec == "auto") plans.Check(*worker, t, events);
    if (c.log_every > 0 && (t % c.log_every == 0 || t == c.steps))
      events.Step(t, loss.item<double>());
  }
  if (!local_updates) end.round = end.steps = t;

  PS_RETURN_IF_ERROR(dump.Close());
  std::optional<double> accuracy;
  if (s.evaluates) {
    // Final parameters: version end.round once every shard closed the last round.
    if (!end.diverged) {
      if (adapter != nullptr) {
        PS_RETURN_IF_ERROR(adapter->StartPull(end.round, c.pull_timeout));
        PS_RETURN_IF_ERROR(adapter->AwaitAll().status());
      } else {
        PS_RETURN_IF_ERROR(worker->PullAll(end.round, outs, c.pull_timeout).status());
      }
    }
    PS_RETURN_IF_ERROR(SaveParameters(s, c.save_parameters));
    const auto eval_start = Clock::now();
    accuracy = Accuracy(*s.model, data.test);
    events.Evaluated(end.steps, *accuracy, SecondsSince(eval_start));
  }
  // Done: the shards stop waiting for this worker at once (a job that goes on, or
  // workers that finish at different rounds), as ps_server.Worker.close() does.
  if (absl::Status left = worker->Leave(std::chrono::seconds(2)); !left.ok()) {
    events.Warning(end.round, absl::StrCat("leaving the shards: ", left.message()));
  }
  events.Done(end.steps, accuracy, SecondsSince(start), end.diverged, end.late_pushes);
  return absl::OkStatus();
}

}  // namespace ps::fashion_mnist
