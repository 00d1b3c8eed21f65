// The frame the bucketed quantizers share (int8, qsgd, terngrad; docs/codecs.md):
// version, numel (varint), one fp32 scale per bucket of `bucket` values (the last may
// be shorter), then the codec's body. The scale's meaning (max|x| / 127, the L2 norm,
// max|x|) and the body are each codec's own.
//
// Thread safety: as Codec (Decode const; one thread encodes at a time).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "codecs/codec.h"
#include "codecs/codec_internal.h"
#include "codecs/wire_internal.h"

namespace ps::codecs::internal {

class BucketedCodec : public Codec {
 public:
  std::string_view spec() const final { return spec_; }

 protected:
  // `format`: the codec's; `spec`: the canonical spec; `seed`: CodecOptions::seed, for
  // stochastic rounding.
  BucketedCodec(PayloadFormat format, std::string spec, size_t bucket, uint64_t seed)
      : Codec(format), spec_(std::move(spec)), bucket_(bucket), seed_(seed) {}

  size_t BucketSize() const { return bucket_; }
  size_t Buckets(size_t numel) const { return BucketCount(numel, bucket_); }
  // Values [Begin(b), End(b, numel)) form bucket b.
  size_t Begin(size_t b) const { return b * bucket_; }
  size_t End(size_t b, size_t numel) const { return std::min(numel, (b + 1) * bucket_); }

  // Replaces *bytes with the version and numel, then room for the scales and
  // body_bytes; returns the offset of the first scale (the body follows the scales).
  size_t StartPayload(size_t numel, size_t body_bytes, std::string* bytes) const;
  static void SetScale(std::string* bytes, size_t scales_at, size_t b, float scale);

  // Reads the version, numel (must be `numel`) and the scales (ReadScales: finite,
  // not negative, at most max_scale; `what` names them in errors).
  absl::Status ReadHeader(WireReader* r, size_t numel, float max_scale, std::string_view what,
                          std::string_view* scales) const;
  // The frame's size without the body.
  size_t HeaderBytes(size_t numel) const { return 1 + VarintSize(numel) + 4 * Buckets(numel); }

  uint32_t RoundingSeedFor(const EncodeContext& ctx) const { return RoundingSeed(seed_, ctx); }

  // max|x| over bucket b of values; an Inf or NaN there refuses the whole encoding
  // with CheckEncodable's message (the bucket pass doubles as the finiteness check).
  absl::StatusOr<float> BucketMaxAbs(std::span<const float> values, size_t b) const;

 private:
  std::string spec_;
  size_t bucket_;
  uint64_t seed_;
};

// The factory of a bucketed codec whose only argument is the bucket ("int8(bucket=64)"):
// T(bucket, CodecOptions::seed).
template <typename T>
absl::StatusOr<std::unique_ptr<Codec>> MakeBucketOnly(Stages stages, const CodecOptions& options) {
  absl::StatusOr<core::StageArgs> args = SingleStage(stages, {"bucket"});
  if (!args.ok()) return args.status();
  absl::StatusOr<size_t> bucket = BucketArg(*args);
  if (!bucket.ok()) return bucket.status();
  return std::unique_ptr<Codec>(std::make_unique<T>(*bucket, options.seed));
}

}  // namespace ps::codecs::internal
