// The Fashion-MNIST models and the torch side of the data: a 784-hidden-10 MLP with
// ReLU and a small CNN (two 5x5 convolutions with max pooling, then a linear layer),
// batches built from the raw IDX bytes, and test-set accuracy.
//
// Parameters are registered in forward order (fc1.weight, fc1.bias, fc2.weight,
// fc2.bias for the MLP), which is the order the parameter server's layout and
// priorities use. torch::nn has no forward pre-hooks in C++, so a Classifier calls its
// own (set_before_forward) with each layer right before that layer runs: the libtorch
// adapter waits there for the layer's freshly pulled parameters
// (worker_lib/torch/torch_worker.h). torch modules are not thread-safe; one thread
// uses a model.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"
#include "examples/fashion_mnist/idx.h"

namespace ps::fashion_mnist {

inline constexpr int64_t kImagePixels = 28 * 28;

// A classifier of flattened 28 x 28 images: x [batch, 784] float -> logits [batch, 10].
class Classifier : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(torch::Tensor x) = 0;

  // Called in forward() with each layer (Mlp: fc1, fc2; Cnn: conv1, conv2, fc) right
  // before that layer's forward, on the calling thread; empty (the default): nothing.
  void set_before_forward(std::function<void(torch::nn::Module&)> hook) {
    before_forward_ = std::move(hook);
  }

 protected:
  // Runs the before-forward hook on `layer`.
  void BeforeForward(torch::nn::Module& layer) {
    if (before_forward_) before_forward_(layer);
  }

 private:
  std::function<void(torch::nn::Module&)> before_forward_;
};

class Mlp final : public Classifier {
 public:
  Mlp(int64_t inputs, int64_t hidden, int64_t classes);
  torch::Tensor forward(torch::Tensor x) override;

 private:
  torch::nn::Linear fc1_{nullptr};
  torch::nn::Linear fc2_{nullptr};
};

// conv1 (1 -> 8, 5x5) relu maxpool2, conv2 (8 -> 16, 5x5) relu maxpool2, fc (256 -> 10):
// 5,994 parameters.
class Cnn final : public Classifier {
 public:
  explicit Cnn(int64_t classes);
  torch::Tensor forward(torch::Tensor x) override;

 private:
  torch::nn::Conv2d conv1_{nullptr};
  torch::nn::Conv2d conv2_{nullptr};
  torch::nn::Linear fc_{nullptr};
};

// "mlp" (with `hidden` units) or "cnn"; its parameters come from torch's generator
// (torch::manual_seed first for identical models everywhere).
absl::StatusOr<std::shared_ptr<Classifier>> MakeClassifier(std::string_view kind, int64_t hidden);

// Images `indices` of `data` as normalized floats [batch, 784] and labels int64 [batch].
std::pair<torch::Tensor, torch::Tensor> MakeBatch(const Dataset& data,
                                                  std::span<const uint32_t> indices);

// Fraction of `data` the model classifies correctly (evaluated in chunks, no grad).
double Accuracy(Classifier& model, const Dataset& data, size_t chunk = 1000);

}  // namespace ps::fashion_mnist
