// powersgd: rank-r factors of a gradient matrix with a warm start (Vogels, Karimireddy,
// Jaggi, "PowerSGD", NeurIPS 2019; docs/codecs.md "powersgd"), for one worker.
//
// The slice is a row-major rows x cols matrix M (cols = EncodeContext::matrix_cols).
// One step of subspace iteration per encoding: P = M Q, orthonormalize P, Q = M^T P;
// the payload carries P (rows x r) and Q (cols x r) and decodes to P Q^T. Q is kept
// per slice id and starts the next encoding of that slice (the warm start), so the
// approximation of a slowly changing gradient improves round after round. Slices that
// are not matrices, or whose factors would not be smaller than the matrix, travel as
// raw fp32. Error feedback is the worker library's job.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codecs/codec.h"
#include "codecs/codec_internal.h"
#include "codecs/wire_internal.h"
#include "core/fp32_bytes.h"
#include "core/status.h"

namespace ps::codecs {
namespace {

constexpr char kPowerSgdName[] = "powersgd";
constexpr int64_t kMaxRank = 64;

enum Mode : uint8_t { kRaw = 0, kFactors = 1 };

// Columns of M per block in the products: a block of the rank x block factor stays in
// L1/L2 while every row of M passes over it.
size_t ColumnBlock(size_t rank) { return std::max<size_t>(256, 16384 / rank); }

// sum a[j] * b[j] with eight partial sums, so the loop vectorizes without reassociation.
float Dot(const float* a, const float* b, size_t n) {
  float acc[8] = {};
  size_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += a[j + l] * b[j + l];
  }
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; j < n; ++j) s += a[j] * b[j];
  return s;
}

// y[j] += a * x[j].
void Axpy(float a, const float* x, float* y, size_t n) {
  for (size_t j = 0; j < n; ++j) y[j] += a * x[j];
}

// An approximately standard normal number from 64 random bits: the sum of four 16-bit
// uniforms (Irwin-Hall), centred and scaled to unit variance. Integer arithmetic up to
// one multiply, so every platform draws the same numbers.
double Gaussian(uint64_t bits) {
  const uint64_t sum = (bits & 0xffff) + ((bits >> 16) & 0xffff) + ((bits >> 32) & 0xffff) + (bits >> 48);
  return (static_cast<double>(sum) / 65536.0 - 2.0) * 1.7320508075688772;
}

// Random-stream tags under StreamSeed(seed, ctx): the initial Q, and re-drawn columns of P.
constexpr uint64_t kInitialQTag = 0x5153'4744'0001ull;
constexpr uint64_t kRedrawPTag = 0x5153'4744'0002ull;

bool AllFinite(const std::vector<float>& v) {
  return core::FindNonFinite(std::span<const float>(v)) < 0;
}

float MaxAbs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

class PowerSgdCodec final : public Codec {
 public:
  PowerSgdCodec(size_t rank, uint64_t seed)
      : Codec(PayloadFormat::kPowerSgd),
        rank_(rank),
        seed_(seed),
        spec_(internal::StageString(kPowerSgdName, {{"rank", absl::StrCat(rank)}})) {}

  std::string_view spec() const override { return spec_; }

  absl::Status Encode(std::span<const float> values, const EncodeContext& ctx,
                      std::string* out) override {
    PS_RETURN_IF_ERROR(internal::CheckEncodable(spec_, values));
    const size_t n = values.size();
    const size_t cols = ctx.matrix_cols;
    if (cols > 0 && n > 0 && n % cols == 0) {
      const size_t rows = n / cols;
      const size_t rank = std::min({rank_, rows, cols});
      if (FactorBytes(n, rows, cols, rank) < MaxEncodedBytes(n) &&
          EncodeFactors(values, ctx, rows, cols, rank, out)) {
        return absl::OkStatus();
      }
    }
    out->clear();
    out->reserve(MaxEncodedBytes(n));
    out->push_back(static_cast<char>(FormatByte(format())));
    out->push_back(static_cast<char>(kRaw));
    internal::PutVarint(out, n);
    if (n > 0) core::AppendFp32(values, out);
    return absl::OkStatus();
  }

