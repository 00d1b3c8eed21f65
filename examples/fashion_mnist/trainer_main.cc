// ps-fashion-mnist: trains an MLP or a CNN on Fashion-MNIST as one worker of
// ps-server, or alone (--local) as a baseline. See docs/examples.md. The loop is
// training.h's; this file holds the flags and the progress output.
//
// With a server the loop per round t is: pull version t into the parameters, compute
// the gradient of one batch, push it (round t) tensor by tensor, wait for the pushes,
// and go on with t + 1. The server applies the optimizer; this process only computes
// gradients. A Byzantine worker (--attack SPEC) pushes what its attack makes of them;
// Byzantine processes collude through --collude-dir (docs/evaluation.md).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/json_line.h"
#include "cli/process_tuning.h"
#include "core/status.h"
#include "crypto/cluster_secret.h"
#include "examples/fashion_mnist/torch_cpu.h"
#include "examples/fashion_mnist/training.h"
#include "worker_lib/metrics.h"
#include "worker_lib/worker.h"

namespace ps::fashion_mnist {
namespace {

using cli::JsonObjectWriter;

struct TrainerFlags {
  TrainerConfig config;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::string progress = "text";
  bool local = false;
  double pull_timeout_s = 120;
  double connect_timeout_s = 60;
  std::string collude_dir;
  std::string token_file;
  std::string run_dir;
};

// Writes start/step/eval/done events as text or one JSON object per line (stdout).
class Progress final : public TrainerEvents {
 public:
  explicit Progress(bool jsonl) : jsonl_(jsonl) {}

  void Start(const TrainerConfig& c, bool local, uint64_t start_step, int64_t parameters) override {
    total_ = c.steps;
    if (jsonl_) {
      JsonObjectWriter w;
      w.Add("event", "start")
          .Add("mode", local ? "local" : "server")
          .Add("worker_id", c.worker_id)
          .Add("workers", c.workers)
          .Add("steps", c.steps)
          .Add("start_step", start_step)
          .Add("batch_size", c.batch_size)
          .Add("model", c.model)
          .Add("hidden", c.hidden)
          .Add("split", c.split)
          .Add("parameters", int64_t{parameters})
          .Add("seed", c.seed)
          .Add("codec", c.codec)
          .Add("error_feedback", c.error_feedback)
          .Add("worker_momentum", c.worker_momentum)
          .Add("attack", c.attack);
      Emit(w.str());
    } else {
      Emit(absl::StrFormat(
          "start: %s worker %u of %u, steps %u (from %u), batch %u, %s, %d parameters, split %s%s",
          local ? "local" : "server", c.worker_id, c.workers, c.steps, start_step, c.batch_size,
          c.model == "mlp" ? absl::StrCat("mlp ", c.hidden) : c.model, parameters, c.split,
          c.attack == "none" ? "" : absl::StrCat(", Byzantine: ", c.attack)));
    }
  }

  void Step(uint64_t step, double loss) override {
    if (jsonl_) {
      Emit(JsonObjectWriter().Add("event", "step").Add("step", step).Add("loss", loss).str());
    } else {
      Emit(absl::StrFormat("step %u/%u loss %.4f", step, total_, loss));
    }
  }

  void Eval(uint64_t step, double accuracy) override {
    if (jsonl_) {
      Emit(JsonObjectWriter().Add("event", "eval").Add("step", step).Add("test_accuracy", accuracy).str());
    } else {
      Emit(absl::StrFormat("eval step %u test_accuracy %.4f", step, accuracy));
    }
  }

  void Warning(uint64_t step, std::string_view message) override {
    if (jsonl_) {
      Emit(JsonObjectWriter().Add("event", "warning").Add("step", step).Add("message", message).str());
    }
    std::fprintf(stderr, "ps-fashion-mnist: step %llu: %.*s\n", static_cast<unsigned long long>(step),
                 static_cast<int>(message.size()), message.data());
  }

