// ps::worker_torch::TorchWorker: the libtorch adapter of ps::Worker (docs/examples.md, "libtorch adapter"; P3: docs/transport.md).
//
// It drives a ps::Worker from a torch::nn::Module's own parameters: one layout tensor
// per parameter (named as in named_parameters(), in that order), a pull that writes
// straight into the parameters' storage, and a gradient hook on every parameter that
// pushes its gradient as soon as autograd produces it (the last layer's first), so
// the shards aggregate while backward still runs on the first layers. The next
// forward pass waits module by module: a layer starts as soon as its own parameters
// arrived, while later layers' are still in flight.
//
// Once, the forward pre-hook (torch::nn::Module has none in C++: the model calls one
// of its own before each layer, as examples/fashion_mnist's
// Classifier::set_before_forward does):
//
//   model.set_before_forward([tw](torch::nn::Module& layer) {
//     tw->AwaitModule(layer).IgnoreError();  // a failed pull comes out of AwaitAll()
//   });
//
// then every step of round t (the Worker's rounds: gradients computed on version t
// are pushed for round t, and the shards then publish version t + 1):
//
//   PS_RETURN_IF_ERROR(tw->StartPull(t, timeout));          // returns at once
//   torch::Tensor loss = Loss(model.forward(x), y);          // each layer waits for its own
//   PS_ASSIGN_OR_RETURN(uint64_t version, tw->AwaitAll());   // > t: rounds were skipped
//   PS_RETURN_IF_ERROR(tw->BeginStep(t));
//   loss.backward();                                         // the hooks push
//   PS_RETURN_IF_ERROR(tw->FinishStep());                    // the shards' answers
//
// A layer whose parameters were not awaited must not run: the pull may still be
// writing them. Backward reads the parameters forward used; AwaitAll() before
// backward also covers parameters no awaited layer owns.
//
// What is pushed: the gradient autograd hands the parameter's AccumulateGrad, i.e.
// exactly what a zeroed .grad accumulates (-0.0 is pushed as +0.0, as 0 + g gives),
// copied before the hook returns; .grad itself is filled as usual. A parameter that
// got no gradient in a step (unused in forward, or requires_grad false) is pushed as
// zeros by FinishStep(): the shards need every slice to close the round. Backward
// outside a step (no BeginStep) pushes nothing; under torch::NoGradGuard (evaluation)
// no hook runs at all.
//
// Requirements: every parameter is a defined, contiguous fp32 CPU tensor (Start and
// Attach refuse others, naming the parameter); the parameters keep their storage for
// the adapter's lifetime (no reassigning a parameter, no resize); one backward per
// step (a second gradient of one parameter in a round is an error).
//
// Ownership: the adapter keeps handles to the parameters (their storage stays alive)
// but not to the module. Start() owns the Worker it starts; Attach() borrows one that
// must outlive the adapter. The destructor removes the hooks and waits for a pull in
// progress.
//
// Thread safety: every method may be called from any thread, but the step methods
// are meant for the one training thread, in the order above (as the model itself,
// which torch does not make thread-safe). The pull methods serialize: a wait blocks
// StartPull and the other waits. The gradient hooks may run on autograd's threads;
// FinishStep waits for hooks still running. Errors inside a hook are recorded, never
// thrown through autograd, and come out of FinishStep(). worker() is as thread-safe
// as ps::Worker.
//
// The header carries no gRPC types.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/layout.h"
#include "worker_lib/worker.h"

