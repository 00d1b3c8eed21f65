// ps-fashion-mnist: trains an MLP on Fashion-MNIST as one worker of ps-server, or
// alone (--local) as a baseline. See docs/examples.md.
//
// With a server the loop per round t is: pull version t into the parameters, compute
// the gradient of one batch, push it (round t) tensor by tensor, wait for the pushes,
// and go on with t + 1. The server applies the optimizer; this process only computes
// gradients. A Byzantine worker (--byzantine signflip) pushes -scale * gradient.
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/layout.h"
#include "core/status.h"
#include "examples/fashion_mnist/idx.h"
#include "core/json_line.h"
#include "examples/fashion_mnist/model.h"
#include "examples/fashion_mnist/partition.h"
#include "worker_lib/worker.h"

namespace ps::fashion_mnist {
namespace {

using Clock = std::chrono::steady_clock;
using core::JsonObjectWriter;

struct TrainerFlags {
  std::vector<std::string> shards;
  uint32_t worker_id = 0;
  uint32_t workers = 1;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  uint64_t steps = 1000;
  uint32_t batch_size = 32;
  uint32_t hidden = 128;
  std::string model = "mlp";
  std::string split = "iid";
  uint64_t seed = 1;
  std::string codec = "fp32";
  bool error_feedback = false;
  double worker_momentum = 0;
  std::string dump_gradients;
  uint64_t dump_every = 50;
  uint64_t eval_every = 100;
  std::string byzantine = "none";
  double byzantine_scale = 10;
  std::string progress = "text";
  uint64_t log_every = 10;
  bool local = false;
  double lr = 0.1;
  double momentum = 0.9;
  double weight_decay = 0;
  double pull_timeout_s = 120;
  double connect_timeout_s = 60;
  double divergence_limit = 1e6;
};

// Writes start/step/eval/done events as text or one JSON object per line (stdout).
class Progress {
 public:
  explicit Progress(bool jsonl) : jsonl_(jsonl) {}

  void Start(const TrainerFlags& f, uint64_t start_step, int64_t parameters) {
    if (jsonl_) {
      JsonObjectWriter w;
      w.Add("event", "start")
          .Add("mode", f.local ? "local" : "server")
          .Add("worker_id", f.worker_id)
          .Add("workers", f.workers)
          .Add("steps", f.steps)
          .Add("start_step", start_step)
          .Add("batch_size", f.batch_size)
          .Add("hidden", f.hidden)
          .Add("parameters", int64_t{parameters})
          .Add("seed", f.seed)
          .Add("codec", f.codec)
          .Add("error_feedback", f.error_feedback)
          .Add("worker_momentum", f.worker_momentum)
          .Add("byzantine", f.byzantine);
      Emit(w.str());
    } else {
      Emit(absl::StrFormat(
          "start: %s worker %u of %u, steps %u (from %u), batch %u, hidden %u, %d parameters%s",
          f.local ? "local" : "server", f.worker_id, f.workers, f.steps, start_step, f.batch_size,
          f.hidden, parameters,
          f.byzantine == "none" ? "" : absl::StrCat(", Byzantine: ", f.byzantine)));
    }
  }

  void Step(uint64_t step, uint64_t total, double loss) {
    if (jsonl_) {
      Emit(JsonObjectWriter().Add("event", "step").Add("step", step).Add("loss", loss).str());
    } else {
      Emit(absl::StrFormat("step %u/%u loss %.4f", step, total, loss));
    }
  }

  void Eval(uint64_t step, double accuracy) {
    if (jsonl_) {
      Emit(JsonObjectWriter()
               .Add("event", "eval")
               .Add("step", step)
               .Add("test_accuracy", accuracy)
               .str());
    } else {
      Emit(absl::StrFormat("eval step %u test_accuracy %.4f", step, accuracy));
    }
  }

  void Warning(uint64_t step, std::string_view message) {
    if (jsonl_) {
      Emit(JsonObjectWriter()
               .Add("event", "warning")
               .Add("step", step)
               .Add("message", message)
               .str());
    }
    std::fprintf(stderr, "ps-fashion-mnist: step %llu: %.*s\n",
                 static_cast<unsigned long long>(step), static_cast<int>(message.size()),
                 message.data());
  }

  void Diverged(uint64_t step) {
    if (jsonl_) {
      Emit(JsonObjectWriter().Add("event", "diverged").Add("step", step).str());
    } else {
      Emit(absl::StrFormat("diverged at step %u: parameters too large or not finite", step));
    }
  }

