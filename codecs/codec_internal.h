// Helpers shared by the codec implementations: the per-codec constructors behind
// MakeCodec() and the header check every dense codec runs first.
#pragma once

#include <cstddef>
#include <cstdint>
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
// Shortest decimal that reads back as the same double (std::to_chars): "0.01", "1e-05".
std::string FormatNumber(double value);

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

// Checks the framing of a dense payload: not empty, bytes[0] == kFormatVersion, and
// exactly 1 + bytes_per_value * numel bytes. Errors are INVALID_ARGUMENT and start
// with `spec`.
absl::Status CheckDensePayload(std::string_view spec, std::string_view bytes,
                               size_t bytes_per_value, size_t numel);

}  // namespace ps::codecs::internal
