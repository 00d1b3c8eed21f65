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

// Real path of the shared library whose sgemm_ libtorch's CPU matrix products call
// (Debian's libtorch uses the system libblas.so.3, chosen by update-alternatives), or
// empty when the process has no such symbol.
std::string BlasLibraryPath();

// Whether `path` is Debian's reference BLAS (.../blas/libblas.so.3, the netlib
// implementation): training on it runs about 3x slower than on OpenBLAS.
bool IsReferenceBlas(std::string_view path);

// Whether `path` is Debian's single-threaded OpenBLAS (.../openblas-serial/, package
// libopenblas0-serial 0.3.21, built without OpenBLAS's USE_LOCKING): it returns wrong
// matrix products when several threads call it at once (docs/examples.md), so it must
// not serve workers that train as threads of one process.
bool IsThreadUnsafeBlas(std::string_view path);

// Sets torch and OpenBLAS to one thread per caller (the workers run in parallel, and a
// run repeats exactly) and, once per process, warns on stderr when the BLAS is the
// reference one, naming the package that replaces it. `threads` is how many workers
// train as threads of this process: above 1, a BLAS that is not safe to call from
// several threads at once is refused (FAILED_PRECONDITION naming the package to
// install) instead of training on wrong products.
absl::Status ConfigureTorchForWorkers(uint32_t threads);

}  // namespace ps::fashion_mnist
