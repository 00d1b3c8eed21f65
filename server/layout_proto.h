// ModelLayout <-> ps.v1.Layout, for the gRPC service (RegisterLayout) and checkpoint
// files. (worker_lib writes the same message on its side; it does not link ps_server.)
#pragma once

#include "absl/status/statusor.h"
#include "core/layout.h"
#include "ps/v1/ps.pb.h"

namespace ps::server {

void LayoutToProto(const core::ModelLayout& layout, v1::Layout* out);
// ModelLayout::Create on the message's fields: its error when they are invalid.
absl::StatusOr<core::ModelLayout> LayoutFromProto(const v1::Layout& layout);

}  // namespace ps::server
