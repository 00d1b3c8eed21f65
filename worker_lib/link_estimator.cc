#include <algorithm>
#include <chrono>
#include <cmath>

#include "worker_lib/link_estimator_internal.h"

namespace ps::internal {
namespace {

// The median of `v` (reordered); v must not be empty. The upper median for an even
// count: a sample, not an average of two.
double Median(std::vector<double>& v) {
  auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

template <typename T>
void PutInRing(std::vector<T>& ring, size_t& next, size_t window, T value) {
  if (ring.size() < window) {
    ring.push_back(value);
  } else {
    ring[next] = value;
  }
  next = (next + 1) % window;
}

}  // namespace

LinkEstimator::LinkEstimator(size_t window, double min_spread)
    : window_(std::max<size_t>(window, 2)), min_spread_(std::max(min_spread, 1.000001)) {}

void LinkEstimator::AddTransfer(uint64_t bytes, double seconds) {
  if (bytes == 0 || !std::isfinite(seconds) || seconds < 0) return;
  PutInRing(transfers_, next_transfer_, window_,
            Transfer{.bytes = static_cast<double>(bytes), .seconds = seconds});
}

void LinkEstimator::AddLatency(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return;
  PutInRing(latencies_, next_latency_, window_, seconds);
}

LinkCost LinkEstimator::Estimate() const {
  LinkCost cost;
  cost.transfers = transfers_.size();
  if (transfers_.empty()) return cost;
  cost.valid = true;
  double lo = transfers_[0].bytes, hi = lo;
  for (const Transfer& t : transfers_) {
    lo = std::min(lo, t.bytes);
    hi = std::max(hi, t.bytes);
  }
  // The slopes and residuals in a buffer kept between calls: a refit on the push path
  // (after every busy period) allocates nothing.
  std::vector<double>& values = scratch_;
  values.clear();
  if (transfers_.size() >= 2 && hi >= min_spread_ * lo) {
    // Pairs of nearly equal sizes give wild slopes; a pair counts when its sizes differ
    // by at least a tenth of the whole spread.
    const double min_gap = (hi - lo) / 10;
    for (size_t i = 0; i < transfers_.size(); ++i) {
      for (size_t j = i + 1; j < transfers_.size(); ++j) {
        const double db = transfers_[j].bytes - transfers_[i].bytes;
        if (std::abs(db) < min_gap) continue;
        values.push_back((transfers_[j].seconds - transfers_[i].seconds) / db);
      }
    }
    if (!values.empty()) {
      cost.from_slope = true;
      cost.seconds_per_byte = std::max(0.0, Median(values));
      values.clear();
      for (const Transfer& t : transfers_)
        values.push_back(t.seconds - cost.seconds_per_byte * t.bytes);
      cost.alpha_seconds = std::max(0.0, Median(values));
      return cost;
    }
  }
  if (!latencies_.empty()) {
    values.assign(latencies_.begin(), latencies_.end());
    cost.alpha_seconds = Median(values);
    values.clear();
  }
  for (const Transfer& t : transfers_) {
    values.push_back(std::max(0.0, t.seconds - cost.alpha_seconds) / t.bytes);
  }
  cost.seconds_per_byte = Median(values);
  return cost;
}

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

namespace {

// Weight of a new sample in RoundIdleMeter's mean: about the last 4 rounds count.
constexpr double kIdleWeight = 0.25;

}  // namespace

TransferMeter::TransferMeter(std::function<double()> now)
    : now_(now ? std::move(now) : SteadySeconds) {}

void TransferMeter::Started() {
  const double t = now_();
  absl::MutexLock lock(&mu_);
  if (in_flight_++ == 0) {
    start_ = t;
    bytes_ = 0;
  }
}

void SharedLinkEstimate::AddTransfer(uint64_t bytes, double seconds) {
  absl::MutexLock lock(&mu_);
  estimator_.AddTransfer(bytes, seconds);
  cached_.reset();
}

LinkCost SharedLinkEstimate::Estimate() const {
  absl::MutexLock lock(&mu_);
  if (!cached_.has_value()) cached_ = estimator_.Estimate();
  return *cached_;
}

void TransferMeter::Finished(uint64_t bytes) {
  const double t = now_();
  uint64_t sample_bytes = 0;
  double sample_seconds = 0;
  {
    absl::MutexLock lock(&mu_);
    if (in_flight_ == 0) return;  // unmatched: nothing to end
    bytes_ += bytes;
    if (--in_flight_ > 0 || bytes_ == 0) return;
    sample_bytes = bytes_;
    sample_seconds = t - start_;
  }
  link_.AddTransfer(sample_bytes, sample_seconds);
}

void BurstTimer::Arrived(uint64_t bytes, bool queued, double seconds) {
  if (queued && last_.has_value()) {
    if (run_bytes_ == 0) run_start_ = *last_;
    run_bytes_ += bytes;
    run_end_ = seconds;
  } else {
    End();
  }
  last_ = seconds;
}

void BurstTimer::End() {
  if (run_bytes_ > 0) link_->AddTransfer(run_bytes_, run_end_ - run_start_);
  run_bytes_ = 0;
}

RoundIdleMeter::RoundIdleMeter(std::function<double()> now)
    : now_(now ? std::move(now) : SteadySeconds) {}

void RoundIdleMeter::Drained() {
  const double t = now_();
  absl::MutexLock lock(&mu_);
  drained_at_ = t;
}

void RoundIdleMeter::Pushing(uint64_t round) {
  const double t = now_();
  absl::MutexLock lock(&mu_);
  if (started_ && round <= round_) return;
  if (started_ && drained_at_.has_value() && *drained_at_ >= round_start_) {
    const double idle = std::max(0.0, t - *drained_at_);
    mean_ = mean_.has_value() ? (1 - kIdleWeight) * *mean_ + kIdleWeight * idle : idle;
  }
  started_ = true;
  round_ = round;
  round_start_ = t;
}

std::optional<double> RoundIdleMeter::Seconds() const {
  absl::MutexLock lock(&mu_);
  return mean_;
}

}  // namespace ps::internal