  void Done(uint64_t steps, std::optional<double> accuracy, double wall_seconds, bool diverged,
            uint64_t late_pushes) {
    if (jsonl_) {
      JsonObjectWriter w;
      w.Add("event", "done").Add("steps", steps);
      if (accuracy) {
        w.Add("final_test_accuracy", *accuracy);
      } else {
        w.AddNull("final_test_accuracy");
      }
      w.Add("wall_seconds", wall_seconds).Add("diverged", diverged).Add("late_pushes", late_pushes);
      Emit(w.str());
    } else {
      Emit(absl::StrFormat("done: %u steps, final test accuracy %s, %.1f s%s", steps,
                           accuracy ? absl::StrFormat("%.4f", *accuracy) : "-", wall_seconds,
                           diverged ? " (diverged)" : ""));
    }
  }

 private:
  void Emit(const std::string& line) {
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }

  bool jsonl_;
};

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// True when training has blown up: a parameter is not finite or its magnitude exceeds
// `limit` (0: no magnitude limit). Every worker checks the same pulled version, so all
// of them stop at the same round; checking before gradients overflow keeps every push
// finite (a shard refuses non-finite pushes).
bool Diverged(const std::vector<torch::Tensor>& tensors, double limit) {
  torch::NoGradGuard no_grad;
  for (const torch::Tensor& t : tensors) {
    const double largest = t.abs().max().item<double>();  // NaN propagates
    if (!std::isfinite(largest) || (limit > 0 && largest > limit)) return true;
  }
  return false;
}

// Everything both modes share: data, model, sampler.
struct Setup {
  Dataset train;
  Dataset test;  // loaded only where it is evaluated
  std::shared_ptr<Classifier> model;
  std::vector<torch::Tensor> params;  // forward order
  std::vector<std::string> names;
  std::unique_ptr<BatchSampler> sampler;
  bool evaluates = false;
};

absl::StatusOr<Setup> Prepare(const TrainerFlags& f) {
  Setup s;
  PS_ASSIGN_OR_RETURN(s.train, LoadFashionMnist(f.data_dir, Split::kTrain));
  s.evaluates = f.local || f.worker_id == 0;
  if (s.evaluates) {
    PS_ASSIGN_OR_RETURN(s.test, LoadFashionMnist(f.data_dir, Split::kTest));
  }
  PS_ASSIGN_OR_RETURN(const SplitSpec split, ParseSplit(f.split));
  PS_ASSIGN_OR_RETURN(std::vector<uint32_t> part,
                      Partition(split, s.train.labels, kNumClasses, f.workers, f.worker_id, f.seed));
  s.sampler =
      std::make_unique<BatchSampler>(std::move(part), DeriveSeed(f.seed, 1000 + f.worker_id));
  // Same seed everywhere: every worker builds the same initial parameters.
  torch::manual_seed(f.seed);
  PS_ASSIGN_OR_RETURN(s.model, MakeClassifier(f.model, f.hidden));
  for (const auto& item : s.model->named_parameters()) {
    s.names.push_back(item.key());
    s.params.push_back(item.value());
  }
  return s;
}

// One batch: forward, backward; returns the loss. Gradients land in param.grad().
double ComputeGradients(Setup& s, uint32_t batch_size, std::vector<uint32_t>& indices) {
  s.sampler->Next(batch_size, indices);
  auto [x, y] = MakeBatch(s.train, indices);
  s.model->zero_grad();
  torch::Tensor loss = torch::nn::functional::cross_entropy(s.model->forward(x), y);
  loss.backward();
  return loss.item<double>();
}

// The gradient this worker contributes: the true one, or the attack's.
torch::Tensor Contribution(const TrainerFlags& f, const torch::Tensor& grad) {
  if (f.byzantine == "signflip") return grad * -f.byzantine_scale;
  return grad;
}

int64_t CountParameters(const Setup& s) {
  int64_t n = 0;
  for (const auto& p : s.params) n += p.numel();
  return n;
}

// --dump-gradients: the gradients as raw little-endian fp32, appended tensor by tensor
// (real data for `ps-bench codecs --data real --gradients FILE`).
class GradientDump {
 public:
  static absl::StatusOr<GradientDump> Open(const TrainerFlags& f) {
    GradientDump d;
    d.path_ = f.dump_gradients;
    if (d.path_.empty()) return d;
    d.file_.reset(std::fopen(d.path_.c_str(), "wb"));
    if (d.file_ == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--dump-gradients: cannot open '", d.path_, "' for writing"));
    }
    return d;
  }
  absl::Status Write(const torch::Tensor& grad) {
    if (file_ == nullptr) return absl::OkStatus();
    const torch::Tensor c = grad.contiguous();
    const size_t n = static_cast<size_t>(c.numel());
    if (std::fwrite(c.data_ptr<float>(), sizeof(float), n, file_.get()) != n) {
      return absl::InternalError(absl::StrCat("--dump-gradients: write to '", path_, "' failed"));
    }
    return absl::OkStatus();
  }
  absl::Status Close() {
    if (file_ != nullptr && std::fclose(file_.release()) != 0) {
      return absl::InternalError(absl::StrCat("--dump-gradients: closing '", path_, "' failed"));
    }
    return absl::OkStatus();
  }

