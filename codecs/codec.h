// Codec: turns a slice of fp32 values into bytes and back (docs/codecs.md). The server
// decodes bytes that a Byzantine worker wrote, so Decode() validates everything
// (format version, sizes, index ranges, finiteness) and returns an error instead of
// crashing; it never allocates more than the slice's declared size.
//
// A codec is named by a spec string in the grammar of core/spec.h: one stage for a
// dense codec ("int8(bucket=512)"), up to three for a sparse one (sparsifier, index
// codec, value codec: "topk(0.01)+bloom(p0, fpr=0.01)+fp16"). spec() is the canonical
// form with every argument written out; pushes carry it and the server makes its
// decoder from it, so payloads need not repeat what the spec says.
//
// Thread safety: Decode() is const and may run concurrently. Encode() may update
// worker-side state (PowerSGD's warm start), so one instance encodes one tensor from
// one thread at a time.
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
#include "core/device.h"

namespace ps::codecs {

// The first byte of every encoded payload: its format, which names the codec family that
// wrote it (one value per layout version of a family). A decoder refuses a payload of
// another format, naming both ("bf16: payload in the fp16 format (2), expected the bf16
// format (3)"), so bytes handed to the wrong codec fail instead of decoding into other values.
// The dense 16-bit formats have the same size for the same values, and before formats
// named their family every codec wrote 1, which is now fp32's alone.
enum class PayloadFormat : uint8_t {
  kFp32 = 1,
  kFp16 = 2,
  kBf16 = 3,
  kInt8 = 4,
  kQsgd = 5,
  kTernGrad = 6,
  kSign = 7,
  kThreeLc = 8,
  kPowerSgd = 9,
  kSparse = 10,  // every sparsifier, index and value stage: the spec names them
};
inline constexpr uint8_t FormatByte(PayloadFormat f) { return static_cast<uint8_t>(f); }
// "fp16" for FormatByte(PayloadFormat::kFp16); empty for a byte no format has.
std::string_view PayloadFormatName(uint8_t byte);

// Where an encoding happens, for codecs that draw random numbers (stochastic
// rounding, random-k masks) or need the slice's shape. Deterministic codecs ignore it.
struct EncodeContext {
  uint64_t round = 0;
  uint32_t slice_id = 0;
  uint32_t worker_id = 0;
  // The slice as a row-major matrix of this many columns (0: not a matrix). PowerSGD
  // factorizes matrices and sends anything else uncompressed.
  uint32_t matrix_cols = 0;
  // What delivering this payload costs beyond its bytes, in bytes of the link it takes:
  // the link's fixed cost per transfer over its cost per byte (alpha / beta,
  // docs/adaptive.md "The cost model"). Codecs that choose their level per encoding
  // (topk(level=cat)) maximize the descent per (fixed_cost_bytes + payload bytes).
  // Negative: unknown, the spec's `overhead` stands in.
  double fixed_cost_bytes = -1;
};

// Options a codec takes from its user rather than from its spec.
struct CodecOptions {
  // Worker-side seed mixed with (worker, round, slice) for stochastic rounding and
  // per-worker random-k masks. Global-seed random-k uses its spec's seed instead.
  uint64_t seed = 0;
  // Where Encode() runs. kCuda encodes on the CUDA device (docs/gpu.md, "Encoding on the
  // device") into the same bytes as the CPU, for the codecs that have a GPU encoder,
  // when this build has CUDA and the machine a device; otherwise the codec encodes on
  // the CPU and device_note() says why. Decode() always runs on the CPU.
  core::Device device = core::Device::kCpu;
};

// Structure every payload of a codec shares with the other workers' payloads of the
// same spec, which lets a shard aggregate them without treating them as dense vectors
// (codecs/compressed.h, docs/codecs.md "Compressed-domain aggregation").
enum class SharedStructure {
  kNone,
  kSeededSupport,  // random-k: the kept coordinates are a function of a seed (SeededSupportOf)
  kSignBits,       // sign: packed sign bits and one scale (SignMajorityVote)
  kTernaryDigits,  // 3lc: a digit in {-1, 0, 1} per value and one scale (Mean3lc)
};

class Codec {
 public:
  virtual ~Codec() = default;
  Codec(const Codec&) = delete;
  Codec& operator=(const Codec&) = delete;

  // The canonical spec string naming this codec ("fp16"); pushes carry it.
  virtual std::string_view spec() const = 0;

  // The first byte of every payload this codec writes, and the only one it decodes.
  PayloadFormat format() const { return format_; }

  // Replaces *out with the encoding of values. On error *out is unchanged.
  virtual absl::Status Encode(std::span<const float> values, const EncodeContext& ctx,
                              std::string* out) = 0;
  absl::Status Encode(std::span<const float> values, std::string* out) {
    return Encode(values, EncodeContext{}, out);
  }

  // Decodes bytes into out, whose size is the slice's declared element count.
  // Refuses another format, a size that does not match out, and non-finite values.
  virtual absl::Status Decode(std::string_view bytes, std::span<float> out) const = 0;

