// Sparse codecs: a sparsifier (topk, threshold, randk) composed with an index stage
// and a value stage, named by one spec: "topk(0.01)+bloom(p0, fpr=0.01)+fp16",
// "threshold(0.5)+varint+raw", "randk(0.01, seed=7)+fp16". Wire format and the
// choices behind it: docs/codecs.md "Sparse codecs".
//
//   0  u8      format version (1)
//   1  u8      index stage id (0 = random-k seed, 1 raw, 2 varint, 3 bitmap, 4 rle, 5 bloom)
//   2  u8      value stage id (1 raw, 2 fp16, 3 deflate, 4 polyfit)
//      varint  numel (must equal the slice size)
//      varint  count: values sent (<= numel)
//      varint  index section length, then the section
//      varint  value section length, then the section
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codecs/codec.h"
#include "codecs/codec_internal.h"
#include "codecs/compressed.h"
#include "codecs/sparse_internal.h"
#include "codecs/wire_internal.h"
#include "core/spec.h"
#include "core/status.h"

namespace ps::codecs {
namespace {

using internal::IndexKind;
using internal::IndexStage;
using internal::SparseConfig;
using internal::Sparsifier;
using internal::ValueKind;
using internal::ValueStage;

// Salt for the Bloom hash seed, so it differs from the stream's other uses.
constexpr uint64_t kBloomSeedSalt = 0xb100'3f11'7e25'eed5ull;

// The header and both sections (the layout at the top of this file).
std::string AssemblePayload(const SparseConfig& config, size_t numel, size_t count,
                            const std::string& index_section, const std::string& value_section) {
  std::string bytes;
  bytes.reserve(3 + 4 * 10 + index_section.size() + value_section.size());
  internal::PutU8(&bytes, FormatByte(PayloadFormat::kSparse));
  internal::PutU8(&bytes, static_cast<uint8_t>(config.index.kind));
  internal::PutU8(&bytes, static_cast<uint8_t>(config.value.kind));
  internal::PutVarint(&bytes, numel);
  internal::PutVarint(&bytes, count);
  internal::PutVarint(&bytes, index_section.size());
  bytes += index_section;
  internal::PutVarint(&bytes, value_section.size());
  bytes += value_section;
  return bytes;
}

}  // namespace

namespace internal {

double EstimatedPayloadBytes(const SparseConfig& c, size_t numel, size_t count) {
  const double k = static_cast<double>(count);
  const uint64_t mean_gap = count == 0 ? numel : std::max<uint64_t>(1, numel / count);
  double index = 0;
  double sent = k;
  switch (c.index.kind) {
    case IndexKind::kSeed:
      index = 8;
      break;
    case IndexKind::kRaw:
      index = 4 * k;
      break;
    case IndexKind::kVarint:
      index = k * static_cast<double>(VarintSize(mean_gap));
      break;
    case IndexKind::kBitmap:
      index = static_cast<double>((numel + 7) / 8);
      break;
    case IndexKind::kRle:
      index = k * static_cast<double>(VarintSize(mean_gap) + 1);
      break;
    case IndexKind::kBloom:
      index = 30 + static_cast<double>(BloomShapeFor(count, numel, c.index.fpr).bytes);
      if (c.index.policy == BloomPolicy::kP0) {
        sent += c.index.fpr * static_cast<double>(numel - count);
      }
      break;
  }
  double value = 0;
  switch (c.value.kind) {
    case ValueKind::kRaw:
      value = 4 * sent;
      break;
    case ValueKind::kFp16:
      value = 2 * sent;
      break;
    case ValueKind::kDeflate:
    case ValueKind::kPolyfit:
      value = static_cast<double>(MaxValueBytes(c.value, static_cast<size_t>(sent)));
      break;
  }
  const double header = 3 + static_cast<double>(VarintSize(numel) + VarintSize(count) +
                                                VarintSize(static_cast<uint64_t>(index)) +
                                                VarintSize(static_cast<uint64_t>(value)));
  return header + index + value;
}

}  // namespace internal

namespace {

class SparseCodec final : public Codec {
 public:
  SparseCodec(SparseConfig config, const CodecOptions& options)
      : Codec(PayloadFormat::kSparse), config_(std::move(config)), options_(options) {}

  std::string_view spec() const override { return config_.spec; }

