// The CUDA aggregation backend (docs/gpu.md): stages the rows on the device, forms the
// Gram matrix with cuBLAS, and runs a plan's pass over the coordinates with the kernels
// of apply.cu. cuBLAS is opened with dlopen on first use rather than linked, so binaries
// that never aggregate on a GPU do not map it at start-up.
#include <dlfcn.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <cublas_api.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "aggregators/coordinate_rules_internal.h"
#include "aggregators/cuda/kernels.h"
#include "aggregators/cuda/plan_rows.h"
#include "aggregators/device_internal.h"
#include "core/status.h"
#include "gpu/cuda_device.h"
#include "gpu/cuda_internal.h"

namespace ps::aggregators::internal {
namespace {

using gpu::CudaStatus;
using gpu::DeviceBuffer;
using gpu::Settled;
namespace kernels = ::ps::aggregators::cuda;
using kernels::PlanRows;
using kernels::RowPlan;

// Coordinates per fp32 Gram product; the products are added in double (docs/gpu.md,
// "Agreement with the CPU").
constexpr size_t kGramChunk = 4096;
// Bytes of fp32 partial products held at once.
constexpr size_t kPartialBytes = 16u << 20;
// Scratch for the general path (more than 64 rows): two rows x chunk float matrices.
constexpr size_t kGeneralScratchBytes = 256u << 20;

// The cuBLAS entry points the backend uses, resolved from the shared library.
struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasSgemmStridedBatched) sgemm_strided_batched = nullptr;

  static absl::StatusOr<Cublas> Load() {
    // The soname of the toolkit the build used, then its full path there.
    void* lib = nullptr;
    std::string tried;
    for (const char* name : {PS_CUBLAS_SONAME, PS_CUBLAS_PATH}) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib != nullptr) break;
      absl::StrAppend(&tried, tried.empty() ? "" : "; ", dlerror());
    }
    if (lib == nullptr) return absl::UnavailableError(absl::StrCat("cannot load cuBLAS: ", tried));
    Cublas c;
    const bool ok = Resolve(lib, "cublasCreate_v2", &c.create) &&
                    Resolve(lib, "cublasDestroy_v2", &c.destroy) &&
                    Resolve(lib, "cublasSetStream_v2", &c.set_stream) &&
                    Resolve(lib, "cublasSetMathMode", &c.set_math_mode) &&
                    Resolve(lib, "cublasSgemmStridedBatched", &c.sgemm_strided_batched);
    if (!ok) return absl::UnavailableError(absl::StrCat("cuBLAS lacks a symbol: ", dlerror()));
    return c;  // the library stays loaded for the process's life
  }

 private:
  template <typename F>
  static bool Resolve(void* lib, const char* name, F* f) {
    *f = reinterpret_cast<F>(dlsym(lib, name));
    return *f != nullptr;
  }
};

absl::Status CublasStatus(cublasStatus_t s, std::string_view what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(core::AsAbsl(what), " failed with cuBLAS status ",
                                          static_cast<int>(s)));
}

// Bytes rounded up to a multiple of 16, for packing several arrays in one buffer.
size_t Aligned(size_t bytes) { return (bytes + 15) / 16 * 16; }

class CudaBackend final : public DeviceBackend {
 public:
  static absl::StatusOr<std::shared_ptr<const DeviceBackend>> Make() {
    PS_ASSIGN_OR_RETURN(std::string description, gpu::CudaDevice());
    PS_ASSIGN_OR_RETURN(Cublas cublas, Cublas::Load());
    auto backend = std::shared_ptr<CudaBackend>(new CudaBackend(std::move(description), cublas));
    PS_RETURN_IF_ERROR(backend->Init());
    return std::shared_ptr<const DeviceBackend>(std::move(backend));
  }

