#include "server/decode_budget.h"

#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/client_text.h"
#include "core/refusal.h"

namespace ps::server {

DecodeBudget::DecodeBudget(uint32_t num_workers, double max_ms)
    : max_ms_(max_ms), max_ns_(max_ms * 1e6) {
  accounts_.reserve(num_workers);
  for (uint32_t w = 0; w < num_workers; ++w) accounts_.push_back(std::make_unique<Account>());
}

void DecodeBudget::RollLocked(Account& a, uint64_t round) {
  if (round <= a.round) return;
  a.round = round;
  a.spent_ns = 0;
}

absl::Status DecodeBudget::Admit(uint32_t worker, uint64_t round, uint32_t slice_id,
                                 std::string_view codec, uint64_t numel) {
  if (!bounded() || worker >= accounts_.size()) return absl::OkStatus();
  Account& a = *accounts_[worker];
  absl::MutexLock lock(&a.mu);
  RollLocked(a, round);
  const double predicted =
      a.codec_hash == std::hash<std::string_view>{}(codec) ? a.ns_per_value * double(numel) : 0;
  // A round's first push is always decoded (so the cost per value is measured again
  // every round, and a push larger than the whole budget still goes once per round).
  if (a.spent_ns == 0) return absl::OkStatus();
  if (a.spent_ns < max_ns_ && a.spent_ns + predicted <= max_ns_) return absl::OkStatus();
  return core::Refused(
      core::Refusal::kDecodeBudget,
      absl::StrFormat("push from worker %u for round %u of slice %u: its pushes of round %u took "
                      "%.3f ms of decoding on this shard, and this one (codec \"%s\", %u values) "
                      "would take about %.3f ms more (--max-decode-ms %g)",
                      worker, round, slice_id, a.round, a.spent_ns / 1e6, core::ClientText(codec),
                      numel, predicted / 1e6, max_ms_));
}

void DecodeBudget::Spent(uint32_t worker, uint64_t round, std::string_view codec, uint64_t numel,
                         std::chrono::nanoseconds took) {
  if (!bounded() || worker >= accounts_.size()) return;
  Account& a = *accounts_[worker];
  absl::MutexLock lock(&a.mu);
  RollLocked(a, round);
  const auto ns = static_cast<double>(took.count());
  a.spent_ns += ns;
  a.codec_hash = std::hash<std::string_view>{}(codec);
  a.ns_per_value = numel > 0 ? ns / double(numel) : 0;
}

}  // namespace ps::server
