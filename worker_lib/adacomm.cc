#include "worker_lib/adacomm.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace ps {

absl::Status ValidateAdaComm(const AdaCommOptions& o) {
  if (o.tau_min < 1) return absl::InvalidArgumentError("AdaComm: tau_min must be at least 1");
  if (o.tau0 < o.tau_min || o.tau0 > o.tau_max) {
    return absl::InvalidArgumentError(absl::StrCat("AdaComm: tau0 ", o.tau0, " is not in [tau_min ",
                                                   o.tau_min, ", tau_max ", o.tau_max, "]"));
  }
  return absl::OkStatus();
}

uint32_t AdaCommPeriod(const AdaCommOptions& o, const std::optional<PublishedLoss>& published,
                       double lr_ratio) {
  uint32_t tau = o.tau0;
  if (published.has_value() && published->loss > 0 && published->first_loss > 0 && lr_ratio > 0 &&
      std::isfinite(lr_ratio)) {
    const double scaled =
        std::ceil(std::sqrt(lr_ratio * published->loss / published->first_loss) * o.tau0);
    // Clamp in double: a huge ratio must not wrap when converted.
    tau = static_cast<uint32_t>(
        std::clamp(scaled, static_cast<double>(o.tau_min), static_cast<double>(o.tau_max)));
  }
  return std::clamp(tau, o.tau_min, o.tau_max);
}

}  // namespace ps
