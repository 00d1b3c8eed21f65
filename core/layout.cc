#include "core/layout.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "core/client_text.h"
#include "core/sha256.h"
#include "core/status.h"

namespace ps::core {
namespace {

void AppendU64(std::string& out, uint64_t v) {
  char bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  out.append(bytes, sizeof(bytes));
}

uint64_t LayoutDigest(const std::vector<TensorSpec>& tensors, uint32_t slice_elems,
                      uint32_t num_shards) {
  // Canonical, length-prefixed encoding so that no two layouts share a preimage. A
  // layout without row lengths keeps the first version's encoding (and so its hash, which
  // checkpoints record); one with any is v2, which adds each tensor's; one with any
  // optimizer spec is v3, which adds each tensor's row length and spec.
  const bool optimizers = std::any_of(tensors.begin(), tensors.end(),
                                      [](const TensorSpec& t) { return !t.optimizer.empty(); });
  const bool rows = optimizers || std::any_of(tensors.begin(), tensors.end(),
                                              [](const TensorSpec& t) { return t.row_elems != 0; });
  std::string buf = optimizers ? "ps.layout.v3" : rows ? "ps.layout.v2" : "ps.layout.v1";
  size_t size = buf.size() + 24;
  for (const TensorSpec& t : tensors) size += 40 + t.name.size() + t.optimizer.size();
  buf.reserve(size);
  AppendU64(buf, tensors.size());
  for (const TensorSpec& t : tensors) {
    AppendU64(buf, t.name.size());
    buf += t.name;
    AppendU64(buf, t.numel);
    AppendU64(buf, static_cast<uint64_t>(static_cast<int64_t>(t.priority)));
    if (rows) AppendU64(buf, t.row_elems);
    if (optimizers) {
      AppendU64(buf, t.optimizer.size());
      buf += t.optimizer;
    }
  }
  AppendU64(buf, slice_elems);
  AppendU64(buf, num_shards);
  const std::array<uint8_t, kSha256Bytes> md = Sha256(buf);
  uint64_t h = 0;
  for (int i = 0; i < 8; ++i) h |= static_cast<uint64_t>(md[i]) << (8 * i);
  return h;
}

}  // namespace

uint32_t SliceElemsOf(const TensorSpec& t, uint32_t slice_elems) {
  if (t.row_elems <= 1 || t.row_elems > slice_elems) return slice_elems;
  return slice_elems - slice_elems % t.row_elems;
}

absl::StatusOr<LayoutSummary> ModelLayout::Check(const std::vector<TensorSpec>& tensors,
                                                 uint32_t slice_elems, uint32_t num_shards) {
  if (tensors.empty()) return absl::InvalidArgumentError("layout has no tensors");
  if (tensors.size() > kMaxTensors) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout has ", tensors.size(), " tensors; the limit is ", kMaxTensors));
  }
  if (slice_elems == 0 || slice_elems > kMaxSliceElems) {
    return absl::InvalidArgumentError(absl::StrCat("slice_elems must be in [1, ", kMaxSliceElems,
                                                   "], got ", slice_elems));
  }
  if (num_shards == 0 || num_shards > kMaxShards) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_shards must be in [1, ", kMaxShards, "], got ", num_shards));
  }
  std::unordered_set<std::string_view> names;
  names.reserve(tensors.size());
  LayoutSummary sum;
  for (const TensorSpec& t : tensors) {
    if (t.name.empty() || t.name.size() > kMaxTensorNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat("tensor names must have 1 to ",
                                                     kMaxTensorNameBytes, " bytes, got '",
                                                     ClientText(t.name), "'"));
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("duplicate tensor name '", ClientText(t.name), "'"));
    }
    if (t.numel == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", ClientText(t.name), "' has no elements"));
    }
    // Neither the sum nor the slice count may wrap: compare against what is left.
    if (t.numel > kMaxModelElems - sum.total_elems) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layout has more than ", kMaxModelElems, " elements (tensor '", ClientText(t.name),
          "' has ", t.numel, ")"));
    }
    if (t.row_elems != 0 && t.numel % t.row_elems != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", ClientText(t.name), "' has ", t.numel,
                       " elements, not whole rows of ", t.row_elems));
    }
    if (t.optimizer.size() > kMaxOptimizerSpecBytes ||
        !std::all_of(t.optimizer.begin(), t.optimizer.end(),
                     [](char c) { return c >= 0x20 && c < 0x7f; })) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", ClientText(t.name), "' has an optimizer spec of ", t.optimizer.size(),
          " bytes; it must be printable ASCII of at most ", kMaxOptimizerSpecBytes, " bytes"));
    }
    sum.total_elems += t.numel;
    const uint32_t len = SliceElemsOf(t, slice_elems);
    const uint64_t whole = t.numel / len;
    const uint64_t rest = t.numel % len != 0 ? 1 : 0;
    sum.num_slices += whole + rest;
    sum.partial_slices += (len < slice_elems ? whole : 0) + rest;
    if (sum.num_slices > kMaxSlices) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layout needs more than ", kMaxSlices, " slices; raise slice_elems"));
    }
  }
  // Create() hands slices out largest first to the least-loaded shard: the full slices
  // go round-robin, then the shorter ones may all land on one shard. Loads end within
  // one slice of each other.
  const uint64_t full_slices = sum.num_slices - sum.partial_slices;
  sum.max_owned_slices = (full_slices + num_shards - 1) / num_shards + sum.partial_slices;
  sum.max_owned_elems = sum.total_elems / num_shards + slice_elems;
  return sum;
}

