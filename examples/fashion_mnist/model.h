// The Fashion-MNIST model and the torch side of the data: a 784-hidden-10 MLP with
// ReLU, batches built from the raw IDX bytes, and test-set accuracy.
//
// Parameters are registered in forward order (fc1.weight, fc1.bias, fc2.weight,
// fc2.bias), which is the order the parameter server's layout and priorities use.
// torch modules are not thread-safe; one thread uses a model.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <span>
#include <utility>

#include "examples/fashion_mnist/idx.h"

namespace ps::fashion_mnist {

inline constexpr int64_t kImagePixels = 28 * 28;

class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(int64_t inputs, int64_t hidden, int64_t classes);
  // x: [batch, inputs] float; returns logits [batch, classes].
  torch::Tensor forward(torch::Tensor x);

 private:
  torch::nn::Linear fc1_{nullptr};
  torch::nn::Linear fc2_{nullptr};
};
TORCH_MODULE(Mlp);

// Images `indices` of `data` as normalized floats [batch, 784] and labels int64 [batch].
std::pair<torch::Tensor, torch::Tensor> MakeBatch(const Dataset& data,
                                                  std::span<const uint32_t> indices);

// Fraction of `data` the model classifies correctly (evaluated in chunks, no grad).
double Accuracy(Mlp& model, const Dataset& data, size_t chunk = 1000);

}  // namespace ps::fashion_mnist