 private:
  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::string path_;
  std::unique_ptr<std::FILE, Closer> file_;
};

absl::Status RunLocal(const TrainerFlags& f, Progress& progress) {
  PS_ASSIGN_OR_RETURN(Setup s, Prepare(f));
  PS_ASSIGN_OR_RETURN(GradientDump dump, GradientDump::Open(f));
  torch::optim::SGD optimizer(
      s.model->parameters(),
      torch::optim::SGDOptions(f.lr).momentum(f.momentum).weight_decay(f.weight_decay));
  progress.Start(f, 0, CountParameters(s));
  const auto start = Clock::now();
  std::vector<uint32_t> indices;
  bool diverged = false;
  uint64_t step = 0;
  for (; step < f.steps; ++step) {
    if (f.eval_every > 0 && step % f.eval_every == 0)
      progress.Eval(step, Accuracy(*s.model, s.test));
    const double loss = ComputeGradients(s, f.batch_size, indices);
    if (step % f.dump_every == 0) {
      for (const auto& p : s.params) PS_RETURN_IF_ERROR(dump.Write(p.grad()));
    }
    if (f.byzantine != "none") {
      torch::NoGradGuard no_grad;
      for (auto& p : s.params) p.mutable_grad().copy_(Contribution(f, p.grad()));
    }
    optimizer.step();
    if (f.log_every > 0 && ((step + 1) % f.log_every == 0 || step + 1 == f.steps)) {
      progress.Step(step + 1, f.steps, loss);
    }
    if (Diverged(s.params, f.divergence_limit)) {
      diverged = true;
      progress.Diverged(step + 1);
      ++step;
      break;
    }
  }
  PS_RETURN_IF_ERROR(dump.Close());
  const double accuracy = Accuracy(*s.model, s.test);
  progress.Eval(step, accuracy);
  progress.Done(step, accuracy, SecondsSince(start), diverged, 0);
  return absl::OkStatus();
}

// `keep_worker` receives the Worker so that it outlives this function (see main).
absl::Status RunWithServer(const TrainerFlags& f, Progress& progress,
                           std::unique_ptr<Worker>& keep_worker) {
  PS_ASSIGN_OR_RETURN(Setup s, Prepare(f));

  std::vector<core::TensorSpec> specs;
  std::vector<std::span<const float>> initial;
  std::vector<std::span<float>> outs;
  for (size_t i = 0; i < s.params.size(); ++i) {
    torch::Tensor& p = s.params[i];
    specs.push_back({s.names[i], static_cast<uint64_t>(p.numel()), static_cast<int32_t>(i)});
    initial.emplace_back(p.data_ptr<float>(), static_cast<size_t>(p.numel()));
    outs.emplace_back(p.data_ptr<float>(), static_cast<size_t>(p.numel()));
  }
  PS_ASSIGN_OR_RETURN(core::ModelLayout layout,
                      core::ModelLayout::Create(std::move(specs), core::kDefaultSliceElems,
                                                static_cast<uint32_t>(f.shards.size())));
  WorkerOptions options;
  options.shard_addresses = f.shards;
  options.worker_id = f.worker_id;
  options.push.codec = f.codec;
  options.push.error_feedback = f.error_feedback;
  options.push.momentum = f.worker_momentum;
  options.codec_seed = f.seed;
  for (size_t i = 0; i < s.params.size(); ++i) {
    if (s.params[i].dim() != 2) continue;
    PushOptions matrix = options.push;  // weights: out x in, row-major
    matrix.matrix_cols = static_cast<uint32_t>(s.params[i].size(1));
    options.tensor_push.emplace(s.names[i], matrix);
  }
  PS_ASSIGN_OR_RETURN(GradientDump dump, GradientDump::Open(f));
  options.connect_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(f.connect_timeout_s * 1000));
  const auto pull_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(f.pull_timeout_s * 1000));
  PS_ASSIGN_OR_RETURN(keep_worker, Worker::Start(std::move(options), std::move(layout), initial));
  Worker* worker = keep_worker.get();

