// The host side of the GPU encoders (device_encoder.h): one engine per codec family
// launches the kernels of cuda/kernels.h on the encoder's stream, copies the payload's parts
// back through pinned memory and frames them as the CPU codec does. Rare cases (no
// values, a value that is not finite, slices too long for 32-bit positions) encode on
// the CPU from a host copy, so their bytes and messages are the CPU codec's own.
#include "codecs/device_encoder.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codecs/codec_internal.h"
#include "codecs/cuda/kernels.h"
#include "codecs/device_engine_internal.h"
#include "codecs/device_internal.h"
#include "codecs/sparse_internal.h"
#include "codecs/wire_internal.h"
#include "core/device.h"
#include "core/spec.h"
#include "core/status.h"
#include "gpu/cuda_device.h"
#include "gpu/cuda_internal.h"

namespace ps::codecs {
namespace {

using gpu::CudaStatus;
using gpu::DeviceBuffer;
using gpu::PinnedBuffer;
using gpu::Settled;
using internal::Context;
using internal::Engine;
using internal::Launched;

class HalvesEngine final : public Engine {
 public:
  HalvesEngine(Context* context, bool bf16) : Engine(context), bf16_(bf16) {}

  absl::Status Encode(const float* x, size_t n, const EncodeContext& ctx, std::string* out,
                      float* residual) override {
    // Device layout: the non-finite word, then the halves.
    PS_RETURN_IF_ERROR(buffer_.Reserve(4 + 2 * n));
    PS_RETURN_IF_ERROR(c_.staging.Reserve(4 + 2 * n));
    auto* flag = buffer_.as<uint32_t>();
    PS_RETURN_IF_ERROR(Launched(cudaMemsetAsync(flag, 0, 4, c_.stream), "cudaMemsetAsync"));
    PS_RETURN_IF_ERROR(Launched(
        cuda::LaunchHalves(x, n, bf16_, buffer_.as<unsigned char>() + 4, flag, residual, c_.stream),
        "fp16/bf16 kernel"));
    PS_RETURN_IF_ERROR(c_.ToStaging(0, buffer_.as<void>(), 4 + 2 * n));
    PS_RETURN_IF_ERROR(c_.Sync());
    if (c_.staging.as<uint32_t>()[0] != 0) return c_.EncodeOnHost(x, n, ctx, out, nullptr);
    out->resize(1 + 2 * n);
    (*out)[0] = static_cast<char>(FormatByte(c_.cpu->format()));
    std::memcpy(out->data() + 1, c_.staging.as<unsigned char>() + 4, 2 * n);
    return absl::OkStatus();
  }

 private:
  const bool bf16_;
  DeviceBuffer buffer_;
};

class SignEngine final : public Engine {
 public:
  using Engine::Engine;

  absl::Status Encode(const float* x, size_t n, const EncodeContext& ctx, std::string* out,
                      float* residual) override {
    // Device layout: sum (double), scale (float), 4 bytes of padding, the sign words.
    const size_t words = (n + 31) / 32;
    const size_t bytes = 16 + 4 * words;
    PS_RETURN_IF_ERROR(buffer_.Reserve(bytes));
    PS_RETURN_IF_ERROR(partials_.Reserve(cuda::kSumAbsBlocks * sizeof(double)));
    PS_RETURN_IF_ERROR(c_.staging.Reserve(bytes));
    auto* base = buffer_.as<unsigned char>();
    auto* sum = reinterpret_cast<double*>(base);
    auto* scale = reinterpret_cast<float*>(base + 8);
    PS_RETURN_IF_ERROR(
        Launched(cuda::LaunchSumAbs(x, n, partials_.as<double>(), sum, scale, c_.stream),
                 "sign sum kernel"));
    PS_RETURN_IF_ERROR(
        Launched(cuda::LaunchSignBits(x, n, scale, reinterpret_cast<uint32_t*>(base + 16), residual,
                                      c_.stream),
                 "sign bits kernel"));
    PS_RETURN_IF_ERROR(c_.ToStaging(0, base, bytes));
    PS_RETURN_IF_ERROR(c_.Sync());
    const auto* staged = c_.staging.as<unsigned char>();
    double host_sum = 0;
    std::memcpy(&host_sum, staged, 8);
    if (!std::isfinite(host_sum)) return c_.EncodeOnHost(x, n, ctx, out, nullptr);
    float host_scale = 0;
    std::memcpy(&host_scale, staged + 8, 4);
    std::string payload;
    payload.reserve(c_.cpu->MaxEncodedBytes(n));
    internal::PutU8(&payload, FormatByte(c_.cpu->format()));
    internal::PutVarint(&payload, n);
    internal::PutF32(&payload, host_scale);
    payload.append(reinterpret_cast<const char*>(staged + 16), (n + 7) / 8);
    *out = std::move(payload);
    return absl::OkStatus();
  }

