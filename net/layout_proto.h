// core::ModelLayout <-> ps.v1.Layout: the one conversion, for the worker's RegisterLayout,
// the shard's answer to it and its checkpoint files.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/layout.h"
#include "ps/v1/ps.pb.h"

namespace ps::net {

void LayoutToProto(const core::ModelLayout& layout, v1::Layout* out);
// The message's tensors, unchecked (a copy linear in the message's size).
std::vector<core::TensorSpec> TensorsFromProto(const v1::Layout& layout);
// Whether the message names exactly `layout` (tensors, slice size, shard count):
// LayoutDifference(layout, msg) is empty.
bool SameLayout(const core::ModelLayout& layout, const v1::Layout& msg);
// The first difference between `have` (a shard's) and `offered` (a worker's), in words,
// or "" when there is none: the first tensor whose name, size, priority or row length
// differs (both named, with their index), else the tensor one of them has beyond the
// other's last, else the slice size or shard count. Stops at that difference, so it
// costs at most the smaller of the two without copying the message; names from the
// message are escaped and cut to 64 characters, so the answer stays under 1 KiB.
std::string LayoutDifference(const core::ModelLayout& have, const v1::Layout& offered);
// ModelLayout::Create on the message's fields: its error when they are invalid.
absl::StatusOr<core::ModelLayout> LayoutFromProto(const v1::Layout& layout);

}  // namespace ps::net