  absl::Status Decode(std::string_view bytes, std::span<float> out) const override {
    const size_t n = out.size();
    internal::WireReader r(kPowerSgdName, bytes);
    PS_RETURN_IF_ERROR(r.Format(format()));
    uint8_t mode = 0;
    PS_RETURN_IF_ERROR(r.U8(&mode, "mode"));
    if (mode != kRaw && mode != kFactors) {
      return r.Error(absl::StrCat("unknown mode ", mode, " (0: raw, 1: factors)"));
    }
    PS_RETURN_IF_ERROR(r.Numel(n));
    if (mode == kRaw) {
      std::string_view body;
      PS_RETURN_IF_ERROR(r.Bytes(sizeof(float) * n, &body, "raw values"));
      PS_RETURN_IF_ERROR(r.Finish("raw values"));
      if (n > 0) std::memcpy(out.data(), body.data(), sizeof(float) * n);
      if (const ptrdiff_t i = core::FindNonFinite(out); i >= 0) {
        return r.Error(absl::StrCat("raw value ", i, " is not finite (", out[i], ")"));
      }
      return absl::OkStatus();
    }

    uint64_t rows = 0, cols = 0, rank = 0;
    PS_RETURN_IF_ERROR(r.Varint(&rows, "rows"));
    PS_RETURN_IF_ERROR(r.Varint(&cols, "cols"));
    if (rows == 0 || cols == 0 || n % rows != 0 || n / rows != cols) {
      return r.Error(absl::StrCat("a ", rows, " x ", cols, " matrix does not have ", n, " values"));
    }
    PS_RETURN_IF_ERROR(r.Varint(&rank, "rank"));
    const uint64_t max_rank = std::min<uint64_t>({rows, cols, kMaxRank});
    if (rank < 1 || rank > max_rank) {
      return r.Error(absl::StrCat("rank ", rank, " outside [1, ", max_rank, "] for a ", rows,
                                  " x ", cols, " matrix"));
    }
    // rows, cols <= n and rank <= 64: no overflow.
    if (rank * (rows + cols) >= n) {
      return r.Error(absl::StrCat("rank ", rank, " factors of a ", rows, " x ", cols,
                                  " matrix are not smaller than the matrix"));
    }
    std::string_view p_bytes, q_bytes;
    PS_RETURN_IF_ERROR(r.Bytes(sizeof(float) * rows * rank, &p_bytes, "P"));
    PS_RETURN_IF_ERROR(r.Bytes(sizeof(float) * cols * rank, &q_bytes, "Q"));
    PS_RETURN_IF_ERROR(r.Finish("Q"));

    // P row-major rows x rank as sent; Q transposed to rank x cols for the row loop.
    std::vector<float> p(rows * rank);
    std::memcpy(p.data(), p_bytes.data(), p_bytes.size());
    if (const ptrdiff_t i = core::FindNonFinite(std::span<const float>(p)); i >= 0) {
      return r.Error(absl::StrCat("P[", i / rank, ", ", i % rank, "] is not finite (", p[i], ")"));
    }
    std::vector<float> q(cols * rank);
    std::memcpy(q.data(), q_bytes.data(), q_bytes.size());
    if (const ptrdiff_t i = core::FindNonFinite(std::span<const float>(q)); i >= 0) {
      return r.Error(absl::StrCat("Q[", i / rank, ", ", i % rank, "] is not finite (", q[i], ")"));
    }
    std::vector<float> qt(rank * cols);
    for (size_t j = 0; j < cols; ++j) {
      for (size_t k = 0; k < rank; ++k) qt[k * cols + j] = q[j * rank + k];
    }
    for (size_t i = 0; i < rows; ++i) {
      float* row = out.data() + i * cols;
      const float* pi = p.data() + i * rank;
      for (size_t j = 0; j < cols; ++j) row[j] = pi[0] * qt[j];
      for (size_t k = 1; k < rank; ++k) Axpy(pi[k], qt.data() + k * cols, row, cols);
    }
    // Finite factors with huge values can still overflow in the product.
    if (const ptrdiff_t i = core::FindNonFinite(out); i >= 0) {
      return r.Error(absl::StrCat("P Q^T overflows at [", i / cols, ", ", i % cols, "] (",
                                  out[i], ")"));
    }
    return absl::OkStatus();
  }

