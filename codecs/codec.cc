#include "codecs/codec.h"

#include <algorithm>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codecs/codec_internal.h"
#include "codecs/sparse_internal.h"
#include "codecs/device_internal.h"
#include "core/fp32_bytes.h"
#include "core/scratch.h"
#include "core/spec.h"
#include "core/status.h"

namespace ps::codecs {
namespace {

struct Entry {
  std::string_view name;
  internal::CodecFactory make;
};

// The registry, in the order CodecNames() reports (stable: fuzz corpora index it).
constexpr Entry kCodecs[] = {
    {"fp32", &internal::MakeFp32Codec},
    {"fp16", &internal::MakeFp16Codec},
    {"bf16", &internal::MakeBf16Codec},
    {"sign", &internal::MakeSignCodec},
    {"3lc", &internal::Make3lcCodec},
    {"topk", &internal::MakeTopkCodec},
    {"threshold", &internal::MakeThresholdCodec},
    {"randk", &internal::MakeRandkCodec},
    {"powersgd", &internal::MakePowerSgdCodec},
    {"int8", &internal::MakeInt8Codec},
    {"qsgd", &internal::MakeQsgdCodec},
    {"terngrad", &internal::MakeTerngradCodec},
};

}  // namespace

std::string_view PayloadFormatName(uint8_t byte) {
  switch (static_cast<PayloadFormat>(byte)) {
    case PayloadFormat::kFp32: return "fp32";
    case PayloadFormat::kFp16: return "fp16";
    case PayloadFormat::kBf16: return "bf16";
    case PayloadFormat::kInt8: return "int8";
    case PayloadFormat::kQsgd: return "qsgd";
    case PayloadFormat::kTernGrad: return "terngrad";
    case PayloadFormat::kSign: return "sign";
    case PayloadFormat::kThreeLc: return "3lc";
    case PayloadFormat::kPowerSgd: return "powersgd";
    case PayloadFormat::kSparse: return "sparse";
  }
  return {};
}

absl::StatusOr<std::unique_ptr<Codec>> MakeCodec(std::string_view spec,
                                                 const CodecOptions& options) {
  PS_ASSIGN_OR_RETURN(std::vector<core::StageSpec> stages, core::ParseSpec(spec, "codec spec"));
  for (const Entry& e : kCodecs) {
    if (e.name != stages.front().name) continue;
    auto codec = e.make(stages, options);
    if (!codec.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("codec spec '", internal::AbslView(spec),
                                                     "': ", codec.status().message()));
    }
    if (options.device == core::Device::kCuda) return internal::OnCuda(*std::move(codec), options);
    return codec;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown codec '", stages.front().name,
                                                 "'; known: ", absl::StrJoin(CodecNames(), ", ")));
}

absl::Status Codec::DecodePieces(std::span<const std::string_view> pieces,
                                 std::span<float> out) const {
  return Decode(internal::Gathered(pieces), out);
}

absl::Status Codec::Check(std::string_view payload, size_t numel) const {
  struct CheckTag;
  return Decode(payload, core::ThreadScratch<float, CheckTag>(numel));
}

absl::StatusOr<std::span<float>> Codec::ChangeScratch(std::span<const float> x,
                                                     std::span<const float> held) const {
  if (held.size() != x.size()) {
    return absl::InvalidArgumentError(absl::StrCat(internal::AbslView(spec()), ": ", held.size(),
                                                   " held values for a change of ", x.size()));
  }
  struct ChangeTag;
  const std::span<float> change = core::ThreadScratch<float, ChangeTag>(x.size());
  core::Subtract(x, held, change);
  return change;
}