 private:
  DeviceBuffer buffer_, partials_;
};

class TernGradEngine final : public Engine {
 public:
  TernGradEngine(Context* context, size_t bucket, uint64_t seed)
      : Engine(context), bucket_(bucket), seed_(seed) {}

  absl::Status Encode(const float* x, size_t n, const EncodeContext& ctx, std::string* out,
                      float* residual) override {
    const size_t buckets = internal::BucketCount(n, bucket_);
    // Device layout: the scales, then the packed codes: the payload after its header.
    const size_t body = 4 * buckets + (n + 3) / 4;
    PS_RETURN_IF_ERROR(max_.Reserve(4 * buckets));
    PS_RETURN_IF_ERROR(buffer_.Reserve(body));
    PS_RETURN_IF_ERROR(c_.staging.Reserve(body));
    PS_RETURN_IF_ERROR(
        Launched(cudaMemsetAsync(max_.as<void>(), 0, 4 * buckets, c_.stream), "cudaMemsetAsync"));
    PS_RETURN_IF_ERROR(
        Launched(cuda::LaunchBucketMaxAbs(x, n, bucket_, max_.as<uint32_t>(), c_.stream),
                 "bucket max kernel"));
    auto* scales = buffer_.as<float>();
    PS_RETURN_IF_ERROR(Launched(
        cuda::LaunchTernGrad(x, n, bucket_, max_.as<uint32_t>(), internal::RoundingSeed(seed_, ctx),
                             scales, buffer_.as<unsigned char>() + 4 * buckets, residual,
                             c_.stream),
        "terngrad kernel"));
    PS_RETURN_IF_ERROR(c_.ToStaging(0, scales, body));
    PS_RETURN_IF_ERROR(c_.Sync());
    for (size_t b = 0; b < buckets; ++b) {
      if (!std::isfinite(c_.staging.as<float>()[b]))
        return c_.EncodeOnHost(x, n, ctx, out, nullptr);
    }
    std::string payload;
    payload.reserve(c_.cpu->MaxEncodedBytes(n));
    internal::PutU8(&payload, FormatByte(c_.cpu->format()));
    internal::PutVarint(&payload, n);
    payload.append(c_.staging.as<char>(), body);
    *out = std::move(payload);
    return absl::OkStatus();
  }

 private:
  const size_t bucket_;
  const uint64_t seed_;
  DeviceBuffer max_, buffer_;
};

class ThreeLcEngine final : public Engine {
 public:
  ThreeLcEngine(Context* context, double s) : Engine(context), s_(s) {}

