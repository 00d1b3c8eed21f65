#include "examples/fashion_mnist/cluster.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "examples/fashion_mnist/torch_cpu.h"
#include "server/local_cluster.h"
#include "server/logging.h"
#include "server/server.h"
#include "worker_lib/metrics.h"

namespace ps::fashion_mnist {
namespace {

using Clock = std::chrono::steady_clock;

// Worker 0's events: kept for the result and passed on to the caller's observer.
class Recorder final : public ForwardingEvents {
 public:
  Recorder(ClusterResult* result, TrainerEvents* next, Clock::time_point start)
      : ForwardingEvents(next), result_(result), start_(start) {}
  void Step(uint64_t step, double loss) override {
    result_->losses.emplace_back(step, loss);
    ForwardingEvents::Step(step, loss);
  }
  void Evaluated(uint64_t step, double accuracy, double seconds) override {
    evaluating_ += seconds;
    result_->evals.emplace_back(step, accuracy);
    result_->eval_seconds.push_back(std::chrono::duration<double>(Clock::now() - start_).count() -
                                    evaluating_);
    ForwardingEvents::Evaluated(step, accuracy, seconds);
  }
  void Planned(uint64_t step, const PlanStats& plan,
               const std::vector<std::string>& tensors) override {
    PlanChange change{.step = step,
                      .predicted_seconds = plan.predicted_seconds,
                      .baseline_seconds = plan.baseline_seconds,
                      .measured_seconds = plan.measured_seconds};
    change.codecs = PlanChoicesText(plan, tensors);
    result_->plans.push_back(std::move(change));
    ForwardingEvents::Planned(step, plan, tensors);
  }
  void Period(uint64_t step, uint64_t round, uint32_t tau) override {
    result_->periods.push_back({step, round, tau});
    ForwardingEvents::Period(step, round, tau);
  }
  void Diverged(uint64_t step) override {
    result_->diverged = true;
    ForwardingEvents::Diverged(step);
  }
  void Done(uint64_t steps, std::optional<double> accuracy, double wall_seconds, bool diverged,
            uint64_t late_pushes) override {
    result_->final_accuracy = accuracy;
    ForwardingEvents::Done(steps, accuracy, wall_seconds, diverged, late_pushes);
  }

 private:
  ClusterResult* result_;
  const Clock::time_point start_;
  double evaluating_ = 0;  // seconds spent in evaluations so far
};

// Counts refused pushes of the other workers; nothing else is reported.
class RefusalCounter final : public TrainerEvents {
 public:
  void Warning(uint64_t, std::string_view) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++count_;
  }
  uint64_t count() {
    std::lock_guard<std::mutex> lock(mu_);
    return count_;
  }

 private:
  std::mutex mu_;
  uint64_t count_ = 0;
};

}  // namespace

