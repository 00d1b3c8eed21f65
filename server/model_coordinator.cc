#include "server/model_coordinator.h"

#include <chrono>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/refusal.h"
#include "core/status.h"
#include "spdlog/spdlog.h"

namespace ps::server {

ModelCoordinator::ModelCoordinator(const ModelRounds::Config& config, core::Clock* clock,
                                   DeadlineQueue* deadlines, Parts parts, bool enabled)
    : config_(config),
      parts_(std::move(parts)),
      enabled_(enabled),
      rounds_(config, clock, deadlines) {}

void ModelCoordinator::SetSender(std::function<void(std::shared_ptr<const RoundShare>)> sender) {
  rounds_.SetSender(std::move(sender));
}

void ModelCoordinator::SliceClosed(uint32_t slice_id, uint64_t round) {
  if (!parts_.aggregation->GramPerSlice()) {
    if (rounds_.SliceClosed(parts_.table->owned_count())) {
      parts_.jobs->Submit([this, round] { Start(round); });
    }
    return;
  }
  parts_.jobs->Submit([this, slice_id, round] {
    if (std::optional<ClosedRound> r = parts_.table->slice(slice_id)->TakeClosed()) {
      const auto start = std::chrono::steady_clock::now();
      parts_.aggregation->SliceGram(*r);
      parts_.counters->Observe(AggregationStage::kModelSliceGram, start);
      absl::MutexLock lock(&taken_mu_);
      taken_.insert_or_assign(slice_id, *std::move(r));
    }
    // Counted once the part is in taken_: the round's start finds it.
    if (rounds_.SliceClosed(parts_.table->owned_count())) Start(round);
  });
}

std::optional<ClosedRound> ModelCoordinator::TakeClosed(uint32_t id, uint64_t round) {
  {
    absl::MutexLock lock(&taken_mu_);
    if (auto it = taken_.find(id); it != taken_.end()) {
      std::optional<ClosedRound> r;
      if (it->second.round == round) r = std::move(it->second);
      taken_.erase(it);  // an older round's, left by a round that never started: dropped
      if (r.has_value()) return r;
    }
  }
  return parts_.table->slice(id)->TakeClosed();
}

void ModelCoordinator::Start(uint64_t round) {
  // Owned slices in increasing id order: the order of the Gram sums.
  std::vector<ClosedRound> closed;
  uint64_t chunks_lost = 0;
  for (uint32_t id : parts_.table->owned_ids()) {
    std::optional<ClosedRound> r = TakeClosed(id, round);
    if (!r.has_value()) continue;
    chunks_lost += r->ChunksLost();
    closed.push_back(*std::move(r));
  }
  const size_t state_rows = config_.state_rows;
  auto share = std::make_shared<RoundShare>();
  share->layout_hash = parts_.table->hash();
  share->shard_id = config_.shard_id;
  share->round = round;
  share->participants = parts_.aggregation->Participants(closed, config_.num_workers);
  const size_t rows = share->participants.size() + state_rows;
  share->gram.assign(rows * rows, 0.0);
  absl::Status st = absl::OkStatus();
  AggregationCounts counts;
  if (!share->participants.empty()) {
    const auto start = std::chrono::steady_clock::now();
    st = parts_.aggregation->AccumulateGram(closed, share->participants, share->gram, &counts);
    parts_.counters->Observe(AggregationStage::kModelGram, start);
  }
  parts_.counters->Aggregated(counts, chunks_lost);
  if (!st.ok()) {
    // Only a programming error gets here (sizes are ours); keep the shards in step by
    // sending a share without participants, which makes the round fail everywhere.
    spdlog::error("shard {}: round {}: Gram matrix: {}", config_.shard_id, round,
                  std::string(st.message()));
    share->participants.clear();
    share->gram.assign(state_rows * state_rows, 0.0);
  }
  // Held before the share goes out: the round may complete at once.
  rounds_.Hold(round, std::move(closed));
  const auto sender = rounds_.sender();
  if (config_.num_shards > 1 && sender) sender(share);
  if (absl::Status stored = Store(share); !stored.ok()) {
    spdlog::error("shard {}: own share of round {}: {}", config_.shard_id, round,
                  std::string(stored.message()));
  }
}

absl::Status ModelCoordinator::AcceptShare(const RoundShare& share) {
  auto refuse = [&](absl::Status st) {
    return parts_.counters->RefusedShare(share.shard_id, share.round, std::move(st));
  };
  if (!enabled_) {
    return refuse(absl::FailedPreconditionError(
        "this shard does not run in model scope (check --aggregator and --aggregation-scope)"));
  }
  if (!parts_.table->registered()) {
    return refuse(core::Refused(core::Refusal::kNoLayout, "no layout registered yet"));
  }
  if (const uint64_t have = parts_.table->hash(); share.layout_hash != have) {
    return refuse(core::Refused(core::Refusal::kLayoutMismatch,
                                absl::StrCat("share for layout ", absl::Hex(share.layout_hash),
                                             ", this shard has ", absl::Hex(have))));
  }
  if (absl::Status st = rounds_.CheckShare(share); !st.ok()) return refuse(std::move(st));
  if (absl::Status st = Store(std::make_shared<const RoundShare>(share)); !st.ok()) {
    return refuse(std::move(st));
  }
  return absl::OkStatus();
}

absl::Status ModelCoordinator::Store(std::shared_ptr<const RoundShare> share) {
  PS_ASSIGN_OR_RETURN(std::optional<ModelRounds::Complete> complete,
                      rounds_.Store(std::move(share)));
  FinishLater(std::move(complete));
  return absl::OkStatus();
}

void ModelCoordinator::FinishLater(std::optional<ModelRounds::Complete> complete) {
  if (!complete.has_value()) return;
  parts_.jobs->Submit([this, c = *std::move(complete)]() mutable { Finish(std::move(c)); });
}

void ModelCoordinator::Finish(ModelRounds::Complete complete) {
  const uint64_t round = complete.round;
  CombinedShares combined = CombineShares(complete.shares, config_.state_rows);
  const size_t k = combined.agreed.size();
  // Every shard agrees on the participants and has the same quorum: all of them drop a
  // round whose agreed participants are fewer, and none runs the rule on it.
  absl::StatusOr<aggregators::RoundPlan> plan =
      [&]() -> absl::StatusOr<aggregators::RoundPlan> {
    PS_RETURN_IF_ERROR(parts_.aggregation->CheckQuorum(
        k, absl::StrCat("model round ", round, " (workers in every slice of every shard)")));
    return parts_.rule->Plan(k, combined.gram, round);
  }();
  // Counted before publishing: a watcher woken below may read the stats.
  parts_.counters->ModelRoundAggregated();
  if (plan.ok()) {
    spdlog::debug("shard {}: round {}: {} of {} workers agreed; {}", config_.shard_id, round, k,
                  config_.num_workers, plan->Describe());
  } else {
    parts_.counters->ModelRoundDropped(
        round, absl::StrCat(plan.status().message(), " (agreed participants: ", k, " of ",
                            config_.num_workers, ")"));
  }
  Publish(round, plan, combined.agreed);
}

void ModelCoordinator::Tick(core::SteadyTime now) {
  const std::optional<uint64_t> overdue = rounds_.Overdue(now);
  if (!overdue.has_value()) return;
  parts_.jobs->Submit([this, round = *overdue] {
    const std::string why = absl::StrCat(
        "no share from every peer shard within --peer-timeout-ms=",
        std::chrono::duration_cast<std::chrono::milliseconds>(config_.peer_timeout).count());
    parts_.counters->ModelRoundDropped(round, why);
    Publish(round, absl::UnavailableError(why), {});
  });
}

void ModelCoordinator::Publish(uint64_t round, const absl::StatusOr<aggregators::RoundPlan>& plan,
                               const std::vector<uint32_t>& agreed) {
  std::vector<ClosedRound> held = rounds_.Release(round);
  absl::flat_hash_map<uint32_t, size_t> index_of;
  for (size_t i = 0; i < held.size(); ++i) index_of[held[i].info.id] = i;
  std::vector<ClosedRound*> order;
  order.reserve(held.size());
  for (uint32_t id : parts_.table->publish_order()) {
    if (const auto it = index_of.find(id); it != index_of.end()) order.push_back(&held[it->second]);
  }
  // Each slice is its own task, claimed in publish order by this job and the pool's idle
  // threads: a slice depends only on the plan, and the first ones go out while later
  // ones are still being applied.
  parts_.jobs->ParallelFor(order.size(), [&](size_t i) { PublishSlice(*order[i], plan, agreed); });
  FinishLater(rounds_.Advance(round));
}

void ModelCoordinator::PublishSlice(ClosedRound& r,
                                    const absl::StatusOr<aggregators::RoundPlan>& plan,
                                    const std::vector<uint32_t>& agreed) {
  const AggregateBuffer buffer(r.info.numel);
  // The aggregate: the buffer, or the row of the input the plan picked.
  std::span<const float> aggregate = buffer.values();
  absl::Status st = plan.status();
  if (plan.ok()) {
    const auto start = std::chrono::steady_clock::now();
    AggregationCounts counts;
    InputWeights weights;
    absl::StatusOr<std::span<const float>> applied =
        parts_.aggregation->Apply(*plan, r, agreed, buffer.values(), &counts, &weights);
    parts_.counters->Aggregated(counts, 0);
    if (applied.ok()) {
      aggregate = *applied;
      parts_.suspicion->Record(r.round, weights.workers, weights.influence, weights.alignment,
                               r.info.numel);
    }
    st = applied.status();
    parts_.counters->Observe(AggregationStage::kModelApply, start);
  }
  parts_.publish(std::move(r), aggregate, st);
}

}  // namespace ps::server