  absl::Status Encode(std::span<const float> values, const EncodeContext& ctx,
                      std::string* out) override {
    PS_RETURN_IF_ERROR(internal::CheckEncodable(config_.spec, values));
    const size_t n = values.size();
    if (n > std::numeric_limits<uint32_t>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat(config_.spec, ": cannot encode ", n, " values (indices are 32-bit)"));
    }
    const uint64_t stream = internal::StreamSeed(options_.seed, ctx);
    std::vector<uint32_t> kept;
    switch (config_.sparsifier) {
      case Sparsifier::kTopk: {
        const size_t k = internal::KeepCount(config_.ratio, n);
        if (config_.cat) {
          const double fixed = ctx.fixed_cost_bytes >= 0 ? ctx.fixed_cost_bytes : config_.overhead;
          kept = internal::TopkCat(values, internal::KeepCount(config_.min_ratio, n), k, fixed,
                                   [this, n](size_t count) {
                                     return internal::EstimatedPayloadBytes(config_, n, count);
                                   })
                     .kept;
        } else {
          kept = config_.sampled ? internal::TopkSampled(values, k, stream)
                                 : internal::TopkExact(values, k);
        }
        break;
      }
      case Sparsifier::kThreshold:
        kept = internal::ThresholdSelect(values, static_cast<float>(config_.tau));
        break;
      case Sparsifier::kRandk:
        return EncodeRandk(values, ctx, stream, out);
    }
    const auto gather = [values](std::span<const uint32_t> sent, std::span<float> sent_values) {
      for (size_t j = 0; j < sent.size(); ++j) sent_values[j] = values[sent[j]];
      return absl::OkStatus();
    };
    return internal::EncodeSelected(config_, kept, n, stream, gather, out, nullptr, nullptr);
  }

  absl::Status Decode(std::string_view bytes, std::span<float> out) const override {
    internal::WireReader r(config_.spec, bytes);
    PS_RETURN_IF_ERROR(r.Format(PayloadFormat::kSparse));
    uint8_t index_id = 0, value_id = 0;
    PS_RETURN_IF_ERROR(r.U8(&index_id, "the index stage id"));
    if (index_id != static_cast<uint8_t>(config_.index.kind)) {
      return r.Error(absl::StrCat("payload has index stage ", StageName(index_id, true),
                                  ", expected ",
                                  internal::AbslView(internal::IndexKindName(config_.index.kind))));
    }
    PS_RETURN_IF_ERROR(r.U8(&value_id, "the value stage id"));
    if (value_id != static_cast<uint8_t>(config_.value.kind)) {
      return r.Error(absl::StrCat("payload has value stage ", StageName(value_id, false),
                                  ", expected ",
                                  internal::AbslView(internal::ValueKindName(config_.value.kind))));
    }
    PS_RETURN_IF_ERROR(r.Numel(out.size()));
    const uint64_t numel = out.size();
    uint64_t count = 0, index_len = 0, value_len = 0;
    PS_RETURN_IF_ERROR(r.Varint(&count, "the value count"));
    if (count > numel) {
      return r.Error(absl::StrCat("value count ", count, " exceeds the ", numel, " values"));
    }
    std::string_view index_section, value_section;
    PS_RETURN_IF_ERROR(r.Varint(&index_len, "the index section length"));
    PS_RETURN_IF_ERROR(r.Bytes(index_len, &index_section, "the index section"));
    PS_RETURN_IF_ERROR(r.Varint(&value_len, "the value section length"));
    PS_RETURN_IF_ERROR(r.Bytes(value_len, &value_section, "the value section"));
    PS_RETURN_IF_ERROR(r.Finish("the value section"));

    std::vector<uint32_t> indices;
    if (config_.index.kind == IndexKind::kSeed) {
      if (index_section.size() != 8) {
        return r.Error(
            absl::StrCat("random-k seed section is ", index_section.size(), " bytes, expected 8"));
      }
      internal::WireReader seed_reader(config_.spec, index_section);
      uint64_t mask_seed = 0;
      PS_RETURN_IF_ERROR(seed_reader.U64(&mask_seed, "the mask seed"));
      indices = SupportIndices({mask_seed, static_cast<uint32_t>(count)}, numel);
    } else {
      PS_RETURN_IF_ERROR(internal::DecodeIndices(config_.spec, config_.index, index_section, numel,
                                                 count, &indices));
    }
    std::vector<float> values(count);
    PS_RETURN_IF_ERROR(internal::DecodeValues(config_.spec, config_.value, value_section, values));
    std::fill(out.begin(), out.end(), 0.0f);
    for (size_t j = 0; j < count; ++j) out[indices[j]] = values[j];
    return absl::OkStatus();
  }

