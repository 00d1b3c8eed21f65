// Index and value stages of the sparse codecs (sparse_internal.h; wire formats in
// docs/codecs.md "Sparse codecs").
#include <algorithm>
#include <bit>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstring>
#include <numeric>

#include <zlib.h>

#include "absl/strings/str_cat.h"
#include "codecs/codec_internal.h"
#include "codecs/half_internal.h"
#include "codecs/sparse_internal.h"
#include "codecs/wire_internal.h"
#include "core/fp32_bytes.h"
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

std::string_view ValueKindName(ValueKind kind) {
  switch (kind) {
    case ValueKind::kRaw: return "raw";
    case ValueKind::kFp16: return "fp16";
    case ValueKind::kDeflate: return "deflate";
    case ValueKind::kPolyfit: return "polyfit";
  }
  return "?";
}

namespace {

absl::Status Invalid(std::string_view codec, const auto&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(AbslView(codec), ": ", parts...));
}

uint32_t LoadLe32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}

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

// ---- values ----

void EncodeDeflate(int level, std::span<const float> values, std::string* out) {
  // Byte planes (all low bytes, ..., all high bytes): signs and exponents group
  // together and compress better than interleaved fp32.
  const size_t n = values.size();
  std::string planes(4 * n, '\0');
  for (size_t i = 0; i < n; ++i) {
    const uint32_t bits = std::bit_cast<uint32_t>(values[i]);
    for (size_t b = 0; b < 4; ++b) planes[b * n + i] = static_cast<char>((bits >> (8 * b)) & 0xff);
  }
  uLongf size = compressBound(static_cast<uLong>(planes.size()));
  std::string packed(size, '\0');
  // Cannot fail: the buffer has compressBound bytes and the level is in [0, 9].
  compress2(reinterpret_cast<Bytef*>(packed.data()), &size,
            reinterpret_cast<const Bytef*>(planes.data()), static_cast<uLong>(planes.size()),
            level);
  out->append(packed.data(), size);
}

absl::Status DecodeDeflate(std::string_view codec, std::string_view section,
                           std::span<float> values) {
  const size_t n = values.size();
  const size_t expected = 4 * n;
  if (section.size() > UINT_MAX || expected > UINT_MAX) {
    return Invalid(codec, "deflate section too large");
  }
  std::string planes(expected, '\0');
  z_stream zs{};
  if (inflateInit(&zs) != Z_OK) return absl::InternalError("zlib inflateInit failed");
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(section.data()));
  zs.avail_in = static_cast<uInt>(section.size());
  zs.next_out = reinterpret_cast<Bytef*>(planes.data());
  zs.avail_out = static_cast<uInt>(expected);
  // The output buffer is exactly the expected size: a stream that would inflate
  // further stops here instead of growing anything (no zip bombs). When the buffer
  // is full before the stream ends, one more byte tells a longer stream from a
  // truncated one.
  int ret = inflate(&zs, Z_FINISH);
  bool beyond = false;
  if (ret != Z_STREAM_END && zs.avail_out == 0) {
    unsigned char extra = 0;
    zs.next_out = &extra;
    zs.avail_out = 1;
    ret = inflate(&zs, Z_FINISH);
    beyond = zs.avail_out == 0;
  }
  const size_t produced = zs.total_out;
  const size_t left_in = zs.avail_in;
  const std::string message = zs.msg != nullptr ? zs.msg : "";
  inflateEnd(&zs);
  if (beyond) {
    return Invalid(codec, "deflate values inflate beyond ", expected, " bytes (", n, " values)");
  }
  if (ret == Z_BUF_ERROR) return Invalid(codec, "deflate stream is truncated");
  if (ret != Z_STREAM_END) return Invalid(codec, "corrupt deflate stream (", message, ")");
  if (produced != expected) {
    return Invalid(codec, "deflate values inflate to ", produced, " bytes, expected ", expected);
  }
  if (left_in != 0) return Invalid(codec, left_in, " trailing bytes after the deflate stream");
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits = 0;
    for (size_t b = 0; b < 4; ++b) {
      bits |= uint32_t{static_cast<unsigned char>(planes[b * n + i])} << (8 * b);
    }
    values[i] = std::bit_cast<float>(bits);
  }
  if (const ptrdiff_t i = core::FindNonFinite(values); i >= 0) {
    return Invalid(codec, "value ", i, " is not finite (", values[i], ")");
  }
  return absl::OkStatus();
}

