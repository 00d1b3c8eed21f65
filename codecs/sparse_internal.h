// The pieces of the sparse codecs (docs/codecs.md "Sparse codecs"): a sparsifier picks
// coordinates (top-k, threshold, random-k), an index stage writes which ones (raw,
// varint, bitmap, rle, bloom), a value stage writes their values (raw, fp16, deflate,
// polyfit). sparse.cc composes them into one Codec; this header exposes the stages to
// each other and to tests.
//
// Conventions: index lists are sorted, strictly increasing and < numel; values travel
// in the order of their indices. Decoders take the codec's spec for error messages
// ("topk(...)+varint+raw: ...") and validate every byte of their section.
//
// Thread safety: every function here is pure and may run concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "codecs/codec_internal.h"
#include "codecs/hd_internal.h"

namespace ps::codecs::internal {

// "<codec>: <parts...>" as INVALID_ARGUMENT: the error of a malformed sparse section.
absl::Status Invalid(std::string_view codec, const auto&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(AbslView(codec), ": ", parts...));
}

// The little-endian 32-bit word at p.
inline uint32_t LoadLe32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}

// ---- sparsifiers (sparse_select.cc) ----

// The k coordinates of largest |x| in increasing order; among equal magnitudes the
// lower indices win. One pass when a fixed-seed sample predicts the k-th magnitude
// (candidates above a slightly lower threshold, then nth_element among them);
// otherwise a radix select on the magnitude bits (a 2048-bin histogram of the top 11
// bits, then a selection inside the bin that holds the k-th largest), two passes.
// The result is exact either way. k >= x.size() keeps everything.
std::vector<uint32_t> TopkExact(std::span<const float> x, size_t k);

// DGC-style top-k: the threshold is the matching quantile of |x| over a sample of
// positions drawn from `seed`, then one pass keeps every |x| >= threshold (about k
// coordinates, possibly a few more or fewer; more than 2k are cut to the exact top k
// of the kept ones). Small slices (sample >= half the slice) use TopkExact.
std::vector<uint32_t> TopkSampled(std::span<const float> x, size_t k, uint64_t seed);

// CAT's choice of k for top-k (docs/adaptive.md, "CAT"): among k in [k_min, k_max],
// the k that maximizes the squared norm kept per unit of cost,
//   |top_k(x)|^2 / (fixed_bytes + bytes(k)),
// which is a(k) / C(k) of the paper up to the constant |x|^2; ties go to the smaller
// k. `bytes(k)` is the payload's (estimated) size for k kept values and
// `fixed_bytes` what a transfer costs beyond its bytes, in bytes of the same link.
// One TopkExact(x, k_max), a sort of its k_max coordinates by magnitude, and one pass
// over their prefix sums. `kept` is exactly TopkExact(x, k*), sorted.
struct CatChoice {
  std::vector<uint32_t> kept;
  double kept_energy = 0;  // |top_k*(x)|^2
};
CatChoice TopkCat(std::span<const float> x, size_t k_min, size_t k_max, double fixed_bytes,
                  const std::function<double(size_t)>& bytes);

// Every coordinate with |x| >= tau (tau > 0).
std::vector<uint32_t> ThresholdSelect(std::span<const float> x, float tau);

// k distinct indices from [0, n), sorted, as a function of `seed` only (Floyd's
// algorithm with an open-addressing set of 2k..4k slots: O(k) memory, O(k log k)
// time). Random-k masks and Bloom policy P1 use it. Requires k <= n < 2^32.
std::vector<uint32_t> SampleSortedIndices(uint64_t seed, size_t k, uint64_t n);

// The number of coordinates a ratio keeps: max(1, round(ratio * numel)), at most
// numel (0 for an empty slice).
size_t KeepCount(double ratio, size_t numel);

// ---- index stages (sparse_stages.cc) ----

// Wire ids (header byte 1). kSeed is random-k's: the section is the 64-bit mask seed.
enum class IndexKind : uint8_t {
  kSeed = 0,
  kRaw = 1,
  kVarint = 2,
  kBitmap = 3,
  kRle = 4,
  kBloom = 5
};
enum class BloomPolicy : uint8_t { kP0 = 0, kP1 = 1, kP2 = 2 };

struct IndexStage {
  IndexKind kind = IndexKind::kRaw;
  BloomPolicy policy = BloomPolicy::kP0;  // bloom only
  double fpr = 0.01;                      // bloom only: target false-positive rate
};

// Name of an index kind ("varint"), for specs and messages.
std::string_view IndexKindName(IndexKind kind);

// Appends the index section for the sorted coordinates `kept` of a slice of `numel`
// values and sets *sent to the coordinates whose values must follow: `kept` itself,
// except for a Bloom filter, which sends the values of its positives (P0) or of the
// positives its policy selects (P1, P2). `seed` seeds the Bloom hashes.
void EncodeIndices(const IndexStage& stage, std::span<const uint32_t> kept, size_t numel,
                   uint64_t seed, std::string* out, std::vector<uint32_t>* sent);