  size_t MaxEncodedBytes(size_t numel) const override {
    size_t count = numel;
    if (config_.sparsifier != Sparsifier::kThreshold) {
      const size_t k = internal::KeepCount(config_.ratio, numel);
      count = config_.sampled ? std::min(numel, 2 * k) : k;
    }
    if (config_.index.kind == IndexKind::kBloom &&
        config_.index.policy == internal::BloomPolicy::kP0) {
      count = numel;  // every positive, false ones included
    }
    return 3 + 4 * 10 + internal::MaxIndexBytes(config_.index, numel, count) +
           internal::MaxValueBytes(config_.value, count);
  }

  SharedStructure shared_structure() const override {
    return config_.sparsifier == Sparsifier::kRandk ? SharedStructure::kSeededSupport
                                                    : SharedStructure::kNone;
  }

 private:
  static std::string StageName(uint8_t id, bool index) {
    if (index && id <= static_cast<uint8_t>(IndexKind::kBloom)) {
      return std::string(internal::IndexKindName(static_cast<IndexKind>(id)));
    }
    if (!index && id >= 1 && id <= static_cast<uint8_t>(ValueKind::kPolyfit)) {
      return std::string(internal::ValueKindName(static_cast<ValueKind>(id)));
    }
    return absl::StrCat("id ", id);
  }

  absl::Status EncodeRandk(std::span<const float> values, const EncodeContext& ctx, uint64_t stream,
                           std::string* out) const {
    const size_t n = values.size();
    // A global mask depends on (seed, round, slice) only: every worker draws it alike.
    EncodeContext global = ctx;
    global.worker_id = 0;
    const uint64_t mask_seed =
        config_.seed.has_value() ? internal::StreamSeed(*config_.seed, global) : stream;
    const std::vector<uint32_t> sent = SupportIndices(
        {mask_seed, static_cast<uint32_t>(internal::KeepCount(config_.ratio, n))}, n);
    std::string index_section;
    internal::PutU64(&index_section, mask_seed);
    std::vector<float> sent_values(sent.size());
    const float scale =
        config_.unbiased && !sent.empty()
            ? static_cast<float>(static_cast<double>(n) / static_cast<double>(sent.size()))
            : 1.0f;
    for (size_t j = 0; j < sent.size(); ++j) sent_values[j] = values[sent[j]] * scale;
    if (scale != 1.0f) {
      for (size_t j = 0; j < sent.size(); ++j) {
        if (!std::isfinite(sent_values[j])) {
          return absl::InvalidArgumentError(absl::StrCat(config_.spec, ": cannot encode value ",
                                                         sent[j], ": not finite once scaled by ",
                                                         scale));
        }
      }
    }
    std::string value_section;
    internal::EncodeValues(config_.value, sent_values, &value_section);
    *out = AssemblePayload(config_, n, sent.size(), index_section, value_section);
    return absl::OkStatus();
  }

