// GPU encoders for the worker-side codecs (docs/gpu.md, "Encoding on the device"):
// fp16, bf16, sign, terngrad, 3lc, and the top-k and threshold sparsifiers with every
// index and value stage. A DeviceEncoder reads fp32 values that are already in device
// memory and writes the payload the CPU codec of the same spec writes, byte for byte
// (sign's scale: within one float ulp, see the docs), so ps-server decodes it unchanged.
// With error feedback it keeps the residual e on the device, as worker_lib's
// TensorEncoder keeps it on the host:
//   v = g + e,  payload = encode(v),  e = v - decode(payload).
//
// The header has no CUDA types: device memory is plain float pointers. Part of ps_codecs
// in every build: the kernels are in codecs/cuda (ps_codecs_cuda) when the build has
// CUDA; without, Make and TimeDeviceEncode return UNAVAILABLE (no_cuda.cc), so code
// that uses this header builds either way. codecs::MakeCodec with CodecOptions::device =
// kCuda reaches the same encoders for host values.
//
// Thread safety: one DeviceEncoder encodes from one thread at a time; each has its own
// CUDA stream, so different encoders may run concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "codecs/codec.h"

namespace ps::codecs {

class DeviceEncoder {
 public:
  // The encoder of `spec` for slices of `numel` values on the current CUDA device.
  // UNAVAILABLE when there is no device (gpu::CudaDevice()'s reason), UNIMPLEMENTED when
  // the spec has no GPU encoder, INVALID_ARGUMENT for a bad spec. options.device is
  // ignored (this is the device).
  static absl::StatusOr<std::unique_ptr<DeviceEncoder>> Make(std::string_view spec,
                                                             const CodecOptions& options,
                                                             size_t numel, bool error_feedback);
  ~DeviceEncoder();
  DeviceEncoder(const DeviceEncoder&) = delete;
  DeviceEncoder& operator=(const DeviceEncoder&) = delete;

  // Replaces *out with the payload of the n values at device_values (device memory,
  // unchanged). With error feedback n must be numel, and the residual is updated only
  // when the encoding succeeds. Refuses Inf and NaN with the CPU codec's message; on
  // error *out is unchanged. Returns once the payload is in *out (on an error, once
  // nothing queued still reads the values). The values must be written by the time of
  // the call: by work on the legacy default stream (plain cudaMemcpy included; the
  // encoder's stream waits for it) or on a stream the caller has synchronized.
  absl::Status Encode(const float* device_values, size_t n, const EncodeContext& ctx,
                      std::string* out);

  // The CPU codec of the spec: its canonical spec() and the Decode() of the payloads.
  const Codec& codec() const;
  // The residual e (numel floats in device memory), or null without error feedback.
  const float* residual() const;

  class Impl;

 private:
  explicit DeviceEncoder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One measurement of `ps-bench codecs --device cuda`: a DeviceEncoder's Encode of
// `values` copied to the device once (so the input is device-resident), against a
// device-to-device copy of the same bytes on the same device.
struct EncodeTiming {
  std::string device;          // gpu::CudaDevice()'s description
  double encode_seconds = 0;   // best Encode() of `repeats`, payload in host memory
  double copy_seconds = 0;     // best cudaMemcpyAsync D2D of the values' bytes
  double to_host_seconds = 0;  // best cudaMemcpyAsync D2H of the payload's bytes (pinned)
  size_t payload_bytes = 0;    // of the first encoding
};
absl::StatusOr<EncodeTiming> TimeDeviceEncode(std::string_view spec, const CodecOptions& options,
                                              std::span<const float> values, int repeats);

}  // namespace ps::codecs