// Least-squares polynomial of `degree` through (u_j, y_j), u_j spread evenly over
// [-1, 1]; coefficients in increasing powers of u. Normal equations in double with
// partial pivoting (degree <= 7 on [-1, 1] is well within double's range).
std::vector<double> FitPolynomial(std::span<const double> y, int degree) {
  const size_t len = y.size();
  const int d = std::min<int>(degree, static_cast<int>(len) - 1);
  const int m = d + 1;
  std::vector<double> coef(static_cast<size_t>(degree) + 1, 0.0);
  double a[kPolyMaxDegree + 1][kPolyMaxDegree + 2] = {};
  for (size_t j = 0; j < len; ++j) {
    const double u = len == 1 ? 0.0 : 2.0 * static_cast<double>(j) / static_cast<double>(len - 1) - 1;
    double pw[2 * kPolyMaxDegree + 1];
    pw[0] = 1;
    for (int e = 1; e <= 2 * d; ++e) pw[e] = pw[e - 1] * u;
    for (int r = 0; r < m; ++r) {
      for (int c = 0; c < m; ++c) a[r][c] += pw[r + c];
      a[r][m] += pw[r] * y[j];
    }
  }
  for (int c = 0; c < m; ++c) {
    int piv = c;
    for (int r = c + 1; r < m; ++r) {
      if (std::fabs(a[r][c]) > std::fabs(a[piv][c])) piv = r;
    }
    for (int k = 0; k <= m; ++k) std::swap(a[c][k], a[piv][k]);
    if (a[c][c] == 0) return coef;  // cannot happen for distinct u; zeros are safe
    for (int r = c + 1; r < m; ++r) {
      const double f = a[r][c] / a[c][c];
      for (int k = c; k <= m; ++k) a[r][k] -= f * a[c][k];
    }
  }
  for (int r = m - 1; r >= 0; --r) {
    double s = a[r][m];
    for (int k = r + 1; k < m; ++k) s -= a[r][k] * coef[static_cast<size_t>(k)];
    coef[static_cast<size_t>(r)] = s / a[r][r];
  }
  return coef;
}

// Value j of a segment of `len` from its coefficients (Horner in double).
double EvalSegment(const float* coef, int degree, size_t j, size_t len) {
  const double u = len == 1 ? 0.0 : 2.0 * static_cast<double>(j) / static_cast<double>(len - 1) - 1;
  double v = coef[degree];
  for (int e = degree - 1; e >= 0; --e) v = v * u + coef[e];
  return v;
}

int RankBits(size_t count) { return count <= 1 ? 0 : std::bit_width(count - 1); }

