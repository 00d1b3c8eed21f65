#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/client_text.h"
#include "worker_lib/held_model_internal.h"

namespace ps::internal {

void HeldModel::Describe(PullAsk& ask) const {
  absl::MutexLock lock(&mu_);
  uint64_t epoch = 0;
  for (uint32_t id : ask.slice_ids) {
    auto it = held_.find(id);
    if (it != held_.end()) {
      epoch = it->second.epoch;
      break;
    }
  }
  if (epoch == 0) return;
  ask.held_epoch = epoch;
  for (uint32_t id : ask.slice_ids) {
    auto it = held_.find(id);
    ask.held_versions.push_back(it != held_.end() && it->second.epoch == epoch ? it->second.version
                                                                               : 0);
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

absl::StatusOr<std::span<char>> HeldModel::Place(const net::PullHeader& h, size_t bytes,
                                                 float* dst) const {
  if (!h.codec.empty()) return std::span<char>();
  const size_t numel = layout_.slices()[h.slice_id].numel;
  if (bytes != numel * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat("slice ", h.slice_id, " (version ", h.version,
                                                   ") has ", bytes, " bytes of values for ",
                                                   numel, " elements"));
  }
  return std::span<char>(reinterpret_cast<char*>(dst), bytes);
}

absl::Status HeldModel::Arrived(const net::PullHeader& h, net::Pieces bytes, float* dst) {
  const uint32_t id = h.slice_id;
  const size_t numel = layout_.slices()[id].numel;
  if (h.codec.empty()) {  // the values are in `dst` (Place)
    if (h.epoch == 0) return absl::OkStatus();
    absl::MutexLock lock(&mu_);
    Held& held = held_[id];
    held.values.assign(dst, dst + numel);
    held.version = h.version;
    held.epoch = h.epoch;
    return absl::OkStatus();
  }
  const std::string spec(h.codec);
  const std::string what =
      absl::StrCat("compressed slice ", id, " (version ", h.version, " from ", h.base_version,
                   ", codec ", core::ClientText(spec), ")");
  absl::MutexLock lock(&mu_);
  auto it = held_.find(id);
  if (it == held_.end() || it->second.epoch != h.epoch) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": a change of values this worker does not hold (another epoch)"));
  }
  Held& held = it->second;
  if (held.version != h.version) {  // else another pull applied this change already
    if (held.version != h.base_version) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": applies to version ", h.base_version, "; held: ", held.version));
    }
    absl::StatusOr<const codecs::Codec*> decoder = DecoderLocked(spec);
    if (!decoder.ok())
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", decoder.status().message()));
    // One pass decodes the change, adds it to what is held (each sum the shard's fp32
    // addition), checks the sums and writes them to the caller's buffer too. A refused
    // change leaves what was held unspecified: it is dropped, and the next pull asks for
    // the slice's values whole.
    const std::span<float> out(dst, numel);
    if (absl::Status st = (*decoder)->DecodeAddPieces(bytes, held.values, out); !st.ok()) {
      held_.erase(it);
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", st.message()));
    }
    held.version = h.version;
    return absl::OkStatus();
  }
  std::memcpy(dst, held.values.data(), numel * sizeof(float));
  return absl::OkStatus();
}

absl::Status HeldModel::Apply(const net::PullFrame& frame, float* dst) {
  // The one slice's sink.
  class Into final : public PullSink {
   public:
    Into(HeldModel* held, float* dst) : held_(held), dst_(dst) {}
    absl::StatusOr<std::span<char>> Place(const net::PullHeader& h, size_t bytes) override {
      return held_->Place(h, bytes, dst_);
    }
    absl::Status Arrived(const net::PullHeader& h, net::Pieces bytes) override {
      return held_->Arrived(h, bytes, dst_);
    }
    void Done(absl::Status) override {}

   private:
    HeldModel* const held_;
    float* const dst_;
  };
  Into sink(this, dst);
  return DeliverPullFrame(frame, sink);
}

}  // namespace ps::internal