absl::Status Codec::EncodeChange(std::span<const float> x, std::span<float> held,
                                 const EncodeContext& ctx, std::string* out,
                                 std::span<float> copy_to) {
  PS_RETURN_IF_ERROR(CheckCopyTo(held, copy_to));
  PS_ASSIGN_OR_RETURN(const std::span<float> change, ChangeScratch(x, held));
  std::string payload;
  PS_RETURN_IF_ERROR(Encode(change, ctx, &payload));
  PS_RETURN_IF_ERROR(Decode(payload, change));
  core::AddInto(held, change);
  if (!copy_to.empty()) std::memcpy(copy_to.data(), held.data(), held.size_bytes());
  *out = std::move(payload);
  return absl::OkStatus();
}

absl::Status Codec::CheckCopyTo(std::span<const float> held, std::span<const float> copy_to) const {
  if (copy_to.empty() || copy_to.size() == held.size()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(internal::AbslView(spec()), ": a copy of ",
                                                 copy_to.size(), " values for ", held.size(),
                                                 " held"));
}

absl::Status Codec::EncodeResidual(std::span<float> v, const EncodeContext& ctx,
                                   std::string* out) {
  std::string payload;
  PS_RETURN_IF_ERROR(Encode(v, ctx, &payload));
  struct ResidualTag;
  const std::span<float> decoded = core::ThreadScratch<float, ResidualTag>(v.size());
  PS_RETURN_IF_ERROR(Decode(payload, decoded));
  for (size_t i = 0; i < v.size(); ++i) v[i] -= decoded[i];
  *out = std::move(payload);
  return absl::OkStatus();
}

absl::Status Codec::DecodeAddPieces(std::span<const std::string_view> pieces,
                                    std::span<float> held, std::span<float> out) const {
  if (held.size() != out.size()) {
    return absl::InvalidArgumentError(absl::StrCat(internal::AbslView(spec()), ": ", held.size(),
                                                   " values to add a change of ", out.size(), " to"));
  }
  PS_RETURN_IF_ERROR(DecodePieces(pieces, out));
  if (!core::AddFinite(held, out)) return internal::NonFiniteSum(out);
  if (!out.empty()) std::memcpy(held.data(), out.data(), out.size_bytes());
  return absl::OkStatus();
}

std::vector<std::string> CodecNames() {
  std::vector<std::string> names;
  for (const Entry& e : kCodecs) names.emplace_back(e.name);
  return names;
}

std::vector<std::string> StageNames() {
  std::vector<std::string> names = CodecNames();
  for (std::string_view name : internal::SparseStageNames()) {
    if (std::find(names.begin(), names.end(), name) == names.end()) names.emplace_back(name);
  }
  return names;
}

namespace internal {

absl::StatusOr<core::StageArgs> SingleStage(Stages stages, std::vector<std::string> keys) {
  if (stages.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(stages[0].name, " is a whole codec; '+",
                                                   stages[1].name, "' cannot follow it"));
  }
  return core::StageArgs::Bind(stages[0], std::move(keys));
}

absl::StatusOr<size_t> BucketArg(const core::StageArgs& args) {
  PS_ASSIGN_OR_RETURN(const int64_t bucket, args.Int("bucket", kDefaultBucket, 1, kMaxBucket));
  return static_cast<size_t>(bucket);
}

std::string StageString(std::string_view name,
                        std::initializer_list<std::pair<std::string_view, std::string>> args) {
  std::string out(name);
  if (args.size() == 0) return out;
  out += '(';
  bool first = true;
  for (const auto& [key, value] : args) {
    if (!first) out += ", ";
    first = false;
    absl::StrAppend(&out, AbslView(key), "=", value);
  }
  out += ')';
  return out;
}

uint64_t StreamSeed(uint64_t seed, const EncodeContext& ctx) {
  return Mix64(Mix64(Mix64(seed ^ ctx.worker_id) ^ ctx.round) ^ ctx.slice_id);
}

