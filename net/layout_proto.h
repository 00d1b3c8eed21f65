// core::ModelLayout <-> ps.v1.Layout: the one conversion, for the worker's RegisterLayout,
// the shard's answer to it and its checkpoint files.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "core/layout.h"
#include "ps/v1/ps.pb.h"

namespace ps::net {

void LayoutToProto(const core::ModelLayout& layout, v1::Layout* out);
// The message's tensors, unchecked (a copy linear in the message's size).
std::vector<core::TensorSpec> TensorsFromProto(const v1::Layout& layout);
// Whether the message names exactly `layout` (tensors, slice size, shard count). Stops
// at the first difference, so answering a registered shard costs at most the smaller of
// the two, without copying or hashing the request.
bool SameLayout(const core::ModelLayout& layout, const v1::Layout& msg);
// ModelLayout::Create on the message's fields: its error when they are invalid.
absl::StatusOr<core::ModelLayout> LayoutFromProto(const v1::Layout& layout);

}  // namespace ps::net
