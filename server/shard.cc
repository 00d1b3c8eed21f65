#include "server/shard.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <random>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/credentials.h"
#include "core/status.h"
#include "spdlog/spdlog.h"

namespace ps::server {

namespace {

// A random non-zero 64-bit value: the lineage of a shard's published values.
uint64_t NewEpoch() {
  std::random_device device;
  uint64_t epoch = 0;
  while (epoch == 0) epoch = (uint64_t{device()} << 32) ^ device();
  return epoch;
}

}  // namespace

Shard::Shard(const ServerOptions& options, uint32_t shard_id,
             std::unique_ptr<aggregators::Aggregator> aggregator, core::Clock* clock,
             core::ThreadPool* pool)
    : options_(options),
      pull_epoch_(options.pull_codec.empty() ? 0 : NewEpoch()),
      shard_id_(shard_id),
      // The default quorum (n - f) is raised to what the rule needs (Bulyan: 4f + 3), so
      // that a round closed at its deadline can always be aggregated.
      quorum_(options.quorum != 0
                  ? options.quorum
                  : std::max<uint32_t>(options.EffectiveQuorum(),
                                       static_cast<uint32_t>(aggregator->MinInputs()))),
      // f + 1 workers include an honest one; at least 2, so no single worker starts a
      // deadline even with f = 0; at most the quorum, so a round with its quorum always
      // has one running.
      starters_(std::min(quorum_, std::max<uint32_t>(options.num_byzantine + 1, 2))),
      aggregator_(std::move(aggregator)),
      udp_rounds_(options.WorkerIds(), starters_),
      aggregation_(aggregator_.get(), pool,
                   SgdOptions{options.learning_rate, options.momentum, options.weight_decay,
                              LrSchedule::Parse(options.lr_schedule).value_or(LrSchedule())},
                   options.aggregate_only, quorum_),
      model_scope_(aggregator_->NeedsGram() &&
                   options.aggregation_scope == AggregationScope::kModel),
      priority_schedule_(options.schedule == Schedule::kPriority),
      clock_(clock),
      decoders_(options.max_cached_decoders),
      // Validated with the options (ServerOptions::Validate).
      codec_policy_(CodecPolicy::Parse(options.allowed_codecs).value_or(CodecPolicy())),
      decode_budget_(options.WorkerIds(), options.max_decode_ms),
      counters_(shard_id, options.WorkerIds()),
      suspicion_(Suspicion::Config{shard_id, options.WorkerIds(), options.suspicion_window,
                                   options.suspicion_threshold}),
      sessions_(options.WorkerIds(),
                core::Identity{core::Identity::Kind::kShard, shard_id}.Name()),
      quarantine_(options.WorkerIds(), options.quarantine),
      membership_(options.num_workers, options.WorkerIds(),
                  std::chrono::duration_cast<core::Duration>(options.worker_timeout)),
      adoption_(options.WorkerIds(),
                Adoption::QuorumFor(options.num_workers, options.num_byzantine, quorum_)),
      table_(SliceTable::Config{shard_id, options.num_shards, options.WorkerIds(),
                                options.max_message_bytes, EffectiveMaxShardBytes(options),
                                aggregator_->StateRows(), !options.checkpoint_dir.empty(),
                                options.aggregate_only, options.schedule == Schedule::kPriority},
             &rules_),
      model_(ModelRounds::Config{shard_id, options.num_shards, options.WorkerIds(),
                                 aggregator_->StateRows(),
                                 std::chrono::duration_cast<core::Duration>(options.peer_timeout)},
             clock, &deadlines_,
             ModelCoordinator::Parts{
                 &table_, &aggregation_, aggregator_.get(), &jobs_, &counters_, &suspicion_,
                 [this](ClosedRound round, std::span<const float> aggregate, absl::Status st) {
                   PublishRound(std::move(round), aggregate, std::move(st));
                 }},
             model_scope_),
      jobs_(pool) {
  rules_.num_workers = options_.WorkerIds();
  rules_.quorum = quorum_;
  rules_.starters = starters_;
  rules_.udp = &udp_rounds_;
  rules_.round_deadline = std::chrono::duration_cast<core::Duration>(options_.round_deadline);
  rules_.clock = clock_;
  rules_.deadlines = &deadlines_;
  rules_.keep_signs = aggregator_->VotesOnSigns();
  rules_.keep_published_model = !options_.checkpoint_dir.empty();
  rules_.flags_velocity = !options_.aggregate_only && options_.momentum != 0;
  rules_.state_rows = aggregator_->StateRows();
  rules_.quarantine = &quarantine_;
  rules_.membership = &membership_;
  rules_.pull_codec = options_.pull_codec;
}

Shard::~Shard() {
  // Aggregation jobs reference this object; wait for them (the pool outlives us).
  jobs_.WaitIdle();
}

absl::Status Shard::Refuse(Refusal r, absl::string_view message) const {
  return counters_.Counted(core::Refused(r, message));
}

void Shard::SetAggregationObserver(std::function<void(AggregationStage, core::Duration)> observer) {
  counters_.SetObserver(std::move(observer));
}

absl::StatusOr<JoinResult> Shard::Join(uint32_t worker_id, std::optional<uint64_t> layout_hash,
                                       std::string_view token) {
  if (draining_.load()) {
    return Refuse(Refusal::kShuttingDown, "shard is shutting down");
  }
  if (worker_id >= options_.WorkerIds()) {
    return Refuse(Refusal::kBadWorkerId,
                  absl::StrCat("worker id ", worker_id, " is out of range: this server accepts ids "
                               "below ", options_.WorkerIds(), " (--workers ", options_.num_workers,
                               ", --max-workers ", options_.WorkerIds(), ")"));
  }
  if (layout_hash == 0) {
    return Refuse(Refusal::kBadLayout, "join without a layout hash");
  }
  if (layout_hash.has_value()) {
    PS_RETURN_IF_ERROR(counters_.Counted(table_.CheckJoin(worker_id, *layout_hash)));
  }
  JoinResult result;
  result.layout_registered = table_.registered();
  if (const core::ModelLayout* layout = table_.layout(); layout != nullptr) {
    result.slice_elems = layout->slice_elems();
  }
  result.ready = table_.ready();
  PS_ASSIGN_OR_RETURN(SessionTable::Issued issued, sessions_.Issue(worker_id, token));
  result.session = std::move(issued.session);
  result.data_session = issued.data_session;
  result.udp_key = std::move(issued.udp_key);
  result.data_secret = std::move(issued.data_secret);
  const uint64_t joins = issued.joins;
  NotePresent(worker_id, clock_->Now(), "a join");
  result.version = MinVersion();
  // A client may join in a loop: the 1st, 2nd, 4th, ... join of each worker at info.
  spdlog::log(std::has_single_bit(joins) ? spdlog::level::info : spdlog::level::debug,
              "shard {}: worker {} joined (layout {}registered; join {} of this worker)", shard_id_,
              worker_id, result.layout_registered ? "" : "not ", joins);
  return result;
}

absl::StatusOr<uint32_t> Shard::Authenticate(std::string_view session) const {
  std::optional<uint32_t> worker = sessions_.WorkerOf(session);
  if (!worker.has_value()) {
    return Refuse(Refusal::kUnknownSession, "unknown session: join (again) first");
  }
  return *worker;
}

absl::StatusOr<std::shared_ptr<const DataSession>> Shard::FindDataSession(
    uint64_t data_session, std::string_view what) const {
  std::shared_ptr<const DataSession> session = sessions_.DataSessionOf(data_session);
  if (session == nullptr) {
    return Refuse(Refusal::kUnknownSession,
                  absl::StrCat(core::AsAbsl(what),
                               " under an unknown or replaced data session: join (again) first"));
  }
  return session;
}

absl::Status Shard::AnswerRegistered(const core::ModelLayout& have, uint32_t worker_id, bool same,
                                     const absl::AlphaNum& offered) const {
  return counters_.Counted(table_.AnswerRegistered(have, worker_id, same, offered));
}

absl::StatusOr<std::vector<uint32_t>> Shard::RegisterLayout(uint32_t worker_id,
                                                            std::vector<core::TensorSpec> tensors,
                                                            uint32_t slice_elems,
                                                            uint32_t num_shards) {
  return Registered(worker_id,
                    table_.Register(worker_id, std::move(tensors), slice_elems, num_shards));
}

absl::StatusOr<std::vector<uint32_t>> Shard::RegisterLayout(uint32_t worker_id,
                                                            const core::ModelLayout& layout) {
  return Registered(worker_id, table_.Register(worker_id, layout));
}

absl::StatusOr<std::vector<uint32_t>> Shard::Registered(
    uint32_t worker_id, absl::StatusOr<std::vector<uint32_t>> owned) {
  if (!owned.ok()) return counters_.Counted(owned.status());
  const core::ModelLayout& layout = *table_.layout();
  spdlog::info("shard {}: worker {} registered layout {:x}: {} tensors, {} slices, {} owned",
               shard_id_, worker_id, layout.hash(), layout.tensors().size(), layout.slices().size(),
               owned->size());
  return owned;
}

absl::StatusOr<SliceRound*> Shard::LookupSlice(uint64_t layout_hash, uint32_t slice_id) {
  absl::StatusOr<SliceRound*> s = table_.Lookup(layout_hash, slice_id);
  if (!s.ok()) return counters_.Counted(s.status());
  return s;
}

const core::ModelLayout* Shard::registered_layout() const { return table_.layout(); }

uint64_t Shard::layout_hash() const { return table_.hash(); }

absl::Status Shard::InitSlice(uint32_t worker_id, uint64_t layout_hash, uint32_t slice_id,
                              std::string_view values) {
  PS_ASSIGN_OR_RETURN(SliceRound * s, LookupSlice(layout_hash, slice_id));
  Wakeups wake;
  PS_RETURN_IF_ERROR(counters_.Counted(s->Initialize(values, &wake)));
  if (table_.SliceInitialized())
    spdlog::info("shard {}: ready (all slices initialized)", shard_id_);
  RunWakeups(wake, true);  // their min_version 0 <= version 0
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const codecs::Codec>> Shard::Decoder(uint32_t worker_id,
                                                                    uint32_t slice_id,
                                                                    std::string_view codec) {
  PS_RETURN_IF_ERROR(codec_policy_.Check(
      absl::StrCat("push from worker ", worker_id, " for slice ", slice_id), codec));
  absl::StatusOr<std::shared_ptr<const codecs::Codec>> decoder = decoders_.Get(codec);
  if (!decoder.ok()) {
    return core::Refused(Refusal::kUnknownCodec,
                         absl::StrCat("push from worker ", worker_id, " for slice ", slice_id, ": ",
                                      decoder.status().message()));
  }
  return decoder;
}

void Shard::NoteRound(uint32_t worker_id, uint64_t round, bool chunk) {
  if (!udp_rounds_.Note(worker_id, round, chunk)) return;
  // Armed: every slice at this round gets its deadline now, so one whose datagrams were
  // all lost still closes, or is dropped below the quorum, instead of stalling.
  table_.ForEach([round](SliceRound& s) { s.StartDeadlineAt(round); });
}

uint32_t Shard::RawRowNumel(uint64_t layout_hash, uint32_t slice_id, std::string_view codec,
                            size_t payload_bytes) const {
  absl::StatusOr<SliceRound*> s = table_.Lookup(layout_hash, slice_id);
  if (!s.ok()) return 0;
  const uint32_t numel = (*s)->info().numel;
  if (payload_bytes != 1 + size_t{numel} * sizeof(float)) return 0;
  const std::shared_ptr<const codecs::Codec> decoder = decoders_.Find(codec);
  return decoder != nullptr && decoder->raw_fp32() ? numel : 0;
}

absl::Status Shard::Push(uint32_t worker_id, uint64_t layout_hash, uint64_t round,
                         uint32_t slice_id, std::string_view codec, const PushPayload& payload,
                         std::optional<float> loss, std::optional<float> lr) {
  if (draining_.load()) {
    return Refuse(Refusal::kShuttingDown, "shard is shutting down");
  }
  PS_RETURN_IF_ERROR(counters_.RefusedPush(worker_id, quarantine_.Check(worker_id, clock_->Now())));
  PS_ASSIGN_OR_RETURN(SliceRound * s, LookupSlice(layout_hash, slice_id));
  // Before the push can close the round and the next one open.
  const std::optional<core::SteadyTime> opened = s->opened();
  DecodeBudget::Reservation budget;
  absl::StatusOr<SliceRound::Progress> progress = s->AcceptPush(
      worker_id, round, codec,
      [&]() -> absl::StatusOr<std::shared_ptr<const codecs::Codec>> {
        PS_ASSIGN_OR_RETURN(budget, decode_budget_.Admit(worker_id, round, slice_id));
        return Decoder(worker_id, slice_id, codec);
      },
      payload, loss, lr);
  if (!progress.ok()) return RefusedPush(worker_id, progress.status());
  budget.Spent(progress->decode);
  const core::SteadyTime now = clock_->Now();
  NotePresent(worker_id, now, "a push");
  counters_.PushAccepted(worker_id, payload.bytes(), uint64_t{s->info().numel} * sizeof(float),
                         opened.has_value() ? now - *opened : core::Duration::zero());
  if (progress->closed) Closed(*s, round, progress->at_deadline);
  NoteRound(worker_id, round, /*chunk=*/false);
  return absl::OkStatus();
}

absl::Status Shard::PushChunk(const net::DatagramHeader& h, std::string_view codec,
                              std::string_view payload) {
  if (draining_.load()) {
    return Refuse(Refusal::kShuttingDown, "shard is shutting down");
  }
  const uint32_t worker_id = h.worker_id;
  if (worker_id >= options_.WorkerIds()) {
    return Refuse(Refusal::kBadWorkerId,
                  absl::StrCat("datagram from worker ", worker_id, " of ", options_.WorkerIds()));
  }
  PS_RETURN_IF_ERROR(counters_.RefusedPush(worker_id, quarantine_.Check(worker_id, clock_->Now())));
  PS_ASSIGN_OR_RETURN(SliceRound * s, LookupSlice(layout_hash(), h.slice_id));
  const bool end = h.kind == net::DatagramKind::kEnd;
  if (absl::Status geometry = net::CheckChunkGeometry(h, s->info().numel); !geometry.ok()) {
    return RefusedPush(
        worker_id,
        core::Refused(Refusal::kMalformed,
                      absl::StrCat("malformed ",
                                   end ? "end of a UDP push"
                                       : absl::StrCat("chunk ", h.chunk_index, " of ",
                                                      h.chunk_count),
                                   " from worker ", worker_id, " for round ", h.round, " of slice ",
                                   h.slice_id, ": ", geometry.message())));
  }
  if (end) {
    absl::StatusOr<SliceRound::Progress> progress =
        s->AcceptEnd({worker_id, h.round, h.chunk_count, h.chunk_elems});
    if (!progress.ok()) {
      // A later copy of the end that closed the round, or a straggler's end: expected,
      // and counted by the backend (ps_udp_push_ends_total), not as a refused push.
      if (core::RefusalOf(progress.status()) == Refusal::kLate) return progress.status();
      return RefusedPush(worker_id, progress.status());
    }
    NotePresent(worker_id, clock_->Now(), "the end of a UDP push");
    if (progress->closed) Closed(*s, h.round, progress->at_deadline);
    return absl::OkStatus();
  }
  const net::ChunkRange range = net::ChunkRangeOf(s->info().numel, h.chunk_elems, h.chunk_index);
  const SliceRound::Chunk chunk{worker_id,     h.round,     h.chunk_index, h.chunk_count,
                                h.chunk_elems, range.first, range.count, h.session_id};
  DecodeBudget::Reservation budget;
  absl::StatusOr<SliceRound::Progress> progress = s->AcceptChunk(
      chunk, codec,
      [&]() -> absl::StatusOr<std::shared_ptr<const codecs::Codec>> {
        PS_ASSIGN_OR_RETURN(budget, decode_budget_.Admit(worker_id, h.round, h.slice_id));
        return Decoder(worker_id, h.slice_id, codec);
      },
      payload);
  if (!progress.ok()) return RefusedPush(worker_id, progress.status());
  budget.Spent(progress->decode);
  NotePresent(worker_id, clock_->Now(), "a UDP chunk");
  if (progress->held_from_before) {
    counters_.ChunkHeldFromBefore();
    return absl::OkStatus();
  }
  counters_.ChunkAccepted(worker_id, payload.size(), uint64_t{range.count} * sizeof(float));
  if (progress->closed) Closed(*s, h.round, progress->at_deadline);
  NoteRound(worker_id, h.round, /*chunk=*/true);
  return absl::OkStatus();
}

absl::Status Shard::RefusedPush(uint32_t worker_id, absl::Status status) {
  status = counters_.RefusedPush(worker_id, std::move(status));
  if (core::RefusalOf(status) == Refusal::kMalformed &&
      quarantine_.Start(worker_id, clock_->Now())) {
    counters_.Quarantined(worker_id, quarantine_.duration());
    WorkerGone();
  }
  return status;
}

std::vector<Membership::State> Shard::MembershipStates() const {
  std::vector<Membership::State> states(membership_.ids());
  for (uint32_t w = 0; w < states.size(); ++w) states[w] = membership_.state(w);
  return states;
}

bool Shard::LoudMembershipLog() {
  return std::has_single_bit(membership_logs_.fetch_add(1) + 1);
}

void Shard::WorkerGone(bool left) {
  // Rounds that were waiting only for absent workers close now.
  table_.ForEach([this](SliceRound& s) {
    if (std::optional<uint64_t> round = s.CloseIfOnlyAbsentMissing()) {
      Closed(s, *round, /*at_deadline=*/false);
    }
  });
  const uint32_t present = membership_.waited_count();
  if (present < quorum_) {
    spdlog::log(!LoudMembershipLog() ? spdlog::level::debug
                : left               ? spdlog::level::info
                                     : spdlog::level::err,
                "shard {}: only {} workers are present (the others left or expired), below the "
                "quorum of {}: rounds cannot close until workers come back or join (the quorum "
                "and the rule's bound stay those of --workers {}, --quorum and --byzantine {})",
                shard_id_, present, quorum_, options_.num_workers, options_.num_byzantine);
  }
}

void Shard::NotePresent(uint32_t worker_id, core::SteadyTime now, std::string_view how) {
  if (membership_.Active(worker_id, now)) {
    spdlog::log(LoudMembershipLog() ? spdlog::level::info : spdlog::level::debug,
                "shard {}: worker {} is back ({}); rounds wait for it again", shard_id_,
                worker_id, how);
  }
}

void Shard::Leave(uint32_t worker_id) {
  if (!membership_.Leave(worker_id)) return;
  spdlog::log(LoudMembershipLog() ? spdlog::level::info : spdlog::level::debug,
              "shard {}: worker {} left; rounds no longer wait for it", shard_id_, worker_id);
  WorkerGone(/*left=*/true);
}

void Shard::Closed(const SliceRound& slice, uint64_t round, bool at_deadline) {
  if (at_deadline) counters_.ClosedAtDeadline();
  if (model_scope_) {
    // The round starts once every owned slice closed it.
    model_.SliceClosed(slice.info().id, round);
    return;
  }
  // Each job aggregates the most urgent closed slice at the time it runs (P3), not
  // necessarily the one that scheduled it.
  jobs_.SubmitRanked(priority_schedule_ ? slice.info().priority : 0, slice.info().id,
                     [this](uint32_t id) { AggregateSlice(id); });
}

void Shard::AggregateSlice(uint32_t slice_id) {
  std::optional<ClosedRound> round = table_.slice(slice_id)->TakeClosed();
  if (!round.has_value()) return;
  const auto start = std::chrono::steady_clock::now();
  const AggregateBuffer buffer(round->info.numel);
  // Kept pushes are decoded into this thread's rows, where the aggregate may stay.
  RowScratch scratch;
  AggregationCounts counts;
  InputWeights weights;
  absl::StatusOr<std::span<const float>> aggregate =
      aggregation_.Aggregate(*round, buffer.values(), &counts, &weights, &scratch);
  counters_.Aggregated(counts, round->ChunksLost());
  if (aggregate.ok()) {
    suspicion_.Record(round->round, weights.workers, weights.influence, weights.alignment,
                      round->info.numel);
  }
  counters_.Observe(AggregationStage::kSlice, start);
  PublishRound(*std::move(round), aggregate.value_or(buffer.values()), aggregate.status());
}

void Shard::PublishRound(ClosedRound round, std::span<const float> aggregate, absl::Status st) {
  RoundAggregation::Publication published = aggregation_.Step(round, aggregate, st);
  // Keep serving: after an error the unchanged parameters (or a zero aggregate) are
  // published so workers move on; the counters say loudly that this round was dropped.
  // Counted before publishing: a watcher woken below may read the stats.
  counters_.Published(round.round, round.info.id, st, round.inputs.pushed, membership_);
  if (membership_.timeout() > core::Duration::zero()) {
    // Those who pushed were waiting for this close: their idle time starts now.
    const core::SteadyTime now = clock_->Now();
    for (uint32_t w = 0; w < round.inputs.pushed.size(); ++w) {
      if (round.inputs.pushed[w] != 0) membership_.Waited(w, now);
    }
  }
  Wakeups wake;
  SliceRound* slice = table_.slice(round.info.id);
  slice->Publish(std::move(round), std::move(published.values), std::move(published.delta_payload),
                 &wake);
  RunWakeups(wake, true);
}

void Shard::SetShareSender(std::function<void(std::shared_ptr<const RoundShare>)> sender) {
  model_.SetSender(std::move(sender));
}

absl::Status Shard::AcceptShare(const RoundShare& share) { return model_.AcceptShare(share); }

size_t Shard::MaxPullSlices() const {
  return table_.registered() ? table_.owned_count() : core::kMaxSlices;
}

absl::Status Shard::ValidatePull(uint64_t layout_hash, std::span<const uint32_t> slice_ids) {
  if (slice_ids.empty()) return Refuse(Refusal::kMalformed, "pull names no slices");
  if (slice_ids.size() > MaxPullSlices()) {
    return Refuse(Refusal::kMalformed, absl::StrCat("pull names ", slice_ids.size(),
                                                    " slices; this shard has ", MaxPullSlices()));
  }
  // Each id is looked up (O(1)) before it is remembered; the set holds at most the
  // owned slices.
  absl::flat_hash_set<uint32_t> seen;
  seen.reserve(slice_ids.size());
  for (uint32_t id : slice_ids) {
    PS_RETURN_IF_ERROR(LookupSlice(layout_hash, id).status());
    if (!seen.insert(id).second) {
      return Refuse(Refusal::kMalformed, absl::StrCat("pull names slice ", id, " twice"));
    }
  }
  return absl::OkStatus();
}

uint64_t Shard::Watch(uint32_t slice_id, uint64_t min_version, std::function<void(bool)> ready) {
  return table_.slice(slice_id)->Watch(min_version, std::move(ready), next_watch_id_.fetch_add(1),
                                       draining_.load());
}

void Shard::Unwatch(uint32_t slice_id, uint64_t watch_id) {
  if (watch_id != 0) table_.slice(slice_id)->Unwatch(watch_id);
}

uint64_t Shard::WatcherCount() const { return table_.WatcherCount(); }

SliceSnapshot Shard::Snapshot(uint32_t slice_id) const {
  return table_.slice(slice_id)->Snapshot();
}

int32_t Shard::SlicePriority(uint32_t slice_id) const {
  return table_.slice(slice_id)->info().priority;
}

void Shard::Tick(core::SteadyTime now) {
  model_.Tick(now);
  const std::vector<uint32_t> expired = membership_.Expire(now);
  for (uint32_t w : expired) {
    spdlog::log(LoudMembershipLog() ? spdlog::level::warn : spdlog::level::debug,
                "shard {}: worker {} expired: nothing taken from it for {} ms "
                "(--worker-timeout-ms); rounds no longer wait for it until it pushes or joins "
                "again",
                shard_id_, w,
                std::chrono::duration_cast<std::chrono::milliseconds>(membership_.timeout())
                    .count());
  }
  if (!expired.empty()) WorkerGone();
  for (uint32_t id : deadlines_.PopDue(now)) {
    SliceRound* s = table_.slice(id);
    const SliceRound::DeadlineOutcome out = s->OnDeadline(now);
    if (!out.due) continue;
    counters_.DeadlinePassed(id, out, options_.num_workers);
    if (out.closed) Closed(*s, out.round, /*at_deadline=*/false);  // counted just now
  }
}

std::optional<core::SteadyTime> Shard::NextDeadline() const {
  std::optional<core::SteadyTime> next = model_.due();
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
  table_.ForEach([](SliceRound& s) {
    Wakeups wake = s.TakeAllWatchers();
    RunWakeups(wake, false);
  });
}

bool Shard::layout_registered() const { return table_.registered(); }

bool Shard::ready() const { return table_.ready(); }

uint32_t Shard::workers_joined() const { return sessions_.joined(); }

uint64_t Shard::MaxVersion() const { return table_.MaxVersion(); }

uint64_t Shard::MinVersion() const { return table_.MinVersion(); }

ShardStats Shard::stats() const {
  ShardStats st = counters_.Get();
  const std::vector<WorkerSuspicion> scores = suspicion_.Get();
  for (size_t w = 0; w < st.workers.size() && w < scores.size(); ++w) {
    st.workers[w].suspicion = scores[w];
  }
  return st;
}

}  // namespace ps::server