  const SparseConfig config_;
  const CodecOptions options_;
};

constexpr std::string_view kIndexNames[] = {"raw", "varint", "bitmap", "rle", "bloom"};
constexpr std::string_view kValueNames[] = {"raw", "fp16", "deflate", "polyfit"};

bool IsIndexName(std::string_view name) {
  return std::find(std::begin(kIndexNames), std::end(kIndexNames), name) != std::end(kIndexNames);
}
bool IsValueName(std::string_view name) {
  return std::find(std::begin(kValueNames), std::end(kValueNames), name) != std::end(kValueNames);
}
std::string Known(std::span<const std::string_view> names) {
  std::string s;
  for (std::string_view n : names)
    absl::StrAppend(&s, s.empty() ? "" : ", ", internal::AbslView(n));
  return s;
}

// Binds an index stage; returns its canonical string.
absl::StatusOr<std::string> ParseIndex(const core::StageSpec& stage, IndexStage* index) {
  if (stage.name == "bloom") {
    PS_ASSIGN_OR_RETURN(core::StageArgs args, core::StageArgs::Bind(stage, {"policy", "fpr"}));
    PS_ASSIGN_OR_RETURN(const size_t policy, args.Choice("policy", {"p0", "p1", "p2"}, 0));
    PS_ASSIGN_OR_RETURN(const double fpr, args.Double("fpr", 0.01, 0));
    if (fpr >= 1)
      return absl::InvalidArgumentError(absl::StrCat("bloom: fpr must be < 1, got ", fpr));
    index->kind = IndexKind::kBloom;
    index->policy = static_cast<internal::BloomPolicy>(policy);
    index->fpr = fpr;
    return internal::StageString(
        "bloom", {{"policy", absl::StrCat("p", policy)}, {"fpr", internal::FormatNumber(fpr)}});
  }
  PS_RETURN_IF_ERROR(core::StageArgs::Bind(stage, {}).status());
  for (size_t i = 0; i < std::size(kIndexNames); ++i) {
    if (stage.name == kIndexNames[i]) index->kind = static_cast<IndexKind>(i + 1);
  }
  return stage.name;
}

absl::StatusOr<std::string> ParseValue(const core::StageSpec& stage, ValueStage* value) {
  if (stage.name == "deflate") {
    PS_ASSIGN_OR_RETURN(core::StageArgs args, core::StageArgs::Bind(stage, {"level"}));
    PS_ASSIGN_OR_RETURN(const int64_t level, args.Int("level", 6, 0, 9));
    value->kind = ValueKind::kDeflate;
    value->deflate_level = static_cast<int>(level);
    return internal::StageString("deflate", {{"level", absl::StrCat(level)}});
  }
  if (stage.name == "polyfit") {
    PS_ASSIGN_OR_RETURN(core::StageArgs args, core::StageArgs::Bind(stage, {"degree"}));
    PS_ASSIGN_OR_RETURN(const int64_t degree, args.Int("degree", 5, 0, internal::kPolyMaxDegree));
    value->kind = ValueKind::kPolyfit;
    value->poly_degree = static_cast<int>(degree);
    return internal::StageString("polyfit", {{"degree", absl::StrCat(degree)}});
  }
  PS_RETURN_IF_ERROR(core::StageArgs::Bind(stage, {}).status());
  value->kind = stage.name == "fp16" ? ValueKind::kFp16 : ValueKind::kRaw;
  return stage.name;
}

absl::StatusOr<double> Ratio(const core::StageArgs& args, std::string_view name) {
  PS_ASSIGN_OR_RETURN(const double ratio, args.Double("ratio", 0.01, 0));
  if (ratio > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(internal::AbslView(name), ": ratio must be <= 1, got ", ratio));
  }
  return ratio;
}