// Decodes an index section holding `count` coordinates of a slice of `numel` values
// (count <= numel, checked by the caller) into *indices (sorted, < numel). Refuses
// out-of-range, non-increasing, overrunning, padded or trailing data.
absl::Status DecodeIndices(std::string_view codec, const IndexStage& stage,
                           std::string_view section, size_t numel, size_t count,
                           std::vector<uint32_t>* indices);

// Largest index section for `count` coordinates of `numel` (Bloom P0: count is the
// number of positives, at most numel).
size_t MaxIndexBytes(const IndexStage& stage, size_t numel, size_t count);

// Bloom filter parameters for `kept` true coordinates of `numel` at a false-positive
// rate fpr: hashes = clamp(round(log2(1/fpr)), 1, 16), bytes = ceil(kept * log2(1/fpr)
// / ln 2 / 8), at least 1 and at most numel + 8 (the bound the decoder enforces).
struct BloomShape {
  int hashes = 1;
  size_t bytes = 1;
};
BloomShape BloomShapeFor(size_t kept, size_t numel, double fpr);
inline constexpr int kBloomMaxHashes = 16;

// ---- value stages (sparse_stages.cc) ----

enum class ValueKind : uint8_t { kRaw = 1, kFp16 = 2, kDeflate = 3, kPolyfit = 4 };

struct ValueStage {
  ValueKind kind = ValueKind::kRaw;
  int deflate_level = 6;  // deflate only, 0..9
  int poly_degree = 5;    // polyfit only, 0..kPolyMaxDegree
};
inline constexpr int kPolyMaxDegree = 7;
// The most segments a polyfit section may have.
inline constexpr size_t kPolyMaxSegments = 128;

std::string_view ValueKindName(ValueKind kind);

// Appends the value section for `values` (finite, in index order).
void EncodeValues(const ValueStage& stage, std::span<const float> values, std::string* out);

// Decodes a value section into values.size() finite values.
absl::Status DecodeValues(std::string_view codec, const ValueStage& stage, std::string_view section,
                          std::span<float> values);

size_t MaxValueBytes(const ValueStage& stage, size_t count);

// Polyfit's segmentation of `count` values sorted in decreasing order whose first
// `positives` are > 0 and last `negatives` are < 0: each sign part is cut into
// segments that halve from the part's middle (near zero) toward its extreme end, the
// smallest at the extreme, none shorter than min_len unless the part is; zeros form
// one segment. Returns the segment lengths in order (sum = count).
std::vector<size_t> PolySegments(size_t count, size_t positives, size_t negatives, size_t min_len);

// ---- the composed codec (sparse.cc) ----

enum class Sparsifier { kTopk, kThreshold, kRandk };

// What a sparse spec says, every argument bound.
struct SparseConfig {
  Sparsifier sparsifier = Sparsifier::kTopk;
  double ratio = 0.01;   // topk, randk
  bool sampled = false;  // topk(method=sampled)
  // topk(level=cat): k is chosen per encoding by TopkCat between KeepCount(min_ratio)
  // and KeepCount(ratio), so `ratio` is the most a payload keeps.
  bool cat = false;
  double min_ratio = 0.001;      // topk(level=cat) only
  double overhead = 16384;       // topk(level=cat): fixed_bytes when the caller has none
  double tau = 0.01;             // threshold
  std::optional<uint64_t> seed;  // randk: global mask seed
  bool unbiased = false;         // randk(scale=unbiased)
  IndexStage index;
  ValueStage value;
  std::string spec;  // canonical
};

// The payload's size for `count` kept coordinates of numel under `config`'s stages:
// CAT's bytes(k) (TopkCat). Exact for raw and bitmap indices with raw or fp16 values;
// varint and rle take the mean gap, Bloom P0 its expected false positives, deflate and
// polyfit their bounds.
double EstimatedPayloadBytes(const SparseConfig& config, size_t numel, size_t count);

// The index and value stage names (raw, varint, ..., fp16, deflate, polyfit; "raw"
// twice: it is both).
std::vector<std::string_view> SparseStageNames();

// The configuration of a topk, threshold or randk spec, as MakeCodec binds it.
absl::StatusOr<SparseConfig> ParseSparseSpec(std::string_view spec);

// Fills values[j] with the value of coordinate sent[j].
using GatherValues =
    std::function<absl::Status(std::span<const uint32_t> sent, std::span<float> values)>;

// The payload of a top-k or threshold codec whose sparsifier kept the sorted
// coordinates `kept` of numel values: the index section, the values of the coordinates
// it sends (through `gather`), the value section and the header, exactly as the CPU
// codec writes them; SparseCodec::Encode and the GPU encoder (codecs/cuda, which
// selects on the device) both end here. `stream` is StreamSeed(CodecOptions::seed,
// ctx). When not null, *sent receives the coordinates sent (kept, or a Bloom filter's
// positives) and *decoded the values a decoder reads for them (for error feedback).
absl::Status EncodeSelected(const SparseConfig& config, std::span<const uint32_t> kept,
                            size_t numel, uint64_t stream, const GatherValues& gather,
                            std::string* out, std::vector<uint32_t>* sent,
                            std::vector<float>* decoded);

}  // namespace ps::codecs::internal
