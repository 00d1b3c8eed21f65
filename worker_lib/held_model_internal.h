// HeldModel: the worker's side of compressed pulls (docs/data_path.md, "Compressed
// pulls"). A shard with --pull-codec stamps every pulled slice with its epoch and may
// send a version as the encoded change from the version before; the worker keeps, per
// such slice, the values it holds with their version and epoch, and applies each change
// to them with Codec::DecodeAddPieces (the shard's own fp32 addition, so both hold the
// same bits), which writes the sums to what is held and to the caller's buffer in one
// pass. Slices from shards without a pull codec (epoch 0) keep nothing here: their
// values go straight to the caller's buffer.
//
// Owns the held values (one fp32 copy of every slice pulled compressed) and a decoder
// per pull codec spec. Thread safety: every method may be called from any thread; one
// lock guards the state (two pulls of the same slice at once apply its change once).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "codecs/codec.h"
#include "core/layout.h"
#include "net/wire.h"
#include "worker_lib/transport/data_channel.h"

namespace ps::internal {

class HeldModel {
 public:
  explicit HeldModel(const core::ModelLayout& layout) : layout_(layout) {}

  // Tells the shard what the worker holds of the slices `ask` names (held_versions,
  // held_epoch), so that it may send changes instead of values. Leaves `ask` as it is
  // when nothing is held.
  void Describe(PullAsk& ask) const;

  // A pulled slice in two steps, as a PullSink sees it (data_channel.h); `dst` is where
  // its values (the layout gives their count) go in the caller's buffer. Place, from
  // the header: for dense values, `dst` itself, to be filled with the `bytes` bytes;
  // for a change, an empty span (Arrived decodes it where the channel holds it).
  // Arrived: keeps dense values that come with an epoch, or applies the change to what
  // is held and writes the result to `dst`. INVALID_ARGUMENT naming slice, versions and
  // codec when the values have the wrong size, the change does not decode, makes a value
  // non-finite or applies to values this worker does not hold (`dst` unspecified). What
  // is held is then as before, except after a change that was decoded and refused (it
  // does not decode, or a sum is not finite): the slice is then no longer held, so the
  // next pull (Describe) asks for its values whole.
  absl::StatusOr<std::span<char>> Place(const net::PullHeader& h, size_t bytes, float* dst) const;
  absl::Status Arrived(const net::PullHeader& h, net::Pieces bytes, float* dst);

  // Both steps for a whole slice message, as a channel delivers one (DeliverPullFrame).
  absl::Status Apply(const net::PullFrame& frame, float* dst);

 private:
  struct Held {
    uint64_t version = 0;
    uint64_t epoch = 0;
    std::vector<float> values;
  };
  absl::StatusOr<const codecs::Codec*> DecoderLocked(const std::string& spec)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const core::ModelLayout& layout_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint32_t, Held> held_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::unique_ptr<codecs::Codec>> decoders_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::internal