  absl::Status Encode(const float* x, size_t n, const EncodeContext& ctx, std::string* out,
                      float* residual) override {
    const size_t groups = (n + 4) / 5;
    // Group indices and token offsets are 32-bit.
    if (groups > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
      return c_.EncodeOnHost(x, n, ctx, out, residual);
    }
    // Device layout: max bits, scale and half, token bytes (one word each), the group
    // bytes, then the tokens (at most one per group).
    PS_RETURN_IF_ERROR(meta_.Reserve(16 + groups + groups));
    PS_RETURN_IF_ERROR(keys_.Reserve(4 * groups));
    PS_RETURN_IF_ERROR(last_.Reserve(4 * groups));
    PS_RETURN_IF_ERROR(sizes_.Reserve(4 * groups));
    PS_RETURN_IF_ERROR(offsets_.Reserve(4 * groups));
    const size_t scratch_bytes = cuda::ScanScratchBytes(groups);
    PS_RETURN_IF_ERROR(scratch_.Reserve(scratch_bytes));
    PS_RETURN_IF_ERROR(c_.staging.Reserve(16 + groups));
    auto* meta = meta_.as<unsigned char>();
    auto* max_bits = reinterpret_cast<uint32_t*>(meta);
    auto* scale_half = reinterpret_cast<float*>(meta + 4);
    auto* total = reinterpret_cast<uint32_t*>(meta + 12);
    auto* bytes = meta + 16;
    unsigned char* tokens = bytes + groups;
    const cudaStream_t s = c_.stream;
    PS_RETURN_IF_ERROR(Launched(cudaMemsetAsync(max_bits, 0, 4, s), "cudaMemsetAsync"));
    PS_RETURN_IF_ERROR(Launched(cuda::LaunchBucketMaxAbs(x, n, n, max_bits, s), "3lc max kernel"));
    PS_RETURN_IF_ERROR(
        Launched(cuda::Launch3lcScale(max_bits, s_, scale_half, s), "3lc scale kernel"));
    PS_RETURN_IF_ERROR(
        Launched(cuda::Launch3lcGroups(x, n, scale_half, bytes, keys_.as<int32_t>(), residual, s),
                 "3lc group kernel"));
    PS_RETURN_IF_ERROR(
        Launched(cuda::InclusiveMaxScan(keys_.as<int32_t>(), last_.as<int32_t>(), groups,
                                        scratch_.as<void>(), scratch_bytes, s),
                 "3lc scan"));
    PS_RETURN_IF_ERROR(
        Launched(cuda::Launch3lcSizes(bytes, last_.as<int32_t>(), groups, sizes_.as<uint32_t>(), s),
                 "3lc size kernel"));
    PS_RETURN_IF_ERROR(Launched(cuda::ExclusiveSum(sizes_.as<uint32_t>(), offsets_.as<uint32_t>(),
                                                   groups, scratch_.as<void>(), scratch_bytes, s),
                                "3lc offsets scan"));
    PS_RETURN_IF_ERROR(
        Launched(cuda::Launch3lcTokens(bytes, last_.as<int32_t>(), sizes_.as<uint32_t>(),
                                       offsets_.as<uint32_t>(), groups, tokens, total, s),
                 "3lc token kernel"));
    PS_RETURN_IF_ERROR(c_.ToStaging(0, meta, 16));
    PS_RETURN_IF_ERROR(c_.Sync());
    const uint32_t* staged = c_.staging.as<uint32_t>();
    if (staged[0] >= 0x7f800000u) return c_.EncodeOnHost(x, n, ctx, out, nullptr);
    const uint32_t token_bytes = staged[3];
    float scale = 0;
    std::memcpy(&scale, &staged[1], 4);
    PS_RETURN_IF_ERROR(c_.ToStaging(16, tokens, token_bytes));
    PS_RETURN_IF_ERROR(c_.Sync());
    std::string payload;
    payload.reserve(c_.cpu->MaxEncodedBytes(n));
    internal::PutU8(&payload, FormatByte(c_.cpu->format()));
    internal::PutVarint(&payload, n);
    internal::PutF32(&payload, scale);
    payload.append(c_.staging.as<char>() + 16, token_bytes);
    *out = std::move(payload);
    return absl::OkStatus();
  }

