// Model layout: the tensors of a model, how they are cut into slices, and which
// shard owns each slice. Every process derives the same map from the layout alone
// (docs/architecture.md, "Layout, slices, shards"), and the layout hash names it on
// the wire.
//
// A ModelLayout is immutable after Create() and safe to share between threads.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ps::core {

// Defaults and hard limits. A layout outside the limits is refused by Create().
inline constexpr uint32_t kDefaultSliceElems = 65536;
inline constexpr uint32_t kMaxSliceElems = 1u << 22;  // 16 MiB of fp32 per slice
inline constexpr uint32_t kMaxShards = 1024;
inline constexpr size_t kMaxTensors = 1u << 16;
// A layout's own tables cost about 50 bytes per slice on every process that holds it,
// so the slice count is capped well below what a 32-bit slice id could name: 2^20
// slices of the default 65,536 elements are 2^36 parameters.
inline constexpr size_t kMaxSlices = 1u << 20;
inline constexpr size_t kMaxTensorNameBytes = 256;
inline constexpr size_t kMaxOptimizerSpecBytes = 256;
// Total elements of a model (2^40 fp32 = 4 TiB): keeps every size computation far from
// 64-bit overflow. Servers set tighter limits of their own (--max-shard-bytes).
inline constexpr uint64_t kMaxModelElems = uint64_t{1} << 40;

struct TensorSpec {
  std::string name;
  uint64_t numel = 0;
  // Lower is more urgent: the tensor used first in the next forward pass gets 0.
  int32_t priority = 0;
  // A matrix's row length (numel / rows), or 0: slices of the tensor then hold whole
  // rows (SliceElemsOf), so a codec that factors matrices (PowerSGD) sees each slice as
  // one. Must divide numel.
  uint32_t row_elems = 0;
  // How the shards update the tensor: an optimizer spec (server/optimizer.h, e.g.
  // "adam(lr=0.001, beta1=0.9, beta2=0.999, eps=1e-08, weight_decay=0)"), or empty for
  // the shards' own (--lr, --momentum, --weight-decay). Part of the layout's hash, so
  // every worker of a job registers the same. Printable ASCII, at most
  // kMaxOptimizerSpecBytes; its grammar is the shard's to check.
  std::string optimizer;
};

// The slice length of tensor `t` in a layout of `slice_elems`: slice_elems rounded down
// to whole rows when the tensor has rows no longer than a slice, else slice_elems.
uint32_t SliceElemsOf(const TensorSpec& t, uint32_t slice_elems);

struct SliceInfo {
  uint32_t id = 0;        // global index, tensor by tensor, offset order
  uint32_t tensor = 0;    // index into tensors()
  uint64_t offset = 0;    // first element within the tensor
  uint32_t numel = 0;     // element count, at most slice_elems
  uint32_t shard = 0;     // owning shard
  int32_t priority = 0;   // the tensor's priority
};

// What a layout amounts to, computed from its tensor list alone (no slice is cut).
struct LayoutSummary {
  uint64_t num_slices = 0;
  uint64_t total_elems = 0;
  // Slices shorter than slice_elems (a tensor's last, and every slice of a tensor cut
  // at whole rows that do not fill slice_elems).
  uint64_t partial_slices = 0;
  // Upper bounds on what any one shard owns under the assignment Create() makes.
  uint64_t max_owned_slices = 0;
  uint64_t max_owned_elems = 0;
};

class ModelLayout {
 public:
  // Validates the tensors (non-empty unique names, positive sizes) and the limits
  // without building anything: its cost is linear in the tensor list, so a request
  // naming a huge model is refused at the price of its own size. Overflow-safe for
  // any numel.
  static absl::StatusOr<LayoutSummary> Check(const std::vector<TensorSpec>& tensors,
                                             uint32_t slice_elems, uint32_t num_shards);
  // The layout hash (see hash()) of a tensor list, without building the layout.
  static uint64_t Hash(const std::vector<TensorSpec>& tensors, uint32_t slice_elems,
                       uint32_t num_shards);

  // Check(), then cuts slices and assigns shards (largest slice first to the least-loaded shard).
  static absl::StatusOr<ModelLayout> Create(std::vector<TensorSpec> tensors,
                                            uint32_t slice_elems = kDefaultSliceElems,
                                            uint32_t num_shards = 1);

  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  const std::vector<SliceInfo>& slices() const { return slices_; }
  uint32_t slice_elems() const { return slice_elems_; }
  uint32_t num_shards() const { return num_shards_; }
  uint64_t total_elems() const { return total_elems_; }
  // 64-bit digest of tensors (row lengths included), slice size and shard count
  // (SHA-256, first 8 bytes).
  uint64_t hash() const { return hash_; }

  // Slice ids of one tensor, in offset order.
  std::span<const uint32_t> SlicesOfTensor(size_t tensor) const;
  // Slice ids owned by one shard, most urgent first (priority, tensor, offset).
  std::span<const uint32_t> SlicesOfShard(uint32_t shard) const;
  // Index of the tensor with this name, or -1.
  int FindTensor(std::string_view name) const;
  // Element count owned by each shard.
  std::vector<uint64_t> ShardLoads() const;

 private:
  ModelLayout() = default;

  std::vector<TensorSpec> tensors_;
  std::vector<SliceInfo> slices_;
  std::vector<uint32_t> tensor_slice_begin_;  // size tensors + 1, into slices_
  std::vector<uint32_t> slice_ids_;           // identity; backing for SlicesOfTensor
  std::vector<std::vector<uint32_t>> shard_slices_;
  uint32_t slice_elems_ = 0;
  uint32_t num_shards_ = 0;
  uint64_t total_elems_ = 0;
  uint64_t hash_ = 0;
};

}  // namespace ps::core
