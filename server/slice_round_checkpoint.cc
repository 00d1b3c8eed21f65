// A slice's round and its checkpoints (slice_round.h): Restore sets the slice from a
// checkpoint before any worker is admitted, Capture gives the published state as a
// checkpoint stores it, and with checkpoints on every publication keeps copies of the
// model that goes with it (KeepPublishedModelLocked).
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/slice_round.h"

namespace ps::server {

absl::Status SliceRound::Restore(const SliceCheckpoint& c) {
  absl::MutexLock lock(&mu_);
  if (closing_) return absl::FailedPreconditionError("restore into a slice that is aggregating");
  if (c.values.size() != size_t{info_.numel} * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint slice ", info_.id, " has ",
                                                   c.values.size(), " bytes of values for ",
                                                   info_.numel, " elements"));
  }
  if (!c.params.empty() && c.params.size() != info_.numel) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint slice ", info_.id, " has ",
                                                   c.params.size(), " parameters for ",
                                                   info_.numel, " elements"));
  }
  // `values` are what the workers held (x̂) when the checkpoint was written; `params`, when
  // a pull codec was on, the parameters x behind them.
  std::vector<float> held(info_.numel);
  std::memcpy(held.data(), c.values.data(), c.values.size());
  model_.params = c.params.empty() ? held : c.params;
  // A velocity this step does not keep (a checkpoint of a run with momentum, restored
  // without) is dropped; one it keeps starts at zero when the checkpoint has none.
  if (!model_.KeepsVelocity(rules_->flags_velocity)) {
    model_.velocity.clear();
  } else {
    model_.velocity = c.velocity.empty() ? std::vector<float>(info_.numel, 0.0f) : c.velocity;
  }
  model_.second_moment.clear();
  if (model_.optimizer != nullptr && model_.optimizer->has_second_moment()) {
    model_.second_moment =
        c.second_moment.empty() ? std::vector<float>(info_.numel, 0.0f) : c.second_moment;
  }
  model_.steps = c.optimizer_steps;
  if (c.rule_state.size() == model_.rule_state.size()) model_.rule_state = c.rule_state;
  version_ = c.version;
  ResetRoundLocked();
  last_closed_pushed_.clear();
  initialized_ = true;
  if (model_.held.codec != nullptr) {
    // The workers' values go on from x̂, the residual x - x̂ with the next change: a
    // worker holding this version from before the restart could even take that change,
    // but the shard's new epoch has it pull this version densely once (pull_delta.h).
    published_ = std::make_shared<const std::string>(c.values);
    model_.held.values = std::move(held);
  } else {
    // Dense pulls: the workers get x itself.
    published_ = PublishFirstLocked(model_.params);
  }
  delta_.reset();
  KeepPublishedModelLocked();
  return absl::OkStatus();
}

SliceCheckpoint SliceRound::Capture(bool with_velocity) const {
  absl::MutexLock lock(&mu_);
  SliceCheckpoint out;
  out.slice_id = info_.id;
  out.version = version_;
  if (published_ != nullptr) out.values = *published_;
  if (published_velocity_ != nullptr && with_velocity) {
    out.velocity = *published_velocity_;
    if (published_second_moment_ != nullptr) out.second_moment = *published_second_moment_;
    out.optimizer_steps = published_steps_;
  }
  if (published_rule_state_ != nullptr) out.rule_state = *published_rule_state_;
  if (published_params_ != nullptr) out.params = *published_params_;
  return out;
}

void SliceRound::KeepPublishedModelLocked() {
  if (!rules_->keep_published_model) return;
  published_velocity_ = std::make_shared<const std::vector<float>>(model_.velocity);
  if (!model_.second_moment.empty()) {
    published_second_moment_ = std::make_shared<const std::vector<float>>(model_.second_moment);
  }
  published_steps_ = model_.steps;
  published_rule_state_ = std::make_shared<const std::vector<float>>(model_.rule_state);
  if (model_.held.codec != nullptr) {
    published_params_ = std::make_shared<const std::vector<float>>(model_.params);
  }
}

}  // namespace ps::server