  uint64_t t = worker->start_version();
  progress.Start(f, t, CountParameters(s));
  const auto start = Clock::now();
  std::vector<uint32_t> indices;
  uint64_t late_pushes = 0;
  bool diverged = false;
  while (t < f.steps) {
    PS_ASSIGN_OR_RETURN(const uint64_t version, worker->PullAll(t, outs, pull_timeout));
    if (version > t) {
      // The others closed rounds without us (quorum at the deadline): catch up.
      progress.Warning(
          t, absl::StrCat("pulled version ", version, " while at round ", t, "; skipping ahead"));
      t = version;
      if (t >= f.steps) break;
    }
    if (Diverged(s.params, f.divergence_limit)) {
      diverged = true;
      progress.Diverged(t);
      break;
    }
    if (s.evaluates && f.eval_every > 0 && t % f.eval_every == 0) {
      progress.Eval(t, Accuracy(*s.model, s.test));
    }
    const double loss = ComputeGradients(s, f.batch_size, indices);
    // Last layer first, as backward produces them; the send queue orders by priority.
    for (size_t i = s.params.size(); i-- > 0;) {
      torch::Tensor grad = Contribution(f, s.params[i].grad()).contiguous();
      if (t % f.dump_every == 0) PS_RETURN_IF_ERROR(dump.Write(grad));
      PS_RETURN_IF_ERROR(worker->Push(
          i, t, std::span<const float>(grad.data_ptr<float>(), static_cast<size_t>(grad.numel()))));
    }
    if (absl::Status pushed = worker->WaitPushes(); !pushed.ok()) {
      if (pushed.code() != absl::StatusCode::kOutOfRange) return pushed;
      ++late_pushes;
      progress.Warning(t, absl::StrCat("late push refused: ", pushed.message()));
    }
    ++t;
    if (f.log_every > 0 && (t % f.log_every == 0 || t == f.steps)) progress.Step(t, f.steps, loss);
  }

  PS_RETURN_IF_ERROR(dump.Close());
  std::optional<double> accuracy;
  if (s.evaluates) {
    // Final parameters: version `steps` once every shard closed the last round.
    if (!diverged) {
      PS_ASSIGN_OR_RETURN(const uint64_t version, worker->PullAll(t, outs, pull_timeout));
      (void)version;
    }
    accuracy = Accuracy(*s.model, s.test);
    progress.Eval(t, *accuracy);
  }
  progress.Done(t, accuracy, SecondsSince(start), diverged, late_pushes);
  return absl::OkStatus();
}

absl::Status Run(const TrainerFlags& f, std::unique_ptr<Worker>& keep_worker) {
  if (f.progress != "text" && f.progress != "jsonl") {
    return absl::InvalidArgumentError("--progress must be text or jsonl");
  }
  if (f.byzantine != "none" && f.byzantine != "signflip") {
    return absl::InvalidArgumentError("--byzantine must be none or signflip");
  }
  if (f.workers == 0 || f.worker_id >= f.workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("--worker-id ", f.worker_id, " must be below --workers ", f.workers));
  }
  if (f.batch_size == 0 || f.hidden == 0) {
    return absl::InvalidArgumentError("--batch-size and --hidden must be positive");
  }
  if (!f.local && f.shards.empty()) {
    return absl::InvalidArgumentError("--shards is required unless --local");
  }
  Progress progress(f.progress == "jsonl");
  try {
    return f.local ? RunLocal(f, progress) : RunWithServer(f, progress, keep_worker);
  } catch (const std::exception& e) {
    // libtorch reports errors by exception; they stop here.
    return absl::InternalError(absl::StrCat("torch: ", e.what()));
  }
}

}  // namespace
}  // namespace ps::fashion_mnist