absl::StatusOr<ClusterResult> RunCluster(const ClusterConfig& config, const TrainingData& data,
                                         TrainerEvents* events) {
  const uint32_t n = config.trainer.workers;
  if (config.byzantine >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("f = ", config.byzantine, " must be below n = ", n));
  }
  if (config.num_shards == 0) return absl::InvalidArgumentError("at least one shard");
  const ClusterConfig::Elastic& elastic = config.elastic;
  if (elastic.workers > 0 &&
      (config.byzantine > 0 || elastic.workers >= n ||
       (elastic.leave != 0 && elastic.leave <= elastic.join) ||
       elastic.join >= config.trainer.steps)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "elastic: ", elastic.workers, " workers joining at step ", elastic.join,
        " and leaving at ", elastic.leave, " of ", config.trainer.steps, " steps need f = 0 (is ",
        config.byzantine, "), fewer elastic workers than n = ", n,
        ", leave 0 or after join, and join before the last step"));
  }
  // Elastic workers: [first_elastic, n); the shards expect the others from the start.
  const uint32_t first_elastic = n - elastic.workers;
  PS_RETURN_IF_ERROR(ConfigureTorchForWorkers(n));
  // The shards' info lines would drown the caller's progress output.
  PS_RETURN_IF_ERROR(server::ConfigureLogging("warn", "plain", "ps-cluster"));

  // Authenticated as ps-server is by default: the shards share a secret in a private
  // run directory that the LocalCluster makes (and removes), and each worker uses its
  // own token.
  server::ServerOptions o;
  o.num_workers = first_elastic;
  o.max_workers = n;
  o.num_byzantine = config.byzantine;
  o.aggregator = config.aggregator;
  o.aggregation_scope = config.aggregation_scope;
  o.learning_rate = static_cast<float>(config.lr);
  o.momentum = static_cast<float>(config.momentum);
  o.lr_schedule = config.lr_schedule;
  o.weight_decay = static_cast<float>(config.weight_decay);
  o.round_deadline = config.round_deadline;
  o.pull_codec = config.pull_codec;
  o.suspicion_window = config.suspicion_window;
  if (config.trainer.udp) o.udp_port = 0;
  if (config.trainer.fifo) o.schedule = server::Schedule::kFifo;
  o.threads = 1;
  o.log_level = "warn";
  PS_ASSIGN_OR_RETURN(server::LocalCluster shards,
                      server::LocalCluster::Start(config.num_shards, std::move(o)));

  ClusterResult result;
  const auto start = Clock::now();
  Recorder recorder(&result, events, start);
  RefusalCounter others;
  SharedGradientBoard board(n - config.byzantine);
  std::vector<absl::Status> statuses(n);
  std::vector<std::unique_ptr<Worker>> workers(n);
  std::atomic<bool> first_done{false};  // worker 0 finished: elastic ones stop waiting
  {
    std::vector<std::thread> threads;
    for (uint32_t w = 0; w < n; ++w) {
      threads.emplace_back([&, w] {
        TrainerConfig c = config.trainer;
        c.worker_id = w;
        if (w >= first_elastic) {
          // Joins once the job reached its step, trains from the shards' version on.
          const auto version = [&shards] {
            uint64_t v = 0;  // a shard owning no slice stays at 0: the highest counts
            for (size_t i = 0; i < shards.num_shards(); ++i) {
              v = std::max(v, shards.shard(i).shard().MinVersion());
            }
            return v;
          };
          while (version() < elastic.join && !first_done.load()) {
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
          }
          if (first_done.load()) return;
          if (elastic.leave != 0) c.steps = elastic.leave;
        }
        absl::StatusOr<std::string> token = shards.WorkerToken(w);
        if (!token.ok()) {
          statuses[w] = token.status();
          return;
        }
        c.credentials.token = *token;
        c.shards = shards.addresses();
        c.byzantine = config.byzantine;
        c.rule = config.aggregator;
        c.attack = w >= n - config.byzantine ? config.attack : "none";
        if (c.attack == "none") c.dump_gradients.clear();
        if (w != 0) c.save_parameters.clear();
        try {
          statuses[w] =
              TrainWithServer(c, data, config.byzantine > 0 ? &board : nullptr,
                              w == 0 ? static_cast<TrainerEvents&>(recorder) : others, &workers[w]);
        } catch (const std::exception& e) {
          statuses[w] = absl::InternalError(absl::StrCat("worker ", w, ": torch: ", e.what()));
        }
        if (w == 0) first_done.store(true);
      });
    }
    for (std::thread& t : threads) t.join();
  }
  result.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  result.refused_pushes = others.count();
  for (const std::unique_ptr<Worker>& w : workers) {
    if (w != nullptr) result.push_bytes += w->stats().push_bytes;
  }
  workers.clear();
  for (size_t i = 0; i < shards.num_shards(); ++i) {
    for (const server::Suspicion::Window& w : shards.shard(i).shard().SuspicionHistory()) {
      result.suspicion.push_back(
          {static_cast<uint32_t>(i), w.first_round, w.scores, w.set_aside, w.alignment});
    }
  }
  shards.Shutdown();
  shards.Stop();
  for (uint32_t w = 0; w < n; ++w) {
    // A Byzantine worker may fail (its attack refused by its own library); the run
    // stands as long as the honest ones finished.
    if (!statuses[w].ok() && w < n - config.byzantine) {
      return absl::Status(statuses[w].code(),
                          absl::StrCat("worker ", w, ": ", statuses[w].message()));
    }
  }
  return result;
}

}  // namespace ps::fashion_mnist
