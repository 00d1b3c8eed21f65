#include "server/slice_round.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/client_text.h"
#include "core/fp32_bytes.h"
#include "core/refusal.h"
#include "server/decode_budget.h"
#include "net/udp_frame.h"

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

std::vector<uint32_t> ClosedRound::Workers() const {
  std::vector<uint32_t> workers;
  for (uint32_t w = 0; w < inputs.pushed.size(); ++w) {
    if (inputs.pushed[w]) workers.push_back(w);
  }
  return workers;
}

std::vector<const float*> ClosedRound::Rows(std::span<const uint32_t> workers) const {
  std::vector<const float*> rows;
  rows.reserve(workers.size());
  for (uint32_t w : workers) rows.push_back(inputs.rows[w].get());
  return rows;
}

InputMasks ClosedRound::MasksOf(std::span<const uint32_t> workers) const {
  InputMasks m;
  const uint32_t numel = info.numel;
  std::vector<size_t> partial;
  for (size_t i = 0; i < workers.size(); ++i) {
    const ChunkedPush& push = inputs.chunked[workers[i]];
    if (push.chunk_count == 0 || push.received == push.chunk_count) continue;
    partial.push_back(i);
    std::vector<uint8_t>& bits = m.bits.emplace_back((numel + 7) / 8, 0);
    for (uint32_t c = 0; c < push.chunk_count; ++c) {
      if (!push.seen[c]) continue;
      const net::ChunkRange r = net::ChunkRangeOf(numel, push.chunk_elems, c);
      for (uint32_t j = r.first; j < r.first + r.count; ++j) bits[j >> 3] |= uint8_t(1u << (j & 7));
    }
  }
  if (partial.empty()) return m;
  m.ptrs.assign(workers.size(), nullptr);
  for (size_t k = 0; k < partial.size(); ++k) m.ptrs[partial[k]] = m.bits[k].data();
  return m;
}

std::vector<uint32_t> ClosedRound::SharedSupport(std::span<const uint32_t> workers) const {
  if (workers.empty()) return {};
  const std::optional<codecs::SeededSupport>& first = inputs.supports[workers[0]];
  if (!first.has_value()) return {};
  for (uint32_t w : workers) {
    if (inputs.supports[w] != first) return {};
  }
  return codecs::SupportIndices(*first, info.numel);
}

std::vector<std::string_view> ClosedRound::Signs(std::span<const uint32_t> workers) const {
  std::vector<std::string_view> signs;
  if (inputs.sign_payloads.empty()) return signs;
  for (uint32_t w : workers) {
    if (inputs.sign_payloads[w].empty()) return {};
    signs.push_back(inputs.sign_payloads[w]);
  }
  return signs;
}

uint64_t ClosedRound::ChunksLost() const {
  uint64_t lost = 0;
  for (const ChunkedPush& push : inputs.chunked) lost += push.chunk_count - push.received;
  return lost;
}

std::optional<float> MedianLoss(const RoundInputs& inputs) {
  std::vector<float> reported;
  for (size_t w = 0; w < inputs.pushed.size() && w < inputs.losses.size(); ++w) {
    if (inputs.pushed[w] && !std::isnan(inputs.losses[w])) reported.push_back(inputs.losses[w]);
  }
  if (reported.empty()) return std::nullopt;
  const size_t mid = reported.size() / 2;
  std::nth_element(reported.begin(), reported.begin() + mid, reported.end());
  if (reported.size() % 2 == 1) return reported[mid];
  // Even: the mean of the two middle values (both within the honest range when fewer
  // than half the reporters lie).
  const float upper = reported[mid];
  const float lower = *std::max_element(reported.begin(), reported.begin() + mid);
  return lower + (upper - lower) / 2;
}

