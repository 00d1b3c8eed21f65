#include "server/slice_table.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "core/client_text.h"
#include "core/refusal.h"
#include "core/status.h"
#include "server/memory_estimate.h"
#include "server/snapshot_pool.h"

namespace ps::server {
namespace {

// Room for the fields around a slice's values in one message.
constexpr uint32_t kMessageOverheadBytes = 4096;

}  // namespace

using core::Refusal;
using core::Refused;

absl::StatusOr<std::vector<std::shared_ptr<const Optimizer>>> SliceTable::TensorOptimizers(
    const core::ModelLayout& layout) const {
  std::vector<std::shared_ptr<const Optimizer>> out(layout.tensors().size());
  for (size_t t = 0; t < out.size(); ++t) {
    const core::TensorSpec& spec = layout.tensors()[t];
    if (spec.optimizer.empty()) continue;
    if (config_.aggregate_only) {
      return Refused(Refusal::kBadLayout,
                     absl::StrCat("tensor '", core::ClientText(spec.name), "' names optimizer ",
                                  core::ClientText(spec.optimizer), ", but shard ",
                                  config_.shard_id, " runs --aggregate-only and applies none "
                                  "(the workers step their own optimizers on the aggregate)"));
    }
    absl::StatusOr<Optimizer> opt = Optimizer::Parse(spec.optimizer);
    if (!opt.ok()) {
      return Refused(Refusal::kBadLayout, absl::StrCat("invalid layout: tensor '",
                                                       core::ClientText(spec.name), "': ",
                                                       opt.status().message()));
    }
    out[t] = std::make_shared<const Optimizer>(*std::move(opt));
  }
  return out;
}

SliceTable::SliceTable(const Config& config, RoundRules* rules) : config_(config), rules_(rules) {}

std::vector<uint32_t> SliceTable::InstallLocked(
    const core::ModelLayout& layout,
    const std::vector<std::shared_ptr<const Optimizer>>& optimizers) {
  std::vector<uint32_t> owned;
  auto span = layout.SlicesOfShard(config_.shard_id);
  owned.assign(span.begin(), span.end());
  slices_.resize(layout.slices().size());
  for (uint32_t id : owned) {
    const core::SliceInfo& info = layout.slices()[id];
    slices_[id] = std::make_unique<SliceRound>(info, rules_, config_.aggregate_only,
                                               optimizers[info.tensor]);
  }
  uninitialized_ = config_.aggregate_only ? 0 : static_cast<uint32_t>(owned.size());
  owned_ids_ = owned;
  std::sort(owned_ids_.begin(), owned_ids_.end());
  publish_order_ = config_.priority_order ? owned : owned_ids_;
  layout_ = layout;
  registered_.store(true, std::memory_order_release);
  return owned;
}

absl::Status SliceTable::AnswerRegisteredLocked(uint32_t worker_id, uint64_t hash) const {
  return AnswerRegistered(*layout_, worker_id, layout_->hash() == hash, absl::Hex(hash));
}

absl::Status SliceTable::AnswerRegistered(const core::ModelLayout& have, uint32_t worker_id,
                                          bool same, const absl::AlphaNum& offered) const {
  if (same) return absl::AlreadyExistsError("this layout is already registered");
  return Refused(
      Refusal::kLayoutMismatch,
      absl::StrCat("layout mismatch: shard ", config_.shard_id, " already holds layout ",
                   absl::Hex(have.hash()), "; worker ", worker_id, " offered ", offered));
}

absl::Status SliceTable::CheckJoin(uint32_t worker_id, uint64_t layout_hash) const {
  absl::MutexLock lock(&mu_);
  if (layout_.has_value() && layout_->hash() != layout_hash) {
    return Refused(Refusal::kLayoutMismatch,
                   absl::StrCat("layout mismatch: worker ", worker_id, " joins with layout ",
                                absl::Hex(layout_hash), " but shard ", config_.shard_id, " holds ",
                                absl::Hex(layout_->hash())));
  }
  return absl::OkStatus();
}

absl::Status SliceTable::CheckFits(const core::LayoutSummary& sum, uint32_t slice_elems,
                                   uint32_t num_shards, uint64_t second_moment_elems) const {
  if (num_shards != config_.num_shards) {
    return Refused(Refusal::kBadLayout,
                   absl::StrCat("layout is cut for ", num_shards, " shards but the server has ",
                                config_.num_shards));
  }
  const uint64_t slice_bytes = uint64_t{slice_elems} * sizeof(float);
  if (slice_bytes + kMessageOverheadBytes > config_.max_message_bytes) {
    return Refused(Refusal::kBadLayout,
                   absl::StrCat("slice_elems ", slice_elems, " needs messages of ",
                                slice_bytes + kMessageOverheadBytes,
                                " bytes, above --max-message-bytes ", config_.max_message_bytes));
  }
  // Published versions beyond the one the estimate counts: with a step and dense pulls,
  // the snapshot pool's spare buffers, made with the first version
  // (SnapshotPool::TakeFilled); with --pull-codec instead what the workers hold (one copy)
  // and each version's encoded change (its largest encoding of a slice, in fp32 copies,
  // rounded up).
  size_t published_copies = config_.aggregate_only ? 0 : SnapshotPool::kMaxFree;
  if (absl::StatusOr<std::shared_ptr<codecs::Codec>> codec = MakePullCodec(rules_->pull_codec);
      codec.ok() && *codec != nullptr && slice_bytes > 0) {
    published_copies = 1 + ((*codec)->MaxEncodedBytes(slice_elems) + slice_bytes - 1) / slice_bytes;
  }
  // Adam's second moments: an upper bound of the shard's share of those tensors.
  const uint64_t owned_moments =
      second_moment_elems == 0 ? 0 : second_moment_elems / num_shards + slice_elems;
  const uint64_t need = EstimateShardBytes(sum, config_.num_workers, config_.state_rows,
                                           config_.keep_published_model, published_copies,
                                           owned_moments);
  if (need > config_.max_shard_bytes) {
    return Refused(
        Refusal::kOverLimit,
        absl::StrCat("layout of ", sum.total_elems, " elements in ", sum.num_slices,
                     " slices needs about ", need >> 20, " MiB on shard ", config_.shard_id,
                     " with ", config_.num_workers, " workers, above --max-shard-bytes ",
                     config_.max_shard_bytes >> 20, " MiB"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint32_t>> SliceTable::Register(uint32_t worker_id,
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
  absl::StatusOr<core::LayoutSummary> sum =
      core::ModelLayout::Check(tensors, slice_elems, num_shards);
  if (!sum.ok()) {
    return Refused(Refusal::kBadLayout, absl::StrCat("invalid layout: ", sum.status().message()));
  }
  PS_RETURN_IF_ERROR(CheckFits(*sum, slice_elems, num_shards));
  // Only a layout within the limits is built, one at a time.
  absl::MutexLock one_at_a_time(&register_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (layout_.has_value()) return AnswerRegisteredLocked(worker_id, hash);
  }
  absl::StatusOr<core::ModelLayout> layout =
      core::ModelLayout::Create(std::move(tensors), slice_elems, num_shards);
  if (!layout.ok()) {
    return Refused(Refusal::kBadLayout,
                   absl::StrCat("invalid layout: ", layout.status().message()));
  }
  return Register(worker_id, *layout);
}

absl::StatusOr<std::vector<uint32_t>> SliceTable::Register(uint32_t worker_id,
                                                           const core::ModelLayout& layout) {
  absl::MutexLock lock(&mu_);
  if (layout_.has_value()) return AnswerRegisteredLocked(worker_id, layout.hash());
  PS_ASSIGN_OR_RETURN(
      const core::LayoutSummary sum,
      core::ModelLayout::Check(layout.tensors(), layout.slice_elems(), layout.num_shards()));
  PS_ASSIGN_OR_RETURN(const std::vector<std::shared_ptr<const Optimizer>> optimizers,
                      TensorOptimizers(layout));
  uint64_t second_moment_elems = 0;
  for (size_t t = 0; t < optimizers.size(); ++t) {
    if (optimizers[t] != nullptr && optimizers[t]->has_second_moment()) {
      second_moment_elems += layout.tensors()[t].numel;
    }
  }
  PS_RETURN_IF_ERROR(
      CheckFits(sum, layout.slice_elems(), layout.num_shards(), second_moment_elems));
  return InstallLocked(layout, optimizers);
}

absl::StatusOr<uint64_t> SliceTable::Restore(const core::ModelLayout& layout,
                                             const std::vector<SliceCheckpoint>& slices) {
  {
    absl::MutexLock lock(&mu_);
    if (layout_.has_value()) {
      return absl::FailedPreconditionError("a layout is registered already: restore comes first");
    }
    absl::StatusOr<std::vector<std::shared_ptr<const Optimizer>>> optimizers =
        TensorOptimizers(layout);
    if (!optimizers.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the checkpoint's layout: ", optimizers.status().message()));
    }
    InstallLocked(layout, *optimizers);
    uninitialized_ = 0;
  }
  // Slice locks are taken without mu_ held.
  uint64_t newest = 0;
  for (const SliceCheckpoint& sc : slices) {
    SliceRound* s = sc.slice_id < slices_.size() ? slices_[sc.slice_id].get() : nullptr;
    if (s == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint slice ", sc.slice_id, " is not owned by this shard"));
    }
    PS_RETURN_IF_ERROR(s->Restore(sc));
    newest = std::max(newest, sc.version);
  }
  return newest;
}

std::vector<SliceCheckpoint> SliceTable::Capture(bool with_velocity) const {
  const std::vector<uint32_t> ids = owned_ids();
  constexpr int kAttempts = 200;
  std::vector<SliceCheckpoint> out;
  for (int attempt = 0;; ++attempt) {
    out.clear();
    uint64_t lo = UINT64_MAX, hi = 0;
    for (uint32_t id : ids) {
      const SliceCheckpoint& c = out.emplace_back(slices_[id]->Capture(with_velocity));
      lo = std::min(lo, c.version);
      hi = std::max(hi, c.version);
    }
    if (lo == hi || attempt + 1 >= kAttempts) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return out;
}

absl::StatusOr<SliceRound*> SliceTable::Lookup(uint64_t layout_hash, uint32_t slice_id) const {
  if (!registered()) return Refused(Refusal::kNoLayout, "no layout registered yet");
  // After registration slices_ and the layout never change, so reading them without mu_
  // is safe; the hash is copied for the check.
  const uint64_t have = hash();
  if (layout_hash != have) {
    return Refused(Refusal::kLayoutMismatch,
                   absl::StrCat("layout mismatch: request names ", absl::Hex(layout_hash),
                                ", shard ", config_.shard_id, " holds ", absl::Hex(have)));
  }
  if (slice_id >= slices_.size()) {
    return Refused(
        Refusal::kUnknownSlice,
        absl::StrCat("unknown slice ", slice_id, ": the layout has ", slices_.size(), " slices"));
  }
  SliceRound* s = slices_[slice_id].get();
  if (s == nullptr) {
    return Refused(Refusal::kWrongShard,
                   absl::StrCat("slice ", slice_id, " is not owned by shard ", config_.shard_id));
  }
  return s;
}

std::vector<uint32_t> SliceTable::owned_ids() const {
  absl::MutexLock lock(&mu_);
  return owned_ids_;
}

std::vector<uint32_t> SliceTable::publish_order() const {
  absl::MutexLock lock(&mu_);
  return publish_order_;
}

size_t SliceTable::owned_count() const {
  absl::MutexLock lock(&mu_);
  return owned_ids_.size();
}

void SliceTable::ForEach(absl::FunctionRef<void(SliceRound&)> f) const {
  for (uint32_t id : owned_ids()) f(*slice(id));
}

uint64_t SliceTable::MinVersion() const {
  std::optional<uint64_t> v;
  ForEach([&](SliceRound& s) { v = std::min(v.value_or(UINT64_MAX), s.version()); });
  return v.value_or(0);
}

uint64_t SliceTable::MaxVersion() const {
  uint64_t v = 0;
  ForEach([&](SliceRound& s) { v = std::max(v, s.version()); });
  return v;
}

uint64_t SliceTable::WatcherCount() const {
  uint64_t n = 0;
  ForEach([&](SliceRound& s) { n += s.watcher_count(); });
  return n;
}

bool SliceTable::SliceInitialized() {
  absl::MutexLock lock(&mu_);
  return --uninitialized_ == 0;
}

bool SliceTable::ready() const {
  absl::MutexLock lock(&mu_);
  return layout_.has_value() && uninitialized_ == 0;
}

uint64_t SliceTable::hash() const {
  absl::MutexLock lock(&mu_);
  return layout_.has_value() ? layout_->hash() : 0;
}

const core::ModelLayout* SliceTable::layout() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // layout_ is written once, before registered_ is released.
  return registered() ? &*layout_ : nullptr;
}

}  // namespace ps::server
