// ModelLayout <-> ps.v1.Layout, for the gRPC service (RegisterLayout) and checkpoint
// files. (worker_lib writes the same message on its side; it does not link ps_server.)
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "core/layout.h"
#include "ps/v1/ps.pb.h"

namespace ps::server {

void LayoutToProto(const core::ModelLayout& layout, v1::Layout* out);
// The message's tensors, unchecked (a copy linear in the message's size).
std::vector<core::TensorSpec> TensorsFromProto(const v1::Layout& layout);
// Whether the message names exactly `layout` (tensors, slice size, shard count). Stops
// at the first difference, so answering a registered shard costs at most the smaller of
// the two, without copying or hashing the request.
bool SameLayout(const core::ModelLayout& layout, const v1::Layout& msg);
// ModelLayout::Create on the message's fields: its error when they are invalid.
absl::StatusOr<core::ModelLayout> LayoutFromProto(const v1::Layout& layout);

}  // namespace ps::server
