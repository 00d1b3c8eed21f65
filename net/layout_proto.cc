#include "net/layout_proto.h"

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

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
    spec->set_optimizer(t.optimizer);
  }
}

std::vector<core::TensorSpec> TensorsFromProto(const v1::Layout& layout) {
  std::vector<core::TensorSpec> tensors;
  tensors.reserve(static_cast<size_t>(layout.tensors_size()));
  for (const v1::TensorSpec& t : layout.tensors()) {
    tensors.push_back(
        core::TensorSpec{t.name(), t.numel(), t.priority(), t.row_elems(), t.optimizer()});
  }
  return tensors;
}

namespace {

// Text from the network, escaped and cut.
std::string Shown(std::string_view text, size_t max) {
  std::string shown = absl::CHexEscape(absl::string_view(text.data(), std::min(text.size(), max)));
  if (text.size() > max) shown += "...";
  return shown;
}

// A tensor in words: 'name' (N elements, priority P[, rows of R][, optimizer S]).
std::string Describe(std::string_view name, uint64_t numel, int32_t priority, uint32_t row_elems,
                     std::string_view optimizer) {
  std::string out =
      absl::StrCat("'", Shown(name, 64), "' (", numel, " elements, priority ", priority);
  if (row_elems != 0) absl::StrAppend(&out, ", rows of ", row_elems);
  if (!optimizer.empty()) absl::StrAppend(&out, ", optimizer ", Shown(optimizer, 96));
  out += ")";
  return out;
}

std::string Describe(const core::TensorSpec& t) {
  return Describe(t.name, t.numel, t.priority, t.row_elems, t.optimizer);
}

std::string Describe(const v1::TensorSpec& t) {
  return Describe(t.name(), t.numel(), t.priority(), t.row_elems(), t.optimizer());
}

}  // namespace

bool SameLayout(const core::ModelLayout& layout, const v1::Layout& msg) {
  return LayoutDifference(layout, msg).empty();
}

std::string LayoutDifference(const core::ModelLayout& have, const v1::Layout& offered) {
  const size_t mine = have.tensors().size();
  const size_t theirs = static_cast<size_t>(offered.tensors_size());
  for (size_t i = 0; i < std::min(mine, theirs); ++i) {
    const core::TensorSpec& h = have.tensors()[i];
    const v1::TensorSpec& o = offered.tensors(static_cast<int>(i));
    if (o.numel() != h.numel || o.priority() != h.priority || o.row_elems() != h.row_elems ||
        o.name() != h.name || o.optimizer() != h.optimizer) {
      return absl::StrCat("tensor ", i, " differs: the shard's is ", Describe(h),
                          ", the worker's ", Describe(o));
    }
  }
  if (mine != theirs) {
    return mine > theirs
               ? absl::StrCat("the worker's layout ends after ", theirs, " of the shard's ", mine,
                              " tensors; the shard's next is ", Describe(have.tensors()[theirs]))
               : absl::StrCat("the worker's layout has ", theirs, " tensors, the shard's ", mine,
                              "; the worker's next is ",
                              Describe(offered.tensors(static_cast<int>(mine))));
  }
  if (offered.slice_elems() != have.slice_elems()) {
    return absl::StrCat("the same tensors cut into slices of ", offered.slice_elems(),
                        " elements by the worker, of ", have.slice_elems(), " by the shard");
  }
  if (offered.num_shards() != have.num_shards()) {
    return absl::StrCat("the same tensors cut for ", offered.num_shards(),
                        " shards by the worker, for ", have.num_shards(), " by the shard");
  }
  return "";
}

absl::StatusOr<core::ModelLayout> LayoutFromProto(const v1::Layout& layout) {
  return core::ModelLayout::Create(TensorsFromProto(layout), layout.slice_elems(),
                                   layout.num_shards());
}

}  // namespace ps::net
