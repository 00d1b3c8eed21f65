// AdaComm's period for local-update training (Wang and Joshi, "Adaptive communication
// strategies to achieve the best error-runtime trade-off in local-update SGD", SysML
// 2019; docs/adaptive.md "AdaComm"). Workers take tau local SGD steps between
// synchronizations and push the change of their parameters; tau falls as the training
// loss F does:
//
//   tau_l = ceil(sqrt(F(x_l) / F(x_0)) * tau_0)                        fixed step size
//   tau_l = ceil(sqrt(eta_0 F(x_l) / (eta_l F(x_0))) * tau_0)          decaying step size
//
// F(x_l) and F(x_0) come from the shards (ps::PublishedLoss): medians of the losses the
// workers reported, so f < n/2 Byzantine workers cannot steer tau outside what the
// honest losses give, and every honest worker computes the same tau from the same
// published values.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "worker_lib/worker.h"

namespace ps {

struct AdaCommOptions {
  uint32_t tau0 = 8;     // the period before any loss was published, and tau_0 above
  uint32_t tau_min = 1;  // bounds of every period
  uint32_t tau_max = 32;
};

// INVALID_ARGUMENT naming the field unless 1 <= tau_min <= tau0 <= tau_max.
absl::Status ValidateAdaComm(const AdaCommOptions& options);

// The period to use after `published` (tau0 while nothing was published or when a
// published loss is not positive), clamped to [tau_min, tau_max]. `lr_ratio` is
// eta_0 / eta_l (1 for a fixed step size).
uint32_t AdaCommPeriod(const AdaCommOptions& options, const std::optional<PublishedLoss>& published,
                       double lr_ratio = 1);

}  // namespace ps
