#include "server/shard.h"


#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iterator>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/client_text.h"
#include "core/fp32_bytes.h"
#include "core/status.h"
#include "spdlog/spdlog.h"

namespace ps::server {
namespace {

// Room for the fields around a slice's values in one message.
constexpr uint32_t kMessageOverheadBytes = 4096;

std::shared_ptr<const std::string> Fp32Bytes(std::span<const float> values) {
  auto s = std::make_shared<std::string>();
  core::AppendFp32(values, s.get());
  return s;
}

}  // namespace

std::string_view AggregationStageName(AggregationStage stage) {
  switch (stage) {
    case AggregationStage::kSlice: return "slice";
    case AggregationStage::kModelGram: return "model_gram";
    case AggregationStage::kModelApply: return "model_apply";
    case AggregationStage::kCount: break;
  }
  return "unknown";
}

using Watchers = std::vector<std::pair<uint64_t, std::function<void(bool)>>>;
// A waiting watch: the version it waits for and what to call.
struct PendingWatch {
  uint64_t min_version = 0;
  std::function<void(bool)> ready;
};

struct Shard::SliceState {
  explicit SliceState(const core::SliceInfo& i) : info(i) {}

  const core::SliceInfo info;
  absl::Mutex mu;
  // Whether version 0 (the initial value) exists; nothing is published before.
  bool initialized ABSL_GUARDED_BY(mu) = false;
  // Published version; round `version` is the open one.
  uint64_t version ABSL_GUARDED_BY(mu) = 0;
  std::shared_ptr<const std::string> published ABSL_GUARDED_BY(mu);
  // With checkpoints on: the velocity and rule state that go with `published`, copied
  // at publication so that a checkpoint never reads them mid-aggregation.
  std::shared_ptr<const std::vector<float>> published_velocity ABSL_GUARDED_BY(mu);
  std::shared_ptr<const std::vector<float>> published_rule_state ABSL_GUARDED_BY(mu);
  // Parameters and SGD velocity. Written only by the aggregation of a closed round
  // (or InitSlice before any round), which nothing else touches meanwhile.
  std::vector<float> params;
  std::vector<float> velocity;
  // The rule's memory for this slice (centered clipping's centre), kept between rounds
  // and written only by the aggregation of a closed round.
  std::vector<float> rule_state;
  // Decoded pushes of the open round: worker w at [w * numel, (w + 1) * numel).
  std::vector<float> inputs;
  // Compressed-domain aggregation (docs/codecs.md): per worker of the open round, the
  // seeded support of a random-k push, and the bytes of a sign push when the rule is
  // sign_majority. Written by Push under mu, read by the aggregation of a closed round.
  std::vector<std::optional<codecs::SeededSupport>> supports;
  std::vector<std::string> sign_payloads;
  // UDP pushes of the open round, per worker (docs/transport.md): the chunk size its
  // first chunk fixed, and which chunks came. chunk_count 0: no UDP push. Written by
  // PushChunk under mu, read by the aggregation of a closed round.
  struct ChunkedPush {
    uint32_t chunk_elems = 0;
    uint32_t chunk_count = 0;
    uint32_t received = 0;
    std::vector<uint8_t> seen;
  };
  std::vector<ChunkedPush> chunked;
  // pushed[w]: worker w sent something this round (a push or a chunk); num_pushed
  // counts them, num_complete those whose push is whole.
  std::vector<uint8_t> pushed ABSL_GUARDED_BY(mu);
  uint32_t num_pushed ABSL_GUARDED_BY(mu) = 0;
  uint32_t num_complete ABSL_GUARDED_BY(mu) = 0;
  // Set when the round is closed and being aggregated: pushes for it are late, and
  // inputs/params belong to the aggregation.
  bool closing ABSL_GUARDED_BY(mu) = false;
  std::optional<core::SteadyTime> deadline ABSL_GUARDED_BY(mu);
  bool deadline_passed ABSL_GUARDED_BY(mu) = false;
  // Waiting watches by id (Shard::Watch); removed when they fire or their pull ends.
  absl::flat_hash_map<uint64_t, PendingWatch> watchers ABSL_GUARDED_BY(mu);
};

namespace {

// Removes and returns the watchers whose version has been reached.
Watchers TakeDueWatchers(Shard::SliceState* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
  Watchers due;
  for (auto it = s->watchers.begin(); it != s->watchers.end();) {
    if (it->second.min_version <= s->version) {
      due.emplace_back(it->second.min_version, std::move(it->second.ready));
      s->watchers.erase(it++);
    } else {
      ++it;
    }
  }
  return due;
}

// ctx.masks for the inputs of `workers`: null for a whole push, else a bitmap of the
// coordinates whose chunks came. Read by the aggregation of a closed round.
struct InputMasks {
  std::vector<std::vector<uint8_t>> bits;
  std::vector<const uint8_t*> ptrs;  // empty when every push is whole
};

InputMasks MasksOf(const Shard::SliceState& s, std::span<const uint32_t> workers) {
  InputMasks m;
  const uint32_t numel = s.info.numel;
  std::vector<size_t> partial;
  for (size_t i = 0; i < workers.size(); ++i) {
    const auto& push = s.chunked[workers[i]];
    if (push.chunk_count == 0 || push.received == push.chunk_count) continue;
    partial.push_back(i);
    std::vector<uint8_t>& bits = m.bits.emplace_back((numel + 7) / 8, 0);
    for (uint32_t c = 0; c < push.chunk_count; ++c) {
      if (!push.seen[c]) continue;
      const core::ChunkRange r = core::ChunkRangeOf(numel, push.chunk_elems, c);
      for (uint32_t j = r.first; j < r.first + r.count; ++j) bits[j >> 3] |= uint8_t(1u << (j & 7));
    }
  }
  if (partial.empty()) return m;
  m.ptrs.assign(workers.size(), nullptr);
  for (size_t k = 0; k < partial.size(); ++k) m.ptrs[partial[k]] = m.bits[k].data();
  return m;
}

}  // namespace

Shard::Shard(const ServerOptions& options, uint32_t shard_id,
             std::unique_ptr<aggregators::Aggregator> aggregator, core::Clock* clock,
             core::ThreadPool* pool)
    : options_(options),
      shard_id_(shard_id),
      // The default quorum (n - f) is raised to what the rule needs (Bulyan: 4f + 3), so
      // that a round closed at its deadline can always be aggregated.
      quorum_(options.quorum != 0
                  ? options.quorum
                  : std::max<uint32_t>(options.EffectiveQuorum(),
                                       static_cast<uint32_t>(aggregator->MinInputs()))),
      sgd_{options.learning_rate, options.momentum, options.weight_decay},
      aggregator_(std::move(aggregator)),
      model_scope_(aggregator_->NeedsGram() && options.aggregation_scope == AggregationScope::kModel),
      sign_vote_(aggregator_->VotesOnSigns()),
      priority_schedule_(options.schedule == Schedule::kPriority),
      checkpoints_(!options.checkpoint_dir.empty()),
      clock_(clock),
      pool_(pool),
      max_shard_bytes_(EffectiveMaxShardBytes(options)),
      decoders_(options.max_cached_decoders),
      sessions_(options.num_workers),
      jobs_(pool) {
  stats_.malformed_by_worker.assign(options_.num_workers, 0);
}

Shard::~Shard() {
  // Aggregation jobs reference this object; wait for them (the pool outlives us).
  jobs_.WaitIdle();
}

absl::Status Shard::Refuse(Refusal r, absl::string_view message) const {
  absl::Status status = core::Refused(r, message);
  uint64_t count;
  {
    absl::MutexLock lock(&stats_mu_);
    count = ++stats_.refusals[static_cast<size_t>(r)];
  }
  // Logarithmic logging: a worker repeating the same fault cannot flood the log.
  if (std::has_single_bit(count)) {
    spdlog::warn("shard {}: refused ({}, {} so far): {}", shard_id_, RefusalName(r), count,
                 std::string(status.message()));
  } else {
    spdlog::debug("shard {}: refused ({}): {}", shard_id_, RefusalName(r),
                  std::string(status.message()));
  }
  return status;
}

void Shard::CountMalformed(uint32_t worker_id) {
  uint64_t count;
  {
    absl::MutexLock stats_lock(&stats_mu_);
    count = ++stats_.malformed_by_worker[worker_id];
  }
  // Per worker, since the refusal log above is rate-limited over all workers together.
  if (std::has_single_bit(count)) {
    spdlog::warn("shard {}: worker {} sent {} malformed pushes or chunks so far (faulty or "
                 "hostile?)",
                 shard_id_, worker_id, count);
  }
}

void Shard::SetAggregationObserver(
    std::function<void(AggregationStage, core::Duration)> observer) {
  absl::MutexLock lock(&observer_mu_);
  aggregation_observer_ = std::move(observer);
}

void Shard::ObserveAggregation(AggregationStage stage,
                               std::chrono::steady_clock::time_point start) {
  absl::ReaderMutexLock lock(&observer_mu_);
  if (aggregation_observer_) aggregation_observer_(stage, std::chrono::steady_clock::now() - start);
}

absl::StatusOr<JoinResult> Shard::Join(uint32_t worker_id, uint64_t layout_hash) {
  if (draining_.load()) {
    return Refuse(Refusal::kShuttingDown, "shard is shutting down");
  }
  if (worker_id >= options_.num_workers) {
    return Refuse(Refusal::kBadWorkerId,
                  absl::StrCat("worker id ", worker_id, " is out of range: this server expects ",
                               options_.num_workers, " workers"));
  }
  if (layout_hash == 0) {
    return Refuse(Refusal::kBadLayout, "join without a layout hash");
  }
  JoinResult result;
  {
    absl::MutexLock lock(&mu_);
    if (layout_.has_value() && layout_->hash() != layout_hash) {
      return Refuse(Refusal::kLayoutMismatch,
                    absl::StrCat("layout mismatch: worker ", worker_id, " joins with layout ",
                                 absl::Hex(layout_hash), " but shard ", shard_id_, " holds ",
                                 absl::Hex(layout_->hash())));
    }
    result.layout_registered = layout_.has_value();
    result.ready = result.layout_registered && uninitialized_ == 0;
  }
  PS_ASSIGN_OR_RETURN(SessionTable::Issued issued, sessions_.Issue(worker_id));
  result.session = std::move(issued.session);
  result.udp_session = issued.udp_session;
  result.udp_key = std::move(issued.udp_key);
  const uint64_t joins = issued.joins;
  result.version = MinVersion();
  // A client may join in a loop: the 1st, 2nd, 4th, ... join of each worker at info.
  spdlog::log(std::has_single_bit(joins) ? spdlog::level::info : spdlog::level::debug,
              "shard {}: worker {} joined (layout {}registered; join {} of this worker)",
              shard_id_, worker_id, result.layout_registered ? "" : "not ", joins);
  return result;
}

absl::StatusOr<uint32_t> Shard::Authenticate(std::string_view session) const {
  std::optional<uint32_t> worker = sessions_.WorkerOf(session);
  if (!worker.has_value()) {
    return Refuse(Refusal::kUnknownSession, "unknown session: join (again) first");
  }
  return *worker;
}

absl::StatusOr<std::shared_ptr<const UdpPeer>> Shard::UdpSession(uint64_t udp_session) const {
  std::shared_ptr<const UdpPeer> peer = sessions_.UdpPeerOf(udp_session);
  if (peer == nullptr) {
    return Refuse(Refusal::kUnknownSession, "datagram under an unknown UDP session");
  }
  return peer;
}

std::vector<uint32_t> Shard::InstallLayoutLocked(const core::ModelLayout& layout) {
  std::vector<uint32_t> owned;
  auto span = layout.SlicesOfShard(shard_id_);
  owned.assign(span.begin(), span.end());
  slices_.resize(layout.slices().size());
  for (uint32_t id : owned) {
    // Not yet shared with any other thread: no lock needed (and taking one here
    // would invert the slice -> shard lock order).
    auto s = std::make_unique<SliceState>(layout.slices()[id]);
    s->pushed.assign(options_.num_workers, 0);
    s->chunked.assign(options_.num_workers, SliceState::ChunkedPush{});
    s->supports.assign(options_.num_workers, std::nullopt);
    if (sign_vote_) s->sign_payloads.assign(options_.num_workers, std::string());
    s->rule_state.assign(aggregator_->StateRows() * s->info.numel, 0.0f);
    if (options_.aggregate_only) {
      // No parameters live here; version 0 is an all-zero "aggregate".
      s->initialized = true;
      s->published = std::make_shared<const std::string>(size_t{s->info.numel} * sizeof(float), '\0');
    }
    slices_[id] = std::move(s);
  }
  uninitialized_ = options_.aggregate_only ? 0 : static_cast<uint32_t>(owned.size());
  owned_ids_ = owned;
  std::sort(owned_ids_.begin(), owned_ids_.end());
  publish_order_ = priority_schedule_ ? owned : owned_ids_;
  layout_ = layout;
  registered_.store(true, std::memory_order_release);
  return owned;
}

absl::Status Shard::AnswerRegisteredLocked(uint32_t worker_id, uint64_t hash) const {
  return AnswerRegistered(*layout_, worker_id, layout_->hash() == hash, absl::Hex(hash));
}

absl::Status Shard::AnswerRegistered(const core::ModelLayout& have, uint32_t worker_id, bool same,
                                     const absl::AlphaNum& offered) const {
  if (same) return absl::AlreadyExistsError("this layout is already registered");
  return Refuse(Refusal::kLayoutMismatch,
                absl::StrCat("layout mismatch: shard ", shard_id_, " already holds layout ",
                             absl::Hex(have.hash()), "; worker ", worker_id, " offered ", offered));
}

absl::Status Shard::CheckLayoutFits(const core::LayoutSummary& sum, uint32_t slice_elems,
                                    uint32_t num_shards) const {
  if (num_shards != options_.num_shards) {
    return Refuse(Refusal::kBadLayout,
                  absl::StrCat("layout is cut for ", num_shards, " shards but the server has ",
                               options_.num_shards));
  }
  const uint64_t slice_bytes = uint64_t{slice_elems} * sizeof(float);
  if (slice_bytes + kMessageOverheadBytes > options_.max_message_bytes) {
    return Refuse(Refusal::kBadLayout,
                  absl::StrCat("slice_elems ", slice_elems, " needs messages of ",
                               slice_bytes + kMessageOverheadBytes,
                               " bytes, above --max-message-bytes ", options_.max_message_bytes));
  }
  const uint64_t need =
      EstimateShardBytes(sum, options_.num_workers, aggregator_->StateRows(), checkpoints_);
  if (need > max_shard_bytes_) {
    return Refuse(Refusal::kOverLimit,
                  absl::StrCat("layout of ", sum.total_elems, " elements in ", sum.num_slices,
                               " slices needs about ", need >> 20, " MiB on shard ", shard_id_,
                               " with ", options_.num_workers, " workers, above --max-shard-bytes ",
                               max_shard_bytes_ >> 20, " MiB"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint32_t>> Shard::RegisterLayout(uint32_t worker_id,
                                                            std::vector<core::TensorSpec> tensors,
                                                            uint32_t slice_elems,
                                                            uint32_t num_shards) {
  // The common case first and at the price of the request: a shard that has its layout
  // answers from the hash, whatever the request names.
  const uint64_t hash = core::ModelLayout::Hash(tensors, slice_elems, num_shards);
  {
    absl::MutexLock lock(&mu_);
    if (layout_.has_value()) return AnswerRegisteredLocked(worker_id, hash);
  }
  absl::StatusOr<core::LayoutSummary> sum = core::ModelLayout::Check(tensors, slice_elems, num_shards);
  if (!sum.ok()) {
    return Refuse(Refusal::kBadLayout, absl::StrCat("invalid layout: ", sum.status().message()));
  }
  PS_RETURN_IF_ERROR(CheckLayoutFits(*sum, slice_elems, num_shards));
  // Only a layout within the limits is built, one at a time.
  absl::MutexLock one_at_a_time(&register_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (layout_.has_value()) return AnswerRegisteredLocked(worker_id, hash);
  }
  absl::StatusOr<core::ModelLayout> layout =
      core::ModelLayout::Create(std::move(tensors), slice_elems, num_shards);
  if (!layout.ok()) {
    return Refuse(Refusal::kBadLayout, absl::StrCat("invalid layout: ", layout.status().message()));
  }
  return RegisterLayout(worker_id, *layout);
}

absl::StatusOr<std::vector<uint32_t>> Shard::RegisterLayout(uint32_t worker_id,
                                                            const core::ModelLayout& layout) {
  std::vector<uint32_t> owned;
  {
    absl::MutexLock lock(&mu_);
    if (layout_.has_value()) return AnswerRegisteredLocked(worker_id, layout.hash());
    PS_ASSIGN_OR_RETURN(const core::LayoutSummary sum,
                        core::ModelLayout::Check(layout.tensors(), layout.slice_elems(),
                                                 layout.num_shards()));
    PS_RETURN_IF_ERROR(CheckLayoutFits(sum, layout.slice_elems(), layout.num_shards()));
    owned = InstallLayoutLocked(layout);
  }
  spdlog::info("shard {}: worker {} registered layout {:x}: {} tensors, {} slices, {} owned",
               shard_id_, worker_id, layout.hash(), layout.tensors().size(),
               layout.slices().size(), owned.size());
  return owned;
}

absl::StatusOr<Shard::SliceState*> Shard::LookupSlice(uint64_t layout_hash, uint32_t slice_id) {
  if (!registered_.load(std::memory_order_acquire)) {
    return Refuse(Refusal::kNoLayout, "no layout registered yet");
  }
  // After registration slices_ and the layout never change, so reading them without
  // mu_ is safe; the hash is copied for the check.
  const uint64_t hash = this->layout_hash();
  if (layout_hash != hash) {
    return Refuse(Refusal::kLayoutMismatch,
                  absl::StrCat("layout mismatch: request names ", absl::Hex(layout_hash),
                               ", shard ", shard_id_, " holds ", absl::Hex(hash)));
  }
  if (slice_id >= slices_.size()) {
    return Refuse(
        Refusal::kUnknownSlice,
        absl::StrCat("unknown slice ", slice_id, ": the layout has ", slices_.size(), " slices"));
  }
  SliceState* s = slices_[slice_id].get();
  if (s == nullptr) {
    return Refuse(Refusal::kWrongShard,
                  absl::StrCat("slice ", slice_id, " is not owned by shard ", shard_id_));
  }
  return s;
}

const core::ModelLayout* Shard::registered_layout() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // layout_ is written once, before registered_ is released.
  return registered_.load(std::memory_order_acquire) ? &*layout_ : nullptr;
}

uint64_t Shard::layout_hash() const {
  absl::MutexLock lock(&mu_);
  return layout_.has_value() ? layout_->hash() : 0;
}

absl::Status Shard::InitSlice(uint32_t worker_id, uint64_t layout_hash, uint32_t slice_id,
                              std::string_view values) {
  PS_ASSIGN_OR_RETURN(SliceState * s, LookupSlice(layout_hash, slice_id));
  Watchers wake;
  {
    absl::MutexLock lock(&s->mu);
    if (s->initialized) {
      return absl::AlreadyExistsError(
          absl::StrCat("slice ", slice_id, " already has its initial value"));
    }
    std::vector<float> params(s->info.numel);
    if (absl::Status st = core::ParseFp32(values, params, absl::StrCat("initial value of slice ", slice_id));
        !st.ok()) {
      return Refuse(Refusal::kMalformed, st.message());
    }
    s->velocity.assign(params.size(), 0.0f);
    s->published = Fp32Bytes(params);
    if (checkpoints_) {
      s->published_velocity = std::make_shared<const std::vector<float>>(s->velocity);
      s->published_rule_state = std::make_shared<const std::vector<float>>(s->rule_state);
    }
    s->params = std::move(params);
    s->initialized = true;
    wake = TakeDueWatchers(s);
  }
  {
    absl::MutexLock lock(&mu_);
    if (--uninitialized_ == 0) spdlog::info("shard {}: ready (all slices initialized)", shard_id_);
  }
  for (auto& [min_version, fn] : wake) fn(true);  // min_version 0 <= version 0 always
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const codecs::Codec>> Shard::CheckedDecoder(
    uint32_t worker_id, uint32_t slice_id, std::string_view codec) {
  absl::StatusOr<std::shared_ptr<const codecs::Codec>> decoder = decoders_.Get(codec);
  if (!decoder.ok()) {
    return Refuse(Refusal::kUnknownCodec,
                  absl::StrCat("push from worker ", worker_id, " for slice ", slice_id, ": ",
                               decoder.status().message()));
  }
  return decoder;
}

absl::Status Shard::CheckOpenRoundLocked(SliceState* s, uint32_t worker_id, uint64_t round) {
  const uint32_t slice_id = s->info.id;
  if (!s->initialized) {
    return Refuse(
        Refusal::kNotReady,
        absl::StrCat("slice ", slice_id, " has no initial value yet; pull version 0 first"));
  }
  if (round < s->version || (round == s->version && s->closing)) {
    return Refuse(Refusal::kLate,
                  absl::StrCat("late push from worker ", worker_id, ": round ", round, " of slice ",
                               slice_id, " is closed (slice is at version ", s->version,
                               s->closing ? ", aggregating)" : ")"));
  }
  if (round > s->version) {
    return Refuse(Refusal::kFutureRound,
                  absl::StrCat("push from worker ", worker_id, " for round ", round, " of slice ",
                               slice_id, " before that round opened (slice is at version ",
                               s->version, "); pull version ", round, " first"));
  }
  return absl::OkStatus();
}

uint32_t Shard::QuorumLocked(const SliceState& s) const {
  // A worker whose datagrams of a slice were all lost cannot be told from an absent one,
  // and nothing is retransmitted: in a round that carried UDP chunks on this shard, every
  // slice closes at its deadline with what came. The aggregation refuses fewer inputs
  // than the rule needs, which drops the round (parameters unchanged) instead of
  // stalling it (docs/transport.md, "Closing a round").
  const int64_t udp_round = udp_round_.load();
  if (udp_round >= 0 && static_cast<uint64_t>(udp_round) >= s.version) return 0;
  return quorum_;
}

void Shard::StartUdpRound(uint64_t round) {
  int64_t seen = udp_round_.load();
  while (seen < static_cast<int64_t>(round) &&
         !udp_round_.compare_exchange_weak(seen, static_cast<int64_t>(round))) {
  }
  if (seen >= static_cast<int64_t>(round)) return;
  // The first chunk of this round on this shard: every slice at this round gets its
  // deadline now, so one whose datagrams were all lost still closes.
  std::vector<uint32_t> ids;
  {
    absl::MutexLock lock(&mu_);
    ids = owned_ids_;
  }
  for (uint32_t id : ids) {
    SliceState* s = slices_[id].get();
    std::optional<core::SteadyTime> deadline;
    {
      absl::MutexLock lock(&s->mu);
      if (s->version != round || s->closing || s->deadline.has_value()) continue;
      s->deadline = clock_->Now() + std::chrono::duration_cast<core::Duration>(options_.round_deadline);
      deadline = s->deadline;
    }
    deadlines_.Add(id, *deadline);
  }
}

bool Shard::AfterPushLocked(SliceState* s, std::optional<core::SteadyTime>* new_deadline) {
  if (s->num_complete == options_.num_workers ||
      (s->deadline_passed && s->num_pushed >= QuorumLocked(*s))) {
    CloseLocked(s, /*at_deadline=*/s->deadline_passed);
    return true;
  }
  if (!s->deadline.has_value()) {
    s->deadline = clock_->Now() + std::chrono::duration_cast<core::Duration>(options_.round_deadline);
    *new_deadline = s->deadline;
  }
  return false;
}


absl::Status Shard::Push(uint32_t worker_id, uint64_t layout_hash, uint64_t round,
                         uint32_t slice_id, std::string_view codec, std::string_view payload) {
  if (draining_.load()) {
    return Refuse(Refusal::kShuttingDown, "shard is shutting down");
  }
  PS_ASSIGN_OR_RETURN(SliceState * s, LookupSlice(layout_hash, slice_id));
  const uint32_t numel = s->info.numel;
  bool close = false;
  std::optional<core::SteadyTime> new_deadline;
  {
    absl::MutexLock lock(&s->mu);
    // The round's state first: a late or duplicate push is refused before its codec is
    // looked at.
    PS_RETURN_IF_ERROR(CheckOpenRoundLocked(s, worker_id, round));
    if (s->pushed[worker_id]) {
      return Refuse(Refusal::kDuplicate,
                    absl::StrCat("duplicate push from worker ", worker_id, " for round ", round,
                                 " of slice ", slice_id));
    }
    PS_ASSIGN_OR_RETURN(const std::shared_ptr<const codecs::Codec> decoder,
                        CheckedDecoder(worker_id, slice_id, codec));
    if (s->inputs.empty()) s->inputs.resize(size_t{options_.num_workers} * numel);
    std::span<float> slot(s->inputs.data() + size_t{worker_id} * numel, numel);
    if (absl::Status st = decoder->Decode(payload, slot); !st.ok()) {
      CountMalformed(worker_id);
      return Refuse(
          Refusal::kMalformed,
          absl::StrCat("malformed push from worker ", worker_id, " for round ", round, " of slice ",
                       slice_id, " (codec ", core::ClientText(codec), "): ", st.message()));
    }
    s->pushed[worker_id] = 1;
    ++s->num_pushed;
    ++s->num_complete;
    const codecs::SharedStructure shared = decoder->shared_structure();
    s->supports[worker_id] = shared == codecs::SharedStructure::kSeededSupport
                                 ? codecs::SeededSupportOf(payload)
                                 : std::nullopt;
    if (sign_vote_) {
      if (shared == codecs::SharedStructure::kSignBits) {
        s->sign_payloads[worker_id].assign(payload);
      } else {
        s->sign_payloads[worker_id].clear();
      }
    }
    close = AfterPushLocked(s, &new_deadline);
  }
  {
    absl::MutexLock stats_lock(&stats_mu_);
    ++stats_.pushes_accepted;
    stats_.push_bytes += payload.size();
    stats_.push_decoded_bytes += uint64_t{numel} * sizeof(float);
  }
  if (new_deadline.has_value() && !close) deadlines_.Add(slice_id, *new_deadline);
  return absl::OkStatus();
}

absl::Status Shard::PushChunk(const core::DatagramHeader& h, std::string_view codec,
                              std::string_view payload) {
  if (draining_.load()) {
    return Refuse(Refusal::kShuttingDown, "shard is shutting down");
  }
  const uint32_t worker_id = h.worker_id;
  if (worker_id >= options_.num_workers) {
    return Refuse(Refusal::kBadWorkerId,
                  absl::StrCat("datagram from worker ", worker_id, " of ", options_.num_workers));
  }
  PS_ASSIGN_OR_RETURN(SliceState * s, LookupSlice(layout_hash(), h.slice_id));
  const uint32_t numel = s->info.numel;
  auto malformed = [&](absl::string_view why) {
    CountMalformed(worker_id);
    return Refuse(
        Refusal::kMalformed,
        absl::StrCat("malformed chunk ", h.chunk_index, " of ", h.chunk_count, " from worker ",
                     worker_id, " for round ", h.round, " of slice ", h.slice_id, ": ", why));
  };
  if (absl::Status geometry = core::CheckChunkGeometry(h, numel); !geometry.ok()) {
    return malformed(geometry.message());
  }
  const core::ChunkRange range = core::ChunkRangeOf(numel, h.chunk_elems, h.chunk_index);
  bool close = false;
  std::optional<core::SteadyTime> new_deadline;
  {
    absl::MutexLock lock(&s->mu);
    PS_RETURN_IF_ERROR(CheckOpenRoundLocked(s, worker_id, h.round));
    SliceState::ChunkedPush& push = s->chunked[worker_id];
    if (push.chunk_count == 0 && s->pushed[worker_id]) {
      return Refuse(Refusal::kDuplicate,
                    absl::StrCat("chunk from worker ", worker_id, " for round ", h.round,
                                 " of slice ", h.slice_id, ", which it already pushed over gRPC"));
    }
    if (push.chunk_count != 0 && push.chunk_elems != h.chunk_elems) {
      return malformed(absl::StrCat("chunk size ", h.chunk_elems, " after chunks of ",
                                    push.chunk_elems, " in the same push"));
    }
    if (push.chunk_count != 0 && push.seen[h.chunk_index]) {
      return Refuse(Refusal::kDuplicate,
                    absl::StrCat("replayed chunk ", h.chunk_index, " from worker ", worker_id,
                                 " for round ", h.round, " of slice ", h.slice_id));
    }
    PS_ASSIGN_OR_RETURN(const std::shared_ptr<const codecs::Codec> decoder,
                        CheckedDecoder(worker_id, h.slice_id, codec));
    if (s->inputs.empty()) s->inputs.resize(size_t{options_.num_workers} * numel);
    std::span<float> slot(s->inputs.data() + size_t{worker_id} * numel + range.first, range.count);
    if (absl::Status st = decoder->Decode(payload, slot); !st.ok()) {
      return malformed(absl::StrCat("codec ", core::ClientText(codec), ": ", st.message()));
    }
    if (push.chunk_count == 0) {
      push.chunk_elems = h.chunk_elems;
      push.chunk_count = h.chunk_count;
      push.received = 0;
      push.seen.assign(h.chunk_count, 0);
      s->pushed[worker_id] = 1;
      ++s->num_pushed;
      // Chunks never share a support or carry a whole sign payload: aggregate decoded.
      s->supports[worker_id] = std::nullopt;
      if (sign_vote_) s->sign_payloads[worker_id].clear();
    }
    push.seen[h.chunk_index] = 1;
    if (++push.received == push.chunk_count) ++s->num_complete;
    close = AfterPushLocked(s, &new_deadline);
  }
  {
    absl::MutexLock stats_lock(&stats_mu_);
    ++stats_.udp_chunks_accepted;
    stats_.push_bytes += payload.size();
    stats_.push_decoded_bytes += uint64_t{range.count} * sizeof(float);
  }
  if (new_deadline.has_value() && !close) deadlines_.Add(h.slice_id, *new_deadline);
  StartUdpRound(h.round);
  return absl::OkStatus();
}

void Shard::CloseLocked(SliceState* s, bool at_deadline) {
  s->closing = true;
  if (s->deadline.has_value()) deadlines_.Remove(s->info.id, *s->deadline);
  s->deadline.reset();
  s->deadline_passed = false;
  uint64_t lost = 0;
  for (const SliceState::ChunkedPush& push : s->chunked) lost += push.chunk_count - push.received;
  {
    absl::MutexLock stats_lock(&stats_mu_);
    if (at_deadline) ++stats_.rounds_closed_at_deadline;
    stats_.udp_chunks_lost += lost;
  }
  if (model_scope_) {
    // The round is aggregated once every owned slice has closed (StartModelRound).
    bool all = false;
    {
      absl::MutexLock lock(&mu_);
      all = ++model_closed_ == owned_ids_.size();
      if (all) model_closed_ = 0;
    }
    if (all) {
      const uint64_t round = s->version;
      jobs_.Submit([this, round] { StartModelRound(round); });
    }
    return;
  }
  // Each job aggregates the most urgent closed slice at the time it runs (P3), not
  // necessarily the one that scheduled it.
  jobs_.SubmitRanked(priority_schedule_ ? s->info.priority : 0, s->info.id,
                     [this](uint32_t slice) { Aggregate(slices_[slice].get()); });
}

std::vector<uint32_t> Shard::SharedSupport(const SliceState& s,
                                           std::span<const uint32_t> workers) {
  if (workers.empty()) return {};
  const std::optional<codecs::SeededSupport>& first = s.supports[workers[0]];
  if (!first.has_value()) return {};
  for (uint32_t w : workers) {
    if (s.supports[w] != first) return {};
  }
  {
    absl::MutexLock stats_lock(&stats_mu_);
    ++stats_.aggregations_on_support;
  }
  return codecs::SupportIndices(*first, s.info.numel);
}

void Shard::Aggregate(SliceState* s) {
  const auto start = std::chrono::steady_clock::now();
  const uint32_t numel = s->info.numel;
  std::vector<uint32_t> workers;
  uint64_t round;
  {
    absl::MutexLock lock(&s->mu);
    round = s->version;
    for (uint32_t w = 0; w < options_.num_workers; ++w) {
      if (s->pushed[w]) workers.push_back(w);
    }
  }
  std::vector<float> out(numel);
  absl::Status st;
  std::vector<std::string_view> signs;
  if (sign_vote_) {
    for (uint32_t w : workers) {
      if (!s->sign_payloads[w].empty()) signs.push_back(s->sign_payloads[w]);
    }
  }
  const InputMasks masks = MasksOf(*s, workers);
  if (!masks.ptrs.empty()) {
    absl::MutexLock stats_lock(&stats_mu_);
    ++stats_.masked_aggregations;
  }
  if (!signs.empty() && signs.size() == workers.size()) {
    // Every push is sign-compressed: vote on the packed bits (same result as the rule).
    st = codecs::SignMajorityVote(signs, out);
    absl::MutexLock stats_lock(&stats_mu_);
    ++stats_.sign_votes;
  } else {
    std::vector<const float*> rows;
    for (uint32_t w : workers) rows.push_back(s->inputs.data() + size_t{w} * numel);
    const std::vector<uint32_t> support = SharedSupport(*s, workers);
    aggregators::AggregationContext ctx;
    ctx.slice_id = s->info.id;
    ctx.round = round;
    ctx.pool = pool_;
    ctx.masks = masks.ptrs;
    ctx.state = s->rule_state;
    ctx.support = support;
    st = aggregator_->Aggregate(rows, out, ctx);
  }
  ObserveAggregation(AggregationStage::kSlice, start);
  Publish(s, round, out, st);
}

void Shard::Publish(SliceState* s, uint64_t round, std::vector<float>& out, absl::Status st) {
  if (st.ok() && core::FindNonFinite(out) >= 0) {
    st = absl::InternalError("aggregate is not finite (inputs overflowed)");
  }
  std::shared_ptr<const std::string> values;
  if (!st.ok()) {
    // Keep serving: publish the unchanged parameters (or a zero aggregate) so workers
    // move on, and say loudly that this round was dropped.
    uint64_t dropped;
    {
      absl::MutexLock stats_lock(&stats_mu_);
      dropped = ++stats_.aggregation_errors;
    }
    // The 1st, 2nd, 4th, 8th, ... loudly (a lossy UDP path can drop many), the rest at debug.
    spdlog::log(std::has_single_bit(dropped) ? spdlog::level::err : spdlog::level::debug,
                "shard {}: round {} of slice {} dropped ({} so far): {}", shard_id_, round,
                s->info.id, dropped, std::string(st.message()));
  }
  if (options_.aggregate_only) {
    if (!st.ok()) std::fill(out.begin(), out.end(), 0.0f);
    values = Fp32Bytes(out);
  } else {
    if (st.ok()) SgdStep(sgd_, out, s->velocity, s->params);
    values = Fp32Bytes(s->params);
  }
  std::shared_ptr<const std::vector<float>> velocity, rule_state;
  if (checkpoints_) {
    velocity = std::make_shared<const std::vector<float>>(s->velocity);
    rule_state = std::make_shared<const std::vector<float>>(s->rule_state);
  }
  Watchers wake;
  std::optional<core::SteadyTime> udp_deadline;
  {
    absl::MutexLock lock(&s->mu);
    ++s->version;
    std::fill(s->pushed.begin(), s->pushed.end(), 0);
    std::fill(s->supports.begin(), s->supports.end(), std::nullopt);
    for (SliceState::ChunkedPush& push : s->chunked) push.chunk_count = push.received = 0;
    s->num_pushed = 0;
    s->num_complete = 0;
    s->closing = false;
    s->published = std::move(values);
    s->published_velocity = std::move(velocity);
    s->published_rule_state = std::move(rule_state);
    // The new round already carries UDP chunks on this shard: its deadline runs now.
    const int64_t udp_round = udp_round_.load();
    if (udp_round >= 0 && static_cast<uint64_t>(udp_round) >= s->version) {
      s->deadline = clock_->Now() + std::chrono::duration_cast<core::Duration>(options_.round_deadline);
      udp_deadline = s->deadline;
    }
    wake = TakeDueWatchers(s);
  }
  if (udp_deadline.has_value()) deadlines_.Add(s->info.id, *udp_deadline);
  {
    absl::MutexLock stats_lock(&stats_mu_);
    ++stats_.rounds_closed;
  }
  for (auto& [min_version, fn] : wake) fn(true);
}

void Shard::SetShareSender(std::function<void(std::shared_ptr<const RoundShare>)> sender) {
  absl::MutexLock lock(&mu_);
  share_sender_ = std::move(sender);
}

void Shard::StartModelRound(uint64_t round) {
  std::vector<uint32_t> ids;
  uint64_t layout_hash = 0;
  {
    absl::MutexLock lock(&mu_);
    ids = owned_ids_;
    layout_hash = layout_->hash();
  }
  // Participants: the workers whose push every owned slice accepted. A worker missing
  // from any slice is left out of the whole round (docs/aggregators.md, "Model scope").
  std::vector<uint8_t> everywhere(options_.num_workers, 1);
  for (uint32_t id : ids) {
    SliceState* s = slices_[id].get();
    absl::MutexLock lock(&s->mu);
    for (uint32_t w = 0; w < options_.num_workers; ++w) everywhere[w] &= s->pushed[w];
  }
  auto share = std::make_shared<RoundShare>();
  share->layout_hash = layout_hash;
  share->shard_id = shard_id_;
  share->round = round;
  for (uint32_t w = 0; w < options_.num_workers; ++w) {
    if (everywhere[w]) share->participants.push_back(w);
  }
  const size_t rows = share->participants.size() + aggregator_->StateRows();
  share->gram.assign(rows * rows, 0.0);
  absl::Status st = absl::OkStatus();
  if (!share->participants.empty()) {
    const auto start = std::chrono::steady_clock::now();
    for (uint32_t id : ids) {
      SliceState* s = slices_[id].get();
      std::vector<const float*> inputs;
      for (uint32_t w : share->participants) inputs.push_back(s->inputs.data() + size_t{w} * s->info.numel);
      const std::vector<uint32_t> support = SharedSupport(*s, share->participants);
      const InputMasks masks = MasksOf(*s, share->participants);
      aggregators::AggregationContext ctx;
      ctx.slice_id = id;
      ctx.round = round;
      ctx.pool = pool_;
      ctx.masks = masks.ptrs;
      ctx.state = s->rule_state;
      ctx.support = support;
      st.Update(aggregator_->AccumulateGram(inputs, s->info.numel, ctx, share->gram));
    }
    ObserveAggregation(AggregationStage::kModelGram, start);
  }
  if (!st.ok()) {
    // Only a programming error gets here (sizes are ours); keep the shards in step by
    // sending a share without participants, which makes the round fail everywhere.
    spdlog::error("shard {}: round {}: Gram matrix: {}", shard_id_, round, std::string(st.message()));
    share->participants.clear();
    share->gram.assign(aggregator_->StateRows() * aggregator_->StateRows(), 0.0);
  }
  std::function<void(std::shared_ptr<const RoundShare>)> sender;
  {
    absl::MutexLock lock(&mu_);
    sender = share_sender_;
  }
  if (options_.num_shards > 1 && sender) sender(share);
  if (absl::Status stored = StoreShare(share); !stored.ok()) {
    spdlog::error("shard {}: own share of round {}: {}", shard_id_, round, std::string(stored.message()));
  }
}

absl::Status Shard::AcceptShare(const RoundShare& share) {
  auto refuse = [&](absl::Status st) {
    {
      absl::MutexLock stats_lock(&stats_mu_);
      ++stats_.shares_refused;
    }
    spdlog::warn("shard {}: refused share of round {} from shard {}: {}", shard_id_, share.round,
                 share.shard_id, std::string(st.message()));
    return st;
  };
  if (!model_scope_) {
    return refuse(absl::FailedPreconditionError(
        "this shard does not run in model scope (check --aggregator and --aggregation-scope)"));
  }
  if (!registered_.load(std::memory_order_acquire)) {
    return refuse(core::Refused(Refusal::kNoLayout, "no layout registered yet"));
  }
  if (share.layout_hash != layout_hash()) {
    return refuse(core::Refused(Refusal::kLayoutMismatch,
                                absl::StrCat("share for layout ", absl::Hex(share.layout_hash),
                                             ", this shard has ", absl::Hex(layout_hash()))));
  }
  if (share.shard_id >= options_.num_shards || share.shard_id == shard_id_) {
    return refuse(core::Refused(
        Refusal::kMalformed, absl::StrCat("share from shard ", share.shard_id, " (this is shard ",
                                          shard_id_, " of ", options_.num_shards, ")")));
  }
  for (size_t i = 0; i < share.participants.size(); ++i) {
    if (share.participants[i] >= options_.num_workers ||
        (i > 0 && share.participants[i] <= share.participants[i - 1])) {
      return refuse(core::Refused(Refusal::kMalformed,
                                  "participants must be increasing worker ids below --workers"));
    }
  }
  const size_t rows = share.participants.size() + aggregator_->StateRows();
  if (share.gram.size() != rows * rows) {
    return refuse(core::Refused(
        Refusal::kMalformed,
        absl::StrCat("Gram matrix of ", share.gram.size(), " values for ", rows, " rows")));
  }
  for (double v : share.gram) {
    if (!std::isfinite(v))
      return refuse(core::Refused(Refusal::kMalformed, "Gram matrix is not finite"));
  }
  absl::Status st = StoreShare(std::make_shared<const RoundShare>(share));
  if (!st.ok()) return refuse(st);
  return absl::OkStatus();
}

absl::Status Shard::StoreShare(std::shared_ptr<const RoundShare> share) {
  std::optional<std::vector<std::shared_ptr<const RoundShare>>> complete;
  uint64_t round = 0;
  bool shares_due_set = false;
  {
    absl::MutexLock lock(&mu_);
    if (share->round < model_round_ || share->round > model_round_ + 1) {
      return absl::OutOfRangeError(absl::StrCat("share of round ", share->round,
                                                " while this shard is at round ", model_round_));
    }
    std::vector<std::shared_ptr<const RoundShare>>& slot = shares_[share->round];
    slot.resize(options_.num_shards);
    if (slot[share->shard_id] != nullptr) {
      return absl::AlreadyExistsError(
          absl::StrCat("second share of round ", share->round, " from shard ", share->shard_id));
    }
    slot[share->shard_id] = share;
    if (share->shard_id == shard_id_ && share->round == model_round_ && options_.num_shards > 1) {
      shares_due_ = clock_->Now() + std::chrono::duration_cast<core::Duration>(options_.peer_timeout);
      shares_due_set = true;
    }
    complete = ClaimCompleteRoundLocked();
    round = model_round_;
  }
  if (shares_due_set && !complete.has_value()) deadlines_.Notify();
  if (complete.has_value()) {
    jobs_.Submit([this, round, shares = *std::move(complete)]() mutable {
      FinishModelRound(round, std::move(shares));
    });
  }
  return absl::OkStatus();
}

std::optional<std::vector<std::shared_ptr<const RoundShare>>> Shard::ClaimCompleteRoundLocked() {
  if (model_finishing_) return std::nullopt;
  auto it = shares_.find(model_round_);
  if (it == shares_.end()) return std::nullopt;
  for (const auto& share : it->second) {
    if (share == nullptr) return std::nullopt;
  }
  model_finishing_ = true;
  shares_due_.reset();
  std::vector<std::shared_ptr<const RoundShare>> shares = std::move(it->second);
  shares_.erase(it);
  return shares;
}

void Shard::FinishModelRound(uint64_t round,
                             std::vector<std::shared_ptr<const RoundShare>> shares) {
  const size_t state_rows = aggregator_->StateRows();
  // The agreed participants: in every shard's share. Every shard computes the same list
  // and the same sum (shards in id order), hence the same plan.
  std::vector<uint32_t> agreed = shares[0]->participants;
  for (const auto& share : shares) {
    std::vector<uint32_t> both;
    std::set_intersection(agreed.begin(), agreed.end(), share->participants.begin(),
                          share->participants.end(), std::back_inserter(both));
    agreed = std::move(both);
  }
  const size_t k = agreed.size();
  const size_t rows = k + state_rows;
  std::vector<double> gram(rows * rows, 0.0);
  for (const auto& share : shares) {
    // Row of each agreed participant (then of each state row) in this share's matrix.
    std::vector<size_t> at;
    size_t j = 0;
    for (uint32_t w : agreed) {
      while (share->participants[j] != w) ++j;
      at.push_back(j);
    }
    const size_t p = share->participants.size();
    for (size_t r = 0; r < state_rows; ++r) at.push_back(p + r);
    const size_t width = p + state_rows;
    for (size_t a = 0; a < rows; ++a) {
      for (size_t b = 0; b < rows; ++b) gram[a * rows + b] += share->gram[at[a] * width + at[b]];
    }
  }
  absl::StatusOr<aggregators::RoundPlan> plan = aggregator_->Plan(k, gram, round);
  {
    // Counted before publishing: a watcher woken below may read the stats.
    absl::MutexLock stats_lock(&stats_mu_);
    ++stats_.model_rounds;
  }
  if (plan.ok()) {
    spdlog::debug("shard {}: round {}: {} of {} workers agreed; {}", shard_id_, round, k,
                  options_.num_workers, plan->Describe());
  } else {
    spdlog::error("shard {}: model round {} dropped: {} (agreed participants: {} of {})",
                  shard_id_, round, std::string(plan.status().message()), k, options_.num_workers);
    absl::MutexLock stats_lock(&stats_mu_);
    ++stats_.model_rounds_dropped;
  }
  PublishModelRound(round, plan, agreed);
}

void Shard::DropModelRound(uint64_t round, const std::string& why) {
  spdlog::error("shard {}: model round {} dropped: {}", shard_id_, round, why);
  {
    absl::MutexLock stats_lock(&stats_mu_);
    ++stats_.model_rounds_dropped;
  }
  PublishModelRound(round, absl::UnavailableError(why), {});
}

void Shard::PublishModelRound(uint64_t round, const absl::StatusOr<aggregators::RoundPlan>& plan,
                              const std::vector<uint32_t>& agreed) {
  std::vector<uint32_t> ids;
  {
    absl::MutexLock lock(&mu_);
    ids = publish_order_;
  }
  for (uint32_t id : ids) {
    SliceState* s = slices_[id].get();
    std::vector<float> out(s->info.numel);
    absl::Status st = plan.status();
    if (plan.ok()) {
      const auto start = std::chrono::steady_clock::now();
      std::vector<const float*> inputs;
      for (uint32_t w : agreed) inputs.push_back(s->inputs.data() + size_t{w} * s->info.numel);
      const std::vector<uint32_t> support = SharedSupport(*s, agreed);
      const InputMasks masks = MasksOf(*s, agreed);
      aggregators::AggregationContext ctx;
      ctx.slice_id = id;
      ctx.round = round;
      ctx.pool = pool_;
      ctx.masks = masks.ptrs;
      ctx.state = s->rule_state;
      ctx.support = support;
      st = aggregator_->Apply(*plan, inputs, out, ctx);
      ObserveAggregation(AggregationStage::kModelApply, start);
    }
    Publish(s, round, out, st);
  }
  AdvanceModelRound(round);
}

void Shard::AdvanceModelRound(uint64_t round) {
  std::optional<std::vector<std::shared_ptr<const RoundShare>>> complete;
  {
    absl::MutexLock lock(&mu_);
    model_round_ = round + 1;
    model_finishing_ = false;
    shares_.erase(round);
    // The next round's own share may already be in (slices reopened as they were
    // published); then its deadline starts now.
    auto next = shares_.find(model_round_);
    if (next != shares_.end() && options_.num_shards > 1 && next->second.size() > shard_id_ &&
        next->second[shard_id_] != nullptr) {
      shares_due_ = clock_->Now() + std::chrono::duration_cast<core::Duration>(options_.peer_timeout);
    }
    complete = ClaimCompleteRoundLocked();
  }
  if (complete.has_value()) {
    jobs_.Submit([this, next = round + 1, shares = *std::move(complete)]() mutable {
      FinishModelRound(next, std::move(shares));
    });
  }
}

absl::Status Shard::ValidatePull(uint64_t layout_hash, std::span<const uint32_t> slice_ids) {
  if (slice_ids.empty()) return absl::InvalidArgumentError("pull names no slices");
  std::vector<uint32_t> sorted(slice_ids.begin(), slice_ids.end());
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return absl::InvalidArgumentError("pull names a slice twice");
  }
  for (uint32_t id : sorted) {
    PS_RETURN_IF_ERROR(LookupSlice(layout_hash, id).status());
  }
  return absl::OkStatus();
}

uint64_t Shard::Watch(uint32_t slice_id, uint64_t min_version, std::function<void(bool)> ready) {
  SliceState* s = slices_[slice_id].get();
  bool now;
  {
    absl::MutexLock lock(&s->mu);
    now = s->initialized && s->version >= min_version;
    if (!now && !draining_.load()) {
      const uint64_t id = next_watch_id_.fetch_add(1);
      s->watchers.emplace(id, PendingWatch{min_version, std::move(ready)});
      return id;
    }
  }
  ready(now);
  return 0;
}

void Shard::Unwatch(uint32_t slice_id, uint64_t watch_id) {
  if (watch_id == 0) return;
  SliceState* s = slices_[slice_id].get();
  std::function<void(bool)> dropped;
  {
    absl::MutexLock lock(&s->mu);
    auto it = s->watchers.find(watch_id);
    if (it == s->watchers.end()) return;
    dropped = std::move(it->second.ready);
    s->watchers.erase(it);
  }
  // `dropped` (and what it holds) is destroyed here, outside the slice's lock.
}

void Shard::ForEachOwnedSlice(const std::function<void(const SliceState&)>& fn) const {
  if (!registered_.load(std::memory_order_acquire)) return;
  for (const auto& s : slices_) {
    if (s == nullptr) continue;
    absl::MutexLock lock(&s->mu);
    fn(*s);
  }
}

uint64_t Shard::WatcherCount() const {
  uint64_t n = 0;
  ForEachOwnedSlice([&](const SliceState& s) ABSL_NO_THREAD_SAFETY_ANALYSIS { n += s.watchers.size(); });
  return n;
}

SliceSnapshot Shard::Snapshot(uint32_t slice_id) const {
  SliceState* s = slices_[slice_id].get();
  absl::MutexLock lock(&s->mu);
  return SliceSnapshot{s->version, s->published};
}

int32_t Shard::SlicePriority(uint32_t slice_id) const { return slices_[slice_id]->info.priority; }

void Shard::Tick(core::SteadyTime now) {
  std::vector<uint32_t> expired;
  std::optional<uint64_t> drop;
  {
    absl::MutexLock lock(&mu_);
    if (shares_due_.has_value() && *shares_due_ <= now && !model_finishing_) {
      shares_due_.reset();
      model_finishing_ = true;
      drop = model_round_;
    }
  }
  expired = deadlines_.PopDue(now);
  if (drop.has_value()) {
    jobs_.Submit([this, round = *drop] {
      DropModelRound(round, absl::StrCat("no share from every peer shard within --peer-timeout-ms=",
                                         options_.peer_timeout.count()));
    });
  }
  for (uint32_t id : expired) {
    SliceState* s = slices_[id].get();
    absl::MutexLock lock(&s->mu);
    if (s->closing || !s->deadline.has_value() || *s->deadline > now) continue;
    s->deadline.reset();
    if (s->num_pushed >= QuorumLocked(*s)) {
      CloseLocked(s, /*at_deadline=*/true);
      uint64_t closed;
      {
        absl::MutexLock stats_lock(&stats_mu_);
        closed = stats_.rounds_closed_at_deadline;
      }
      // On a lossy UDP path most rounds close here: log the 1st, 2nd, 4th, 8th, ...
      spdlog::log(std::has_single_bit(closed) ? spdlog::level::info : spdlog::level::debug,
                  "shard {}: round {} of slice {} closed at its deadline with {} of {} pushes "
                  "({} whole; {} rounds closed at a deadline so far)",
                  shard_id_, s->version, id, s->num_pushed, options_.num_workers,
                  s->num_complete, closed);
    } else {
      s->deadline_passed = true;
      spdlog::warn("shard {}: round {} of slice {} passed its deadline with {} pushes, below the "
                   "quorum of {}; closing as soon as the quorum is reached",
                   shard_id_, s->version, id, s->num_pushed, QuorumLocked(*s));
    }
  }
}

std::optional<core::SteadyTime> Shard::NextDeadline() const {
  absl::MutexLock lock(&mu_);
  std::optional<core::SteadyTime> next = shares_due_;
  const std::optional<core::SteadyTime> slice = deadlines_.Next();
  if (slice.has_value() && (!next.has_value() || *slice < *next)) next = slice;
  return next;
}

void Shard::SetDeadlineListener(std::function<void()> listener) {
  deadlines_.SetListener(std::move(listener));
}

void Shard::Drain(core::Duration timeout) {
  draining_.store(true);
  jobs_.WaitIdle(timeout);
  if (!registered_.load(std::memory_order_acquire)) return;
  for (auto& s : slices_) {
    if (s == nullptr) continue;
    absl::flat_hash_map<uint64_t, PendingWatch> wake;
    {
      absl::MutexLock lock(&s->mu);
      wake.swap(s->watchers);
    }
    for (auto& [id, watch] : wake) watch.ready(false);
  }
}

bool Shard::layout_registered() const { return registered_.load(std::memory_order_acquire); }

bool Shard::ready() const {
  absl::MutexLock lock(&mu_);
  return layout_.has_value() && uninitialized_ == 0;
}

uint32_t Shard::workers_joined() const { return sessions_.joined(); }

uint64_t Shard::MaxVersion() const {
  uint64_t v = 0;
  ForEachOwnedSlice([&](const SliceState& s) ABSL_NO_THREAD_SAFETY_ANALYSIS { v = std::max(v, s.version); });
  return v;
}

absl::StatusOr<ShardCheckpoint> Shard::Capture() const {
  ShardCheckpoint c;
  c.shard_id = shard_id_;
  c.num_shards = options_.num_shards;
  c.config_summary = options_.ConsistencySummary();
  c.written_unix_s =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  std::vector<uint32_t> ids;
  {
    absl::MutexLock lock(&mu_);
    if (!layout_.has_value() || uninitialized_ != 0) {
      return absl::FailedPreconditionError(
          "nothing to checkpoint yet: the layout is not registered or not every slice has its "
          "initial value");
    }
    c.layout = *layout_;
    ids = owned_ids_;
  }
  // Slices publish one after the other; between two rounds they all stand at the same
  // version. Try for a while to catch such a moment (a restore moves slices that are a
  // version behind up, losing that version's update on them).
  constexpr int kAttempts = 200;
  for (int attempt = 0;; ++attempt) {
    c.slices.clear();
    uint64_t lo = UINT64_MAX, hi = 0;
    for (uint32_t id : ids) {
      SliceState* s = slices_[id].get();
      absl::MutexLock lock(&s->mu);
      SliceCheckpoint& out = c.slices.emplace_back();
      out.slice_id = id;
      out.version = s->version;
      out.values = *s->published;
      if (s->published_velocity != nullptr && !options_.aggregate_only) {
        out.velocity = *s->published_velocity;
      }
      if (s->published_rule_state != nullptr) out.rule_state = *s->published_rule_state;
      lo = std::min(lo, s->version);
      hi = std::max(hi, s->version);
    }
    if (lo == hi || attempt + 1 >= kAttempts) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return c;
}

absl::Status Shard::Restore(const ShardCheckpoint& c) {
  if (c.shard_id != shard_id_ || c.num_shards != options_.num_shards) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint belongs to shard ", c.shard_id, " of ", c.num_shards,
        "; this is shard ", shard_id_, " of ", options_.num_shards,
        ": refusing to restore it (point --checkpoint-dir elsewhere, or move the directory away "
        "to start from scratch)"));
  }
  if (!c.layout.has_value()) return absl::OkStatus();
  if (c.layout->num_shards() != options_.num_shards) {
    return absl::FailedPreconditionError(absl::StrCat("the checkpoint's layout is cut for ",
                                                      c.layout->num_shards(), " shards, not ",
                                                      options_.num_shards));
  }
  uint64_t newest = 0;
  {
    absl::MutexLock lock(&mu_);
    if (layout_.has_value()) {
      return absl::FailedPreconditionError("a layout is registered already: restore comes first");
    }
    InstallLayoutLocked(*c.layout);
    uninitialized_ = 0;
  }
  // Slice locks are taken without mu_ held (the lock order is slice -> shard).
  {
    for (const SliceCheckpoint& sc : c.slices) {
      SliceState* s = slices_[sc.slice_id].get();
      if (s == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("checkpoint slice ", sc.slice_id, " is not owned by this shard"));
      }
      // Not yet shared with any other thread (no worker admitted yet).
      s->params.resize(s->info.numel);
      std::memcpy(s->params.data(), sc.values.data(), sc.values.size());
      s->velocity = sc.velocity.empty() ? std::vector<float>(s->info.numel, 0.0f) : sc.velocity;
      if (sc.rule_state.size() == s->rule_state.size()) s->rule_state = sc.rule_state;
      absl::MutexLock slice_lock(&s->mu);
      s->version = sc.version;
      s->initialized = true;
      s->published = std::make_shared<const std::string>(sc.values);
      if (checkpoints_) {
        s->published_velocity = std::make_shared<const std::vector<float>>(s->velocity);
        s->published_rule_state = std::make_shared<const std::vector<float>>(s->rule_state);
      }
      newest = std::max(newest, sc.version);
    }
  }
  {
    absl::MutexLock lock(&mu_);
    model_round_ = newest;
  }
  const uint32_t moved = FastForward(newest);
  spdlog::info("shard {}: restored layout {:x} and {} slices at version {}{}", shard_id_,
               c.layout->hash(), c.slices.size(), newest,
               moved > 0 ? absl::StrCat(" (", moved, " slices were a version behind and moved up)")
                         : std::string());
  return absl::OkStatus();
}

uint32_t Shard::FastForward(uint64_t version) {
  if (!registered_.load(std::memory_order_acquire)) return 0;
  uint32_t moved = 0;
  std::vector<Watchers> wake;
  for (const auto& sp : slices_) {
    SliceState* s = sp.get();
    if (s == nullptr) continue;
    absl::MutexLock lock(&s->mu);
    if (s->version >= version || s->closing || !s->initialized) continue;
    s->version = version;
    std::fill(s->pushed.begin(), s->pushed.end(), 0);
    std::fill(s->supports.begin(), s->supports.end(), std::nullopt);
    for (SliceState::ChunkedPush& push : s->chunked) push.chunk_count = push.received = 0;
    s->num_pushed = 0;
    s->num_complete = 0;
    s->deadline.reset();
    s->deadline_passed = false;
    wake.push_back(TakeDueWatchers(s));
    ++moved;
  }
  {
    absl::MutexLock lock(&mu_);
    if (model_round_ < version) {
      model_round_ = version;
      model_closed_ = 0;
      shares_.erase(shares_.begin(), shares_.lower_bound(version));
      shares_due_.reset();
    }
  }
  for (Watchers& w : wake) {
    for (auto& [min_version, fn] : w) fn(true);
  }
  return moved;
}

uint64_t Shard::MinVersion() const {
  uint64_t v = UINT64_MAX;
  bool any = false;
  ForEachOwnedSlice([&](const SliceState& s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    v = std::min(v, s.version);
    any = true;
  });
  return any ? v : 0;
}

ShardStats Shard::stats() const {
  absl::MutexLock lock(&stats_mu_);
  return stats_;
}

}  // namespace ps::server