 private:
  const double s_;
  DeviceBuffer meta_, keys_, last_, sizes_, offsets_, scratch_;
};

// topk (exact and sampled) and threshold: the coordinates are chosen on the device,
// the index and value sections written by the CPU's stages (internal::EncodeSelected)
// from the kept coordinates and their values, O(k) work on the host.
constexpr char kEncoders[] = "fp16, bf16, sign, terngrad, 3lc, topk and threshold";

// The engine for `cpu`'s (canonical) spec, or UNIMPLEMENTED.
absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(const Codec& cpu, const CodecOptions& options,
                                                   Context* context) {
  PS_ASSIGN_OR_RETURN(std::vector<core::StageSpec> stages,
                      core::ParseSpec(cpu.spec(), "codec spec"));
  const std::string& name = stages.front().name;
  if (name == "fp16" || name == "bf16")
    return std::make_unique<HalvesEngine>(context, name == "bf16");
  if (name == "sign") return std::make_unique<SignEngine>(context);
  if (name == "terngrad") {
    PS_ASSIGN_OR_RETURN(core::StageArgs args, internal::SingleStage(stages, {"bucket"}));
    PS_ASSIGN_OR_RETURN(const size_t bucket, internal::BucketArg(args));
    return std::make_unique<TernGradEngine>(context, bucket, options.seed);
  }
  if (name == "3lc") {
    PS_ASSIGN_OR_RETURN(core::StageArgs args,
                        internal::SingleStage(stages, {"s", "level", "overhead"}));
    if (args.Has("level")) {
      return absl::UnimplementedError(absl::StrCat("no GPU encoder for '",
                                                   internal::AbslView(cpu.spec()),
                                                   "' (level=cat chooses s on the CPU)"));
    }
    PS_ASSIGN_OR_RETURN(const double s, args.Double("s", 1.0, 0));
    return std::make_unique<ThreeLcEngine>(context, s);
  }
  if (name == "topk" || name == "threshold") {
    PS_ASSIGN_OR_RETURN(internal::SparseConfig config, internal::ParseSparseSpec(cpu.spec()));
    if (config.cat) {
      return absl::UnimplementedError(
          absl::StrCat("no GPU encoder for '", internal::AbslView(cpu.spec()),
                       "' (level=cat chooses k on the CPU from the sorted magnitudes)"));
    }
    return internal::MakeSparseEngine(context, std::move(config), options.seed);
  }
  return absl::UnimplementedError(absl::StrCat(
      "no GPU encoder for '", internal::AbslView(cpu.spec()), "' (GPU encoders: ", kEncoders, ")"));
}

}  // namespace

class DeviceEncoder::Impl {
 public:
  static absl::StatusOr<std::unique_ptr<Impl>> Make(std::string_view spec, CodecOptions options,
                                                    size_t numel, bool error_feedback) {
    PS_RETURN_IF_ERROR(gpu::CudaDevice().status());
    options.device = core::Device::kCpu;
    PS_ASSIGN_OR_RETURN(std::unique_ptr<Codec> cpu, MakeCodec(spec, options));
    auto impl = std::unique_ptr<Impl>(new Impl(std::move(cpu)));
    // A blocking stream: it waits for work queued before on the legacy default stream,
    // so values the caller wrote with plain cudaMemcpy (whose DMA may still be running
    // when it returns) are complete before a kernel reads them.
    PS_RETURN_IF_ERROR(
        CudaStatus(cudaStreamCreateWithFlags(&impl->context_.stream, cudaStreamDefault),
                   "cudaStreamCreateWithFlags"));
    PS_ASSIGN_OR_RETURN(impl->engine_, MakeEngine(*impl->cpu_, options, &impl->context_));
    if (error_feedback) {
      impl->numel_ = numel;
      for (DeviceBuffer& b : impl->residuals_) PS_RETURN_IF_ERROR(b.Reserve(4 * numel));
      PS_RETURN_IF_ERROR(CudaStatus(
          cudaMemsetAsync(impl->residuals_[0].as<void>(), 0, 4 * numel, impl->context_.stream),
          "cudaMemsetAsync (residual)"));
      PS_RETURN_IF_ERROR(impl->context_.Sync());
      impl->error_feedback_ = true;
    }
    return impl;
  }

  ~Impl() {
    // Buffers are freed by their destructors after the stream has finished with them.
    if (context_.stream != nullptr) {
      cudaStreamSynchronize(context_.stream);
      cudaStreamDestroy(context_.stream);
    }
  }

  // An error returns once the stream has drained, so no queued work still reads
  // `values` afterwards.
  absl::Status Encode(const float* values, size_t n, const EncodeContext& ctx, std::string* out) {
    return Settled(context_.stream, EncodeQueued(values, n, ctx, out));
  }

