#include "worker_lib/torch/torch_worker.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/status.h"

namespace ps::worker_torch {
namespace {

// The parameters of `model` in named_parameters() order, refused with their name
// unless each is a defined, contiguous fp32 CPU tensor.
absl::Status CollectParameters(const torch::nn::Module& model, std::vector<torch::Tensor>& params,
                               std::vector<std::string>& names) {
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const torch::Tensor& p = item.value();
    const std::string& name = item.key();
    if (!p.defined()) return absl::InvalidArgumentError(absl::StrCat("parameter '", name, "' is undefined"));
    if (p.scalar_type() != torch::kFloat32) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", name, "' is ",
                                                     c10::toString(p.scalar_type()),
                                                     "; the parameter server takes fp32 (Float) only"));
    }
    if (!p.device().is_cpu()) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", name, "' is on ", p.device().str(),
                                                     "; only CPU parameters are supported"));
    }
    if (!p.is_contiguous()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter '", name, "' is not contiguous; the pull writes into its storage in row-major order"));
    }
    if (p.numel() == 0) return absl::InvalidArgumentError(absl::StrCat("parameter '", name, "' is empty"));
    params.push_back(p);
    names.push_back(name);
  }
  if (params.empty()) return absl::InvalidArgumentError("the model has no parameters");
  return absl::OkStatus();
}

class TorchWorkerImpl final : public TorchWorker {
 public:
  TorchWorkerImpl(Worker* worker, std::unique_ptr<Worker> owned, std::vector<torch::Tensor> params,
                  std::vector<std::string> names)
      : owned_(std::move(owned)), worker_(worker), params_(std::move(params)), names_(std::move(names)) {
    for (size_t i = 0; i < params_.size(); ++i) {
      index_.emplace(params_[i].unsafeGetTensorImpl(), i);
      outs_.emplace_back(params_[i].data_ptr<float>(), static_cast<size_t>(params_[i].numel()));
      staging_.emplace_back(static_cast<size_t>(params_[i].numel()));
    }
    produced_.assign(params_.size(), false);
    hooks_.assign(params_.size(), std::nullopt);
  }