  ~CudaBackend() override {
    if (handle_ != nullptr) cublas_.destroy(handle_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  const std::string& description() const override { return description_; }

  // Each entry point returns an error only once the stream has drained (Settled), so
  // no work queued before the error still touches the caller's memory afterwards.
  absl::Status AccumulateGram(std::span<const float* const> rows, size_t d, Memory where,
                              std::span<const uint8_t* const> masks,
                              std::span<double> gram) const override {
    absl::MutexLock lock(&mu_);
    return Settled(stream_, AccumulateGramLocked(rows, d, where, masks, gram));
  }

  absl::Status Apply(const PlanData& plan, std::span<const float* const> rows,
                     std::span<float> out, Memory where, std::span<const uint8_t* const> masks,
                     float* state) const override {
    absl::MutexLock lock(&mu_);
    return Settled(stream_, ApplyLocked(plan, rows, out, where, masks, state));
  }

  absl::Status Aggregate(
      std::span<const float* const> rows, std::span<float> out, Memory where,
      std::span<const uint8_t* const> masks, float* state, bool needs_gram,
      const std::function<absl::StatusOr<RoundPlan>(std::span<const double>)>& make_plan)
      const override {
    absl::MutexLock lock(&mu_);
    return Settled(stream_, AggregateLocked(rows, out, where, masks, state, needs_gram, make_plan));
  }

 private:
  // Rows as the kernels see them: device pointers, and for cuBLAS one matrix with a
  // fixed row stride. With masks, the rows are this backend's copy in matrix_ and
  // masks[i] is input i's bitmap on the device (null: complete); FillLocked fills the
  // copy and clears masks.
  struct Staged {
    std::vector<const float*> rows;
    const float* matrix = nullptr;
    size_t ld = 0;
    std::vector<const uint8_t*> masks;
  };

  CudaBackend(std::string description, Cublas cublas)
      : description_(std::move(description)), cublas_(cublas) {}

  absl::Status AccumulateGramLocked(std::span<const float* const> rows, size_t d, Memory where,
                                    std::span<const uint8_t* const> masks, std::span<double> gram) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    PS_ASSIGN_OR_RETURN(Staged staged, Stage(rows, d, where, /*need_matrix=*/true, masks));
    PS_RETURN_IF_ERROR(FillLocked(staged, d));
    return GramLocked(staged, rows.size(), d, gram);
  }

  absl::Status ApplyLocked(const PlanData& plan, std::span<const float* const> rows,
                           std::span<float> out, Memory where, std::span<const uint8_t* const> masks,
                           float* state) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    PS_ASSIGN_OR_RETURN(Staged staged, Stage(rows, out.size(), where, /*need_matrix=*/false, masks));
    return PassLocked(plan, staged, out, where, state);
  }

