#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/client_text.h"
#include "core/fp32_bytes.h"
#include "core/scratch.h"
#include "worker_lib/held_model_internal.h"

namespace ps::internal {

void HeldModel::Describe(v1::PullRequest& req) const {
  absl::MutexLock lock(&mu_);
  uint64_t epoch = 0;
  for (uint32_t id : req.slice_ids()) {
    auto it = held_.find(id);
    if (it != held_.end()) {
      epoch = it->second.epoch;
      break;
    }
  }
  if (epoch == 0) return;
  req.set_held_epoch(epoch);
  for (uint32_t id : req.slice_ids()) {
    auto it = held_.find(id);
    req.add_held_versions(it != held_.end() && it->second.epoch == epoch ? it->second.version : 0);
  }
}

absl::StatusOr<const codecs::Codec*> HeldModel::DecoderLocked(const std::string& spec) {
  auto it = decoders_.find(spec);
  if (it != decoders_.end()) return it->second.get();
  absl::StatusOr<std::unique_ptr<codecs::Codec>> made = codecs::MakeCodec(spec);
  if (!made.ok()) return made.status();
  // A shard uses one pull codec; a few specs at most ever get here from a sane shard.
  if (decoders_.size() >= 16) decoders_.clear();
  return (decoders_[spec] = *std::move(made)).get();
}

absl::Status HeldModel::Apply(const net::PullFrame& frame, float* dst) {
  const uint32_t id = frame.slice_id;
  const size_t numel = layout_.slices()[id].numel;
  if (frame.codec.empty()) {
    if (frame.values.size() != numel * sizeof(float)) {
      return absl::InvalidArgumentError(absl::StrCat("slice ", id, " (version ", frame.version,
                                                     ") has ", frame.values.size(),
                                                     " bytes of values for ", numel, " elements"));
    }
    frame.values.CopyTo(reinterpret_cast<char*>(dst));
    if (frame.epoch == 0) return absl::OkStatus();
    absl::MutexLock lock(&mu_);
    Held& h = held_[id];
    h.values.assign(dst, dst + numel);
    h.version = frame.version;
    h.epoch = frame.epoch;
    return absl::OkStatus();
  }
  const std::string spec = frame.codec.ToString();
  const std::string what =
      absl::StrCat("compressed slice ", id, " (version ", frame.version, " from ",
                   frame.base_version, ", codec ", core::ClientText(spec), ")");
  absl::MutexLock lock(&mu_);
  auto it = held_.find(id);
  if (it == held_.end() || it->second.epoch != frame.epoch) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": a change of values this worker does not hold (another epoch)"));
  }
  Held& h = it->second;
  if (h.version != frame.version) {  // else another pull applied this change already
    if (h.version != frame.base_version) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": applies to version ", frame.base_version, "; held: ", h.version));
    }
    absl::StatusOr<const codecs::Codec*> decoder = DecoderLocked(spec);
    if (!decoder.ok())
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", decoder.status().message()));
    struct ChangeTag;
    const std::span<float> change = core::ThreadScratch<float, ChangeTag>(numel);
    if (absl::Status st = (*decoder)->DecodePieces(frame.values.parts(), change); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", st.message()));
    }
    // change + held, each sum the same fp32 addition as the shard's held + change.
    core::AddInto(change, h.values);
    if (const ptrdiff_t i = core::FindNonFinite(change); i >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": value ", i, " is not finite once the change is applied"));
    }
    std::memcpy(h.values.data(), change.data(), numel * sizeof(float));
    h.version = frame.version;
  }
  std::memcpy(dst, h.values.data(), numel * sizeof(float));
  return absl::OkStatus();
}

}  // namespace ps::internal
