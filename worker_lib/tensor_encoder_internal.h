// The worker side of one tensor's pushes: worker momentum, error feedback and the
// tensor's codec (PushOptions in worker.h). The Worker holds one per tensor and calls
// it under that tensor's lock; it has no gRPC in it, so it is tested on its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "codecs/codec.h"
#include "worker_lib/worker.h"

namespace ps::internal {

// Where one slice lies in its tensor.
struct SliceRange {
  uint32_t id = 0;
  uint64_t offset = 0;
  uint32_t numel = 0;
  // The push's fixed cost in bytes of its shard's link (codecs::EncodeContext), for
  // codecs that choose their level per encoding; negative: not measured yet.
  double fixed_cost_bytes = -1;
};

class TensorEncoder {
 public:
  // Refuses a bad codec spec, momentum outside [0, 1).
  static absl::StatusOr<std::unique_ptr<TensorEncoder>> Make(const PushOptions& options,
                                                             uint64_t codec_seed, size_t numel);

  // Encodes this round's gradient `grad` (the whole tensor) slice by slice into
  // payloads[i] for slices[i], which cover the tensor, each value once (INVALID_ARGUMENT
  // when their sizes do not add up to it). Momentum and the residual are updated only
  // when every slice encoded; on error nothing changes.
  absl::Status Encode(std::span<const float> grad, uint64_t round, uint32_t worker_id,
                      std::span<const SliceRange> slices, std::vector<std::string>* payloads);
  // Whether Borrow may encode this tensor's pushes now: its codec sends the values as
  // they are (Codec::raw_fp32) and neither momentum nor error feedback changes them.
  bool CanBorrow() const { return codec_->raw_fp32() && momentum_.empty() && residual_.empty(); }
  // Encode without the copy, where CanBorrow(): checks that every value of the slices is
  // finite (the codec's refusal, else) and gives the bytes that precede every slice's
  // values (*head, alike for all) and (*borrowed)[i], slice i's values in `grad` as
  // they are.
  absl::Status Borrow(std::span<const float> grad, std::span<const SliceRange> slices,
                      std::string* head, std::vector<std::span<const char>>* borrowed);

  std::string_view spec() const { return codec_->spec(); }
  // The codec's largest encoding of `numel` values (Codec::MaxEncodedBytes).
  size_t MaxEncodedBytes(size_t numel) const { return codec_->MaxEncodedBytes(numel); }
  // Where the codec was asked to encode (PushOptions::device, then SetCodec's).
  core::Device device() const { return device_; }
  // Encodes from now on with `spec` on `device` (made as Make makes the first), keeping
  // the momentum and the error-feedback residual: both are independent of the codec
  // (e_t = v_t - decode(encode(v_t)) for whichever codec encoded v_t, on either device:
  // the device encoders write the CPU's bytes), so a tensor may change codec between
  // rounds. On error nothing changes.
  absl::Status SetCodec(std::string_view spec, uint64_t codec_seed, core::Device device);
  // Empty when the codec encodes where PushOptions::device asked; otherwise the one
  // line to log saying why it encodes on the CPU (Codec::device_note()).
  std::string_view device_note() const { return codec_->device_note(); }
  // The error-feedback residual e_t (empty without error feedback).
  std::span<const float> residual() const { return residual_; }

 private:
  TensorEncoder(const PushOptions& options, std::unique_ptr<codecs::Codec> codec, size_t numel);

  const PushOptions options_;
  core::Device device_;
  std::unique_ptr<codecs::Codec> codec_;
  std::vector<float> momentum_;  // u_{t-1}; empty without momentum
  std::vector<float> residual_;  // e_{t-1}; empty without error feedback
  bool first_ = true;            // no u_{t-1} yet
  std::vector<float> next_momentum_, next_residual_;  // scratch
};

}  // namespace ps::internal
