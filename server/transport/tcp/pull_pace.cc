#include "server/transport/tcp/pull_pace.h"

#include <algorithm>

namespace ps::server::transport::tcp {

void PullPace::Wrote(size_t slices, double seconds) {
  if (slices == 0 || !(seconds >= 0)) return;
  constexpr double kKeep = 7.0 / 8.0;
  slices_ = slices_ * kKeep + static_cast<double>(slices);
  seconds_ = seconds_ * kKeep + seconds;
}

size_t PullPace::WritesInFlight() const {
  if (slices_ == 0) return kMinSlices;
  // Slices per kWindowSeconds at the measured pace; writes that took no measurable time
  // are a fast link.
  const double per_window =
      seconds_ > 0 ? slices_ * kWindowSeconds / seconds_ : static_cast<double>(kMaxSlices);
  // (The small addition keeps 4.9999... from rounding a whole count down.)
  return std::clamp(static_cast<size_t>(std::min(per_window + 1e-6, double(kMaxSlices))),
                    kMinSlices, kMaxSlices);
}

}  // namespace ps::server::transport::tcp
