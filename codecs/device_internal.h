// The interface through which a Codec encodes on a device (docs/gpu.md, "Encoding on
// the device"). Implemented by codecs/cuda/ (ps_codecs_cuda) in builds with CUDA, and by
// no_cuda.cc, which always refuses, in builds without. MakeCodec() wraps the CPU codec
// around it when CodecOptions::device asks for CUDA (device_codec.cc).
#pragma once

#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "codecs/codec.h"

namespace ps::codecs::internal {

// Encodes host values on the device into the bytes the CPU codec of the same spec
// writes. Thread safety: as Codec::Encode (one thread at a time).
class DeviceEncode {
 public:
  virtual ~DeviceEncode() = default;
  // As Codec::Encode: on error (a value not finite, a CUDA failure) *out is unchanged.
  virtual absl::Status Encode(std::span<const float> values, const EncodeContext& ctx,
                              std::string* out) = 0;
};

// The CUDA encoder for `cpu`'s spec, or why there is none: UNAVAILABLE when this build
// has no CUDA or the machine no device (gpu::CudaDevice()'s reason), UNIMPLEMENTED when
// the spec has no GPU encoder.
absl::StatusOr<std::unique_ptr<DeviceEncode>> MakeCudaEncode(const Codec& cpu,
                                                             const CodecOptions& options);

// What MakeCodec returns for CodecOptions::device == kCuda: `cpu` (the CPU codec of the
// spec) encoding through MakeCudaEncode when there is a device encoder, else `cpu`
// itself behind a device_note() that says why it encodes on the CPU. Decode,
// MaxEncodedBytes and the shared structure are always `cpu`'s.
std::unique_ptr<Codec> OnCuda(std::unique_ptr<Codec> cpu, const CodecOptions& options);

}  // namespace ps::codecs::internal
