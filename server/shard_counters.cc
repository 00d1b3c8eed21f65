#include "server/shard_counters.h"

#include <bit>
#include <string>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace ps::server {

std::string_view AggregationStageName(AggregationStage stage) {
  switch (stage) {
    case AggregationStage::kSlice:
      return "slice";
    case AggregationStage::kModelGram:
      return "model_gram";
    case AggregationStage::kModelApply:
      return "model_apply";
    case AggregationStage::kModelSliceGram:
      return "model_slice_gram";
    case AggregationStage::kCount:
      break;
  }
  return "unknown";
}

ShardCounters::ShardCounters(uint32_t shard_id, uint32_t num_workers) : shard_id_(shard_id) {
  stats_.workers.assign(num_workers, WorkerCounts{});
}

absl::Status ShardCounters::Counted(absl::Status status) {
  const std::optional<core::Refusal> r = core::RefusalOf(status);
  if (!r.has_value()) return status;
  uint64_t count;
  {
    absl::MutexLock lock(&mu_);
    count = ++stats_.refusals[static_cast<size_t>(*r)];
  }
  // Logarithmic logging: a worker repeating the same fault cannot flood the log.
  spdlog::log(std::has_single_bit(count) ? spdlog::level::warn : spdlog::level::debug,
              "shard {}: refused ({}, {} so far): {}", shard_id_, core::RefusalName(*r), count,
              std::string(status.message()));
  return status;
}

absl::Status ShardCounters::RefusedPush(uint32_t worker_id, absl::Status status) {
  const std::optional<core::Refusal> r = core::RefusalOf(status);
  if (r.has_value() && worker_id < stats_.workers.size()) {  // the size never changes
    uint64_t count;
    {
      absl::MutexLock lock(&mu_);
      count = ++stats_.workers[worker_id].refusals[static_cast<size_t>(*r)];
    }
    // Per worker, since the refusal log is rate-limited over all workers together.
    if (*r == core::Refusal::kMalformed && std::has_single_bit(count)) {
      spdlog::warn(
          "shard {}: worker {} sent {} malformed pushes or chunks so far (faulty or hostile?)",
          shard_id_, worker_id, count);
    }
  }
  return Counted(std::move(status));
}

absl::Status ShardCounters::RefusedShare(uint32_t from_shard, uint64_t round, absl::Status status) {
  Bump(&ShardStats::shares_refused);
  spdlog::warn("shard {}: refused share of round {} from shard {}: {}", shard_id_, round,
               from_shard, std::string(status.message()));
  return status;
}

void ShardCounters::PushAccepted(uint32_t worker, uint64_t wire_bytes, uint64_t decoded_bytes,
                                 core::Duration latency) {
  absl::MutexLock lock(&mu_);
  ++stats_.pushes_accepted;
  if (worker < stats_.workers.size()) {
    ++stats_.workers[worker].pushes_accepted;
    stats_.workers[worker].push_latency_seconds +=
        std::chrono::duration<double>(latency).count();
  }
  stats_.push_bytes += wire_bytes;
  stats_.push_decoded_bytes += decoded_bytes;
}

void ShardCounters::ChunkAccepted(uint32_t worker, uint64_t wire_bytes, uint64_t decoded_bytes) {
  absl::MutexLock lock(&mu_);
  ++stats_.udp_chunks_accepted;
  if (worker < stats_.workers.size()) ++stats_.workers[worker].chunks_accepted;
  stats_.push_bytes += wire_bytes;
  stats_.push_decoded_bytes += decoded_bytes;
}

void ShardCounters::ChunkHeldFromBefore() {
  absl::MutexLock lock(&mu_);
  ++stats_.udp_chunks_held_from_before;
}

void ShardCounters::Quarantined(uint32_t worker, core::Duration duration) {
  {
    absl::MutexLock lock(&mu_);
    ++stats_.quarantines;
    if (worker < stats_.workers.size()) ++stats_.workers[worker].quarantines;
  }
  spdlog::warn(
      "shard {}: worker {} quarantined for {} ms after a malformed push or chunk; rounds go on "
      "without it",
      shard_id_, worker, std::chrono::duration_cast<std::chrono::milliseconds>(duration).count());
}

void ShardCounters::ClosedAtDeadline() { Bump(&ShardStats::rounds_closed_at_deadline); }

uint64_t ShardCounters::Bump(uint64_t ShardStats::*count) {
  absl::MutexLock lock(&mu_);
  return ++(stats_.*count);
}