void EncodePolyfit(int degree, std::span<const float> values, std::string* out) {
  const size_t n = values.size();
  PutU8(out, static_cast<uint8_t>(degree));
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  });
  size_t positives = 0, negatives = 0;
  for (float v : values) {
    positives += v > 0;
    negatives += v < 0;
  }
  const std::vector<size_t> segs =
      PolySegments(n, positives, negatives, std::max<size_t>(8, 2 * (static_cast<size_t>(degree) + 1)));
  PutVarint(out, segs.size());
  for (size_t len : segs) PutVarint(out, len);
  size_t start = 0;
  std::vector<double> y;
  std::vector<float> coef(static_cast<size_t>(degree) + 1);
  for (size_t len : segs) {
    y.resize(len);
    for (size_t j = 0; j < len; ++j) y[j] = values[order[start + j]];
    const std::vector<double> fit = FitPolynomial(y, degree);
    bool finite = true;
    for (size_t i = 0; i < coef.size(); ++i) {
      coef[i] = static_cast<float>(fit[i]);
      finite &= std::isfinite(coef[i]);
    }
    // The decoder refuses a segment whose fp32 coefficients or values overflow (values
    // near FLT_MAX can fit to such a curve): send the segment's mean as a constant then.
    for (size_t j = 0; j < len && finite; ++j) {
      finite = std::isfinite(static_cast<float>(EvalSegment(coef.data(), degree, j, len)));
    }
    if (!finite) {
      double mean = 0;
      for (double v : y) mean += v / static_cast<double>(len);
      std::fill(coef.begin(), coef.end(), 0.0f);
      coef[0] = static_cast<float>(std::clamp(mean, -double{FLT_MAX}, double{FLT_MAX}));
    }
    for (float c : coef) PutF32(out, c);
    start += len;
  }
  std::vector<uint32_t> rank(n);
  for (size_t r = 0; r < n; ++r) rank[order[r]] = static_cast<uint32_t>(r);
  const int bits = RankBits(n);
  BitWriter w(out);
  for (size_t i = 0; i < n && bits > 0; ++i) w.Put(rank[i], bits);
  w.Finish();
}

absl::Status DecodePolyfit(std::string_view codec, std::string_view section,
                           std::span<float> values) {
  const size_t n = values.size();
  WireReader r(codec, section);
  uint8_t degree = 0;
  PS_RETURN_IF_ERROR(r.U8(&degree, "the polyfit degree"));
  if (degree > kPolyMaxDegree) {
    return r.Error(absl::StrCat("polyfit degree ", int{degree}, " is above ", kPolyMaxDegree));
  }
  uint64_t segments = 0;
  PS_RETURN_IF_ERROR(r.Varint(&segments, "the polyfit segment count"));
  const uint64_t max_segments = std::min<uint64_t>(n, kPolyMaxSegments);
  if ((n == 0 && segments != 0) || (n > 0 && (segments < 1 || segments > max_segments))) {
    return r.Error(absl::StrCat("polyfit segment count ", segments, " is not in [", n > 0 ? 1 : 0,
                                ", ", max_segments, "]"));
  }
  std::vector<size_t> lens(segments);
  size_t total = 0;
  for (size_t s = 0; s < segments; ++s) {
    uint64_t len = 0;
    PS_RETURN_IF_ERROR(r.Varint(&len, "a polyfit segment length"));
    if (len < 1 || len > n - total) {
      return r.Error(absl::StrCat("polyfit segment ", s, " of length ", len, " does not fit in ",
                                  n - total, " remaining values"));
    }
    lens[s] = len;
    total += len;
  }
  if (total != n) {
    return r.Error(absl::StrCat("polyfit segments cover ", total, " values, expected ", n));
  }
  const size_t per = size_t{degree} + 1;
  std::vector<float> coef(segments * per);
  for (size_t i = 0; i < coef.size(); ++i) {
    PS_RETURN_IF_ERROR(r.F32(&coef[i], "the polyfit coefficients"));
    if (!std::isfinite(coef[i])) {
      return r.Error(absl::StrCat("polyfit coefficient ", i, " is not finite"));
    }
  }
  std::vector<float> sorted(n);
  size_t at = 0;
  for (size_t s = 0; s < segments; ++s) {
    for (size_t j = 0; j < lens[s]; ++j, ++at) {
      sorted[at] = static_cast<float>(EvalSegment(&coef[s * per], degree, j, lens[s]));
      if (!std::isfinite(sorted[at])) {
        return r.Error(absl::StrCat("polyfit value ", at, " in sorted order is not finite"));
      }
    }
  }
  const int bits = RankBits(n);
  const size_t rank_bytes = (n * static_cast<size_t>(bits) + 7) / 8;
  std::string_view ranks;
  PS_RETURN_IF_ERROR(r.Bytes(rank_bytes, &ranks, "the polyfit ranks"));
  PS_RETURN_IF_ERROR(r.Finish("the polyfit ranks"));
  BitReader br(ranks);
  std::vector<bool> seen(n, false);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t rank = bits > 0 ? br.Get(bits) : 0;
    if (rank >= n || seen[rank]) {
      return r.Error(absl::StrCat("polyfit ranks are not a permutation (value ", i, " has rank ",
                                  rank, ")"));
    }
    seen[rank] = true;
    values[i] = sorted[rank];
  }
  if (!br.PaddingIsZero()) return r.Error("polyfit rank padding bits are not zero");
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

