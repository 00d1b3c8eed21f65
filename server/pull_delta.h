// Compressed pulls on the shard (docs/data_path.md, "Compressed pulls"): with
// --pull-codec, each slice keeps the values every worker holds (x̂) next to its true
// parameters x. At each publication the change x - x̂ is encoded once with the pull
// codec, x̂ moves by exactly what a worker decodes, and x̂ is what the shard publishes,
// densely and as that delta. What the codec lost stays in x - x̂ and goes out with the
// next version's change (error feedback on the shard), so no worker drifts and every
// worker that applies the deltas holds x̂ bit for bit.
//
// Ownership: HeldValues belongs to its slice's SliceModel (it moves with the round into
// its aggregation job and back). Thread safety: none; one slice's publication at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "codecs/codec.h"

namespace ps::server {

// A version's change, encoded: applied to the values of base_version it gives those of
// version.
struct PullDelta {
  uint64_t base_version = 0;
  uint64_t version = 0;
  std::shared_ptr<const std::string> payload;
};

// x̂ of one slice, and the pull codec's encoder for it (null: dense pulls only).
struct HeldValues {
  std::vector<float> values;
  std::shared_ptr<codecs::Codec> codec;
};

// The encoder for `spec` (checked by ServerOptions::Validate), or null for "".
absl::StatusOr<std::shared_ptr<codecs::Codec>> MakePullCodec(const std::string& spec);

// Encodes x - held.values for the version `version`, adds the decoded change to
// held.values (Codec::EncodeChange), writing the new values to `copy_to` too (held's
// size, or empty), and returns the payload. On an error (the codec refusing its input)
// held.values becomes x, copy_to is unspecified, and the error is returned: the next
// pulls are dense.
absl::StatusOr<std::shared_ptr<const std::string>> EncodeChange(std::span<const float> x,
                                                                uint32_t slice_id, uint64_t version,
                                                                HeldValues& held,
                                                                std::span<float> copy_to = {});

}  // namespace ps::server
