#include "examples/fashion_mnist/model.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace ps::fashion_mnist {
namespace {

// Mean and standard deviation of Fashion-MNIST training pixels in [0, 1].
constexpr float kPixelMean = 0.2860f;
constexpr float kPixelStd = 0.3530f;

}  // namespace

Mlp::Mlp(int64_t inputs, int64_t hidden, int64_t classes)
    : fc1_(register_module("fc1", torch::nn::Linear(inputs, hidden))),
      fc2_(register_module("fc2", torch::nn::Linear(hidden, classes))) {}

torch::Tensor Mlp::forward(torch::Tensor x) {
  BeforeForward(*fc1_);
  x = torch::relu(fc1_(x));
  BeforeForward(*fc2_);
  return fc2_(x);
}

Cnn::Cnn(int64_t classes)
    : conv1_(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 5)))),
      conv2_(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 5)))),
      fc_(register_module("fc", torch::nn::Linear(16 * 4 * 4, classes))) {}

torch::Tensor Cnn::forward(torch::Tensor x) {
  x = x.view({-1, 1, 28, 28});
  BeforeForward(*conv1_);
  x = torch::max_pool2d(torch::relu(conv1_(x)), 2);  // 8 x 12 x 12
  BeforeForward(*conv2_);
  x = torch::max_pool2d(torch::relu(conv2_(x)), 2);  // 16 x 4 x 4
  BeforeForward(*fc_);
  return fc_(x.flatten(1));
}

absl::StatusOr<std::shared_ptr<Classifier>> MakeClassifier(std::string_view kind, int64_t hidden) {
  if (kind == "mlp") {
    if (hidden <= 0) return absl::InvalidArgumentError("mlp: hidden width must be positive");
    return std::shared_ptr<Classifier>(std::make_shared<Mlp>(kImagePixels, hidden, kNumClasses));
  }
  if (kind == "cnn") return std::shared_ptr<Classifier>(std::make_shared<Cnn>(kNumClasses));
  return absl::InvalidArgumentError(
      absl::StrCat("unknown model '", core::AsAbsl(kind), "'; known: mlp, cnn"));
}

std::pair<torch::Tensor, torch::Tensor> MakeBatch(const Dataset& data,
                                                  std::span<const uint32_t> indices) {
  const auto batch = static_cast<int64_t>(indices.size());
  const size_t pixels = data.images.image_size();
  torch::Tensor x = torch::empty({batch, static_cast<int64_t>(pixels)}, torch::kFloat32);
  torch::Tensor y = torch::empty({batch}, torch::kInt64);
  float* xp = x.data_ptr<float>();
  int64_t* yp = y.data_ptr<int64_t>();
  constexpr float kScale = 1.0f / (255.0f * kPixelStd);
  constexpr float kShift = kPixelMean / kPixelStd;
  for (int64_t b = 0; b < batch; ++b) {
    const uint32_t index = indices[static_cast<size_t>(b)];
    const uint8_t* src = data.images.pixels.data() + size_t{index} * pixels;
    float* dst = xp + static_cast<size_t>(b) * pixels;
    for (size_t p = 0; p < pixels; ++p) dst[p] = static_cast<float>(src[p]) * kScale - kShift;
    yp[b] = data.labels[index];
  }
  return {x, y};
}

double Accuracy(Classifier& model, const Dataset& data, size_t chunk) {
  torch::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  int64_t correct = 0;
  std::vector<uint32_t> indices;
  for (size_t begin = 0; begin < data.size(); begin += chunk) {
    const size_t end = std::min(data.size(), begin + chunk);
    indices.resize(end - begin);
    std::iota(indices.begin(), indices.end(), static_cast<uint32_t>(begin));
    auto [x, y] = MakeBatch(data, indices);
    correct += model.forward(x).argmax(1).eq(y).sum().item<int64_t>();
  }
  model.train(was_training);
  return data.size() == 0 ? 0.0 : static_cast<double>(correct) / static_cast<double>(data.size());
}

}  // namespace ps::fashion_mnist