  // The raw encoding; the encoder sends factors only when they are smaller.
  size_t MaxEncodedBytes(size_t numel) const override {
    return 2 + internal::VarintSize(numel) + sizeof(float) * numel;
  }

 private:
  struct SliceState {
    size_t rows = 0;
    size_t cols = 0;
    size_t rank = 0;
    std::vector<float> qt;  // Q transposed, rank x cols, columns of Q normalized
  };

  static size_t FactorBytes(size_t n, size_t rows, size_t cols, size_t rank) {
    if (rank * (rows + cols) >= n) return std::numeric_limits<size_t>::max();
    return 2 + internal::VarintSize(n) + internal::VarintSize(rows) + internal::VarintSize(cols) +
           internal::VarintSize(rank) + sizeof(float) * rank * (rows + cols);
  }

  // One power step; false (state and *out untouched) when a factor or the product
  // P Q^T would not be finite, and the caller sends raw values instead.
  bool EncodeFactors(std::span<const float> m, const EncodeContext& ctx, size_t rows,
                     size_t cols, size_t rank, std::string* out) {
    const uint64_t stream = internal::StreamSeed(seed_, ctx);
    std::vector<float> qt;
    if (const auto it = state_.find(ctx.slice_id);
        it != state_.end() && it->second.rows == rows && it->second.cols == cols &&
        it->second.rank == rank) {
      qt = it->second.qt;
    } else {
      qt.resize(rank * cols);
      const uint64_t q_stream = internal::Mix64(stream ^ kInitialQTag);
      for (size_t i = 0; i < qt.size(); ++i) {
        qt[i] = static_cast<float>(Gaussian(internal::Mix64(q_stream + i)));
      }
    }
    const size_t block = ColumnBlock(rank);

    // P = M Q, accumulated per column block in double; pc is column-major (rank x rows).
    std::vector<double> pc(rank * rows, 0.0);
    for (size_t j0 = 0; j0 < cols; j0 += block) {
      const size_t len = std::min(block, cols - j0);
      for (size_t i = 0; i < rows; ++i) {
        const float* mi = m.data() + i * cols + j0;
        for (size_t k = 0; k < rank; ++k) pc[k * rows + i] += Dot(mi, qt.data() + k * cols + j0, len);
      }
    }
    if (!OrthonormalizeColumns(pc, rows, rank, internal::Mix64(stream ^ kRedrawPTag))) return false;
    std::vector<float> p(rows * rank);  // row-major, as sent
    for (size_t i = 0; i < rows; ++i) {
      for (size_t k = 0; k < rank; ++k) p[i * rank + k] = static_cast<float>(pc[k * rows + i]);
    }

    // Q = M^T P (transposed: qt_k += P[i, k] * row i of M), per column block.
    std::fill(qt.begin(), qt.end(), 0.0f);
    for (size_t j0 = 0; j0 < cols; j0 += block) {
      const size_t len = std::min(block, cols - j0);
      for (size_t i = 0; i < rows; ++i) {
        const float* mi = m.data() + i * cols + j0;
        for (size_t k = 0; k < rank; ++k) Axpy(p[i * rank + k], mi, qt.data() + k * cols + j0, len);
      }
    }
    // |(P Q^T)[i, j]| <= rank * max|P| * max|Q| bounds every partial sum of the decoder.
    if (!AllFinite(qt) ||
        static_cast<double>(rank) * MaxAbs(p) * MaxAbs(qt) > 0.5 * static_cast<double>(FLT_MAX)) {
      return false;
    }

    out->clear();
    out->reserve(FactorBytes(m.size(), rows, cols, rank));
    out->push_back(static_cast<char>(FormatByte(format())));
    out->push_back(static_cast<char>(kFactors));
    internal::PutVarint(out, m.size());
    internal::PutVarint(out, rows);
    internal::PutVarint(out, cols);
    internal::PutVarint(out, rank);
    core::AppendFp32(p, out);
    std::vector<float> q(cols * rank);
    for (size_t j = 0; j < cols; ++j) {
      for (size_t k = 0; k < rank; ++k) q[j * rank + k] = qt[k * cols + j];
    }
    core::AppendFp32(q, out);

    // Warm start: Q with unit columns (the scale of Q's columns does not change the
    // span of the next P, and keeping it at 1 keeps repeated products from growing).
    for (size_t k = 0; k < rank; ++k) {
      float* col = qt.data() + k * cols;
      double norm = 0;
      for (size_t j = 0; j < cols; ++j) norm += double{col[j]} * col[j];
      if (norm > 0) {
        const auto inv = static_cast<float>(1.0 / std::sqrt(norm));
        for (size_t j = 0; j < cols; ++j) col[j] *= inv;
      }
    }
    state_[ctx.slice_id] = SliceState{rows, cols, rank, std::move(qt)};
    return true;
  }