void EncodeValues(const ValueStage& stage, std::span<const float> values, std::string* out) {
  switch (stage.kind) {
    case ValueKind::kRaw:
      core::AppendFp32(values, out);
      return;
    case ValueKind::kFp16: {
      const size_t start = out->size();
      out->resize(start + 2 * values.size());
      FloatsToHalves(values, reinterpret_cast<unsigned char*>(out->data() + start));
      return;
    }
    case ValueKind::kDeflate:
      EncodeDeflate(stage.deflate_level, values, out);
      return;
    case ValueKind::kPolyfit:
      EncodePolyfit(stage.poly_degree, values, out);
      return;
  }
}

absl::Status DecodeValues(std::string_view codec, const ValueStage& stage,
                          std::string_view section, std::span<float> values) {
  const size_t n = values.size();
  switch (stage.kind) {
    case ValueKind::kRaw: {
      if (section.size() != 4 * n) {
        return Invalid(codec, "raw value section is ", section.size(), " bytes, expected ", 4 * n,
                       " (4 * ", n, " values)");
      }
      for (size_t i = 0; i < n; ++i) values[i] = std::bit_cast<float>(LoadLe32(section.data() + 4 * i));
      if (const ptrdiff_t i = core::FindNonFinite(values); i >= 0) {
        return Invalid(codec, "value ", i, " is not finite (", values[i], ")");
      }
      return absl::OkStatus();
    }
    case ValueKind::kFp16: {
      if (section.size() != 2 * n) {
        return Invalid(codec, "fp16 value section is ", section.size(), " bytes, expected ",
                       2 * n, " (2 * ", n, " values)");
      }
      const auto* halves = reinterpret_cast<const unsigned char*>(section.data());
      HalvesToFloats(halves, values);
      return CheckDecoded16(codec, halves, values);
    }
    case ValueKind::kDeflate:
      return DecodeDeflate(codec, section, values);
    case ValueKind::kPolyfit:
      return DecodePolyfit(codec, section, values);
  }
  return absl::InternalError("unknown value stage");
}

size_t MaxValueBytes(const ValueStage& stage, size_t count) {
  switch (stage.kind) {
    case ValueKind::kRaw: return 4 * count;
    case ValueKind::kFp16: return 2 * count;
    case ValueKind::kDeflate: return compressBound(static_cast<uLong>(4 * count));
    case ValueKind::kPolyfit:
      return 1 + 10 + kPolyMaxSegments * (10 + 4 * (kPolyMaxDegree + 1)) + 4 * count;
  }
  return 0;
}

std::vector<size_t> PolySegments(size_t count, size_t positives, size_t negatives,
                                 size_t min_len) {
  // Halving from the inner end: n/2, n/4, ... until less than 2 * min_len is left.
  auto inner_first = [min_len](size_t n) {
    std::vector<size_t> lens;
    size_t rest = n;
    while (rest >= 2 * min_len) {
      const size_t h = rest - rest / 2;
      lens.push_back(h);
      rest -= h;
    }
    if (rest > 0) lens.push_back(rest);
    return lens;
  };
  std::vector<size_t> segs = inner_first(positives);
  std::reverse(segs.begin(), segs.end());  // the largest values come first
  if (const size_t zeros = count - positives - negatives; zeros > 0) segs.push_back(zeros);
  for (size_t len : inner_first(negatives)) segs.push_back(len);
  return segs;
}

}  // namespace ps::codecs::internal