void ShardCounters::DeadlinePassed(uint32_t slice_id, const SliceRound::DeadlineOutcome& out,
                                   uint32_t num_workers) {
  if (!out.closed || out.below_quorum) {
    const uint64_t below = Bump(&ShardStats::deadlines_below_quorum);
    // Rate-limited: a lossy UDP path, or workers that are gone, make many of these.
    spdlog::log(std::has_single_bit(below) ? spdlog::level::warn : spdlog::level::debug,
                "shard {}: round {} of slice {} passed its deadline with {} of {} pushes, below "
                "the quorum of {}; {} ({} such deadlines so far)",
                shard_id_, out.round, slice_id, out.pushed, num_workers, out.quorum,
                out.below_quorum ? "dropping it (a UDP round that enough workers are in)"
                : out.grace      ? "waiting one more deadline for late pushes, then dropping it"
                                 : "closing as soon as the quorum is reached",
                below);
    return;
  }
  const uint64_t closed = Bump(&ShardStats::rounds_closed_at_deadline);
  spdlog::log(std::has_single_bit(closed) ? spdlog::level::info : spdlog::level::debug,
              "shard {}: round {} of slice {} closed at its deadline with {} of {} pushes ({} "
              "whole; {} rounds closed at a deadline so far)",
              shard_id_, out.round, slice_id, out.pushed, num_workers, out.complete, closed);
}

void ShardCounters::Aggregated(const AggregationCounts& counts, uint64_t chunks_lost) {
  absl::MutexLock lock(&mu_);
  stats_.aggregations_on_support += counts.on_support;
  stats_.sign_votes += counts.sign_votes;
  stats_.means_of_digits += counts.means_of_digits;
  stats_.masked_aggregations += counts.masked;
  stats_.udp_chunks_lost += chunks_lost;
}

void ShardCounters::Published(uint64_t round, uint32_t slice_id, const absl::Status& error,
                              std::span<const uint8_t> pushed, const Membership& membership) {
  const bool below_quorum = !error.ok() && IsBelowQuorum(error);
  uint64_t dropped = 0;
  {
    absl::MutexLock lock(&mu_);
    ++stats_.rounds_closed;
    for (size_t w = 0; w < stats_.workers.size(); ++w) {
      if ((w >= pushed.size() || pushed[w] == 0) &&
          membership.state(static_cast<uint32_t>(w)) != Membership::State::kSpare) {
        ++stats_.workers[w].slice_rounds_missed;
      }
    }
    if (below_quorum) {
      dropped = ++stats_.rounds_dropped_below_quorum;
    } else if (!error.ok()) {
      dropped = ++stats_.aggregation_errors;
    }
  }
  if (error.ok()) return;
  // The 1st, 2nd, 4th, 8th, ... loudly (a lossy UDP path can drop many), the rest at debug.
  spdlog::log(std::has_single_bit(dropped) ? spdlog::level::err : spdlog::level::debug,
              "shard {}: round {} of slice {} dropped ({} so far{}): {}", shard_id_, round,
              slice_id, dropped, below_quorum ? " below the quorum" : "",
              std::string(error.message()));
}

void ShardCounters::ModelRoundAggregated() { Bump(&ShardStats::model_rounds); }

void ShardCounters::ModelRoundDropped(uint64_t round, std::string_view why) {
  Bump(&ShardStats::model_rounds_dropped);
  spdlog::error("shard {}: model round {} dropped: {}", shard_id_, round, why);
}

ShardStats ShardCounters::Get() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void ShardCounters::SetObserver(std::function<void(AggregationStage, core::Duration)> observer) {
  absl::MutexLock lock(&observer_mu_);
  observer_ = std::move(observer);
}

void ShardCounters::Observe(AggregationStage stage, std::chrono::steady_clock::time_point start) {
  absl::ReaderMutexLock lock(&observer_mu_);
  if (observer_) observer_(stage, std::chrono::steady_clock::now() - start);
}

std::string TotalsLine(const ShardStats& st, bool model_scope) {
  uint64_t refused = 0;
  for (uint64_t r : st.refusals) refused += r;
  return absl::StrCat(
      st.rounds_closed, " slice rounds (", st.rounds_closed_at_deadline, " at the deadline), ",
      st.pushes_accepted, " pushes accepted, ", refused, " refused",
      model_scope ? absl::StrCat("; ", st.model_rounds, " model-scope rounds (", st.model_rounds_dropped,
                                 " dropped), ", st.shares_refused, " peer shares refused")
                  : std::string());
}

}  // namespace ps::server