  // Encode of host values: copied to the device on this encoder's stream first.
  absl::Status EncodeHost(std::span<const float> values, const EncodeContext& ctx,
                          std::string* out) {
    PS_RETURN_IF_ERROR(input_.Reserve(4 * values.size()));
    if (!values.empty()) {
      PS_RETURN_IF_ERROR(
          CudaStatus(cudaMemcpyAsync(input_.as<void>(), values.data(), 4 * values.size(),
                                     cudaMemcpyHostToDevice, context_.stream),
                     "cudaMemcpyAsync (values to the device)"));
    }
    return Encode(input_.as<float>(), values.size(), ctx, out);
  }

  const Codec& codec() const { return *cpu_; }
  const float* residual() const {
    return error_feedback_ ? residuals_[current_].as<float>() : nullptr;
  }

 private:
  explicit Impl(std::unique_ptr<Codec> cpu) : cpu_(std::move(cpu)) { context_.cpu = cpu_.get(); }

  absl::Status EncodeQueued(const float* values, size_t n, const EncodeContext& ctx,
                            std::string* out) {
    if (!error_feedback_) {
      if (n == 0) return context_.EncodeOnHost(values, 0, ctx, out, nullptr);
      return engine_->Encode(values, n, ctx, out, nullptr);
    }
    if (n != numel_) {
      return absl::InvalidArgumentError(
          absl::StrCat("DeviceEncoder with error feedback encodes ", numel_, " values, got ", n));
    }
    if (n == 0) return context_.EncodeOnHost(values, 0, ctx, out, nullptr);
    // v = g + e into the other buffer; the engine turns it into v - decode(payload) in
    // place, which becomes e once the encoding succeeded.
    float* v = residuals_[1 - current_].as<float>();
    const float* e = residuals_[current_].as<float>();
    context_.rebuild_input = [&] {
      return CudaStatus(cuda::LaunchAdd(values, e, n, v, context_.stream), "error feedback kernel");
    };
    absl::Status status = context_.rebuild_input();
    if (status.ok()) status = engine_->Encode(v, n, ctx, out, v);
    context_.rebuild_input = nullptr;
    PS_RETURN_IF_ERROR(status);
    PS_RETURN_IF_ERROR(context_.Sync());
    current_ = 1 - current_;
    return absl::OkStatus();
  }

  std::unique_ptr<Codec> cpu_;
  Context context_;
  std::unique_ptr<Engine> engine_;
  bool error_feedback_ = false;
  size_t numel_ = 0;
  DeviceBuffer residuals_[2];  // e, and the next round's v then e
  int current_ = 0;
  DeviceBuffer input_;  // EncodeHost's copy of the values
};

DeviceEncoder::DeviceEncoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceEncoder::~DeviceEncoder() = default;

absl::StatusOr<std::unique_ptr<DeviceEncoder>> DeviceEncoder::Make(std::string_view spec,
                                                                   const CodecOptions& options,
                                                                   size_t numel,
                                                                   bool error_feedback) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl, Impl::Make(spec, options, numel, error_feedback));
  return std::unique_ptr<DeviceEncoder>(new DeviceEncoder(std::move(impl)));
}

absl::Status DeviceEncoder::Encode(const float* device_values, size_t n, const EncodeContext& ctx,
                                   std::string* out) {
  return impl_->Encode(device_values, n, ctx, out);
}

const Codec& DeviceEncoder::codec() const { return impl_->codec(); }
const float* DeviceEncoder::residual() const { return impl_->residual(); }

namespace {

// internal::DeviceEncode for MakeCodec: host values copied to the device on the
// encoder's stream, then encoded without error feedback (the worker keeps its residual
// on the host).
class HostInputEncode final : public internal::DeviceEncode {
 public:
  explicit HostInputEncode(std::unique_ptr<DeviceEncoder::Impl> encoder)
      : encoder_(std::move(encoder)) {}

  absl::Status Encode(std::span<const float> values, const EncodeContext& ctx,
                      std::string* out) override {
    return encoder_->EncodeHost(values, ctx, out);
  }

 private:
  std::unique_ptr<DeviceEncoder::Impl> encoder_;
};

}  // namespace