absl::StatusOr<SparseConfig> ParseSparse(Sparsifier sparsifier, internal::Stages stages) {
  SparseConfig c;
  c.sparsifier = sparsifier;
  const core::StageSpec& first = stages[0];
  std::string head;
  switch (sparsifier) {
    case Sparsifier::kTopk: {
      PS_ASSIGN_OR_RETURN(
          core::StageArgs args,
          core::StageArgs::Bind(first, {"ratio", "method", "level", "min", "overhead"}));
      PS_ASSIGN_OR_RETURN(c.ratio, Ratio(args, "topk"));
      PS_ASSIGN_OR_RETURN(const size_t method, args.Choice("method", {"exact", "sampled"}, 0));
      c.sampled = method == 1;
      PS_ASSIGN_OR_RETURN(const size_t level, args.Choice("level", {"fixed", "cat"}, 0));
      c.cat = level == 1;
      const std::string ratio = internal::FormatNumber(c.ratio);
      const std::string method_name = c.sampled ? "sampled" : "exact";
      if (!c.cat) {
        if (args.Has("min") || args.Has("overhead")) {
          return absl::InvalidArgumentError(
              "topk: min and overhead are arguments of level=cat (the ratio is fixed otherwise)");
        }
        head = internal::StageString("topk", {{"ratio", ratio}, {"method", method_name}});
        break;
      }
      if (c.sampled) {
        return absl::InvalidArgumentError(
            "topk: level=cat chooses k from the sorted magnitudes, so it needs method=exact");
      }
      PS_ASSIGN_OR_RETURN(c.min_ratio, args.Double("min", 0.001, 0));
      if (c.min_ratio > c.ratio) {
        return absl::InvalidArgumentError(absl::StrCat(
            "topk: level=cat needs min <= ratio (the most a payload keeps), got min=", c.min_ratio,
            " and ratio=", c.ratio));
      }
      PS_ASSIGN_OR_RETURN(c.overhead, args.Double("overhead", 16384, -1));
      if (c.overhead < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("topk: overhead (bytes) must be >= 0, got ", c.overhead));
      }
      head = internal::StageString("topk", {{"ratio", ratio},
                                            {"method", method_name},
                                            {"level", "cat"},
                                            {"min", internal::FormatNumber(c.min_ratio)},
                                            {"overhead", internal::FormatNumber(c.overhead)}});
      break;
    }
    case Sparsifier::kThreshold: {
      PS_ASSIGN_OR_RETURN(core::StageArgs args, core::StageArgs::Bind(first, {"tau"}));
      PS_ASSIGN_OR_RETURN(c.tau, args.Double("tau", 0.01, 0));
      if (!std::isfinite(static_cast<float>(c.tau))) {
        return absl::InvalidArgumentError(
            absl::StrCat("threshold: tau ", c.tau, " is not a finite float"));
      }
      head = internal::StageString("threshold", {{"tau", internal::FormatNumber(c.tau)}});
      break;
    }
    case Sparsifier::kRandk: {
      PS_ASSIGN_OR_RETURN(core::StageArgs args,
                          core::StageArgs::Bind(first, {"ratio", "seed", "scale"}));
      PS_ASSIGN_OR_RETURN(c.ratio, Ratio(args, "randk"));
      if (args.Has("seed")) {
        PS_ASSIGN_OR_RETURN(const int64_t seed,
                            args.Int("seed", 0, 0, std::numeric_limits<int64_t>::max()));
        c.seed = static_cast<uint64_t>(seed);
      }
      PS_ASSIGN_OR_RETURN(const size_t scale, args.Choice("scale", {"none", "unbiased"}, 0));
      c.unbiased = scale == 1;
      const std::string ratio = internal::FormatNumber(c.ratio);
      const std::string scale_name = c.unbiased ? "unbiased" : "none";
      head = c.seed.has_value()
                 ? internal::StageString(
                       "randk",
                       {{"ratio", ratio}, {"seed", absl::StrCat(*c.seed)}, {"scale", scale_name}})
                 : internal::StageString("randk", {{"ratio", ratio}, {"scale", scale_name}});
      break;
    }
  }
  const std::string& name = first.name;
  std::string index_spec = "raw", value_spec = "raw";
  if (sparsifier == Sparsifier::kRandk) {
    c.index.kind = IndexKind::kSeed;
    if (stages.size() >= 2 && (stages.size() > 2 || !IsValueName(stages[1].name))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "randk sends no indices (its mask comes from a seed), so no index stage: '+",
          stages[1].name, "' cannot follow it; write randk(...)+<value codec> with one of ",
          Known(kValueNames)));
    }
    if (stages.size() == 2) {
      PS_ASSIGN_OR_RETURN(value_spec, ParseValue(stages[1], &c.value));
    }
    c.spec = absl::StrCat(head, "+", value_spec);
    return c;
  }
  if (stages.size() > 3) {
    return absl::InvalidArgumentError(absl::StrCat(name,
                                                   " takes an index and a value stage at most; '+",
                                                   stages[3].name, "' is one too many"));
  }
  if (stages.size() == 2) {
    // One stage: an index codec if it names one ("raw" is both: the same codec
    // either way), else a value codec after raw indices.
    if (IsIndexName(stages[1].name)) {
      PS_ASSIGN_OR_RETURN(index_spec, ParseIndex(stages[1], &c.index));
    } else if (IsValueName(stages[1].name)) {
      PS_ASSIGN_OR_RETURN(value_spec, ParseValue(stages[1], &c.value));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("'+", stages[1].name, "' is neither an index codec (", Known(kIndexNames),
                       ") nor a value codec (", Known(kValueNames), ")"));
    }
  }
  if (stages.size() == 3) {
    if (!IsIndexName(stages[1].name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("'+", stages[1].name, "' is not an index codec (", Known(kIndexNames), ")"));
    }
    if (!IsValueName(stages[2].name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("'+", stages[2].name, "' is not a value codec (", Known(kValueNames), ")"));
    }
    PS_ASSIGN_OR_RETURN(index_spec, ParseIndex(stages[1], &c.index));
    PS_ASSIGN_OR_RETURN(value_spec, ParseValue(stages[2], &c.value));
  }
  c.spec = absl::StrCat(head, "+", index_spec, "+", value_spec);
  return c;
}