  void Planned(uint64_t step, const ps::PlanStats& plan,
               const std::vector<std::string>& tensors) override {
    const std::string codecs = ps::PlanChoicesText(plan, tensors);
    if (jsonl_) {
      Emit(JsonObjectWriter()
               .Add("event", "plan")
               .Add("step", step)
               .Add("plan", plan.plans)
               .Add("round", plan.planned_at)
               .Add("codecs", codecs)
               .Add("predicted_seconds", plan.predicted_seconds)
               .Add("baseline_seconds", plan.baseline_seconds)
               .Add("measured_seconds", plan.measured_seconds)
               .str());
    } else {
      Emit(absl::StrFormat(
          "step %u: plan %u at round %u: %s; round predicted %.3f s (all fp32 %.3f s), "
          "measured %.3f s",
          step, plan.plans, plan.planned_at, codecs, plan.predicted_seconds,
          plan.baseline_seconds, plan.measured_seconds));
    }
  }

  void Metrics(std::string_view url) override {
    if (jsonl_) {
      Emit(JsonObjectWriter().Add("event", "metrics").Add("url", url).str());
    } else {
      Emit("metrics on " + std::string(url));
    }
  }

  void Period(uint64_t step, uint64_t round, uint32_t tau) override {
    if (jsonl_) {
      Emit(JsonObjectWriter()
               .Add("event", "period")
               .Add("step", step)
               .Add("round", round)
               .Add("tau", tau)
               .str());
    } else {
      Emit(absl::StrFormat("step %u round %u: %u local steps per round (AdaComm)", step, round, tau));
    }
  }

  void Diverged(uint64_t step) override {
    if (jsonl_) {
      Emit(JsonObjectWriter().Add("event", "diverged").Add("step", step).str());
    } else {
      Emit(absl::StrFormat("diverged at step %u: parameters too large or not finite", step));
    }
  }

