#include "server/slice_round.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/client_text.h"
#include "core/fp32_bytes.h"
#include "core/refusal.h"
#include "server/decode_budget.h"

namespace ps::server {

using core::Refusal;
using core::Refused;

UdpRounds::UdpRounds(uint32_t num_workers, uint32_t starters)
    : num_workers_(num_workers), starters_(std::clamp<uint32_t>(starters, 1, std::max(num_workers, 1u))) {
  absl::MutexLock lock(&mu_);
  for (Pending& p : pending_) p.seen.assign(num_workers_, 0);
}

bool UdpRounds::Armed(uint64_t round) const {
  const int64_t armed = armed_.load(std::memory_order_acquire);
  return armed >= 0 && static_cast<uint64_t>(armed) >= round;
}

bool UdpRounds::Note(uint32_t worker, uint64_t round, bool chunk) {
  if (worker >= num_workers_ || Armed(round) ||
      round > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return false;
  }
  absl::MutexLock lock(&mu_);
  Pending& p = pending_[round % kWindow];
  if (!p.used || p.round < round) {
    p.used = true;
    p.round = round;
    p.chunk = false;
    p.count = 0;
    std::fill(p.seen.begin(), p.seen.end(), 0);
  } else if (p.round > round) {
    return false;  // kWindow rounds behind the newest: not tracked
  }
  if (!p.seen[worker]) {
    p.seen[worker] = 1;
    ++p.count;
  }
  p.chunk = p.chunk || chunk;
  if (!p.chunk || p.count < starters_) return false;
  // Armed: raise the newest armed round (under mu_, so only one caller arms each round).
  const int64_t r = static_cast<int64_t>(round);
  if (armed_.load(std::memory_order_relaxed) >= r) return false;
  armed_.store(r, std::memory_order_release);
  return true;
}

core::SteadyTime RoundRules::DeadlineFromNow() const { return clock->Now() + round_deadline; }

void RunWakeups(Wakeups& wake, bool ready) {
  for (auto& fn : wake) fn(ready);
  wake.clear();
}

SliceRound::SliceRound(const core::SliceInfo& info, RoundRules* rules, bool aggregate_only,
                       std::shared_ptr<const Optimizer> optimizer)
    : info_(info), rules_(rules) {
  const uint32_t n = rules_->num_workers;
  // Not yet shared with any other thread: the lock only satisfies the annotations.
  absl::MutexLock lock(&mu_);
  inputs_.pushed.assign(n, 0);
  inputs_.losses.assign(n, std::numeric_limits<float>::quiet_NaN());
  inputs_.lrs.assign(n, std::numeric_limits<float>::quiet_NaN());
  model_.optimizer = std::move(optimizer);
  inputs_.chunked.assign(n, ChunkedPush{});
  inputs_.rows.resize(n);
  inputs_.kept.resize(n);
  inputs_.supports.assign(n, std::nullopt);
  if (rules_->keep_signs) inputs_.sign_payloads.assign(n, std::string());
  model_.rule_state.assign(rules_->state_rows * info_.numel, 0.0f);
  // ServerOptions::Validate checked the spec; a spec it refused leaves pulls dense.
  if (absl::StatusOr<std::shared_ptr<codecs::Codec>> codec = MakePullCodec(rules_->pull_codec);
      codec.ok() && !aggregate_only) {
    model_.held.codec = *std::move(codec);
  }
  if (aggregate_only) {
    // No parameters live here; version 0 is an all-zero "aggregate".
    initialized_ = true;
    published_ = std::make_shared<const std::string>(size_t{info_.numel} * sizeof(float), '\0');
  }
}

absl::Status SliceRound::Initialize(std::string_view values, Wakeups* wake) {
  absl::MutexLock lock(&mu_);
  if (initialized_) {
    return absl::AlreadyExistsError(
        absl::StrCat("slice ", info_.id, " already has its initial value"));
  }
  std::vector<float> params(info_.numel);
  if (absl::Status st =
          core::ParseFp32(values, params, absl::StrCat("initial value of slice ", info_.id));
      !st.ok()) {
    return Refused(Refusal::kMalformed, st.message());
  }
  model_.velocity.assign(model_.KeepsVelocity(rules_->flags_velocity) ? params.size() : 0, 0.0f);
  if (model_.optimizer != nullptr && model_.optimizer->has_second_moment()) {
    model_.second_moment.assign(params.size(), 0.0f);
  }
  model_.steps = 0;
  published_ = PublishFirstLocked(params);
  if (model_.held.codec != nullptr) model_.held.values = params;
  model_.params = std::move(params);
  KeepPublishedModelLocked();
  initialized_ = true;
  MarkOpenedLocked();
  TakeDueWatchersLocked(wake);
  return absl::OkStatus();
}

std::shared_ptr<const std::string> SliceRound::PublishFirstLocked(
    std::span<const float> params) {
  // Dense pulls publish every version into the pool's buffers (RoundAggregation::Step);
  // with a pull codec the published values are the held ones, copied.
  if (model_.held.codec != nullptr) return core::SharedFp32(params);
  return SnapshotPool::TakeFilled(model_.snapshots, params);
}

absl::Status SliceRound::CheckOpenRoundLocked(uint32_t worker, uint64_t round) const {
  if (!initialized_) {
    return Refused(
        Refusal::kNotReady,
        absl::StrCat("slice ", info_.id, " has no initial value yet; pull version 0 first"));
  }
  if (round < version_ || (round == version_ && closing_)) {
    return Refused(Refusal::kLate,
                   absl::StrCat("late push from worker ", worker, ": round ", round, " of slice ",
                                info_.id, " is closed (slice is at version ", version_,
                                closing_ ? ", aggregating)" : ")"));
  }
  if (round > version_) {
    return Refused(Refusal::kFutureRound,
                   absl::StrCat("push from worker ", worker, " for round ", round, " of slice ",
                                info_.id, " before that round opened (slice is at version ",
                                version_, "); pull version ", round, " first"));
  }
  return absl::OkStatus();
}

std::span<float> SliceRound::SlotLocked(uint32_t worker, uint32_t first, uint32_t count) {
  Row& row = inputs_.rows[worker];
  // Zeroed once, when the worker first sends to this slice; reused by its later rounds.
  if (row == nullptr) row = std::make_unique<float[]>(info_.numel);
  return std::span<float>(row.get() + first, count);
}

bool SliceRound::InPlaceLocked(const codecs::Codec& codec, const PushPayload& payload) const {
  return payload.raw != nullptr && codec.raw_fp32() && payload.raw->numel == info_.numel;
}

absl::Status SliceRound::DecodeLocked(uint32_t worker, const codecs::Codec& codec,
                                      const PushPayload& payload, std::span<float> slot) {
  if (payload.raw == nullptr) return codec.DecodePieces(payload.pieces, slot);
  RawRow& raw = *payload.raw;
  const std::string_view pieces[2] = {
      std::string_view(reinterpret_cast<const char*>(&raw.version), 1),
      std::string_view(reinterpret_cast<const char*>(raw.values.get()),
                       size_t{raw.numel} * sizeof(float))};
  if (slot.data() != nullptr) return codec.DecodePieces(pieces, slot);
  // No slot (InPlaceLocked): the values are where the pieces say, so decoding them in
  // place only checks them.
  absl::Status checked = codec.DecodePieces(pieces, std::span<float>(raw.values.get(), raw.numel));
  if (checked.ok()) std::swap(inputs_.rows[worker], raw.values);
  return checked;
}

absl::Status SliceRound::KeepLocked(uint32_t worker, std::shared_ptr<const codecs::Codec> codec,
                                    std::span<const std::string_view> pieces) {
  KeptPush& kept = inputs_.kept[worker];
  kept.payload.clear();
  for (std::string_view piece : pieces) kept.payload.append(piece);
  absl::Status checked = codec->Check(kept.payload, info_.numel);
  if (checked.ok()) {
    kept.codec = std::move(codec);
  } else {
    kept.payload.clear();
  }
  return checked;
}

absl::StatusOr<SliceRound::Progress> SliceRound::AcceptPush(uint32_t worker, uint64_t round,
                                                            std::string_view codec,
                                                            DecoderFn decoder,
                                                            const PushPayload& payload,
                                                            std::optional<float> loss,
                                                            std::optional<float> lr) {
  Locked lock(this);
  // The round's state first: a late or duplicate push is refused before its codec is
  // looked at.
  if (round == last_closed_round_ && worker < last_closed_pushed_.size() &&
      last_closed_pushed_[worker]) {
    return Refused(Refusal::kDuplicate,
                   absl::StrCat("duplicate push from worker ", worker, " for round ", round,
                                " of slice ", info_.id, ", which closed with its first copy"));
  }
  if (absl::Status st = CheckOpenRoundLocked(worker, round); !st.ok()) return st;
  if (inputs_.pushed[worker] || inputs_.chunked[worker].ended) {
    return Refused(Refusal::kDuplicate,
                   absl::StrCat("duplicate push from worker ", worker, " for round ", round,
                                " of slice ", info_.id,
                                inputs_.pushed[worker] ? "" : " (its UDP push of it ended)"));
  }
  if (loss.has_value() && !std::isfinite(*loss)) {
    return Refused(Refusal::kMalformed,
                   absl::StrCat("malformed push from worker ", worker, " for round ", round,
                                " of slice ", info_.id, ": its loss ", *loss, " is not finite"));
  }
  if (lr.has_value() && !(std::isfinite(*lr) && *lr >= 0)) {
    return Refused(Refusal::kMalformed,
                   absl::StrCat("malformed push from worker ", worker, " for round ", round,
                                " of slice ", info_.id, ": its learning rate ", *lr,
                                " is not a finite number >= 0"));
  }
  absl::StatusOr<std::shared_ptr<const codecs::Codec>> decoded_by = decoder();
  if (!decoded_by.ok()) return decoded_by.status();
  const codecs::SharedStructure shared = (*decoded_by)->shared_structure();
  // Kept encoded until the round closes: checked now, decoded by the aggregation into
  // rows in its caches (docs/data_path.md, "Pushes kept encoded"), or for 3lc's digits
  // read from the kept payload (the mean of them, codecs::Mean3lc).
  const bool keep = payload.raw == nullptr && (*decoded_by)->checks_without_decoding() &&
                    (shared == codecs::SharedStructure::kNone ||
                     shared == codecs::SharedStructure::kTernaryDigits);
  const bool in_place = InPlaceLocked(**decoded_by, payload);
  const std::span<float> slot =
      in_place || keep ? std::span<float>() : SlotLocked(worker, 0, info_.numel);
  // A row taken in place is only checked for values that are not finite: its size fixes
  // that cost and no payload can raise it, so it is not timed (the thread's CPU clock is
  // a system call) and charges the decode budget nothing.
  const auto cpu_now = [in_place] {
    return in_place ? std::chrono::nanoseconds{0} : DecodeBudget::ThreadCpuNow();
  };
  const std::chrono::nanoseconds decode_start = cpu_now();
  absl::Status decoded = keep ? KeepLocked(worker, *decoded_by, payload.pieces)
                              : DecodeLocked(worker, **decoded_by, payload, slot);
  if (absl::Status st = std::move(decoded); !st.ok()) {
    return Refused(
        Refusal::kMalformed,
        absl::StrCat("malformed push from worker ", worker, " for round ", round, " of slice ",
                     info_.id, " (codec ", core::ClientText(codec), "): ", st.message()));
  }
  const std::chrono::nanoseconds decode = cpu_now() - decode_start;
  inputs_.pushed[worker] = 1;
  inputs_.losses[worker] = loss.value_or(std::numeric_limits<float>::quiet_NaN());
  inputs_.lrs[worker] = lr.value_or(std::numeric_limits<float>::quiet_NaN());
  ++num_pushed_;
  ++num_complete_;
  // The support and the sign vote read the payload whole (it is small: a seed, or sign
  // bits): gathered only for those codecs.
  std::string whole;
  if (shared == codecs::SharedStructure::kSeededSupport ||
      shared == codecs::SharedStructure::kSignBits) {
    for (std::string_view piece : payload.pieces) whole.append(piece);
  }
  inputs_.supports[worker] = shared == codecs::SharedStructure::kSeededSupport
                                 ? codecs::SeededSupportOf(whole)
                                 : std::nullopt;
  if (rules_->keep_signs) {
    if (shared == codecs::SharedStructure::kSignBits) {
      inputs_.sign_payloads[worker] = std::move(whole);
    } else {
      inputs_.sign_payloads[worker].clear();
    }
  }
  absl::StatusOr<Progress> progress = AfterPushLocked();
  if (progress.ok()) progress->decode = decode;
  return progress;
}

bool SliceRound::OnlyAbsentMissingLocked() const {
  const Quarantine* q = rules_->quarantine;
  const Membership* m = rules_->membership;
  if (num_pushed_ < std::max<uint32_t>(rules_->quorum, 1)) return false;
  const core::SteadyTime now = rules_->clock->Now();
  const bool quarantined = q != nullptr && q->Any(now);
  const bool gone = m != nullptr && m->AnyAbsent();
  if (!quarantined && !gone) return false;
  for (uint32_t w = 0; w < rules_->num_workers; ++w) {
    const ChunkedPush& c = inputs_.chunked[w];
    const bool whole = inputs_.pushed[w] && (c.chunk_count == 0 || c.received == c.chunk_count);
    if (whole || c.ended) continue;
    if (!(quarantined && q->Contains(w, now)) && !(gone && m->Absent(w))) return false;
  }
  return true;
}

std::optional<uint64_t> SliceRound::CloseIfOnlyAbsentMissing() {
  Locked lock(this);
  if (!initialized_ || closing_ || !OnlyAbsentMissingLocked()) return std::nullopt;
  const uint64_t round = version_;
  CloseLocked();
  return round;
}

SliceRound::Progress SliceRound::AfterPushLocked() {
  Progress p;
  if (num_complete_ + num_ended_ == rules_->num_workers ||
      (deadline_passed_ && num_pushed_ >= rules_->quorum) || OnlyAbsentMissingLocked()) {
    p.closed = true;
    p.at_deadline = deadline_passed_;
    CloseLocked();
    return p;
  }
  // The deadline starts once `starters` distinct workers pushed, never with one worker's
  // (a Byzantine worker's) first push. Once it passed below the quorum, the round waits
  // for its quorum; only an armed UDP round sets another deadline (OnDeadline).
  if (!deadline_.has_value() && !deadline_passed_ && num_pushed_ >= rules_->starters) {
    SetDeadlineLocked();
  }
  return p;
}

void SliceRound::SetDeadlineLocked() {
  deadline_ = rules_->DeadlineFromNow();
  // Registered once mu_ is released (Locked): the queue's listener takes the ticker's
  // lock, which must never be taken under a slice's.
  pending_deadline_ = deadline_;
}

SliceRound::Locked::Locked(SliceRound* s) : s_(s) { s_->mu_.Lock(); }

SliceRound::Locked::~Locked() {
  const std::optional<core::SteadyTime> added = std::exchange(s_->pending_deadline_, std::nullopt);
  s_->mu_.Unlock();
  if (added.has_value()) s_->rules_->deadlines->Add(s_->info_.id, *added);
}

void SliceRound::CloseLocked() {
  closing_ = true;
  if (deadline_.has_value()) rules_->deadlines->Remove(info_.id, *deadline_);
  deadline_.reset();
  deadline_passed_ = false;
  last_closed_round_ = version_;
  last_closed_pushed_ = inputs_.pushed;
  ClosedRound& r = closed_.emplace();
  r.info = info_;
  r.round = version_;
  r.inputs = std::move(inputs_);
  r.model = std::move(model_);
}

SliceRound::DeadlineOutcome SliceRound::OnDeadline(core::SteadyTime now) {
  Locked lock(this);
  DeadlineOutcome out;
  if (closing_ || !deadline_.has_value() || *deadline_ > now) return out;
  deadline_.reset();
  out.due = true;
  out.round = version_;
  out.pushed = num_pushed_;
  out.complete = num_complete_;
  out.quorum = rules_->quorum;
  if (num_pushed_ >= out.quorum) {
    out.closed = true;
    CloseLocked();
    return out;
  }
  const bool armed = rules_->Armed(version_);
  if (armed && deadline_passed_) {
    // A further deadline passed without the quorum in a round that enough workers are
    // in: datagrams were lost, or workers are missing. Closed to be dropped (the
    // aggregation refuses fewer inputs than the quorum) rather than stall every pull.
    out.closed = true;
    out.below_quorum = true;
    CloseLocked();
    last_closed_pushed_.clear();  // dropped: no push of it counted
    return out;
  }
  deadline_passed_ = true;
  if (armed) {
    out.grace = true;
    SetDeadlineLocked();
  }
  return out;
}

void SliceRound::StartDeadlineAt(uint64_t round) {
  Locked lock(this);
  if (version_ != round || closing_ || deadline_.has_value() || !initialized_) return;
  SetDeadlineLocked();
}

std::optional<ClosedRound> SliceRound::TakeClosed() {
  absl::MutexLock lock(&mu_);
  std::optional<ClosedRound> r = std::move(closed_);
  closed_.reset();
  return r;
}

void SliceRound::ResetRoundLocked() {
  std::fill(inputs_.pushed.begin(), inputs_.pushed.end(), 0);
  std::fill(inputs_.losses.begin(), inputs_.losses.end(), std::numeric_limits<float>::quiet_NaN());
  std::fill(inputs_.lrs.begin(), inputs_.lrs.end(), std::numeric_limits<float>::quiet_NaN());
  std::fill(inputs_.supports.begin(), inputs_.supports.end(), std::nullopt);
  for (ChunkedPush& push : inputs_.chunked) {
    push.chunk_count = push.received = push.end_count = 0;
    push.ended = false;
  }
  for (KeptPush& kept : inputs_.kept) kept.payload.clear();  // capacity kept for the next
  num_pushed_ = 0;
  num_complete_ = 0;
  num_ended_ = 0;
  if (deadline_.has_value()) rules_->deadlines->Remove(info_.id, *deadline_);
  deadline_.reset();
  deadline_passed_ = false;
  MarkOpenedLocked();
}

void SliceRound::MarkOpenedLocked() {
  if (rules_->clock == nullptr) return;
  opened_.store(rules_->clock->Now().time_since_epoch().count(), std::memory_order_relaxed);
}

void SliceRound::Publish(ClosedRound round, std::shared_ptr<const std::string> values,
                         std::shared_ptr<const std::string> delta_payload, Wakeups* wake) {
  Locked lock(this);
  loss_ = MedianLoss(round.inputs);
  if (!first_loss_.has_value()) first_loss_ = loss_;
  inputs_ = std::move(round.inputs);
  model_ = std::move(round.model);
  if (delta_payload != nullptr) {
    delta_ = std::make_shared<const PullDelta>(
        PullDelta{.base_version = version_, .version = version_ + 1, .payload = std::move(delta_payload)});
  } else {
    delta_.reset();
  }
  ++version_;
  ResetRoundLocked();
  closing_ = false;
  published_ = std::move(values);
  KeepPublishedModelLocked();
  // The new round is already armed on this shard (other slices are there): its
  // deadline runs now.
  if (rules_->Armed(version_)) SetDeadlineLocked();
  TakeDueWatchersLocked(wake);
}

bool SliceRound::FastForward(uint64_t version, Wakeups* wake) {
  absl::MutexLock lock(&mu_);
  if (version_ >= version || closing_ || !initialized_) return false;
  version_ = version;
  delta_.reset();  // no change leads to the new version: its pulls are dense
  ResetRoundLocked();
  last_closed_pushed_.clear();
  TakeDueWatchersLocked(wake);
  return true;
}

absl::Status SliceRound::Adopt(uint64_t round, std::string_view values, Wakeups* wake) {
  std::vector<float> params(info_.numel);
  if (absl::Status st =
          core::ParseFp32(values, params, absl::StrCat("adopted value of slice ", info_.id));
      !st.ok()) {
    return Refused(Refusal::kMalformed, st.message());
  }
  Locked lock(this);
  if (!initialized_) {
    return Refused(Refusal::kNotReady, absl::StrCat("slice ", info_.id, " has no initial value yet"));
  }
  if (version_ > round || closing_) {
    return Refused(Refusal::kLate,
                   absl::StrCat("slice ", info_.id,
                                closing_ ? " is aggregating round " : " is at version ",
                                version_, ": too late to adopt values for round ", round));
  }
  std::fill(model_.velocity.begin(), model_.velocity.end(), 0.0f);
  std::fill(model_.second_moment.begin(), model_.second_moment.end(), 0.0f);
  model_.steps = 0;
  published_ = PublishFirstLocked(params);
  if (model_.held.codec != nullptr) model_.held.values = params;
  model_.params = std::move(params);
  delta_.reset();  // no change leads to the adopted values: their pulls are dense
  version_ = round + 1;
  ResetRoundLocked();
  last_closed_pushed_.clear();
  KeepPublishedModelLocked();
  TakeDueWatchersLocked(wake);
  return absl::OkStatus();
}

void SliceRound::TakeDueWatchersLocked(Wakeups* wake) {
  if (!initialized_) return;
  for (auto it = watchers_.begin(); it != watchers_.end();) {
    if (it->second.first <= version_) {
      wake->push_back(std::move(it->second.second));
      watchers_.erase(it++);
    } else {
      ++it;
    }
  }
}

uint64_t SliceRound::Watch(uint64_t min_version, std::function<void(bool)> ready, uint64_t id,
                           bool closed_to_watchers) {
  bool now;
  {
    absl::MutexLock lock(&mu_);
    now = initialized_ && version_ >= min_version;
    if (!now && !closed_to_watchers) {
      watchers_.emplace(id, std::make_pair(min_version, std::move(ready)));
      return id;
    }
  }
  ready(now);
  return 0;
}

void SliceRound::Unwatch(uint64_t watch_id) {
  std::function<void(bool)> dropped;
  {
    absl::MutexLock lock(&mu_);
    auto it = watchers_.find(watch_id);
    if (it == watchers_.end()) return;
    dropped = std::move(it->second.second);
    watchers_.erase(it);
  }
  // `dropped` (and what it holds) is destroyed here, outside the slice's lock.
}

Wakeups SliceRound::TakeAllWatchers() {
  Wakeups all;
  absl::MutexLock lock(&mu_);
  for (auto& [id, watch] : watchers_) all.push_back(std::move(watch.second));
  watchers_.clear();
  return all;
}

SliceSnapshot SliceRound::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return SliceSnapshot{version_, published_, delta_, loss_, first_loss_};
}

uint64_t SliceRound::version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

size_t SliceRound::watcher_count() const {
  absl::MutexLock lock(&mu_);
  return watchers_.size();
}

}  // namespace ps::server
