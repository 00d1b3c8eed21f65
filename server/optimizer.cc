#include "server/optimizer.h"

#include <cstddef>

namespace ps::server {

void SgdStep(const SgdOptions& opt, std::span<const float> grad, std::span<float> velocity,
             std::span<float> params) {
  const float lr = opt.learning_rate;
  const float mu = opt.momentum;
  const float wd = opt.weight_decay;
  const float* g = grad.data();
  float* v = velocity.data();
  float* w = params.data();
  const size_t n = params.size();
  for (size_t i = 0; i < n; ++i) {
    const float d = g[i] + wd * w[i];
    v[i] = mu * v[i] + d;
    w[i] -= lr * v[i];
  }
}

}  // namespace ps::server