  absl::Status AggregateLocked(
      std::span<const float* const> rows, std::span<float> out, Memory where,
      std::span<const uint8_t* const> masks, float* state, bool needs_gram,
      const std::function<absl::StatusOr<RoundPlan>(std::span<const double>)>& make_plan) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const size_t d = out.size();
    PS_ASSIGN_OR_RETURN(Staged staged, Stage(rows, d, where, needs_gram, masks));
    std::vector<double> gram;
    if (needs_gram) {
      // As on the CPU: filled once, and every later step runs on the filled rows.
      PS_RETURN_IF_ERROR(FillLocked(staged, d));
      gram.assign(rows.size() * rows.size(), 0.0);
      PS_RETURN_IF_ERROR(GramLocked(staged, rows.size(), d, gram));
    }
    PS_ASSIGN_OR_RETURN(RoundPlan plan, make_plan(gram));
    return PassLocked(Pipeline::Data(plan), staged, out, where, state);
  }

  absl::Status Init() {
    // A blocking stream: it waits for work queued before on the legacy default stream,
    // so device rows that the caller filled with plain cudaMemcpy (whose DMA may still
    // be running when it returns) are complete before a kernel reads them.
    PS_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamDefault),
                                  "cudaStreamCreate"));
    PS_RETURN_IF_ERROR(CublasStatus(cublas_.create(&handle_), "cublasCreate"));
    PS_RETURN_IF_ERROR(CublasStatus(cublas_.set_stream(handle_, stream_), "cublasSetStream"));
    // Plain fp32 products: no TF32 tensor cores, whose 10-bit mantissas would break the
    // documented agreement with the CPU.
    return CublasStatus(cublas_.set_math_mode(handle_, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");
  }

  // Copies host rows into matrix_ (or, for device rows, uses them where they are,
  // copying them together only when cuBLAS needs one matrix and they are not one).
  absl::StatusOr<Staged> Stage(std::span<const float* const> rows, size_t d, Memory where,
                               bool need_matrix, std::span<const uint8_t* const> masks) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Staged s;
    const size_t n = rows.size();
    if (d > static_cast<size_t>(INT_MAX)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cuda aggregation: ", d, " coordinates exceed cuBLAS's int dimensions"));
    }
    if (!masks.empty()) {
      if (where != Memory::kHost || masks.size() > n) {
        return absl::InvalidArgumentError("cuda aggregation: masks need host rows, one per input");
      }
      PS_RETURN_IF_ERROR(StageMasks(masks, d, &s));
    }
    if (where == Memory::kDevice) {
      s.rows.assign(rows.begin(), rows.end());
      if (!need_matrix) return s;
      const ptrdiff_t stride = n > 1 ? rows[1] - rows[0] : static_cast<ptrdiff_t>(d);
      bool strided = stride >= static_cast<ptrdiff_t>(d) && stride <= INT_MAX;
      for (size_t i = 1; i < n && strided; ++i) strided = rows[i] - rows[0] == stride * static_cast<ptrdiff_t>(i);
      if (strided) {
        s.matrix = rows[0];
        s.ld = static_cast<size_t>(stride);
        return s;
      }
    }
    PS_RETURN_IF_ERROR(Reserve(matrix_, n * d * sizeof(float)));
    float* m = matrix_.as<float>();
    const cudaMemcpyKind kind =
        where == Memory::kHost ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice;
    s.rows.resize(n);
    for (size_t i = 0; i < n; ++i) {
      PS_RETURN_IF_ERROR(CudaStatus(
          cudaMemcpyAsync(m + i * d, rows[i], d * sizeof(float), kind, stream_), "copying a row to the device"));
      s.rows[i] = m + i * d;
    }
    s.matrix = m;
    s.ld = d;
    return s;
  }

  // Grows `buffer` to `bytes`, first waiting for the stream's work, which may still use
  // the memory a reallocation frees.
  absl::Status Reserve(DeviceBuffer& buffer, size_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (bytes <= buffer.bytes()) return absl::OkStatus();
    PS_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_), "aggregation kernels"));
    return buffer.Reserve(bytes);
  }

  // Copies the bitmaps that are not null into masks_ and points s->masks at them.
  absl::Status StageMasks(std::span<const uint8_t* const> masks, size_t d, Staged* s) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const size_t bytes = (d + 7) / 8;
    const size_t stride = Aligned(bytes);
    size_t present = 0;
    for (const uint8_t* m : masks) present += m != nullptr ? 1 : 0;
    if (present == 0) return absl::OkStatus();  // every input complete: no masks
    PS_RETURN_IF_ERROR(Reserve(masks_, present * stride));
    s->masks.assign(masks.size(), nullptr);
    size_t next = 0;
    for (size_t i = 0; i < masks.size(); ++i) {
      if (masks[i] == nullptr) continue;
      uint8_t* dst = masks_.as<uint8_t>() + next++ * stride;
      PS_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(dst, masks[i], bytes, cudaMemcpyHostToDevice, stream_),
                                    "copying a mask to the device"));
      s->masks[i] = dst;
    }
    return absl::OkStatus();
  }

  // With masks: every missing coordinate of the staged copy takes the median (midpoint)
  // of the values present there, as the CPU's FilledInputs; then the rows are complete.
  absl::Status FillLocked(Staged& s, size_t d) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (s.masks.empty()) return absl::OkStatus();
    const size_t k = s.masks.size();
    PS_RETURN_IF_ERROR(Reserve(median_, d * sizeof(float)));
    RowPlan median;
    for (uint32_t i = 0; i < k; ++i) {
      median.rows.push_back({kernels::RowSpec::Kind::kUnit, i, 1});
      median.terms.push_back({i, 1.0f});
    }
    median.unit = true;
    median.op = kernels::CoordinateOp::kSorted;
    std::vector<internal::SortedPlan> plans(k + 1);
    for (size_t c = 1; c <= k; ++c) plans[c] = internal::MidpointPlan(c);
    Staged inputs = s;
    inputs.rows.resize(k);
    PS_RETURN_IF_ERROR(
        RunLocked(median, inputs, plans, median_.as<float>(), d, static_cast<uint32_t>(k)));
    for (size_t i = 0; i < k; ++i) {
      if (s.masks[i] == nullptr) continue;
      // A masked row is the backend's own copy (Stage), so it may be written.
      auto* row = const_cast<float*>(s.rows[i]);
      PS_RETURN_IF_ERROR(CudaStatus(kernels::LaunchFill(row, s.masks[i], median_.as<float>(), d, stream_),
                                    "filling missing coordinates"));
    }
    s.masks.clear();
    return absl::OkStatus();
  }

  // gram += the n x n Gram matrix of the staged matrix's d coordinates.
  absl::Status GramLocked(const Staged& s, size_t n, size_t d, std::span<double> gram) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const size_t nn = n * n;
    const size_t chunks = d / kGramChunk;
    const size_t tail = d % kGramChunk;
    const size_t wave = std::clamp<size_t>(kPartialBytes / (nn * sizeof(float)), 1,
                                           std::max<size_t>(chunks, 1));
    PS_RETURN_IF_ERROR(Reserve(acc_, nn * sizeof(double)));
    PS_RETURN_IF_ERROR(Reserve(partials_, wave * nn * sizeof(float)));
    PS_RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(acc_.as<double>(), 0, nn * sizeof(double), stream_),
                                  "cudaMemset"));
    const int ni = static_cast<int>(n);
    const int ld = static_cast<int>(s.ld);
    const float one = 1.0f;
    const float zero = 0.0f;
    // Column-major view: the matrix is ld x n with input j in column j, so each chunk's
    // product A^T A is the chunk's Gram matrix (symmetric, so row-major alike).
    auto products = [&](size_t first_coordinate, size_t length, size_t batches) -> absl::Status {
      const float* a = s.matrix + first_coordinate;
      PS_RETURN_IF_ERROR(CublasStatus(
          cublas_.sgemm_strided_batched(handle_, CUBLAS_OP_T, CUBLAS_OP_N, ni, ni,
                                        static_cast<int>(length), &one, a, ld,
                                        static_cast<long long>(kGramChunk), a, ld,
                                        static_cast<long long>(kGramChunk), &zero,
                                        partials_.as<float>(), ni, static_cast<long long>(nn),
                                        static_cast<int>(batches)),
          "cublasSgemmStridedBatched"));
      return CudaStatus(kernels::LaunchAddPartials(partials_.as<float>(), batches, nn,
                                                   acc_.as<double>(), stream_),
                        "adding Gram partials");
    };
    for (size_t first = 0; first < chunks; first += wave) {
      const size_t batches = std::min(wave, chunks - first);
      PS_RETURN_IF_ERROR(products(first * kGramChunk, kGramChunk, batches));
    }
    if (tail > 0) PS_RETURN_IF_ERROR(products(chunks * kGramChunk, tail, 1));
    std::vector<double> host(nn);
    PS_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(host.data(), acc_.as<double>(), nn * sizeof(double),
                                                  cudaMemcpyDeviceToHost, stream_),
                                  "copying the Gram matrix"));
    PS_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_), "Gram matrix"));
    for (size_t i = 0; i < nn; ++i) gram[i] += host[i];
    return absl::OkStatus();
  }

  // A plan's pass over the coordinates into out (host or device memory, as `where`),
  // then state = out when state is not null. Masks are read natively by a coordinate
  // rule on the inputs as they are, and filled in first otherwise (Aggregator::Apply).
  absl::Status PassLocked(const PlanData& plan, Staged& s, std::span<float> out, Memory where,
                          float* state) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const size_t d = out.size();
    const bool native = plan.mixing.rows == 0 && plan.coordinate.has_value();
    if (!native) PS_RETURN_IF_ERROR(FillLocked(s, d));
    std::vector<internal::SortedPlan> plans;
    if (!s.masks.empty()) {
      plans.resize(plan.k + 1);
      for (size_t c = 1; c <= plan.k; ++c) plans[c] = internal::PlanFor(*plan.coordinate, c);
    }
    float* dev_out = out.data();
    if (where == Memory::kHost) {
      PS_RETURN_IF_ERROR(Reserve(out_, d * sizeof(float)));
      dev_out = out_.as<float>();
    }
    PS_RETURN_IF_ERROR(RunLocked(PlanRows(plan), s, plans, dev_out, d, static_cast<uint32_t>(plan.k)));
    if (where == Memory::kHost) {
      PS_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(out.data(), dev_out, d * sizeof(float),
                                                    cudaMemcpyDeviceToHost, stream_),
                                    "copying the aggregate back"));
    }
    if (state != nullptr) {
      PS_RETURN_IF_ERROR(CudaStatus(
          cudaMemcpyAsync(state, dev_out, d * sizeof(float),
                          where == Memory::kHost ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice,
                          stream_),
          "updating the rule's state"));
    }
    return CudaStatus(cudaStreamSynchronize(stream_), "aggregation kernels");
  }

  // Launches the pass of `rp` over the staged rows into dev_out (d floats of device
  // memory), with s.masks and plans[c] (c present values) when s has masks. k: the
  // plan's inputs (sign_majority).
  absl::Status RunLocked(const RowPlan& rp, const Staged& s,
                         const std::vector<internal::SortedPlan>& plans, float* dev_out, size_t d,
                         uint32_t k) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // The row pointers, specs, terms, (for unit rows) each row's input, and the masks
    // and their plans in one upload.
    std::vector<const float*> unit_rows;
    if (rp.unit) {
      for (const kernels::RowSpec& row : rp.rows) unit_rows.push_back(s.rows[rp.terms[row.first].input]);
    }
    std::vector<unsigned char> packed;
    auto pack = [&packed](const void* data, size_t bytes) {
      const size_t at = packed.size();
      packed.resize(at + Aligned(bytes));
      if (bytes > 0) std::memcpy(packed.data() + at, data, bytes);
      return at;
    };
    const size_t ptr_at = pack(s.rows.data(), s.rows.size() * sizeof(float*));
    const size_t row_at = pack(rp.rows.data(), rp.rows.size() * sizeof(kernels::RowSpec));
    const size_t term_at = pack(rp.terms.data(), rp.terms.size() * sizeof(kernels::RowTerm));
    const size_t unit_at = pack(unit_rows.data(), unit_rows.size() * sizeof(float*));
    const size_t mask_at = pack(s.masks.data(), s.masks.size() * sizeof(uint8_t*));
    const size_t plan_at = pack(plans.data(), plans.size() * sizeof(internal::SortedPlan));
    PS_RETURN_IF_ERROR(Reserve(args_, packed.size()));
    unsigned char* base = args_.as<unsigned char>();
    PS_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(base, packed.data(), packed.size(), cudaMemcpyHostToDevice, stream_),
        "copying the plan"));
    kernels::ApplyArgs a;
    a.inputs = reinterpret_cast<const float* const*>(base + ptr_at);
    a.rows = reinterpret_cast<const kernels::RowSpec*>(base + row_at);
    a.terms = reinterpret_cast<const kernels::RowTerm*>(base + term_at);
    if (rp.unit) a.unit_rows = reinterpret_cast<const float* const*>(base + unit_at);
    if (!s.masks.empty()) {
      a.masks = reinterpret_cast<const uint8_t* const*>(base + mask_at);
      a.plans = reinterpret_cast<const internal::SortedPlan*>(base + plan_at);
    }
    a.num_rows = static_cast<uint32_t>(rp.rows.size());
    a.op = rp.op;
    a.plan = rp.sorted;
    a.out = dev_out;
    a.d = d;

    if (rp.sign_vote) return SignVote(a.inputs, a.masks, k, d, dev_out);
    if (rp.op == kernels::CoordinateOp::kRow0 && rp.rows[0].kind == kernels::RowSpec::Kind::kUnit) {
      const float* src = s.rows[rp.terms[rp.rows[0].first].input];
      if (src == dev_out) return absl::OkStatus();
      return CudaStatus(cudaMemcpyAsync(dev_out, src, d * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
                        "copying the selected row");
    }
    if (rp.op != kernels::CoordinateOp::kSorted) {
      return CudaStatus(kernels::LaunchLinear(a, stream_), "mixing kernel");
    }
    if (a.num_rows <= kernels::kMaxRegisterRows) {
      return CudaStatus(kernels::LaunchSortedRegisters(a, stream_), "coordinate kernel");
    }
    const size_t w = std::clamp<size_t>(kGeneralScratchBytes / (2 * sizeof(float) * a.num_rows), 1, d);
    PS_RETURN_IF_ERROR(Reserve(general_, 2 * a.num_rows * w * sizeof(float)));
    float* rows = general_.as<float>();
    float* sorted = rows + a.num_rows * w;
    for (size_t begin = 0; begin < d; begin += w) {
      PS_RETURN_IF_ERROR(CudaStatus(
          kernels::LaunchSortedGeneral(a, begin, std::min(w, d - begin), rows, sorted, stream_),
          "coordinate kernel (general path)"));
    }
    return absl::OkStatus();
  }

  // sign_majority: the scale is the median over inputs of the mean |x| of their present
  // coordinates (inputs with none do not count), as the CPU's SignVote; the vote a kernel.
  absl::Status SignVote(const float* const* inputs, const uint8_t* const* masks, uint32_t k,
                        size_t d, float* out) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const size_t sums_bytes = Aligned(k * sizeof(double));
    PS_RETURN_IF_ERROR(Reserve(acc_, sums_bytes + k * sizeof(unsigned long long)));
    auto* sums = acc_.as<double>();
    auto* counts = reinterpret_cast<unsigned long long*>(acc_.as<unsigned char>() + sums_bytes);
    PS_RETURN_IF_ERROR(CudaStatus(
        cudaMemsetAsync(acc_.as<unsigned char>(), 0, sums_bytes + k * sizeof(unsigned long long), stream_),
        "cudaMemset"));
    PS_RETURN_IF_ERROR(CudaStatus(kernels::LaunchAbsSums(inputs, masks, k, d, sums, counts, stream_),
                                  "|x| sums"));
    std::vector<double> host_sums(k);
    std::vector<unsigned long long> host_counts(k);
    PS_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(host_sums.data(), sums, k * sizeof(double),
                                                  cudaMemcpyDeviceToHost, stream_),
                                  "copying |x| sums"));
    PS_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(host_counts.data(), counts,
                                                  k * sizeof(unsigned long long),
                                                  cudaMemcpyDeviceToHost, stream_),
                                  "copying present counts"));
    PS_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_), "|x| sums"));
    std::vector<double> means;
    for (uint32_t i = 0; i < k; ++i) {
      if (host_counts[i] > 0) means.push_back(host_sums[i] / static_cast<double>(host_counts[i]));
    }
    const auto scale = static_cast<float>(internal::SignVoteScale(std::move(means)));
    return CudaStatus(kernels::LaunchSignVote(inputs, masks, k, d, scale, out, stream_),
                      "sign vote kernel");
  }

  const std::string description_;
  const Cublas cublas_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  // One call at a time owns the stream and the buffers.
  mutable absl::Mutex mu_;
  mutable DeviceBuffer matrix_ ABSL_GUARDED_BY(mu_);
  mutable DeviceBuffer partials_ ABSL_GUARDED_BY(mu_);
  mutable DeviceBuffer acc_ ABSL_GUARDED_BY(mu_);
  mutable DeviceBuffer out_ ABSL_GUARDED_BY(mu_);
  mutable DeviceBuffer args_ ABSL_GUARDED_BY(mu_);
  mutable DeviceBuffer general_ ABSL_GUARDED_BY(mu_);
  mutable DeviceBuffer masks_ ABSL_GUARDED_BY(mu_);
  mutable DeviceBuffer median_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::shared_ptr<const DeviceBackend>> MakeCudaBackend() {
  // One backend per process: every aggregator shares its stream and buffers.
  static const absl::StatusOr<std::shared_ptr<const DeviceBackend>> backend = CudaBackend::Make();
  return backend;
}

}  // namespace ps::aggregators::internal