namespace ps::worker_torch {

struct TorchWorkerOptions {
  // Elements per slice of the layout (core::ModelLayout::Create); kJobSliceElems (the
  // default): the job's, as Worker::Start resolves it (MakeLayout then cuts slices of
  // core::kDefaultSliceElems; worker().layout() tells the size used).
  uint32_t slice_elems = kJobSliceElems;
  // Send priority by parameter name, lower = more urgent (P3). A parameter not named
  // here gets its index in named_parameters(): a module's own parameters, then each
  // child's in registration order, recursively; that is forward order for a model
  // that registers its layers as children in the order it runs them. An unknown name
  // is an error.
  std::map<std::string, int32_t, std::less<>> priority;
};

// The layout of `model`'s parameters for `num_shards` shards: one tensor per
// parameter of named_parameters() (recursive), in that order; a parameter of two or
// more dimensions is a matrix of size(0) rows (TensorSpec::row_elems), so its slices
// hold whole rows (for PowerSGD's per-slice factorization). Refuses a parameter that
// is undefined, not fp32, not on the CPU or not contiguous, with its name.
absl::StatusOr<core::ModelLayout> MakeLayout(const torch::nn::Module& model, uint32_t num_shards,
                                             const TorchWorkerOptions& options = {});

class TorchWorker {
 public:
  // Builds the layout of `model` (MakeLayout, with options.shard_addresses.size()
  // shards), starts a Worker with the parameters' current values as initial values
  // (used when this worker registers the model) and attaches to it. Its pushes borrow
  // (PushOptions::borrow, for every tensor): the adapter pushes from buffers of its own
  // and waits for the answers (FinishStep) before it writes them again, so the copy
  // into a payload is never needed.
  static absl::StatusOr<std::unique_ptr<TorchWorker>> Start(WorkerOptions options,
                                                            torch::nn::Module& model,
                                                            const TorchWorkerOptions& torch_options = {});

  // Attaches to a started Worker (borrowed: it must outlive the adapter) whose layout
  // has `model`'s parameters in named_parameters() order with their names and sizes,
  // as MakeLayout() gives. For callers that decide the Worker's lifetime themselves.
  static absl::StatusOr<std::unique_ptr<TorchWorker>> Attach(Worker& worker, torch::nn::Module& model);

  // Removes the hooks and waits for a pull in progress.
  virtual ~TorchWorker() = default;
  TorchWorker(const TorchWorker&) = delete;
  TorchWorker& operator=(const TorchWorker&) = delete;

  virtual Worker& worker() = 0;

  // Starts pulling every parameter at version >= min_version into its own storage
  // (Worker::StartPullAll) and returns at once. A pull not yet waited for is waited
  // for first (its outcome dropped). FAILED_PRECONDITION while a step is open: the
  // pull would overwrite parameters that backward reads.
  virtual absl::Status StartPull(uint64_t min_version, std::chrono::milliseconds timeout) = 0;

  // Blocks until the parameters that belong directly to `module`
  // (module.parameters(/*recurse=*/false)), or with `recurse` all of its parameters,
  // hold the pulled values. OK at once without a pull or for a module without
  // parameters. On a failed pull it waits until nothing writes into the parameters
  // any more and returns the pull's error. INVALID_ARGUMENT for a parameter that is
  // not one of the model's.
  virtual absl::Status AwaitModule(const torch::nn::Module& module, bool recurse = false) = 0;

  // Blocks until the whole pull has arrived; returns the lowest version received
  // (above the requested one when the shards closed rounds without this worker) or
  // the pull's error, the same on every call until the next StartPull().
  // FAILED_PRECONDITION when no pull was started.
  virtual absl::StatusOr<uint64_t> AwaitAll() = 0;

  // Opens the step of `round`: from now on each parameter's gradient hook pushes for
  // it. FAILED_PRECONDITION when a step is already open.
  virtual absl::Status BeginStep(uint64_t round) = 0;

  // Closes the step: waits for hooks still running, pushes zeros for the parameters
  // that got no gradient, and waits until every push is answered
  // (Worker::WaitPushes). Returns OK, or the first error of a hook (an invalid
  // gradient, a push the Worker refused, a second gradient in the round), else the
  // first refusal of a shard (OUT_OF_RANGE: the round closed without this worker).
  // FAILED_PRECONDITION when no step is open.
  virtual absl::Status FinishStep() = 0;

 protected:
  TorchWorker() = default;
};

}  // namespace ps::worker_torch
