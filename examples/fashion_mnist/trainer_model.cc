#include "examples/fashion_mnist/trainer_model_internal.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <mutex>

#include "core/status.h"

namespace ps::fashion_mnist {

bool Diverged(const std::vector<torch::Tensor>& tensors, double limit) {
  torch::NoGradGuard no_grad;
  for (const torch::Tensor& t : tensors) {
    const double largest = t.abs().max().item<double>();  // NaN propagates
    if (!std::isfinite(largest) || (limit > 0 && largest > limit)) return true;
  }
  return false;
}

absl::StatusOr<Setup> Prepare(const TrainerConfig& c, const TrainingData& data, bool local) {
  Setup s;
  s.evaluates = local || c.worker_id == 0;
  if (s.evaluates && data.test.size() == 0) {
    return absl::FailedPreconditionError("this worker evaluates but the test set is not loaded");
  }
  PS_ASSIGN_OR_RETURN(const SplitSpec split, ParseSplit(c.split));
  PS_ASSIGN_OR_RETURN(std::vector<uint32_t> part, Partition(split, data.train.labels, kNumClasses,
                                                            c.workers, c.worker_id, c.seed));
  s.sampler =
      std::make_unique<BatchSampler>(std::move(part), DeriveSeed(c.seed, 1000 + c.worker_id));
  if (c.attack != "none") {
    PS_ASSIGN_OR_RETURN(s.attack, attacks::MakeAttack(c.attack));
    if (s.attack->needs_rule()) s.attack_pool = std::make_unique<core::ThreadPool>(0);
  }
  {
    // torch's generator is process-wide: seed and build under one lock, so that every
    // worker (thread or process) starts from the same parameters.
    static std::mutex init_mu;
    std::lock_guard<std::mutex> lock(init_mu);
    torch::manual_seed(c.seed);
    PS_ASSIGN_OR_RETURN(s.model, MakeClassifier(c.model, c.hidden));
  }
  for (const auto& item : s.model->named_parameters()) {
    s.names.push_back(item.key());
    s.params.push_back(item.value());
  }
  return s;
}

torch::Tensor Forward(Setup& s, const Dataset& train, uint32_t batch_size,
                      std::vector<uint32_t>& indices) {
  s.sampler->Next(batch_size, indices);
  auto [x, y] = MakeBatch(train, indices);
  if (s.attack != nullptr && s.attack->flips_labels()) y = (kNumClasses - 1) - y;
  s.model->zero_grad();
  return torch::nn::functional::cross_entropy(s.model->forward(x), y);
}

double ComputeGradients(Setup& s, const Dataset& train, uint32_t batch_size,
                        std::vector<uint32_t>& indices) {
  torch::Tensor loss = Forward(s, train, batch_size, indices);
  loss.backward();
  return loss.item<double>();
}

int64_t CountParameters(const Setup& s) {
  int64_t n = 0;
  for (const auto& p : s.params) n += p.numel();
  return n;
}

std::vector<float> Flat(const Setup& s, bool gradients) {
  torch::NoGradGuard no_grad;
  std::vector<float> flat;
  flat.reserve(static_cast<size_t>(CountParameters(s)));
  for (const auto& p : s.params) {
    const torch::Tensor g = (gradients ? p.grad() : p.detach()).contiguous();
    flat.insert(flat.end(), g.data_ptr<float>(), g.data_ptr<float>() + g.numel());
  }
  return flat;
}

absl::Status SaveParameters(const Setup& s, const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (const auto& p : s.params) {
    const torch::Tensor c = p.detach().contiguous();
    out.write(reinterpret_cast<const char*>(c.data_ptr<float>()),
              static_cast<std::streamsize>(c.numel() * 4));
  }
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write the parameters to ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> Contribution(const TrainerConfig& c, const Setup& s,
                                                GradientBoard* board,
                                                const aggregators::Aggregator* rule, uint64_t round,
                                                std::vector<float> own) {
  const bool byzantine = s.attack != nullptr;
  if (board != nullptr && board->Publishes(byzantine)) {
    PS_RETURN_IF_ERROR(board->Publish(round, c.worker_id, own));
  }
  if (!byzantine) return own;
  std::vector<std::vector<float>> seen;
  if (board != nullptr && s.attack->omniscient()) {
    PS_ASSIGN_OR_RETURN(seen, board->Collect(round, c.pull_timeout));
  }
  std::vector<std::span<const float>> honest(seen.begin(), seen.end());
  attacks::AttackContext ctx;
  ctx.own = own;
  ctx.honest = honest;
  ctx.num_workers = static_cast<int>(c.workers);
  ctx.num_byzantine = static_cast<int>(c.byzantine);
  ctx.rule = rule;
  ctx.shared_search = board != nullptr ? board->shared_search() : nullptr;
  ctx.pool = s.attack_pool.get();
  ctx.seed = c.seed;
  ctx.worker_id = c.worker_id;
  ctx.round = round;
  std::vector<float> out(own.size());
  PS_RETURN_IF_ERROR(s.attack->Apply(ctx, out));
  return out;
}

void SetGradients(Setup& s, const std::vector<float>& flat) {
  torch::NoGradGuard no_grad;
  size_t at = 0;
  for (auto& p : s.params) {
    torch::Tensor g = p.mutable_grad();
    std::memcpy(g.data_ptr<float>(), flat.data() + at,
                static_cast<size_t>(g.numel()) * sizeof(float));
    at += static_cast<size_t>(g.numel());
  }
}

absl::StatusOr<std::unique_ptr<aggregators::Aggregator>> AttackRule(const TrainerConfig& c,
                                                                    const Setup& s) {
  if (s.attack == nullptr || !s.attack->needs_rule()) return nullptr;
  aggregators::AggregatorOptions options;
  options.num_workers = static_cast<int>(c.workers);
  options.num_byzantine = static_cast<int>(c.byzantine);
  return aggregators::MakeAggregator(c.rule, options);
}

}  // namespace ps::fashion_mnist
