// fp32: the identity codec. Wire: version byte, then numel little-endian fp32
// (core/fp32_bytes.h; the host is little-endian, which that file asserts).
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "codecs/codec.h"
#include "codecs/codec_internal.h"
#include "core/fp32_bytes.h"
#include "core/status.h"

namespace ps::codecs {
namespace {

constexpr char kFp32Spec[] = "fp32";

// Bytes copied at a time before the values they complete are checked: small enough that
// the check reads them from the first-level cache right after the copy wrote them, so
// copy and check are one pass over memory instead of two (docs/bench.md, "The TCP data
// plane against gRPC and the one-copy ceiling").
constexpr size_t kChunkBytes = 16384;

class Fp32Codec final : public Codec {
 public:
  Fp32Codec() : Codec(PayloadFormat::kFp32) {}

  std::string_view spec() const override { return kFp32Spec; }

  absl::Status Encode(std::span<const float> values, const EncodeContext& /*ctx*/,
                      std::string* out) override {
    // Built in scratch_ and swapped in, so that a refusal leaves *out as it was. scratch_
    // holds what *out held before the last swap: a caller that hands the same strings
    // back round after round (the worker's payloads, a core::StringPool) finds it already
    // as long as the payload, and the values are copied and checked in one pass
    // (core::StoreFindNonFinite). A shorter one is built from a reserve, each chunk
    // checked, then appended while it is in cache: growing a string to write into it
    // would zero-fill it first, one more pass.
    const size_t bytes = MaxEncodedBytes(values.size());
    if (scratch_.size() >= bytes) {
      scratch_.resize(bytes);
      scratch_[0] = static_cast<char>(FormatByte(format()));
      if (core::StoreFindNonFinite(values, scratch_.data() + 1) >= 0) {
        return internal::CheckEncodable(kFp32Spec, values);
      }
      out->swap(scratch_);
      return absl::OkStatus();
    }
    scratch_.clear();
    scratch_.reserve(bytes);
    scratch_.push_back(static_cast<char>(FormatByte(format())));
    constexpr size_t kChunk = kChunkBytes / sizeof(float);
    for (size_t at = 0; at < values.size(); at += kChunk) {
      const std::span<const float> chunk = values.subspan(at, std::min(kChunk, values.size() - at));
      // The refusal names the first bad value's index in `values` (a refusal is rare:
      // finding it again from the start costs only then).
      if (core::FindNonFinite(chunk) >= 0) return internal::CheckEncodable(kFp32Spec, values);
      core::AppendFp32(chunk, &scratch_);
    }
    out->swap(scratch_);
    return absl::OkStatus();
  }

  absl::Status Decode(std::string_view bytes, std::span<float> out) const override {
    PS_RETURN_IF_ERROR(internal::CheckDensePayload(*this, bytes, sizeof(float), out.size()));
    size_t written = 0;
    return CopyChecked(bytes.substr(1), out, written);
  }

  // The values straight from the pieces into out: one pass, no gather. A payload of
  // the wrong size or version takes Decode's path, for its exact message.
  absl::Status DecodePieces(std::span<const std::string_view> pieces,
                            std::span<float> out) const override {
    if (!internal::IsDensePayload(format(), pieces, sizeof(float), out.size()) || out.empty()) {
      return Codec::DecodePieces(pieces, out);
    }
    bool versioned = false;
    size_t written = 0;
    for (std::string_view p : pieces) {
      if (p.empty()) continue;
      if (!versioned) {
        p.remove_prefix(1);
        versioned = true;
      }
      PS_RETURN_IF_ERROR(CopyChecked(p, out, written));
    }
    return absl::OkStatus();
  }

  // The change read where it lies in the pieces, added to what is held, copied to out
  // and checked in one pass (core::AddFiniteKeepBytes; a value cut between two pieces is
  // gathered with its block).
  absl::Status DecodeAddPieces(std::span<const std::string_view> pieces,
                               std::span<float> held, std::span<float> out) const override {
    return internal::DecodeAddDense(
        *this, sizeof(float), pieces, held, out,
        [](const unsigned char* change, std::span<float> held_part, std::span<float> out_part) {
          return core::AddFiniteKeepBytes(held_part, change, out_part);
        });
  }

  size_t MaxEncodedBytes(size_t numel) const override { return 1 + sizeof(float) * numel; }

  bool raw_fp32() const override { return true; }

 private:
  std::string scratch_;  // what Encode builds, swapped into its output when it succeeds

  // Copies `bytes` into `out` from byte `written` on (advanced past them), a chunk at a
  // time, checking the values each chunk completes while they are in cache: the first
  // NaN or Inf is refused naming its index, as a check of the whole would (the rest of
  // `out` is then unspecified). The caller checked that the bytes fit. Bytes that lie
  // where they would be copied to (a transport read them into `out`) are checked only.
  // Whole values at a value's boundary (a datagram's, a piece that splits none) are
  // copied and checked in one pass (core::CopyFindNonFinite).
  static absl::Status CopyChecked(std::string_view bytes, std::span<float> out, size_t& written) {
    auto* base = reinterpret_cast<char*>(out.data());
    while (!bytes.empty()) {
      const size_t n = std::min(bytes.size(), kChunkBytes);
      const size_t checked = written / sizeof(float);
      // The values this chunk completes: with a value cut between two pieces, the one
      // it starts is completed by the next.
      const std::span<float> done = out.subspan(checked, (written + n) / sizeof(float) - checked);
      ptrdiff_t bad = -1;
      if (base + written == bytes.data()) {
        bad = core::FindNonFinite(done);  // in place: checked only
      } else if (written % sizeof(float) == 0 && n % sizeof(float) == 0) {
        bad = core::CopyFindNonFinite(bytes.data(), done);
      } else {
        std::memcpy(base + written, bytes.data(), n);
        bad = core::FindNonFinite(done);
      }
      written += n;
      bytes.remove_prefix(n);
      if (bad >= 0) {
        const size_t at = checked + static_cast<size_t>(bad);
        return absl::InvalidArgumentError(
            absl::StrCat(kFp32Spec, ": value ", at, " is not finite (", out[at], ")"));
      }
    }
    return absl::OkStatus();
  }
};

}  // namespace

namespace internal {
absl::StatusOr<std::unique_ptr<Codec>> MakeFp32Codec(Stages stages, const CodecOptions& /*options*/) {
  PS_RETURN_IF_ERROR(SingleStage(stages, {}).status());
  return std::unique_ptr<Codec>(std::make_unique<Fp32Codec>());
}
}  // namespace internal

}  // namespace ps::codecs