absl::StatusOr<std::unique_ptr<Codec>> MakeSparse(Sparsifier sparsifier, internal::Stages stages,
                                                  const CodecOptions& options) {
  PS_ASSIGN_OR_RETURN(SparseConfig config, ParseSparse(sparsifier, stages));
  return std::unique_ptr<Codec>(std::make_unique<SparseCodec>(std::move(config), options));
}

}  // namespace

std::optional<SeededSupport> SeededSupportOf(std::string_view randk_payload) {
  internal::WireReader r("randk", randk_payload);
  uint8_t index_id = 0, value_id = 0;
  uint64_t numel = 0, count = 0, index_len = 0, mask_seed = 0;
  if (!r.Format(PayloadFormat::kSparse).ok() || !r.U8(&index_id, "").ok() ||
      index_id != static_cast<uint8_t>(IndexKind::kSeed) || !r.U8(&value_id, "").ok() ||
      !r.Varint(&numel, "").ok() || !r.Varint(&count, "").ok() || count > numel ||
      count > std::numeric_limits<uint32_t>::max() || !r.Varint(&index_len, "").ok() ||
      index_len != 8 || !r.U64(&mask_seed, "").ok()) {
    return std::nullopt;
  }
  return SeededSupport{mask_seed, static_cast<uint32_t>(count)};
}

std::vector<uint32_t> SupportIndices(const SeededSupport& support, size_t numel) {
  return internal::SampleSortedIndices(support.mask_seed, support.k, numel);
}

namespace internal {

std::vector<std::string_view> SparseStageNames() {
  std::vector<std::string_view> names(std::begin(kIndexNames), std::end(kIndexNames));
  names.insert(names.end(), std::begin(kValueNames), std::end(kValueNames));
  return names;
}

absl::StatusOr<SparseConfig> ParseSparseSpec(std::string_view spec) {
  PS_ASSIGN_OR_RETURN(std::vector<core::StageSpec> stages, core::ParseSpec(spec, "codec spec"));
  const std::string& name = stages.front().name;
  if (name == "topk") return ParseSparse(Sparsifier::kTopk, stages);
  if (name == "threshold") return ParseSparse(Sparsifier::kThreshold, stages);
  if (name == "randk") return ParseSparse(Sparsifier::kRandk, stages);
  return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not a sparse codec"));
}

absl::Status EncodeSelected(const SparseConfig& config, std::span<const uint32_t> kept,
                            size_t numel, uint64_t stream, const GatherValues& gather,
                            std::string* out, std::vector<uint32_t>* sent_out,
                            std::vector<float>* decoded) {
  std::string index_section;
  std::vector<uint32_t> sent;
  EncodeIndices(config.index, kept, numel, Mix64(stream ^ kBloomSeedSalt), &index_section, &sent);
  std::vector<float> sent_values(sent.size());
  PS_RETURN_IF_ERROR(gather(sent, sent_values));
  std::string value_section;
  EncodeValues(config.value, sent_values, &value_section);
  if (decoded != nullptr) {
    decoded->resize(sent.size());
    PS_RETURN_IF_ERROR(DecodeValues(config.spec, config.value, value_section, *decoded));
  }
  *out = AssemblePayload(config, numel, sent.size(), index_section, value_section);
  if (sent_out != nullptr) *sent_out = std::move(sent);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Codec>> MakeTopkCodec(Stages stages, const CodecOptions& options) {
  return MakeSparse(Sparsifier::kTopk, stages, options);
}
absl::StatusOr<std::unique_ptr<Codec>> MakeThresholdCodec(Stages stages,
                                                          const CodecOptions& options) {
  return MakeSparse(Sparsifier::kThreshold, stages, options);
}
absl::StatusOr<std::unique_ptr<Codec>> MakeRandkCodec(Stages stages, const CodecOptions& options) {
  return MakeSparse(Sparsifier::kRandk, stages, options);
}
}  // namespace internal

}  // namespace ps::codecs
