// What a shard says of a pulled slice besides its values, in one struct for every data
// plane: gRPC's ps.v1.PullResponse (net/wire.h), the TCP plane's SLICE and each entry
// of its SLICES (net/data_frame.h), and what a worker's pull sink takes. A layer that
// hands a slice to the next copies these fields as one value.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace ps::net {

// A pulled slice's fields besides its values and codec: what ps.v1.PullResponse, a TCP
// SLICE and each entry of a SLICES say alike.
struct SliceFields {
  uint32_t slice_id = 0;
  uint64_t version = 0;
  uint64_t base_version = 0;
  uint64_t epoch = 0;  // 0: the shard sends no deltas
  // AdaComm (docs/adaptive.md): the medians of the workers' reported losses.
  std::optional<float> loss;
  std::optional<float> first_loss;
  // Written right after the previous frame of the stream (ps.v1.PullResponse.queued).
  bool queued = false;
  bool operator==(const SliceFields&) const = default;
};

// What a PullResponse (or a SLICE) says besides the values, as a pull's sink takes it.
struct PullHeader : SliceFields {
  std::string_view codec;  // empty: dense values; else the change's codec
};

}  // namespace ps::net
