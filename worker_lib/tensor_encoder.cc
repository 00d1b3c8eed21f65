#include "worker_lib/tensor_encoder_internal.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/fp32_bytes.h"
#include "core/status.h"

namespace ps::internal {

absl::StatusOr<std::unique_ptr<TensorEncoder>> TensorEncoder::Make(const PushOptions& options,
                                                                   uint64_t codec_seed,
                                                                   size_t numel) {
  if (!(options.momentum >= 0 && options.momentum < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker momentum must lie in [0, 1), got ", options.momentum));
  }
  codecs::CodecOptions codec_options;
  codec_options.seed = codec_seed;
  codec_options.device = options.device;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<codecs::Codec> codec,
                      codecs::MakeCodec(options.codec, codec_options));
  return std::unique_ptr<TensorEncoder>(new TensorEncoder(options, std::move(codec), numel));
}

absl::Status TensorEncoder::SetCodec(std::string_view spec, uint64_t codec_seed,
                                     core::Device device) {
  codecs::CodecOptions codec_options;
  codec_options.seed = codec_seed;
  codec_options.device = device;
  PS_ASSIGN_OR_RETURN(codec_, codecs::MakeCodec(spec, codec_options));
  device_ = device;
  return absl::OkStatus();
}

TensorEncoder::TensorEncoder(const PushOptions& options, std::unique_ptr<codecs::Codec> codec,
                             size_t numel)
    : options_(options), device_(options.device), codec_(std::move(codec)) {
  if (options_.momentum > 0) momentum_.assign(numel, 0.0f);
  if (options_.error_feedback) residual_.assign(numel, 0.0f);
}

absl::Status TensorEncoder::Encode(std::span<const float> grad, uint64_t round, uint32_t worker_id,
                                   std::span<const SliceRange> slices,
                                   std::vector<std::string>* payloads) {
  size_t covered = 0;
  for (const SliceRange& s : slices) covered += s.numel;
  if (covered != grad.size()) {
    return absl::InvalidArgumentError(absl::StrCat("slices of ", covered, " values for a tensor of ",
                                                   grad.size()));
  }
  const float beta = static_cast<float>(options_.momentum);
  if (!momentum_.empty()) next_momentum_.resize(grad.size());
  if (!residual_.empty()) next_residual_.resize(grad.size());
  payloads->resize(slices.size());
  // Slice by slice, so each slice's momentum and v = u + e are still in the caches when
  // it is encoded.
  for (size_t k = 0; k < slices.size(); ++k) {
    const SliceRange& s = slices[k];
    const size_t end = size_t{s.offset} + s.numel;
    // v = u + e, where u is the gradient or its moving average.
    std::span<const float> v = grad;
    if (!momentum_.empty()) {
      for (size_t i = s.offset; i < end; ++i) {
        // The first round has no history: u_0 = g_0 rather than (1 - beta) g_0, so the
        // pushed magnitude does not start too small.
        next_momentum_[i] = first_ ? grad[i] : beta * momentum_[i] + (1 - beta) * grad[i];
      }
      v = next_momentum_;
    }
    if (!residual_.empty()) {
      for (size_t i = s.offset; i < end; ++i) next_residual_[i] = v[i] + residual_[i];
    }
    codecs::EncodeContext ctx;
    ctx.round = round;
    ctx.slice_id = s.id;
    ctx.worker_id = worker_id;
    ctx.fixed_cost_bytes = s.fixed_cost_bytes;
    const uint32_t cols = options_.matrix_cols;
    if (cols > 0 && s.offset % cols == 0 && s.numel % cols == 0) ctx.matrix_cols = cols;
    if (residual_.empty()) {
      PS_RETURN_IF_ERROR(codec_->Encode(v.subspan(s.offset, s.numel), ctx, &(*payloads)[k]));
    } else {
      // e_t = v - decode(payload), left in next_residual_.
      const std::span<float> e = std::span<float>(next_residual_).subspan(s.offset, s.numel);
      PS_RETURN_IF_ERROR(codec_->EncodeResidual(e, ctx, &(*payloads)[k]));
    }
  }
  if (!momentum_.empty()) momentum_.swap(next_momentum_);
  if (!residual_.empty()) residual_.swap(next_residual_);
  first_ = false;
  return absl::OkStatus();
}

absl::Status TensorEncoder::Borrow(std::span<const float> grad, std::span<const SliceRange> slices,
                                   std::string* head,
                                   std::vector<std::span<const char>>* borrowed) {
  if (!CanBorrow()) {
    return absl::InternalError(absl::StrCat(
        "cannot borrow: codec ", core::AsAbsl(codec_->spec()),
        " does not send the values as they are, or momentum or error feedback changes them"));
  }
  for (const SliceRange& s : slices) {
    const std::span<const float> values = grad.subspan(s.offset, s.numel);
    if (core::FindNonFinite(values) >= 0) {
      // The codec's refusal, with its message (a refusal is rare: encoding to find it
      // costs only then).
      std::string unused;
      codecs::EncodeContext ctx;
      ctx.slice_id = s.id;
      absl::Status refused = codec_->Encode(values, ctx, &unused);
      return refused.ok() ? absl::InternalError("a non-finite value the codec took") : refused;
    }
  }
  // The codec's own encoding of no values: the bytes before the values (the format
  // byte), the same for every slice.
  PS_RETURN_IF_ERROR(codec_->Encode({}, codecs::EncodeContext{}, head));
  borrowed->resize(slices.size());
  for (size_t k = 0; k < slices.size(); ++k) {
    (*borrowed)[k] = std::span<const char>(
        reinterpret_cast<const char*>(grad.data() + slices[k].offset),
        size_t{slices[k].numel} * sizeof(float));
  }
  return absl::OkStatus();
}

}  // namespace ps::internal