  // A shard's compressed pull (docs/data_path.md, "Compressed pulls"): replaces *out with
  // the encoding of the change x - held and adds to each held value what a worker's
  // DecodeAddPieces of *out adds to its copy, bit for bit (held[i] = held[i] + the decoded
  // change, one fp32 addition). held has x's size. On error held and *out are unchanged.
  // This default subtracts into a per-thread scratch, encodes, decodes and adds; 3lc adds
  // each block's quantized change as it makes the block's digits. With `copy_to` (held's
  // size, or empty) the new held values are also written there (a shard's published
  // snapshot), in the same pass where the codec can; on error it is unspecified.
  virtual absl::Status EncodeChange(std::span<const float> x, std::span<float> held,
                                    const EncodeContext& ctx, std::string* out,
                                    std::span<float> copy_to);
  absl::Status EncodeChange(std::span<const float> x, std::span<float> held,
                            const EncodeContext& ctx, std::string* out) {
    return EncodeChange(x, held, ctx, out, {});
  }

  // A worker's error feedback (PushOptions::error_feedback): replaces *out with the
  // encoding of v and leaves in v what the encoding lost, v[i] - decoded[i] (one fp32
  // subtraction of what Decode of *out gives), bit for bit. On error v and *out are
  // unchanged. This default encodes, decodes into a per-thread scratch and subtracts;
  // 3lc subtracts each block's quantized values as it makes the block's digits.
  virtual absl::Status EncodeResidual(std::span<float> v, const EncodeContext& ctx,
                                      std::string* out);

  // Decode of bytes that arrived in pieces, in order (a received message's buffers):
  // the same result and errors as Decode of their concatenation. This default gathers
  // the pieces into a per-thread scratch buffer first (none when there is one piece);
  // codecs whose decoding reads the payload once, front to back, read the pieces in
  // place instead (fp32: docs/data_path.md).
  virtual absl::Status DecodePieces(std::span<const std::string_view> pieces,
                                    std::span<float> out) const;

  // A change in pieces (as DecodePieces reads them) applied to what a worker holds:
  // held[i] = held[i] + change[i], each that one fp32 addition (core::AddInto's, the one a
  // shard with a pull codec makes: docs/data_path.md, "Compressed pulls"), so the bits are
  // those of DecodePieces then the addition, and each sum also written to out (the
  // caller's buffer; core::AddFiniteKeep). Refuses what DecodePieces refuses, with its
  // message, and then a sum that is not finite: "value I is not finite once the change
  // is applied", I the first. held and out have
  // the slice's size and overlap neither each other nor the pieces; both are unspecified
  // after a refusal (what was held is lost: the worker drops it). This default decodes
  // into out and adds held in one more pass that also checks, then copies the sums; the
  // codecs a shard uses for pulls (3lc, fp32, fp16, bf16, int8) decode, add, check and
  // write both in one pass.
  virtual absl::Status DecodeAddPieces(std::span<const std::string_view> pieces,
                                       std::span<float> held, std::span<float> out) const;

  // Refuses what Decode of `payload` into numel values would refuse, with its message,
  // and writes nothing. This default decodes into a per-thread scratch buffer; a codec
  // that checks without decoding says so (checks_without_decoding).
  virtual absl::Status Check(std::string_view payload, size_t numel) const;

  // Whether Check costs a small part of a decode (it walks the payload without making
  // values): a shard then keeps such a push encoded until its round closes and decodes
  // it there, into rows its aggregation reads while they are in cache (3lc;
  // docs/data_path.md, "Pushes kept encoded").
  virtual bool checks_without_decoding() const { return false; }

  // Largest encoding of numel values, for message-size limits.
  virtual size_t MaxEncodedBytes(size_t numel) const = 0;

  // What a shard may exploit across the pushes of this codec (kNone: decode each).
  virtual SharedStructure shared_structure() const { return SharedStructure::kNone; }

  // Whether every payload is PayloadFormat::kFp32 and then the values as little-endian fp32,
  // nothing else (fp32). A transport may then read a payload's values straight into
  // their row; DecodePieces of pieces whose values already lie at `out` only checks them.
  virtual bool raw_fp32() const { return false; }

  // Empty when Encode() runs where CodecOptions::device asked; otherwise one line for
  // the owner's log saying where it runs and why: "device=cuda requested but
  // unavailable (no CUDA device: ...); encoding on the CPU".
  virtual std::string_view device_note() const { return {}; }

 protected:
  explicit Codec(PayloadFormat format) : format_(format) {}

  // EncodeChange's first step: x - held in the calling thread's scratch (valid until the
  // thread's next call), or INVALID_ARGUMENT when the sizes differ.
  absl::StatusOr<std::span<float>> ChangeScratch(std::span<const float> x,
                                                 std::span<const float> held) const;
  // EncodeChange's check of copy_to: empty or held's size, else INVALID_ARGUMENT.
  absl::Status CheckCopyTo(std::span<const float> held, std::span<const float> copy_to) const;

 private:
  const PayloadFormat format_;
};

// Makes the codec named by `spec`; refuses unknown names (listing the known ones),
// unknown or out-of-range arguments and stages that do not compose.
absl::StatusOr<std::unique_ptr<Codec>> MakeCodec(std::string_view spec,
                                                 const CodecOptions& options = {});

// Names of the first stage MakeCodec accepts ("fp32", ..., "topk", ...), in a stable
// order; each makes a codec with its default arguments.
std::vector<std::string> CodecNames();

// Every stage name a spec may contain: CodecNames() and the sparse codecs' index and
// value stages ("varint", "bloom", "deflate", ...), in a stable order. A shard's
// --allowed-codecs names a subset of them.
std::vector<std::string> StageNames();

}  // namespace ps::codecs
