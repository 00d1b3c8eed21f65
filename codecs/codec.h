// Codec: turns a slice of fp32 values into bytes and back (DESIGN §5). The server
// decodes bytes that a Byzantine worker wrote, so Decode() validates everything
// (format version, sizes, finiteness) and returns an error instead of crashing; it
// never allocates more than the slice's declared size.
//
// Thread safety: Decode() is const and may run concurrently. Encode() may update
// worker-side state (error feedback, later), so one instance encodes one tensor
// from one thread at a time.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ps::codecs {

// First byte of every encoded payload. A decoder refuses versions it does not know.
inline constexpr unsigned char kFormatVersion = 1;

class Codec {
 public:
  virtual ~Codec() = default;
  Codec(const Codec&) = delete;
  Codec& operator=(const Codec&) = delete;

  // The canonical spec string naming this codec ("fp16"); pushes carry it.
  virtual std::string_view spec() const = 0;

  // Replaces *out with the encoding of values.
  virtual absl::Status Encode(std::span<const float> values, std::string* out) = 0;

  // Decodes bytes into out, whose size is the slice's declared element count.
  // Refuses a wrong version, a size that does not match out, and non-finite values.
  virtual absl::Status Decode(std::string_view bytes, std::span<float> out) const = 0;

  // Largest encoding of numel values, for message-size limits.
  virtual size_t MaxEncodedBytes(size_t numel) const = 0;

 protected:
  Codec() = default;
};

// Makes the codec named by `spec` (one of CodecNames()); refuses unknown specs with
// a message that lists the known ones.
absl::StatusOr<std::unique_ptr<Codec>> MakeCodec(std::string_view spec);

// Specs accepted by MakeCodec, in a stable order.
std::vector<std::string> CodecNames();

}  // namespace ps::codecs
