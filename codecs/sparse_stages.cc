// Index stages of the sparse codecs (sparse_internal.h; wire formats in docs/codecs.md
// "Sparse codecs"); the value stages are in sparse_values.cc.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "codecs/codec_internal.h"
#include "codecs/sparse_internal.h"
#include "codecs/wire_internal.h"
#include "core/status.h"

namespace ps::codecs::internal {

std::string_view IndexKindName(IndexKind kind) {
  switch (kind) {
    case IndexKind::kSeed: return "seed";
    case IndexKind::kRaw: return "raw";
    case IndexKind::kVarint: return "varint";
    case IndexKind::kBitmap: return "bitmap";
    case IndexKind::kRle: return "rle";
    case IndexKind::kBloom: return "bloom";
  }
  return "?";
}

namespace {

// ---- Bloom filter ----

// Bit positions of coordinate p: double hashing g_j = x + j * y over one 64-bit mix,
// each reduced to [0, bits) by a multiply-high. Nothing is precomputed per coordinate.
struct BloomFilter {
  const unsigned char* bytes;
  uint64_t bits;  // 8 * byte count
  int hashes;
  uint64_t seed;

  template <typename F>
  void ForEachBit(uint32_t p, F&& f) const {
    const uint64_t x = Mix64(seed ^ p);
    const uint64_t y = std::rotl(x, 32) | 1;
    uint64_t g = x;
    for (int j = 0; j < hashes; ++j, g += y) f(BoundedRandom(g, bits));
  }
  bool Query(uint32_t p) const {
    const uint64_t x = Mix64(seed ^ p);
    const uint64_t y = std::rotl(x, 32) | 1;
    uint64_t g = x;
    for (int j = 0; j < hashes; ++j, g += y) {
      const uint64_t b = BoundedRandom(g, bits);
      if (((bytes[b >> 3] >> (b & 7)) & 1) == 0) return false;
    }
    return true;
  }
};

constexpr uint64_t kP1Salt = 0x5031'5031'5031'5031ull;
constexpr uint64_t kP2Salt = 0x5032'5032'5032'5032ull;

// The positives a policy sends values for, sorted; the encoder and the decoder both
// run it on the same filter and positives.
std::vector<uint32_t> SelectPositives(BloomPolicy policy, const BloomFilter& filter,
                                      std::vector<uint32_t> positives, size_t k) {
  if (policy == BloomPolicy::kP0 || k >= positives.size()) return positives;
  if (policy == BloomPolicy::kP1) {
    // P1: k positives drawn uniformly from a seed.
    std::vector<uint32_t> ranks =
        SampleSortedIndices(Mix64(filter.seed ^ kP1Salt), k, positives.size());
    for (uint32_t& r : ranks) r = positives[r];
    return ranks;
  }
  // P2: conflict sets. Every set bit was set by at least one true coordinate, so a
  // positive that alone maps to one of its bits is surely true, and a positive whose
  // least-shared bit is shared by few is likely true. Rank positives by the size of
  // their smallest conflict set (saturating at 255), ties broken by a seeded hash,
  // and keep the k best.
  std::vector<uint8_t> shared(filter.bits, 0);
  for (uint32_t p : positives) {
    filter.ForEachBit(p, [&](uint64_t b) { shared[b] += shared[b] < 255; });
  }
  std::vector<uint64_t> keys(positives.size());
  for (size_t i = 0; i < positives.size(); ++i) {
    const uint32_t p = positives[i];
    unsigned least = 255;
    filter.ForEachBit(p, [&](uint64_t b) { least = std::min<unsigned>(least, shared[b]); });
    const uint64_t tie = Mix64(filter.seed ^ kP2Salt ^ p) & 0xffffffull;
    keys[i] = (uint64_t{least} << 56) | (tie << 32) | p;  // unique: p in the low bits
  }
  std::nth_element(keys.begin(), keys.begin() + static_cast<ptrdiff_t>(k), keys.end());
  std::vector<uint32_t> out(k);
  for (size_t i = 0; i < k; ++i) out[i] = static_cast<uint32_t>(keys[i] & 0xffffffffu);
  std::sort(out.begin(), out.end());
  return out;
}

void EncodeBloom(const IndexStage& stage, std::span<const uint32_t> kept, size_t numel,
                 uint64_t seed, std::string* out, std::vector<uint32_t>* sent) {
  const BloomShape shape = BloomShapeFor(kept.size(), numel, stage.fpr);
  std::string bytes(shape.bytes, '\0');
  auto* raw = reinterpret_cast<unsigned char*>(bytes.data());
  const BloomFilter filter{raw, 8 * uint64_t{shape.bytes}, shape.hashes, seed};
  for (uint32_t p : kept) {
    filter.ForEachBit(p, [&](uint64_t b) { raw[b >> 3] |= static_cast<unsigned char>(1u << (b & 7)); });
  }
  std::vector<uint32_t> positives;
  positives.reserve(kept.size() + kept.size() / 8 + 8);
  for (size_t p = 0; p < numel; ++p) {
    if (filter.Query(static_cast<uint32_t>(p))) positives.push_back(static_cast<uint32_t>(p));
  }
  PutU8(out, static_cast<uint8_t>(stage.policy));
  PutU8(out, static_cast<uint8_t>(shape.hashes));
  PutU64(out, seed);
  if (stage.policy != BloomPolicy::kP0) PutVarint(out, positives.size());
  PutVarint(out, shape.bytes);
  out->append(bytes);
  *sent = SelectPositives(stage.policy, filter, std::move(positives), kept.size());
}

absl::Status DecodeBloom(std::string_view codec, const IndexStage& stage,
                         std::string_view section, size_t numel, size_t count,
                         std::vector<uint32_t>* indices) {
  WireReader r(codec, section);
  uint8_t policy = 0, hashes = 0;
  uint64_t seed = 0, positives = count, bytes = 0;
  PS_RETURN_IF_ERROR(r.U8(&policy, "the bloom policy"));
  if (policy != static_cast<uint8_t>(stage.policy)) {
    return r.Error(absl::StrCat("bloom policy ", int{policy}, ", expected p",
                                static_cast<int>(stage.policy)));
  }
  PS_RETURN_IF_ERROR(r.U8(&hashes, "the bloom hash count"));
  if (hashes < 1 || hashes > kBloomMaxHashes) {
    return r.Error(absl::StrCat("bloom hash count ", int{hashes}, " is not in [1, ",
                                kBloomMaxHashes, "]"));
  }
  PS_RETURN_IF_ERROR(r.U64(&seed, "the bloom seed"));
  if (stage.policy != BloomPolicy::kP0) {
    PS_RETURN_IF_ERROR(r.Varint(&positives, "the bloom positive count"));
    if (positives > numel || positives < count) {
      return r.Error(absl::StrCat("bloom positive count ", positives, " is not in [", count,
                                  ", ", numel, "]"));
    }
  }
  PS_RETURN_IF_ERROR(r.Varint(&bytes, "the bloom filter size"));
  if (bytes < 1 || bytes > numel + 8) {
    return r.Error(absl::StrCat("bloom filter of ", bytes, " bytes for ", numel,
                                " values (allowed 1 to numel + 8)"));
  }
  std::string_view filter_bytes;
  PS_RETURN_IF_ERROR(r.Bytes(bytes, &filter_bytes, "the bloom filter"));
  PS_RETURN_IF_ERROR(r.Finish("the bloom filter"));
  const BloomFilter filter{reinterpret_cast<const unsigned char*>(filter_bytes.data()),
                           8 * bytes, hashes, seed};
  // A linear scan over every coordinate; stops as soon as the filter claims more
  // positives than the header allows, so memory stays bounded by the header.
  std::vector<uint32_t> found;
  found.reserve(positives);
  for (size_t p = 0; p < numel; ++p) {
    if (!filter.Query(static_cast<uint32_t>(p))) continue;
    if (found.size() == positives) {
      return r.Error(absl::StrCat("bloom filter has more than ", positives,
                                  " positives (from coordinate ", p, ")"));
    }
    found.push_back(static_cast<uint32_t>(p));
  }
  if (found.size() != positives) {
    return r.Error(absl::StrCat("bloom filter has ", found.size(), " positives, expected ",
                                positives));
  }
  *indices = SelectPositives(stage.policy, filter, std::move(found), count);
  return absl::OkStatus();
}

// ---- the other index stages ----

void EncodeRle(std::span<const uint32_t> kept, size_t numel, std::string* out) {
  // Runs alternate zeros, ones, zeros, ...; only the first may be empty.
  size_t pos = 0;
  size_t j = 0;
  while (j < kept.size()) {
    PutVarint(out, kept[j] - pos);
    size_t end = j + 1;
    while (end < kept.size() && kept[end] == kept[end - 1] + 1) ++end;
    PutVarint(out, end - j);
    pos = kept[end - 1] + size_t{1};
    j = end;
  }
  if (pos < numel) PutVarint(out, numel - pos);
}

absl::Status DecodeRle(std::string_view codec, std::string_view section, size_t numel,
                       size_t count, std::vector<uint32_t>* indices) {
  WireReader r(codec, section);
  indices->clear();
  indices->reserve(count);
  size_t pos = 0;
  bool ones = false;
  for (bool first = true; pos < numel; first = false, ones = !ones) {
    uint64_t run = 0;
    PS_RETURN_IF_ERROR(r.Varint(&run, "an rle run"));
    if (run == 0 && !first) return r.Error(absl::StrCat("empty rle run at coordinate ", pos));
    if (run > numel - pos) {
      return r.Error(absl::StrCat("rle run of ", run, " at coordinate ", pos, " overruns ",
                                  numel, " values"));
    }
    if (ones) {
      if (run > count - indices->size()) {
        return r.Error(absl::StrCat("rle runs hold more than ", count, " ones"));
      }
      for (size_t p = pos; p < pos + run; ++p) indices->push_back(static_cast<uint32_t>(p));
    }
    pos += run;
  }
  PS_RETURN_IF_ERROR(r.Finish("the rle runs"));
  if (indices->size() != count) {
    return r.Error(absl::StrCat("rle runs hold ", indices->size(), " ones, expected ", count));
  }
  return absl::OkStatus();
}

absl::Status DecodeBitmap(std::string_view codec, std::string_view section, size_t numel,
                          size_t count, std::vector<uint32_t>* indices) {
  const size_t bytes = (numel + 7) / 8;
  if (section.size() != bytes) {
    return Invalid(codec, "bitmap is ", section.size(), " bytes, expected ", bytes, " for ",
                   numel, " values");
  }
  const auto* b = reinterpret_cast<const unsigned char*>(section.data());
  if (numel % 8 != 0 && (b[bytes - 1] >> (numel % 8)) != 0) {
    return Invalid(codec, "bitmap padding bits are not zero");
  }
  size_t ones = 0;
  for (size_t i = 0; i < bytes; ++i) ones += static_cast<size_t>(std::popcount(b[i]));
  if (ones != count) return Invalid(codec, "bitmap has ", ones, " ones, expected ", count);
  indices->resize(count);
  size_t n = 0;
  for (size_t i = 0; i < bytes; ++i) {
    for (unsigned v = b[i]; v != 0; v &= v - 1) {
      (*indices)[n++] = static_cast<uint32_t>(8 * i + static_cast<size_t>(std::countr_zero(v)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

BloomShape BloomShapeFor(size_t kept, size_t numel, double fpr) {
  const double bits_per_key = std::log2(1 / fpr);
  BloomShape s;
  s.hashes = std::clamp(static_cast<int>(std::lround(bits_per_key)), 1, kBloomMaxHashes);
  const double bytes = std::ceil(static_cast<double>(kept) * bits_per_key / std::log(2.0) / 8);
  const double cap = static_cast<double>(numel) + 8;
  s.bytes = static_cast<size_t>(std::clamp(bytes, 1.0, cap));
  return s;
}

void EncodeIndices(const IndexStage& stage, std::span<const uint32_t> kept, size_t numel,
                   uint64_t seed, std::string* out, std::vector<uint32_t>* sent) {
  switch (stage.kind) {
    case IndexKind::kSeed:
      break;  // random-k writes its seed itself
    case IndexKind::kRaw:
      for (uint32_t p : kept) PutU32(out, p);
      break;
    case IndexKind::kVarint:
      for (size_t j = 0; j < kept.size(); ++j) PutVarint(out, j == 0 ? kept[0] : kept[j] - kept[j - 1] - 1);
      break;
    case IndexKind::kBitmap: {
      const size_t start = out->size();
      out->append((numel + 7) / 8, '\0');
      for (uint32_t p : kept) (*out)[start + p / 8] |= static_cast<char>(1u << (p % 8));
      break;
    }
    case IndexKind::kRle:
      EncodeRle(kept, numel, out);
      break;
    case IndexKind::kBloom:
      EncodeBloom(stage, kept, numel, seed, out, sent);
      return;
  }
  sent->assign(kept.begin(), kept.end());
}

absl::Status DecodeIndices(std::string_view codec, const IndexStage& stage,
                           std::string_view section, size_t numel, size_t count,
                           std::vector<uint32_t>* indices) {
  switch (stage.kind) {
    case IndexKind::kSeed:
      return absl::InternalError("random-k indices come from SupportIndices");
    case IndexKind::kRaw: {
      if (section.size() != 4 * count) {
        return Invalid(codec, "raw index section is ", section.size(), " bytes, expected ",
                       4 * count, " (4 * ", count, " indices)");
      }
      indices->resize(count);
      for (size_t j = 0; j < count; ++j) {
        const uint32_t p = LoadLe32(section.data() + 4 * j);
        if (p >= numel) return Invalid(codec, "index ", j, " is ", p, ", not below ", numel);
        if (j > 0 && p <= (*indices)[j - 1]) {
          return Invalid(codec, "index ", j, " (", p, ") does not increase");
        }
        (*indices)[j] = p;
      }
      return absl::OkStatus();
    }
    case IndexKind::kVarint: {
      WireReader r(codec, section);
      indices->resize(count);
      uint64_t next = 0;  // the least value the next index may take
      for (size_t j = 0; j < count; ++j) {
        uint64_t v = 0;
        PS_RETURN_IF_ERROR(r.Varint(&v, "a varint index"));
        if (v >= numel || next + v >= numel) {
          return r.Error(absl::StrCat("varint index ", j, " lies beyond ", numel, " values"));
        }
        (*indices)[j] = static_cast<uint32_t>(next + v);
        next += v + 1;
      }
      return r.Finish("the varint indices");
    }
    case IndexKind::kBitmap:
      return DecodeBitmap(codec, section, numel, count, indices);
    case IndexKind::kRle:
      return DecodeRle(codec, section, numel, count, indices);
    case IndexKind::kBloom:
      return DecodeBloom(codec, stage, section, numel, count, indices);
  }
  return absl::InternalError("unknown index stage");
}

size_t MaxIndexBytes(const IndexStage& stage, size_t numel, size_t count) {
  switch (stage.kind) {
    case IndexKind::kSeed: return 8;
    case IndexKind::kRaw: return 4 * count;
    case IndexKind::kVarint: return 5 * count;
    case IndexKind::kBitmap: return (numel + 7) / 8;
    case IndexKind::kRle: return 5 * (2 * count + 1);
    case IndexKind::kBloom: return 1 + 1 + 8 + 10 + 10 + numel + 8;
  }
  return 0;
}

}  // namespace ps::codecs::internal