SliceRound::SliceRound(const core::SliceInfo& info, RoundRules* rules, bool aggregate_only)
    : info_(info), rules_(rules) {
  const uint32_t n = rules_->num_workers;
  // Not yet shared with any other thread: the lock only satisfies the annotations.
  absl::MutexLock lock(&mu_);
  inputs_.pushed.assign(n, 0);
  inputs_.losses.assign(n, std::numeric_limits<float>::quiet_NaN());
  inputs_.chunked.assign(n, ChunkedPush{});
  inputs_.rows.resize(n);
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
  model_.velocity.assign(params.size(), 0.0f);
  published_ = core::SharedFp32(params);
  if (model_.held.codec != nullptr) model_.held.values = params;
  model_.params = std::move(params);
  KeepPublishedModelLocked();
  initialized_ = true;
  TakeDueWatchersLocked(wake);
  return absl::OkStatus();
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

size_t PushPayload::bytes() const {
  if (raw != nullptr) return 1 + size_t{raw->numel} * sizeof(float);
  size_t n = 0;
  for (std::string_view piece : pieces) n += piece.size();
  return n;
}

std::span<float> SliceRound::SlotLocked(uint32_t worker, uint32_t first, uint32_t count) {
  Row& row = inputs_.rows[worker];
  // Zeroed once, when the worker first sends to this slice; reused by its later rounds.
  if (row == nullptr) row = std::make_unique<float[]>(info_.numel);
  return std::span<float>(row.get() + first, count);
}

absl::Status SliceRound::DecodeLocked(uint32_t worker, const codecs::Codec& codec,
                                      const PushPayload& payload) {
  if (payload.raw == nullptr) {
    return codec.DecodePieces(payload.pieces, SlotLocked(worker, 0, info_.numel));
  }
  RawRow& raw = *payload.raw;
  const std::string_view pieces[2] = {
      std::string_view(reinterpret_cast<const char*>(&raw.version), 1),
      std::string_view(reinterpret_cast<const char*>(raw.values.get()),
                       size_t{raw.numel} * sizeof(float))};
  if (!codec.raw_fp32() || raw.numel != info_.numel) {
    return codec.DecodePieces(pieces, SlotLocked(worker, 0, info_.numel));
  }
  // The values are where the pieces say: decoding them in place checks them only.
  absl::Status checked = codec.DecodePieces(pieces, std::span<float>(raw.values.get(), raw.numel));
  if (checked.ok()) std::swap(inputs_.rows[worker], raw.values);
  return checked;
}

absl::StatusOr<SliceRound::Progress> SliceRound::AcceptPush(uint32_t worker, uint64_t round,
                                                            std::string_view codec,
                                                            DecoderFn decoder,
                                                            const PushPayload& payload,
                                                            std::optional<float> loss) {
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
  if (inputs_.pushed[worker]) {
    return Refused(Refusal::kDuplicate, absl::StrCat("duplicate push from worker ", worker,
                                                     " for round ", round, " of slice ", info_.id));
  }
  if (loss.has_value() && !std::isfinite(*loss)) {
    return Refused(Refusal::kMalformed,
                   absl::StrCat("malformed push from worker ", worker, " for round ", round,
                                " of slice ", info_.id, ": its loss ", *loss, " is not finite"));
  }
  absl::StatusOr<std::shared_ptr<const codecs::Codec>> decoded_by = decoder();
  if (!decoded_by.ok()) return decoded_by.status();
  const std::chrono::nanoseconds decode_start = DecodeBudget::ThreadCpuNow();
  if (absl::Status st = DecodeLocked(worker, **decoded_by, payload); !st.ok()) {
    return Refused(
        Refusal::kMalformed,
        absl::StrCat("malformed push from worker ", worker, " for round ", round, " of slice ",
                     info_.id, " (codec ", core::ClientText(codec), "): ", st.message()));
  }
  const std::chrono::nanoseconds decode = DecodeBudget::ThreadCpuNow() - decode_start;
  inputs_.pushed[worker] = 1;
  inputs_.losses[worker] = loss.value_or(std::numeric_limits<float>::quiet_NaN());
  ++num_pushed_;
  ++num_complete_;
  const codecs::SharedStructure shared = (*decoded_by)->shared_structure();
  // The compressed-domain paths read the payload whole (they are small: a seed, or
  // sign bits): gathered only for those codecs.
  std::string whole;
  if (shared != codecs::SharedStructure::kNone) {
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

absl::StatusOr<SliceRound::Progress> SliceRound::AcceptChunk(const Chunk& c, std::string_view codec,
                                                             DecoderFn decoder,
                                                             std::string_view payload) {
  Locked lock(this);
  if (absl::Status st = CheckOpenRoundLocked(c.worker, c.round); !st.ok()) return st;
  ChunkedPush& push = inputs_.chunked[c.worker];
  // Built only for a refusal.
  auto what = [&] {
    return absl::StrCat("chunk ", c.index, " of ", c.count_in_push, " from worker ", c.worker,
                        " for round ", c.round, " of slice ", info_.id);
  };
  if (push.chunk_count == 0 && inputs_.pushed[c.worker]) {
    return Refused(Refusal::kDuplicate,
                   absl::StrCat("chunk from worker ", c.worker, " for round ", c.round,
                                " of slice ", info_.id, ", which it already pushed over gRPC"));
  }
  if (push.chunk_count != 0 && push.chunk_elems != c.chunk_elems) {
    return Refused(Refusal::kMalformed,
                   absl::StrCat("malformed ", what(), ": chunk size ", c.chunk_elems,
                                " after chunks of ", push.chunk_elems, " in the same push"));
  }
  if (push.chunk_count != 0 && push.seen[c.index]) {
    return Refused(Refusal::kDuplicate,
                   absl::StrCat("replayed chunk ", c.index, " from worker ", c.worker,
                                " for round ", c.round, " of slice ", info_.id));
  }
  absl::StatusOr<std::shared_ptr<const codecs::Codec>> decoded_by = decoder();
  if (!decoded_by.ok()) return decoded_by.status();
  const std::chrono::nanoseconds decode_start = DecodeBudget::ThreadCpuNow();
  if (absl::Status st = (*decoded_by)->Decode(payload, SlotLocked(c.worker, c.first, c.count));
      !st.ok()) {
    return Refused(Refusal::kMalformed, absl::StrCat("malformed ", what(), ": codec ",
                                                     core::ClientText(codec), ": ", st.message()));
  }
  if (push.chunk_count == 0) {
    push.chunk_elems = c.chunk_elems;
    push.chunk_count = c.count_in_push;
    push.received = 0;
    push.seen.assign(c.count_in_push, 0);
    inputs_.pushed[c.worker] = 1;
    ++num_pushed_;
    // Chunks never share a support or carry a whole sign payload: aggregate decoded.
    inputs_.supports[c.worker] = std::nullopt;
    if (rules_->keep_signs) inputs_.sign_payloads[c.worker].clear();
  }
  const std::chrono::nanoseconds decode = DecodeBudget::ThreadCpuNow() - decode_start;
  push.seen[c.index] = 1;
  if (++push.received == push.chunk_count) ++num_complete_;
  absl::StatusOr<Progress> progress = AfterPushLocked();
  if (progress.ok()) progress->decode = decode;
  return progress;
}

bool SliceRound::OnlyQuarantinedMissingLocked() const {
  const Quarantine* q = rules_->quarantine;
  if (q == nullptr || num_pushed_ < std::max<uint32_t>(rules_->quorum, 1)) {
    return false;
  }
  const core::SteadyTime now = rules_->clock->Now();
  if (!q->Any(now)) return false;
  for (uint32_t w = 0; w < rules_->num_workers; ++w) {
    const ChunkedPush& c = inputs_.chunked[w];
    const bool whole = inputs_.pushed[w] && (c.chunk_count == 0 || c.received == c.chunk_count);
    if (!whole && !q->Contains(w, now)) return false;
  }
  return true;
}

std::optional<uint64_t> SliceRound::CloseIfOnlyQuarantinedMissing() {
  Locked lock(this);
  if (!initialized_ || closing_ || !OnlyQuarantinedMissingLocked()) return std::nullopt;
  const uint64_t round = version_;
  CloseLocked();
  return round;
}

SliceRound::Progress SliceRound::AfterPushLocked() {
  Progress p;
  if (num_complete_ == rules_->num_workers ||
      (deadline_passed_ && num_pushed_ >= rules_->quorum) || OnlyQuarantinedMissingLocked()) {
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
  std::fill(inputs_.supports.begin(), inputs_.supports.end(), std::nullopt);
  for (ChunkedPush& push : inputs_.chunked) push.chunk_count = push.received = 0;
  num_pushed_ = 0;
  num_complete_ = 0;
  if (deadline_.has_value()) rules_->deadlines->Remove(info_.id, *deadline_);
  deadline_.reset();
  deadline_passed_ = false;
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
  model_.velocity = c.velocity.empty() ? std::vector<float>(info_.numel, 0.0f) : c.velocity;
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
    published_ = core::SharedFp32(model_.params);
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
  if (published_velocity_ != nullptr && with_velocity) out.velocity = *published_velocity_;
  if (published_rule_state_ != nullptr) out.rule_state = *published_rule_state_;
  if (published_params_ != nullptr) out.params = *published_params_;
  return out;
}

void SliceRound::KeepPublishedModelLocked() {
  if (!rules_->keep_published_model) return;
  published_velocity_ = std::make_shared<const std::vector<float>>(model_.velocity);
  published_rule_state_ = std::make_shared<const std::vector<float>>(model_.rule_state);
  if (model_.held.codec != nullptr) {
    published_params_ = std::make_shared<const std::vector<float>>(model_.params);
  }
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