uint64_t ModelLayout::Hash(const std::vector<TensorSpec>& tensors, uint32_t slice_elems,
                           uint32_t num_shards) {
  return LayoutDigest(tensors, slice_elems, num_shards);
}

absl::StatusOr<ModelLayout> ModelLayout::Create(std::vector<TensorSpec> tensors,
                                                uint32_t slice_elems, uint32_t num_shards) {
  PS_ASSIGN_OR_RETURN(const LayoutSummary sum, Check(tensors, slice_elems, num_shards));
  const uint64_t num_slices = sum.num_slices;
  const uint64_t total = sum.total_elems;

  ModelLayout l;
  l.slice_elems_ = slice_elems;
  l.num_shards_ = num_shards;
  l.total_elems_ = total;
  l.hash_ = LayoutDigest(tensors, slice_elems, num_shards);
  l.tensors_ = std::move(tensors);
  l.slices_.reserve(num_slices);
  l.tensor_slice_begin_.reserve(l.tensors_.size() + 1);
  for (uint32_t t = 0; t < l.tensors_.size(); ++t) {
    l.tensor_slice_begin_.push_back(static_cast<uint32_t>(l.slices_.size()));
    const TensorSpec& spec = l.tensors_[t];
    const uint32_t len = SliceElemsOf(spec, slice_elems);
    for (uint64_t off = 0; off < spec.numel; off += len) {
      SliceInfo s;
      s.id = static_cast<uint32_t>(l.slices_.size());
      s.tensor = t;
      s.offset = off;
      s.numel = static_cast<uint32_t>(std::min<uint64_t>(len, spec.numel - off));
      s.priority = spec.priority;
      l.slices_.push_back(s);
    }
  }
  l.tensor_slice_begin_.push_back(static_cast<uint32_t>(l.slices_.size()));
  l.slice_ids_.resize(l.slices_.size());
  std::iota(l.slice_ids_.begin(), l.slice_ids_.end(), 0u);

  // Longest-processing-time assignment: deterministic and within one slice of
  // perfect balance.
  std::vector<uint32_t> by_size = l.slice_ids_;
  std::stable_sort(by_size.begin(), by_size.end(), [&](uint32_t a, uint32_t b) {
    return l.slices_[a].numel > l.slices_[b].numel;
  });
  std::vector<uint64_t> load(num_shards, 0);
  for (uint32_t id : by_size) {
    uint32_t best = 0;
    for (uint32_t s = 1; s < num_shards; ++s) {
      if (load[s] < load[best]) best = s;
    }
    l.slices_[id].shard = best;
    load[best] += l.slices_[id].numel;
  }
  l.shard_slices_.assign(num_shards, {});
  for (const SliceInfo& s : l.slices_) l.shard_slices_[s.shard].push_back(s.id);
  for (auto& ids : l.shard_slices_) {
    std::stable_sort(ids.begin(), ids.end(), [&](uint32_t a, uint32_t b) {
      return l.slices_[a].priority < l.slices_[b].priority;
    });
  }
  return l;
}

std::span<const uint32_t> ModelLayout::SlicesOfTensor(size_t tensor) const {
  const uint32_t begin = tensor_slice_begin_[tensor];
  const uint32_t end = tensor_slice_begin_[tensor + 1];
  return std::span<const uint32_t>(slice_ids_).subspan(begin, end - begin);
}

std::span<const uint32_t> ModelLayout::SlicesOfShard(uint32_t shard) const {
  return shard_slices_[shard];
}

int ModelLayout::FindTensor(std::string_view name) const {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

std::vector<uint64_t> ModelLayout::ShardLoads() const {
  std::vector<uint64_t> load(num_shards_, 0);
  for (const SliceInfo& s : slices_) load[s.shard] += s.numel;
  return load;
}

}  // namespace ps::core