  // Gram-Schmidt with re-orthogonalization in double on the rank columns of pc
  // (column-major, rows each). A column that loses all but 1e-4 of its norm to the
  // earlier ones (M has rank below r, or is zero) is re-drawn from `redraw_stream`.
  // False when a column is not finite (M Q overflowed).
  static bool OrthonormalizeColumns(std::vector<double>& pc, size_t rows, size_t rank,
                                    uint64_t redraw_stream) {
    for (size_t k = 0; k < rank; ++k) {
      double* col = pc.data() + k * rows;
      double before = 0;
      for (size_t i = 0; i < rows; ++i) before += col[i] * col[i];
      if (!std::isfinite(before)) return false;
      for (int attempt = 0; attempt < 3; ++attempt) {
        for (int pass = 0; pass < 2; ++pass) {
          for (size_t l = 0; l < k; ++l) {
            const double* prev = pc.data() + l * rows;
            double dot = 0;
            for (size_t i = 0; i < rows; ++i) dot += prev[i] * col[i];
            for (size_t i = 0; i < rows; ++i) col[i] -= dot * prev[i];
          }
        }
        double after = 0;
        for (size_t i = 0; i < rows; ++i) after += col[i] * col[i];
        if (before > 0 && after > 1e-8 * before) {
          const double inv = 1.0 / std::sqrt(after);
          for (size_t i = 0; i < rows; ++i) col[i] *= inv;
          break;
        }
        if (attempt == 2) {
          std::fill(col, col + rows, 0.0);  // unreachable for rows >= rank; stays a zero factor
          break;
        }
        const uint64_t s = internal::Mix64(redraw_stream ^ (uint64_t{k} << 8 | uint64_t(attempt)));
        for (size_t i = 0; i < rows; ++i) col[i] = Gaussian(internal::Mix64(s + i));
        before = 0;
        for (size_t i = 0; i < rows; ++i) before += col[i] * col[i];
      }
    }
    return true;
  }

  const size_t rank_;
  const uint64_t seed_;
  const std::string spec_;
  std::unordered_map<uint32_t, SliceState> state_;
};

}  // namespace

namespace internal {
absl::StatusOr<std::unique_ptr<Codec>> MakePowerSgdCodec(Stages stages,
                                                         const CodecOptions& options) {
  PS_ASSIGN_OR_RETURN(core::StageArgs args, SingleStage(stages, {"rank"}));
  PS_ASSIGN_OR_RETURN(const int64_t rank, args.Int("rank", 4, 1, kMaxRank));
  return std::unique_ptr<Codec>(
      std::make_unique<PowerSgdCodec>(static_cast<size_t>(rank), options.seed));
}
}  // namespace internal

}  // namespace ps::codecs