  ~TorchWorkerImpl() override {
    for (size_t i = 0; i < params_.size(); ++i) {
      if (hooks_[i].has_value()) params_[i].remove_hook(*hooks_[i]);
    }
    {
      absl::MutexLock lock(&step_mu_);
      auto idle = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return hooks_running_ == 0; };
      step_mu_.Await(absl::Condition(&idle));
    }
    absl::MutexLock lock(&pull_mu_);
    ticket_.reset();  // waits for the pull; the Worker is still alive
  }

  // register_hook throws (c10::Error) for a tensor that needs no gradient; those are
  // skipped and pushed as zeros by FinishStep().
  absl::Status RegisterHooks() {
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!params_[i].requires_grad()) continue;
      try {
        hooks_[i] = params_[i].register_hook([this, i](torch::Tensor grad) { OnGradient(i, grad); });
      } catch (const std::exception& e) {
        return absl::InternalError(
            absl::StrCat("parameter '", names_[i], "': cannot register a gradient hook: ", e.what()));
      }
    }
    return absl::OkStatus();
  }

  Worker& worker() override { return *worker_; }

  absl::Status StartPull(uint64_t min_version, std::chrono::milliseconds timeout) override {
    {
      absl::MutexLock lock(&step_mu_);
      if (step_open_) {
        return absl::FailedPreconditionError(absl::StrCat(
            "StartPull(", min_version, ") while the step of round ", round_,
            " is open: the pull would overwrite parameters backward reads (FinishStep first)"));
      }
    }
    absl::MutexLock lock(&pull_mu_);
    DrainPullLocked();
    pull_result_.reset();
    absl::StatusOr<std::unique_ptr<PullTicket>> ticket = worker_->StartPullAll(min_version, outs_, timeout);
    if (!ticket.ok()) {
      pull_result_ = ticket.status();
      return ticket.status();
    }
    ticket_ = *std::move(ticket);
    return absl::OkStatus();
  }

  absl::Status AwaitModule(const torch::nn::Module& module, bool recurse) override {
    std::vector<size_t> wanted;
    for (const torch::Tensor& p : module.parameters(recurse)) {
      auto it = index_.find(p.unsafeGetTensorImpl());
      if (it == index_.end()) {
        return absl::InvalidArgumentError(absl::StrCat("module ", module.name(),
                                                       " has a parameter that is not one of the model's"));
      }
      wanted.push_back(it->second);
    }
    absl::MutexLock lock(&pull_mu_);
    if (ticket_ == nullptr) {
      // No pull, or it ended: only an error is worth reporting.
      if (pull_result_.has_value() && !pull_result_->ok()) return pull_result_->status();
      return absl::OkStatus();
    }
    for (size_t tensor : wanted) {
      absl::Status status = ticket_->WaitTensor(tensor);
      if (!status.ok()) {
        // Other shards may still be writing into other parameters: let the pull end
        // before the caller goes on.
        DrainPullLocked();
        return status;
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> AwaitAll() override {
    absl::MutexLock lock(&pull_mu_);
    DrainPullLocked();
    if (!pull_result_.has_value()) return absl::FailedPreconditionError("AwaitAll() without StartPull()");
    return *pull_result_;
  }

  absl::Status BeginStep(uint64_t round) override {
    absl::MutexLock lock(&step_mu_);
    if (step_open_) {
      return absl::FailedPreconditionError(
          absl::StrCat("BeginStep(", round, ") while the step of round ", round_, " is open"));
    }
    step_open_ = true;
    round_ = round;
    produced_.assign(params_.size(), false);
    hook_error_ = absl::OkStatus();
    return absl::OkStatus();
  }

  absl::Status FinishStep() override {
    std::vector<size_t> missing;
    uint64_t round = 0;
    absl::Status first;
    {
      absl::MutexLock lock(&step_mu_);
      if (!step_open_) return absl::FailedPreconditionError("FinishStep() without BeginStep()");
      auto idle = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return hooks_running_ == 0; };
      step_mu_.Await(absl::Condition(&idle));
      step_open_ = false;  // later hooks push nothing
      round = round_;
      first = hook_error_;
      for (size_t i = 0; i < params_.size(); ++i) {
        if (!produced_[i]) missing.push_back(i);
      }
    }
    for (size_t i : missing) {
      std::vector<float>& zeros = staging_[i];
      std::fill(zeros.begin(), zeros.end(), 0.0f);
      absl::Status status = worker_->Push(i, round, zeros);
      if (!status.ok() && first.ok()) first = status;
    }
    // Always wait, so that the next step starts with nothing in flight.
    absl::Status answered = worker_->WaitPushes();
    return first.ok() ? answered : first;
  }

 private:
  // Runs inside autograd: records errors, never throws.
  void OnGradient(size_t tensor, const torch::Tensor& grad) {
    uint64_t round = 0;
    {
      absl::MutexLock lock(&step_mu_);
      if (!step_open_) return;
      if (produced_[tensor]) {
        if (hook_error_.ok()) {
          hook_error_ = absl::FailedPreconditionError(
              absl::StrCat("a second gradient of '", names_[tensor], "' in round ", round_,
                           " (one backward per step); not pushed"));
        }
        return;
      }
      produced_[tensor] = true;
      ++hooks_running_;
      round = round_;
    }
    absl::Status status = PushGradient(tensor, round, grad);
    absl::MutexLock lock(&step_mu_);
    --hooks_running_;
    if (!status.ok() && hook_error_.ok()) hook_error_ = status;
  }

  absl::Status PushGradient(size_t tensor, uint64_t round, const torch::Tensor& grad) {
    std::vector<float>& staged = staging_[tensor];
    try {
      if (!grad.defined()) {
        std::fill(staged.begin(), staged.end(), 0.0f);
      } else {
        if (grad.scalar_type() != torch::kFloat32 || !grad.device().is_cpu() ||
            static_cast<size_t>(grad.numel()) != staged.size()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "gradient of '", names_[tensor], "' is ", c10::toString(grad.scalar_type()), " on ",
              grad.device().str(), " with ", grad.numel(), " elements; expected fp32 on the CPU with ",
              staged.size()));
        }
        const torch::Tensor dense = grad.contiguous();
        const float* g = dense.data_ptr<float>();
        // 0 + g, as a zeroed .grad accumulates it: -0.0 becomes +0.0, so that the push is
        // bit for bit the .grad a zero_grad() + backward() leaves.
        for (size_t j = 0; j < staged.size(); ++j) staged[j] = 0.0f + g[j];
      }
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("gradient of '", names_[tensor], "': torch: ", e.what()));
    }
    return worker_->Push(tensor, round, staged);
  }

  void DrainPullLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(pull_mu_) {
    if (ticket_ == nullptr) return;
    pull_result_ = ticket_->Wait();
    ticket_.reset();
  }

  std::unique_ptr<Worker> owned_;  // null when attached to a borrowed Worker
  Worker* const worker_;           // owned_ or borrowed
  const std::vector<torch::Tensor> params_;  // named_parameters() order = layout order
  const std::vector<std::string> names_;
  absl::flat_hash_map<const void*, size_t> index_;  // TensorImpl -> tensor index
  std::vector<std::span<float>> outs_;               // the parameters' storage
  std::vector<std::optional<unsigned>> hooks_;       // hook handle per parameter
  // Per-parameter copy of the gradient being pushed: only the tensor's own hook (once
  // per step, flagged under step_mu_) or FinishStep (after the hooks) touches it.
  std::vector<std::vector<float>> staging_;

  absl::Mutex pull_mu_;
  std::unique_ptr<PullTicket> ticket_ ABSL_GUARDED_BY(pull_mu_);
  // Outcome of the last pull once it ended; empty while it runs or before any.
  std::optional<absl::StatusOr<uint64_t>> pull_result_ ABSL_GUARDED_BY(pull_mu_);

  absl::Mutex step_mu_;
  bool step_open_ ABSL_GUARDED_BY(step_mu_) = false;
  uint64_t round_ ABSL_GUARDED_BY(step_mu_) = 0;
  std::vector<bool> produced_ ABSL_GUARDED_BY(step_mu_);  // gradient seen this step
  int hooks_running_ ABSL_GUARDED_BY(step_mu_) = 0;
  absl::Status hook_error_ ABSL_GUARDED_BY(step_mu_);
};

