// SGD with momentum and weight decay, applied by a shard to the slices it owns, in
// PyTorch's convention:  v <- momentum * v + (g + weight_decay * w);  w <- w - lr * v.
// Stateless apart from the velocity buffer the caller owns per slice.
#pragma once

#include <span>

namespace ps::server {

struct SgdOptions {
  float learning_rate = 0.1f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;
};

// Applies one step to params in place; velocity has params.size() elements (zero at
// first). grad has the same size.
void SgdStep(const SgdOptions& opt, std::span<const float> grad, std::span<float> velocity,
             std::span<float> params);

}  // namespace ps::server