int main(int argc, char** argv) {
  using ps::fashion_mnist::TrainerFlags;
  TrainerFlags f;
  CLI::App app{"ps-fashion-mnist: train an MLP on Fashion-MNIST with ps-server (or --local)"};
  app.option_defaults()->always_capture_default();
  app.add_option("--shards", f.shards, "Shard addresses host:port, by shard id (comma-separated)")
      ->delimiter(',');
  app.add_option("--worker-id", f.worker_id, "This worker's rank in [0, --workers)");
  app.add_option("--workers", f.workers, "Number of workers n (for the data partition)");
  app.add_option("--data-dir", f.data_dir, "Directory with the Fashion-MNIST IDX .gz files");
  app.add_option("--steps", f.steps, "Training rounds (steps) in total");
  app.add_option("--batch-size", f.batch_size, "Examples per step and worker");
  app.add_option("--hidden", f.hidden, "Hidden width of the 784-hidden-10 MLP");
  app.add_option("--model", f.model, "Model: mlp (784-hidden-10) or cnn (two 5x5 convolutions)")
      ->check(CLI::IsMember({"mlp", "cnn"}));
  app.add_option("--split", f.split,
                 "How the training set is split among workers: iid, dirichlet(alpha=A) or "
                 "gamma(G) (a G fraction IID, the rest sorted by label; docs/evaluation.md)");
  app.add_option("--seed", f.seed,
                 "Seed: same on all workers (identical initial parameters); batch sampling "
                 "uses a per-worker seed derived from it");
  app.add_option("--codec", f.codec, "Codec spec for pushes (see docs/codecs.md)");
  app.add_flag("--error-feedback", f.error_feedback,
               "Add what the codec lost to the next push (needed by sign, 3lc, topk, ...)");
  app.add_option("--worker-momentum", f.worker_momentum,
                 "Push the moving average beta * u + (1 - beta) * g instead of g (0: off)")
      ->check(CLI::Range(0.0, 0.999999));
  app.add_option("--dump-gradients", f.dump_gradients,
                 "Append this worker's gradients as raw little-endian fp32 to FILE every "
                 "--dump-every rounds (for ps-bench codecs --data real)");
  app.add_option("--dump-every", f.dump_every, "Rounds between gradient dumps")
      ->check(CLI::PositiveNumber);
  app.add_option(
      "--eval-every", f.eval_every,
      "Evaluate test accuracy every this many steps (worker 0 only; 0: only at the end)");
  app.add_option("--byzantine", f.byzantine, "Attack of this worker: none or signflip")
      ->check(CLI::IsMember({"none", "signflip"}));
  app.add_option("--byzantine-scale", f.byzantine_scale, "signflip pushes -scale * gradient");
  app.add_option("--progress", f.progress, "Progress output on stdout: text or jsonl")
      ->check(CLI::IsMember({"text", "jsonl"}));
  app.add_option("--log-every", f.log_every, "Report the loss every this many steps (0: never)");
  app.add_flag("--local", f.local, "No server: plain SGD in this process (baseline)");
  app.add_option("--lr", f.lr, "Learning rate (--local only; the server has its own)");
  app.add_option("--momentum", f.momentum, "Momentum (--local only)");
  app.add_option("--weight-decay", f.weight_decay, "Weight decay (--local only)");
  app.add_option("--pull-timeout-s", f.pull_timeout_s, "Deadline of one pull, seconds");
  app.add_option("--connect-timeout-s", f.connect_timeout_s,
                 "How long to keep trying to reach every shard at start, seconds");
  app.add_option("--divergence-limit", f.divergence_limit,
                 "Stop (\"diverged\") once a parameter's magnitude exceeds this or is not "
                 "finite; 0: only non-finite");
  CLI11_PARSE(app, argc, argv);

  torch::set_num_threads(1);
  std::unique_ptr<ps::Worker> worker;
  const absl::Status status = ps::fashion_mnist::Run(f, worker);
  if (!status.ok()) {
    std::fprintf(stderr, "ps-fashion-mnist: %s\n", status.ToString().c_str());
  }
  // End without destructors: the Worker is not destroyed and static destructors do not
  // run. Destroying the last gRPC channel tears down gRPC's process-wide callback
  // completion queue, and in gRPC 1.51 that teardown races with the queue's own threads
  // (an abort "assertion failed: prior > 0" in grpc_cq_internal_unref, or a SIGSEGV,
  // after training had finished; see grpc/grpc#32584). Nothing is in flight here: the
  // pushes were waited for and the output is flushed.
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(status.ok() ? 0 : 1);
}
