// One worker's model for the training loops of training.cc: the model, its batches and
// its attack (Setup), a batch's forward and backward passes, flat views of the gradients
// and parameters in parameter order, what the worker contributes to a round (its gradient
// or its attack's vector), --dump-gradients and --save-parameters. Internal to
// examples/fashion_mnist.
#pragma once

#include <torch/torch.h>

#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "aggregators/aggregator.h"
#include "core/thread_pool.h"
#include "examples/fashion_mnist/model.h"
#include "examples/fashion_mnist/partition.h"
#include "examples/fashion_mnist/training.h"
#include "worker_lib/attacks/attack.h"

namespace ps::fashion_mnist {

// Everything both modes share: model, sampler, attack.
struct Setup {
  std::shared_ptr<Classifier> model;
  std::vector<torch::Tensor> params;  // forward order
  std::vector<std::string> names;
  std::unique_ptr<BatchSampler> sampler;
  std::unique_ptr<attacks::Attack> attack;  // null: honest
  // Threads for an optimized attack's search: the honest workers wait for the attackers'
  // pushes meanwhile, so their cores are free.
  std::unique_ptr<core::ThreadPool> attack_pool;
  bool evaluates = false;
};

// The model (seeded by config, the same on every worker), this worker's part of the
// training set and its attack. FAILED_PRECONDITION when this worker evaluates without a
// test set.
absl::StatusOr<Setup> Prepare(const TrainerConfig& c, const TrainingData& data, bool local);

// True when training has blown up: a parameter is not finite or its magnitude exceeds
// `limit` (0: no magnitude limit). Every worker checks the same pulled version, so all
// of them stop at the same round; checking before gradients overflow keeps every push
// finite (a shard refuses non-finite pushes).
bool Diverged(const std::vector<torch::Tensor>& tensors, double limit);

// The next batch's forward pass, with zeroed gradients; returns the loss. A
// label-flipping attacker trains on label 9 - y.
torch::Tensor Forward(Setup& s, const Dataset& train, uint32_t batch_size,
                      std::vector<uint32_t>& indices);
// One batch: forward, backward; returns the loss. Gradients land in param.grad().
double ComputeGradients(Setup& s, const Dataset& train, uint32_t batch_size,
                        std::vector<uint32_t>& indices);

int64_t CountParameters(const Setup& s);
// The gradient of every parameter (or the parameters themselves), concatenated in
// parameter order.
std::vector<float> Flat(const Setup& s, bool gradients);
inline std::vector<float> FlatGradient(const Setup& s) { return Flat(s, /*gradients=*/true); }
// Copies flat (parameter order) into the parameters' gradients.
void SetGradients(Setup& s, const std::vector<float>& flat);

// --dump-gradients: the gradients as raw little-endian fp32, appended tensor by tensor
// (real data for `ps-bench codecs --data real --gradients FILE`).
class GradientDump {
 public:
  static absl::StatusOr<GradientDump> Open(const std::string& path) {
    GradientDump d;
    d.path_ = path;
    if (path.empty()) return d;
    d.file_.reset(std::fopen(path.c_str(), "wb"));
    if (d.file_ == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--dump-gradients: cannot open '", path, "' for writing"));
    }
    return d;
  }
  bool enabled() const { return file_ != nullptr; }
  absl::Status Write(std::span<const float> values) {
    if (file_ == nullptr) return absl::OkStatus();
    if (std::fwrite(values.data(), sizeof(float), values.size(), file_.get()) != values.size()) {
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

// Writes the parameters, concatenated in parameter order, as raw fp32 to `path`.
absl::Status SaveParameters(const Setup& s, const std::string& path);

// What this worker contributes this round, flattened: its gradient, or its attack's
// vector computed from it (and from the board's gradients for omniscient attacks).
absl::StatusOr<std::vector<float>> Contribution(const TrainerConfig& c, const Setup& s,
                                                GradientBoard* board,
                                                const aggregators::Aggregator* rule, uint64_t round,
                                                std::vector<float> own);

// The rule the optimized attacks search against (null when the attack needs none).
absl::StatusOr<std::unique_ptr<aggregators::Aggregator>> AttackRule(const TrainerConfig& c,
                                                                    const Setup& s);

}  // namespace ps::fashion_mnist