  void Done(uint64_t steps, std::optional<double> accuracy, double wall_seconds, bool diverged,
            uint64_t late_pushes) override {
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
  uint64_t total_ = 0;
};

absl::Status Run(TrainerFlags& f, std::unique_ptr<Worker>& keep_worker) {
  TrainerConfig& c = f.config;
  c.pull_timeout = std::chrono::milliseconds(static_cast<int64_t>(f.pull_timeout_s * 1000));
  c.connect_timeout = std::chrono::milliseconds(static_cast<int64_t>(f.connect_timeout_s * 1000));
  if (!f.token_file.empty()) {
    PS_ASSIGN_OR_RETURN(c.credentials.token, core::ReadTokenFile(f.token_file));
  } else if (!f.run_dir.empty()) {
    // Through the checked directory: no symbolic link, this user's, private.
    PS_ASSIGN_OR_RETURN(c.credentials.token,
                        crypto::ReadRunDirectoryToken(
                            f.run_dir, core::Identity{core::Identity::Kind::kWorker, c.worker_id}));
  }
  PS_RETURN_IF_ERROR(c.credentials.Validate());
  PS_RETURN_IF_ERROR(ValidateConfig(c, f.local));
  Progress progress(f.progress == "jsonl");
  try {
    PS_ASSIGN_OR_RETURN(const TrainingData data,
                        LoadTrainingData(f.data_dir, /*with_test=*/f.local || c.worker_id == 0));
    if (f.local) return TrainLocal(c, data, progress);
    std::unique_ptr<GradientBoard> board;
    if (!f.collude_dir.empty() && c.attack != "none") {
      board = std::make_unique<DirectoryGradientBoard>(f.collude_dir, c.byzantine);
    }
    return TrainWithServer(c, data, board.get(), progress, &keep_worker);
  } catch (const std::exception& e) {
    // libtorch reports errors by exception; they stop here.
    return absl::InternalError(absl::StrCat("torch: ", e.what()));
  }
}

}  // namespace
}  // namespace ps::fashion_mnist

int main(int argc, char** argv) {
  ps::cli::TuneProcessForThroughput();  // docs/data_path.md, "Allocator"
  using ps::fashion_mnist::TrainerFlags;
  TrainerFlags f;
  ps::fashion_mnist::TrainerConfig& c = f.config;
  CLI::App app{"ps-fashion-mnist: train an MLP or CNN on Fashion-MNIST with ps-server (or --local)"};
  app.option_defaults()->always_capture_default();
  app.add_option("--shards", c.shards, "Shard addresses host:port, by shard id (comma-separated)")
      ->delimiter(',');
  app.add_option("--worker-id", c.worker_id, "This worker's rank in [0, --workers)");
  app.add_option("--tls-ca", c.credentials.tls_ca,
                 "CA bundle that signed the shards' certificates: connect with TLS");
  app.add_option("--tls-cert", c.credentials.tls_cert,
                 "Client certificate (common name worker-N) for shards that require mTLS");
  app.add_option("--tls-key", c.credentials.tls_key, "Key of --tls-cert");
  app.add_option("--tls-server-name", c.credentials.tls_server_name,
                 "Name to check in the shards' certificates instead of the address's host");
  app.add_option("--token-file", f.token_file, "File holding this worker's token");
  app.add_option("--run-id", c.run_id,
                 "The training run to join: shards started with --run-id refuse another")
      ->envname("PS_RUN_ID");
  app.add_option("--run-dir", f.run_dir,
                 "Run directory of local shards (ps-server --run-dir): use its "
                 "token-worker-<worker-id> file");
  app.add_option("--workers", c.workers, "Number of workers n (for the data partition)");
  app.add_option("--data-dir", f.data_dir, "Directory with the Fashion-MNIST IDX .gz files");
  app.add_option("--steps", c.steps, "Training rounds (steps) in total");
  app.add_option("--batch-size", c.batch_size, "Examples per step and worker");
  app.add_option("--model", c.model, "Model: mlp (784-hidden-10) or cnn (two 5x5 convolutions)")
      ->check(CLI::IsMember({"mlp", "cnn"}));
  app.add_option("--hidden", c.hidden, "Hidden width of the 784-hidden-10 MLP");
  app.add_option("--split", c.split,
                 "How the training set is split among workers: iid, dirichlet(alpha=A) or "
                 "gamma(G) (a G fraction IID, the rest sorted by label; docs/evaluation.md)");
  app.add_option("--seed", c.seed,
                 "Seed: same on all workers (identical initial parameters); batch sampling "
                 "uses a per-worker seed derived from it");
  app.add_option("--codec", c.codec,
                 "Codec spec for pushes (see docs/codecs.md), or auto: Espresso's plan picks "
                 "each tensor's among --codec-candidates from measured costs "
                 "(docs/adaptive.md)");
  app.add_option("--codec-candidates", c.codec_candidates,
                 "--codec auto: the codec specs to choose from, separated by ';'")
      ->delimiter(';');
  app.add_option("--push-device", c.push_device,
                 "Where the push codec encodes: cpu, or cuda (the CPU, with a warning saying "
                 "why, where no CUDA device can; docs/gpu.md)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_flag("--udp", c.udp, "Push gradients as datagrams on the shards' UDP path (docs/transport.md)");
  app.add_option("--udp-loss", c.udp_loss, "Injected datagram loss in [0, 1) (seeded; with --udp)");
  app.add_option("--udp-chunk-elems", c.udp_chunk_elems,
                 "Values per datagram (with --udp; 0: as many fp32 values as fill one packet of "
                 "the route's MTU)");
  app.add_option("--udp-end-copies", c.udp_end_copies,
                 "Copies of the end datagram after each push's chunks, which let its round "
                 "close without waiting for the deadline when chunks were lost (0: none; "
                 "with --udp)")
      ->check(CLI::Range(0, 16));
  app.add_option("--shape", c.shaping,
                 "Shape this worker's link, e.g. rate=100mbps,latency=1ms (docs/transport.md)");
  app.add_flag("--fifo", c.fifo, "Send in push order instead of by priority (P3 off)");
  app.add_flag("--error-feedback", c.error_feedback,
               "Add what the codec lost to the next push (needed by sign, 3lc, topk, ...)");
  app.add_option("--worker-momentum", c.worker_momentum,
                 "Push the moving average beta * u + (1 - beta) * g instead of g (0: off)")
      ->check(CLI::Range(0.0, 0.999999));
  app.add_option("--dump-gradients", c.dump_gradients,
                 "Append this worker's gradients as raw little-endian fp32 to FILE every "
                 "--dump-every rounds (for ps-bench codecs --data real)");
  app.add_option("--save-parameters", c.save_parameters,
                 "Write the final parameters as raw little-endian fp32 to FILE (worker 0, or --local)");
  app.add_option("--dump-every", c.dump_every, "Rounds between gradient dumps")->check(CLI::PositiveNumber);
  app.add_option("--eval-every", c.eval_every,
                 "Evaluate test accuracy every this many steps (worker 0 only; 0: only at the end)");
  app.add_option("--attack", c.attack,
                 "This worker's attack, e.g. signflip(scale=10), ipm(eps=0.1), alie, alie_opt, "
                 "gaussian(sigma=200), labelflip, mimic, nan (docs/evaluation.md); none: honest");
  app.add_option("--byzantine", c.byzantine,
                 "f, the number of Byzantine workers in the cluster (the attacks' context)");
  app.add_option("--rule", c.rule, "The servers' aggregator spec, which optimized attacks search against");
  app.add_option("--collude-dir", f.collude_dir,
                 "Directory where the Byzantine processes share their gradients each round "
                 "(omniscient attacks across processes; docs/evaluation.md)");
  app.add_option("--progress", f.progress, "Progress output on stdout: text or jsonl")
      ->check(CLI::IsMember({"text", "jsonl"}));
  app.add_option("--log-every", c.log_every, "Report the loss every this many steps (0: never)");
  app.add_flag("--local", f.local, "No server: plain SGD in this process (baseline)");
  app.add_option("--comm", c.comm,
                 "How workers communicate: sync (a gradient push per step), adacomm "
                 "(local-update SGD, AdaComm's period; run the shards with --lr 1 "
                 "--momentum 0), or auto (adacomm with fp16 pushes where the shards run "
                 "so, else sync with --codec auto, CAT among the candidates; both with "
                 "--error-feedback; docs/adaptive.md)")
      ->check(CLI::IsMember({"sync", "adacomm", "auto"}));
  app.add_option("--objective", c.objective,
                 "What --codec auto's plan and CAT's levels minimize: time (the round's) or "
                 "bytes (sent, without a slower round than fp32; docs/adaptive.md)")
      ->check(CLI::IsMember({"time", "bytes"}));
  app.add_option("--metrics-port", c.metrics_port,
                 "Serve this worker's Prometheus metrics on this port (-1: none, 0: a free "
                 "one; docs/metrics.md \"Worker metrics\")");
  app.add_option("--metrics-host", c.metrics_host, "Address the metrics port listens on");
  app.add_option("--tau0", c.tau0, "--comm adacomm: local steps per round at the start");
  app.add_option("--tau-max", c.tau_max, "--comm adacomm: most local steps per round");
  app.add_option("--lr", c.lr,
                 "Learning rate of this process's own SGD (--local, --comm adacomm; the "
                 "server has its own)");
  app.add_option("--momentum", c.momentum, "Momentum (--local, --comm adacomm)");
  app.add_option("--weight-decay", c.weight_decay, "Weight decay (--local, --comm adacomm)");
  app.add_option("--pull-timeout-s", f.pull_timeout_s, "Deadline of one pull, seconds");
  app.add_option("--connect-timeout-s", f.connect_timeout_s,
                 "How long to keep trying to reach every shard at start, seconds");
  app.add_option("--divergence-limit", c.divergence_limit,
                 "Stop (\"diverged\") once a parameter's magnitude exceeds this or is not "
                 "finite; 0: only non-finite");
  CLI11_PARSE(app, argc, argv);

  std::unique_ptr<ps::Worker> worker;
  absl::Status status = ps::fashion_mnist::ConfigureTorchForWorkers(/*threads=*/1);
  if (status.ok()) status = ps::fashion_mnist::Run(f, worker);
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