std::string_view Gathered(std::span<const std::string_view> pieces) {
  size_t total = 0;
  const std::string_view* only = nullptr;
  for (const std::string_view& p : pieces) {
    total += p.size();
    if (!p.empty()) only = &p;
  }
  if (only == nullptr) return {};
  if (only->size() == total) return *only;
  struct GatherTag;
  const std::span<char> scratch = core::ThreadScratch<char, GatherTag>(total);
  size_t at = 0;
  for (std::string_view p : pieces) {
    if (p.empty()) continue;  // memcpy from a null data() is undefined even for 0 bytes
    std::memcpy(scratch.data() + at, p.data(), p.size());
    at += p.size();
  }
  return std::string_view(scratch.data(), total);
}

bool IsDensePayload(PayloadFormat format, std::span<const std::string_view> pieces,
                    size_t value_bytes, size_t numel) {
  size_t total = 0;
  const std::string_view* first = nullptr;
  for (const std::string_view& p : pieces) {
    total += p.size();
    if (first == nullptr && !p.empty()) first = &p;
  }
  return total == 1 + value_bytes * numel &&
         static_cast<unsigned char>((*first)[0]) == FormatByte(format);
}

absl::Status DecodeAddWidened16(const Codec& codec, Widen16 widen,
                                std::span<const std::string_view> pieces, std::span<float> held,
                                std::span<float> out) {
  return DecodeAddDense(codec, 2, pieces, held, out,
                        [widen](const unsigned char* words, std::span<float> held_part,
                                std::span<float> out_part) {
                          alignas(64) float widened[kMaxBlockBytes / 2];
                          const std::span<float> values(widened, out_part.size());
                          widen(words, values);
                          return core::AddFiniteKeep(held_part, values, out_part);
                        });
}

absl::Status RefusedSum(const Codec& codec, std::span<const std::string_view> pieces,
                        std::span<const float> held, std::span<float> out) {
  PS_RETURN_IF_ERROR(codec.DecodePieces(pieces, out));
  return NonFiniteSum(held);
}

absl::Status NonFiniteSum(std::span<const float> out) {
  const ptrdiff_t i = core::FindNonFinite(out);
  if (i < 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("value ", i, " is not finite once the change is applied"));
}

absl::Status CheckEncodable(std::string_view spec, std::span<const float> values) {
  if (const ptrdiff_t i = core::FindNonFinite(values); i >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(AbslView(spec), ": cannot encode value ", i,
                                                   ": not finite (", values[i], ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckDecoded16(std::string_view spec, const unsigned char* words,
                            std::span<const float> out) {
  if (const ptrdiff_t i = core::FindNonFinite(out); i >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(AbslView(spec), ": value ", i, " is not finite (bits 0x",
                     absl::Hex(Load16(words, static_cast<size_t>(i)), absl::kZeroPad4), ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckFormat(std::string_view spec, uint8_t byte, PayloadFormat expected) {
  if (byte == FormatByte(expected)) return absl::OkStatus();
  const std::string_view got = PayloadFormatName(byte);
  return absl::InvalidArgumentError(absl::StrCat(
      AbslView(spec), ": payload in ",
      got.empty() ? absl::StrCat("format ", int{byte}, ", which no codec writes")
                  : absl::StrCat("the ", AbslView(got), " format (", int{byte}, ")"),
      ", expected the ", AbslView(PayloadFormatName(FormatByte(expected))), " format (",
      int{FormatByte(expected)}, ")"));
}

absl::Status CheckDensePayload(const Codec& codec, std::string_view bytes,
                               size_t bytes_per_value, size_t numel) {
  const absl::string_view spec = AbslView(codec.spec());
  // numel is the size of an existing float buffer, so this cannot overflow.
  const size_t expected = 1 + bytes_per_value * numel;
  if (bytes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(spec, ": empty payload, expected ", expected,
                                                   " bytes for ", numel, " values"));
  }
  PS_RETURN_IF_ERROR(CheckFormat(codec.spec(), static_cast<uint8_t>(bytes[0]), codec.format()));
  if (bytes.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(spec, ": payload is ", bytes.size(),
                                                   " bytes, expected ", expected, " (1 + ",
                                                   bytes_per_value, " * ", numel, " values)"));
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace ps::codecs
