// Value stages of the sparse codecs (sparse_internal.h; wire formats in docs/codecs.md
// "Sparse codecs"): raw fp32, fp16, deflate over byte planes and piecewise polynomials.
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