absl::StatusOr<EncodeTiming> TimeDeviceEncode(std::string_view spec, const CodecOptions& options,
                                              std::span<const float> values, int repeats) {
  PS_ASSIGN_OR_RETURN(std::string device, gpu::CudaDevice());
  PS_ASSIGN_OR_RETURN(std::unique_ptr<DeviceEncoder> encoder,
                      DeviceEncoder::Make(spec, options, values.size(), false));
  const size_t bytes = 4 * values.size();
  DeviceBuffer input, copy;
  PS_RETURN_IF_ERROR(input.Reserve(bytes));
  PS_RETURN_IF_ERROR(copy.Reserve(bytes));
  PS_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpy(input.as<void>(), values.data(), bytes, cudaMemcpyHostToDevice),
                 "cudaMemcpy (values to the device)"));
  cudaStream_t stream = nullptr;
  PS_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                "cudaStreamCreateWithFlags"));
  EncodeTiming timing{.device = device};
  std::string payload;
  // One untimed encoding sizes the encoder's buffers, and one untimed copy warms the
  // copy's stream, so neither side pays first-use costs in the timed runs.
  absl::Status status =
      encoder->Encode(input.as<float>(), values.size(), EncodeContext{}, &payload);
  timing.payload_bytes = payload.size();
  status.Update(CudaStatus(
      cudaMemcpyAsync(copy.as<void>(), input.as<void>(), bytes, cudaMemcpyDeviceToDevice, stream),
      "cudaMemcpyAsync (baseline copy)"));
  status.Update(CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
  // The transfer floor: the payload's bytes from device memory into pinned host memory,
  // which every encoding must move (fp16's is half the input, top-k's a few per cent).
  PinnedBuffer to_host;
  status.Update(to_host.Reserve(std::max<size_t>(timing.payload_bytes, 1)));
  auto copy_to_host = [&] {
    status.Update(CudaStatus(
        cudaMemcpyAsync(to_host.as<void>(), input.as<void>(), std::min(timing.payload_bytes, bytes),
                        cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync (payload floor)"));
    status.Update(CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
  };
  if (status.ok()) copy_to_host();
  // Wall time of the whole Encode (kernels, copies back, framing on the host), and of
  // each baseline with its synchronisation, so all include the same launch overheads.
  using Clock = std::chrono::steady_clock;
  double best_encode = std::numeric_limits<double>::infinity();
  double best_copy = std::numeric_limits<double>::infinity();
  double best_to_host = std::numeric_limits<double>::infinity();
  for (int r = 0; r < std::max(repeats, 1) && status.ok(); ++r) {
    EncodeContext ctx;
    ctx.round = static_cast<uint64_t>(r) + 1;
    const Clock::time_point t0 = Clock::now();
    status.Update(encoder->Encode(input.as<float>(), values.size(), ctx, &payload));
    const Clock::time_point t1 = Clock::now();
    status.Update(CudaStatus(
        cudaMemcpyAsync(copy.as<void>(), input.as<void>(), bytes, cudaMemcpyDeviceToDevice, stream),
        "cudaMemcpyAsync (baseline copy)"));
    status.Update(CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
    const Clock::time_point t2 = Clock::now();
    copy_to_host();
    const Clock::time_point t3 = Clock::now();
    best_encode = std::min(best_encode, std::chrono::duration<double>(t1 - t0).count());
    best_copy = std::min(best_copy, std::chrono::duration<double>(t2 - t1).count());
    best_to_host = std::min(best_to_host, std::chrono::duration<double>(t3 - t2).count());
  }
  cudaStreamDestroy(stream);
  PS_RETURN_IF_ERROR(status);
  timing.encode_seconds = best_encode;
  timing.copy_seconds = best_copy;
  timing.to_host_seconds = best_to_host;
  return timing;
}

}  // namespace ps::codecs

namespace ps::codecs::internal {

absl::StatusOr<std::unique_ptr<DeviceEncode>> MakeCudaEncode(const Codec& cpu,
                                                             const CodecOptions& options) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<DeviceEncoder::Impl> encoder,
                      DeviceEncoder::Impl::Make(cpu.spec(), options, 0, false));
  return std::unique_ptr<DeviceEncode>(std::make_unique<HostInputEncode>(std::move(encoder)));
}

}  // namespace ps::codecs::internal