absl::StatusOr<std::unique_ptr<TorchWorker>> Make(Worker* worker, std::unique_ptr<Worker> owned,
                                                  std::vector<torch::Tensor> params,
                                                  std::vector<std::string> names) {
  auto tw = std::make_unique<TorchWorkerImpl>(worker, std::move(owned), std::move(params), std::move(names));
  PS_RETURN_IF_ERROR(tw->RegisterHooks());
  return std::unique_ptr<TorchWorker>(std::move(tw));
}

}  // namespace

absl::StatusOr<core::ModelLayout> MakeLayout(const torch::nn::Module& model, uint32_t num_shards,
                                             const TorchWorkerOptions& options) {
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;
  PS_RETURN_IF_ERROR(CollectParameters(model, params, names));
  std::vector<core::TensorSpec> specs;
  for (size_t i = 0; i < params.size(); ++i) {
    // A weight (out x in, or out x in x kh x kw) is a matrix of out rows to the codecs
    // that factor matrices: its slices hold whole rows.
    const auto numel = static_cast<uint64_t>(params[i].numel());
    const uint32_t row_elems =
        params[i].dim() >= 2 ? static_cast<uint32_t>(numel / params[i].size(0)) : 0;
    specs.push_back({names[i], numel, static_cast<int32_t>(i), row_elems});
  }
  for (const auto& [name, priority] : options.priority) {
    auto it = std::find_if(specs.begin(), specs.end(),
                           [&](const core::TensorSpec& s) { return s.name == name; });
    if (it == specs.end()) {
      return absl::InvalidArgumentError(absl::StrCat("priority for '", name, "', which is not a parameter"));
    }
    it->priority = priority;
  }
  return core::ModelLayout::Create(
      std::move(specs),
      options.slice_elems == kJobSliceElems ? core::kDefaultSliceElems : options.slice_elems,
      num_shards);
}

absl::StatusOr<std::unique_ptr<TorchWorker>> TorchWorker::Start(WorkerOptions options,
                                                                torch::nn::Module& model,
                                                                const TorchWorkerOptions& torch_options) {
  const auto num_shards = static_cast<uint32_t>(options.shard_addresses.size());
  PS_ASSIGN_OR_RETURN(core::ModelLayout layout, MakeLayout(model, num_shards, torch_options));
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;
  PS_RETURN_IF_ERROR(CollectParameters(model, params, names));
  std::vector<std::span<const float>> initial;
  for (const torch::Tensor& p : params) {
    initial.emplace_back(p.data_ptr<float>(), static_cast<size_t>(p.numel()));
  }
  // The staging buffers are written only after FinishStep's WaitPushes.
  options.push.borrow = true;
  for (auto& [name, push] : options.tensor_push) push.borrow = true;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Worker> worker,
                      Worker::Start(std::move(options), layout.tensors(),
                                    torch_options.slice_elems, initial));
  Worker* raw = worker.get();
  return Make(raw, std::move(worker), std::move(params), std::move(names));
}

absl::StatusOr<std::unique_ptr<TorchWorker>> TorchWorker::Attach(Worker& worker, torch::nn::Module& model) {
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;
  PS_RETURN_IF_ERROR(CollectParameters(model, params, names));
  const std::vector<core::TensorSpec>& tensors = worker.layout().tensors();
  if (tensors.size() != params.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the Worker's layout has ", tensors.size(),
                                                   " tensors but the model ", params.size(), " parameters"));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (tensors[i].name != names[i] || tensors[i].numel != static_cast<uint64_t>(params[i].numel())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", i, " of the Worker's layout is '", tensors[i].name, "' of ", tensors[i].numel,
          " elements but the model's parameter ", i, " is '", names[i], "' of ", params[i].numel()));
    }
  }
  return Make(&worker, nullptr, std::move(params), std::move(names));
}

}  // namespace ps::worker_torch
