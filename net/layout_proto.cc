#include "net/layout_proto.h"

#include <utility>
#include <vector>

namespace ps::net {

void LayoutToProto(const core::ModelLayout& layout, v1::Layout* out) {
  out->set_slice_elems(layout.slice_elems());
  out->set_num_shards(layout.num_shards());
  for (const core::TensorSpec& t : layout.tensors()) {
    v1::TensorSpec* spec = out->add_tensors();
    spec->set_name(t.name);
    spec->set_numel(t.numel);
    spec->set_priority(t.priority);
    spec->set_row_elems(t.row_elems);
  }
}

std::vector<core::TensorSpec> TensorsFromProto(const v1::Layout& layout) {
  std::vector<core::TensorSpec> tensors;
  tensors.reserve(static_cast<size_t>(layout.tensors_size()));
  for (const v1::TensorSpec& t : layout.tensors()) {
    tensors.push_back(core::TensorSpec{t.name(), t.numel(), t.priority(), t.row_elems()});
  }
  return tensors;
}

bool SameLayout(const core::ModelLayout& layout, const v1::Layout& msg) {
  if (msg.slice_elems() != layout.slice_elems() || msg.num_shards() != layout.num_shards() ||
      static_cast<size_t>(msg.tensors_size()) != layout.tensors().size()) {
    return false;
  }
  for (int i = 0; i < msg.tensors_size(); ++i) {
    const v1::TensorSpec& t = msg.tensors(i);
    const core::TensorSpec& have = layout.tensors()[static_cast<size_t>(i)];
    if (t.numel() != have.numel || t.priority() != have.priority ||
        t.row_elems() != have.row_elems || t.name() != have.name) {
      return false;
    }
  }
  return true;
}

absl::StatusOr<core::ModelLayout> LayoutFromProto(const v1::Layout& layout) {
  return core::ModelLayout::Create(TensorsFromProto(layout), layout.slice_elems(),
                                   layout.num_shards());
}

}  // namespace ps::net
