#include "server/model_rounds.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "core/refusal.h"

namespace ps::server {

using core::Refusal;
using core::Refused;

CombinedShares CombineShares(const Shares& shares, size_t state_rows) {
  CombinedShares out;
  out.agreed = shares[0]->participants;
  for (const auto& share : shares) {
    std::vector<uint32_t> both;
    std::set_intersection(out.agreed.begin(), out.agreed.end(), share->participants.begin(),
                          share->participants.end(), std::back_inserter(both));
    out.agreed = std::move(both);
  }
  const size_t rows = out.agreed.size() + state_rows;
  out.gram.assign(rows * rows, 0.0);
  for (const auto& share : shares) {
    // Row of each agreed participant (then of each state row) in this share's matrix.
    std::vector<size_t> at;
    size_t j = 0;
    for (uint32_t w : out.agreed) {
      while (share->participants[j] != w) ++j;
      at.push_back(j);
    }
    const size_t p = share->participants.size();
    for (size_t r = 0; r < state_rows; ++r) at.push_back(p + r);
    const size_t width = p + state_rows;
    for (size_t a = 0; a < rows; ++a) {
      for (size_t b = 0; b < rows; ++b)
        out.gram[a * rows + b] += share->gram[at[a] * width + at[b]];
    }
  }
  return out;
}

ModelRounds::ModelRounds(const Config& config, core::Clock* clock, DeadlineQueue* deadlines)
    : config_(config), clock_(clock), deadlines_(deadlines) {}

bool ModelRounds::SliceClosed(size_t owned) {
  absl::MutexLock lock(&mu_);
  if (++closed_ < owned) return false;
  closed_ = 0;
  return true;
}

void ModelRounds::SetSender(std::function<void(std::shared_ptr<const RoundShare>)> sender) {
  absl::MutexLock lock(&mu_);
  sender_ = std::move(sender);
}

std::function<void(std::shared_ptr<const RoundShare>)> ModelRounds::sender() const {
  absl::MutexLock lock(&mu_);
  return sender_;
}

absl::Status ModelRounds::CheckShare(const RoundShare& share) const {
  if (share.shard_id >= config_.num_shards || share.shard_id == config_.shard_id) {
    return Refused(Refusal::kMalformed,
                   absl::StrCat("share from shard ", share.shard_id, " (this is shard ",
                                config_.shard_id, " of ", config_.num_shards, ")"));
  }
  for (size_t i = 0; i < share.participants.size(); ++i) {
    if (share.participants[i] >= config_.num_workers ||
        (i > 0 && share.participants[i] <= share.participants[i - 1])) {
      return Refused(Refusal::kMalformed,
                     "participants must be increasing worker ids below --workers");
    }
  }
  const size_t rows = share.participants.size() + config_.state_rows;
  if (share.gram.size() != rows * rows) {
    return Refused(Refusal::kMalformed, absl::StrCat("Gram matrix of ", share.gram.size(),
                                                     " values for ", rows, " rows"));
  }
  for (double v : share.gram) {
    if (!std::isfinite(v)) return Refused(Refusal::kMalformed, "Gram matrix is not finite");
  }
  return absl::OkStatus();
}

void ModelRounds::Hold(uint64_t round, std::vector<ClosedRound> slices) {
  absl::MutexLock lock(&mu_);
  held_[round] = std::move(slices);
}

std::vector<ClosedRound> ModelRounds::Release(uint64_t round) {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(round);
  if (it == held_.end()) return {};
  std::vector<ClosedRound> slices = std::move(it->second);
  held_.erase(it);
  return slices;
}

absl::StatusOr<std::optional<ModelRounds::Complete>> ModelRounds::Store(
    std::shared_ptr<const RoundShare> share) {
  std::optional<Complete> complete;
  bool due_set = false;
  {
    absl::MutexLock lock(&mu_);
    if (share->round < round_ || share->round > round_ + 1) {
      return absl::OutOfRangeError(
          absl::StrCat("share of round ", share->round, " while this shard is at round ", round_));
    }
    Shares& slot = shares_[share->round];
    slot.resize(config_.num_shards);
    if (slot[share->shard_id] != nullptr) {
      return absl::AlreadyExistsError(
          absl::StrCat("second share of round ", share->round, " from shard ", share->shard_id));
    }
    slot[share->shard_id] = share;
    if (share->shard_id == config_.shard_id && share->round == round_ && config_.num_shards > 1) {
      due_ = clock_->Now() + config_.peer_timeout;
      due_set = true;
    }
    complete = ClaimCompleteLocked();
  }
  if (due_set && !complete.has_value()) deadlines_->Notify();
  return complete;
}

std::optional<ModelRounds::Complete> ModelRounds::ClaimCompleteLocked() {
  if (finishing_) return std::nullopt;
  auto it = shares_.find(round_);
  if (it == shares_.end()) return std::nullopt;
  for (const auto& share : it->second) {
    if (share == nullptr) return std::nullopt;
  }
  finishing_ = true;
  due_.reset();
  Complete c{round_, std::move(it->second)};
  shares_.erase(it);
  return c;
}

std::optional<ModelRounds::Complete> ModelRounds::Advance(uint64_t round) {
  absl::MutexLock lock(&mu_);
  round_ = round + 1;
  finishing_ = false;
  shares_.erase(round);
  // The next round's own share may already be in (slices reopened as they were
  // published); then its deadline starts now.
  auto next = shares_.find(round_);
  if (next != shares_.end() && config_.num_shards > 1 && next->second.size() > config_.shard_id &&
      next->second[config_.shard_id] != nullptr) {
    due_ = clock_->Now() + config_.peer_timeout;
  }
  return ClaimCompleteLocked();
}

std::optional<uint64_t> ModelRounds::Overdue(core::SteadyTime now) {
  absl::MutexLock lock(&mu_);
  if (!due_.has_value() || *due_ > now || finishing_) return std::nullopt;
  due_.reset();
  finishing_ = true;
  return round_;
}

std::optional<core::SteadyTime> ModelRounds::due() const {
  absl::MutexLock lock(&mu_);
  return due_;
}

void ModelRounds::FastForward(uint64_t round) {
  absl::MutexLock lock(&mu_);
  if (round_ >= round) return;
  round_ = round;
  closed_ = 0;
  shares_.erase(shares_.begin(), shares_.lower_bound(round));
  due_.reset();
}

}  // namespace ps::server
