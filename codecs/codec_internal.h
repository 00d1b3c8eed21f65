// Helpers shared by the codec implementations: the per-codec constructors behind
// MakeCodec() and the header check every dense codec runs first.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/status/statusor.h"
#include "codecs/codec.h"
#include "codecs/hd_internal.h"
#include "core/spec.h"

namespace ps::codecs::internal {

// Debian's abseil has its own string_view type (ABSL_OPTION_USE_STD_STRING_VIEW is
// 0), so std::string_view must be converted before it meets StrCat or Status.
inline absl::string_view AbslView(std::string_view s) { return {s.data(), s.size()}; }

// A codec's factory: `stages` is the parsed spec (stages[0] names this codec), at
// least one stage. Registered in codec.cc under stages[0].name.
using Stages = std::span<const core::StageSpec>;
using CodecFactory = absl::StatusOr<std::unique_ptr<Codec>> (*)(Stages stages,
                                                                const CodecOptions& options);

absl::StatusOr<std::unique_ptr<Codec>> MakeFp32Codec(Stages stages, const CodecOptions& options);
absl::StatusOr<std::unique_ptr<Codec>> MakeFp16Codec(Stages stages, const CodecOptions& options);
absl::StatusOr<std::unique_ptr<Codec>> MakeBf16Codec(Stages stages, const CodecOptions& options);
absl::StatusOr<std::unique_ptr<Codec>> MakeSignCodec(Stages stages, const CodecOptions& options);
// Sparse compositions (sparse.cc): sparsifier + index stage + value stage.
absl::StatusOr<std::unique_ptr<Codec>> MakeTopkCodec(Stages stages, const CodecOptions& options);
absl::StatusOr<std::unique_ptr<Codec>> MakeThresholdCodec(Stages stages, const CodecOptions& options);
absl::StatusOr<std::unique_ptr<Codec>> MakeRandkCodec(Stages stages, const CodecOptions& options);
absl::StatusOr<std::unique_ptr<Codec>> MakeInt8Codec(Stages stages, const CodecOptions& options);
absl::StatusOr<std::unique_ptr<Codec>> MakeQsgdCodec(Stages stages, const CodecOptions& options);
absl::StatusOr<std::unique_ptr<Codec>> MakeTerngradCodec(Stages stages, const CodecOptions& options);
absl::StatusOr<std::unique_ptr<Codec>> Make3lcCodec(Stages stages, const CodecOptions& options);
absl::StatusOr<std::unique_ptr<Codec>> MakePowerSgdCodec(Stages stages, const CodecOptions& options);

// Binds the arguments of a codec that is a single stage (every dense codec), refusing
// further stages: "fp16 is a whole codec; '+raw' cannot follow it".
absl::StatusOr<core::StageArgs> SingleStage(Stages stages, std::vector<std::string> keys);

// The quantizers' bucket size (int8, qsgd, terngrad): argument "bucket", values per
// scale, in [1, kMaxBucket] (default 512).
inline constexpr int64_t kDefaultBucket = 512;
inline constexpr int64_t kMaxBucket = int64_t{1} << 24;
absl::StatusOr<size_t> BucketArg(const core::StageArgs& args);
inline size_t BucketCount(size_t numel, size_t bucket) { return (numel + bucket - 1) / bucket; }

// The canonical stage string with every argument written out, in the order given:
// StageString("int8", {{"bucket", "512"}}) == "int8(bucket=512)".
std::string StageString(std::string_view name,
                        std::initializer_list<std::pair<std::string_view, std::string>> args);
using core::FormatNumber;  // core/spec.h: shortest decimal that reads back the same

// The random stream of one encoding: Mix64(Mix64(Mix64(seed ^ worker) ^ round) ^ slice)
// (Mix64 in hd_internal.h).
uint64_t StreamSeed(uint64_t seed, const EncodeContext& ctx);
// The 32-bit stream seed of stochastic rounding for one encoding (kernels_internal.h).
inline uint32_t RoundingSeed(uint64_t seed, const EncodeContext& ctx) {
  return static_cast<uint32_t>(StreamSeed(seed, ctx) >> 32);
}

// What every Encode() checks first: no Inf or NaN among the values (refused on the
// worker too, so an honest worker learns about a NaN gradient locally instead of from
// the server's decode error). "fp16: cannot encode value 5: not finite (nan)".
absl::Status CheckEncodable(std::string_view spec, std::span<const float> values);

// What a 16-bit decoder (fp16, bf16) checks last: no Inf or NaN among the decoded
// values; the error names the first one and its wire bits (`words`: the little-endian
// 16-bit values after the version byte). "bf16: value 1 is not finite (bits 0x7f80)".
absl::Status CheckDecoded16(std::string_view spec, const unsigned char* words,
                            std::span<const float> out);

// The little-endian 16-bit word at in[2 * i].
inline uint16_t Load16(const unsigned char* in, size_t i) {
  return static_cast<uint16_t>(in[2 * i] | (in[2 * i + 1] << 8));
}

// The concatenation of `pieces`: the one non-empty piece itself, or a copy in a
// per-thread scratch buffer, valid until the thread's next call (DecodePieces' default).
std::string_view Gathered(std::span<const std::string_view> pieces);

// DecodeAddPieces' refusal of a sum that is not finite, naming the first in out: "value
// 5 is not finite once the change is applied"; OK when every value of out is finite.
absl::Status NonFiniteSum(std::span<const float> out);

// Calls fn(block, offset, size) over the bytes of `pieces` after their first `skip`, in
// order, in blocks of `block_bytes` (the last may be shorter): `offset` counts from the
// first byte after `skip`. A block within one piece is passed where it lies, one across
// pieces gathered into a buffer first, so a block is always whole (block_bytes at most
// kMaxBlockBytes; a multiple of the value size keeps values whole too).
inline constexpr size_t kMaxBlockBytes = 4096;
template <typename Fn>
void ForEachBlock(std::span<const std::string_view> pieces, size_t skip, size_t block_bytes,
                  Fn&& fn) {
  alignas(64) unsigned char gather[kMaxBlockBytes];
  size_t have = 0;  // bytes of the block being gathered
  size_t offset = 0;
  for (std::string_view piece : pieces) {
    const size_t skipped = std::min(skip, piece.size());
    skip -= skipped;
    piece.remove_prefix(skipped);
    const auto* p = reinterpret_cast<const unsigned char*>(piece.data());
    size_t left = piece.size();
    if (have > 0) {
      const size_t take = std::min(block_bytes - have, left);
      if (take > 0) std::memcpy(gather + have, p, take);  // an empty piece may have no data
      have += take;
      p += take;
      left -= take;
      if (have < block_bytes) continue;
      fn(static_cast<const unsigned char*>(gather), offset, block_bytes);
      offset += block_bytes;
      have = 0;
    }
    for (; left >= block_bytes; p += block_bytes, left -= block_bytes, offset += block_bytes) {
      fn(p, offset, block_bytes);
    }
    if (left > 0) {
      std::memcpy(gather, p, left);
      have = left;
    }
  }
  if (have > 0) fn(static_cast<const unsigned char*>(gather), offset, have);
}

// Whether `pieces` frame a dense payload of numel values as CheckDensePayload wants it:
// 1 + value_bytes * numel bytes in all, the first `format`'s byte.
bool IsDensePayload(PayloadFormat format, std::span<const std::string_view> pieces,
                    size_t value_bytes, size_t numel);

// DecodeAddPieces' refusal once a fused pass added every value of the change to `held`
// (the sums there, some not finite): DecodePieces' own refusal of the change when it has
// one (written over out), else the first sum that is not finite (NonFiniteSum(held)).
absl::Status RefusedSum(const Codec& codec, std::span<const std::string_view> pieces,
                        std::span<const float> held, std::span<float> out);

// DecodeAddPieces of a dense codec (version, then value_bytes bytes a value): when the
// pieces frame such a payload, add_block(block, held part, out part) for each block of
// whole values of the payload, in order (ForEachBlock), which adds the change to the held
// part, writes the sums to the out part too and returns whether they are finite. When
// the framing is off, the default's path (nothing added yet); when a sum is not finite
// (a non-finite change value too), RefusedSum's exact refusal.
template <typename AddBlock>
absl::Status DecodeAddDense(const Codec& codec, size_t value_bytes,
                            std::span<const std::string_view> pieces, std::span<float> held,
                            std::span<float> out, AddBlock&& add_block) {
  if (held.size() != out.size() ||
      !IsDensePayload(codec.format(), pieces, value_bytes, out.size())) {
    return codec.Codec::DecodeAddPieces(pieces, held, out);
  }
  bool finite = true;
  const size_t block_bytes = kMaxBlockBytes / value_bytes * value_bytes;
  ForEachBlock(pieces, 1, block_bytes, [&](const unsigned char* block, size_t offset, size_t size) {
    const size_t at = offset / value_bytes;
    const size_t count = size / value_bytes;
    finite &= add_block(block, held.subspan(at, count), out.subspan(at, count));
  });
  return finite ? absl::OkStatus() : RefusedSum(codec, pieces, held, out);
}

// DecodeAddDense of a codec of little-endian 16-bit words (fp16, bf16): each block's
// words widened to floats by `widen` into a buffer in the first-level cache, then added
// to what is held, copied to out and checked (core::AddFiniteKeep).
using Widen16 = void (*)(const unsigned char* words, std::span<float> out);
absl::Status DecodeAddWidened16(const Codec& codec, Widen16 widen,
                                std::span<const std::string_view> pieces, std::span<float> held,
                                std::span<float> out);

// A payload's first byte against the format its decoder reads: INVALID_ARGUMENT naming
// both ("SPEC: payload in the fp16 format (2), expected the bf16 format (3)") when they differ.
absl::Status CheckFormat(std::string_view spec, uint8_t byte, PayloadFormat expected);

// Checks the framing of a dense payload of `codec`: not empty, bytes[0] its format, and
// exactly 1 + bytes_per_value * numel bytes. Errors are INVALID_ARGUMENT and start
// with its spec.
absl::Status CheckDensePayload(const Codec& codec, std::string_view bytes,
                               size_t bytes_per_value, size_t numel);

}  // namespace ps::codecs::internal
