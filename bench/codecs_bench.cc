// `ps-bench codecs`: per codec spec and data set, single-thread encode and decode
// throughput (fp32 input bytes per second, also as a ratio against the memory read
// bandwidth measured in the same run), compression ratio and relative L2 error
// (docs/bench.md). Only the public codecs API is used (MakeCodec, Encode, Decode); the
// default specs come from the generic codec tests' list (ExampleSpecs()) plus a few
// aggressive settings, so codecs added later are measured without touching this file.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "bench/commands.h"
#include "codecs/codec.h"
#include "codecs/device_encoder.h"
#include "core/device.h"
#include "core/fp32_bytes.h"
#include "core/layout.h"
#include "gpu/cuda_device.h"
#include "tests/codecs/example_specs.h"

namespace ps::bench {
namespace {

// Measured by default besides every ExampleSpecs() entry: the most aggressive
// settings, the ones with a throughput target (docs/codecs.md, "Speed and quality"). A spec that
// this build's MakeCodec refuses (a codec not there yet, or other argument names) is skipped with a
// note.
constexpr const char* kAggressiveSpecs[] = {
    "3lc(s=1.9)", "topk(0.01)+varint+fp16", "topk(0.001)+varint+fp16", "sign", "terngrad", "int8",
};

struct CodecsFlags {
  std::vector<std::string> codecs;  // empty: DefaultSpecs()
  std::string data;                 // gaussian|real|both; empty: gaussian (+ real with --gradients)
  std::string gradients;
  std::string numel = "2^22";
  std::string slice_elems = absl::StrCat(core::kDefaultSliceElems);
  uint32_t matrix_cols = 256;
  int repeats = 3;
  double min_seconds = 0.1;
  std::string memread_bytes = "1G";
  std::string json;
  uint64_t seed = 1;
  bool quick = false;
  bool list = false;
  bool apply = false;
  std::string device = "cpu";
};

struct CodecsGiven {
  CLI::Option* numel = nullptr;
  CLI::Option* slice_elems = nullptr;
  CLI::Option* repeats = nullptr;
  CLI::Option* min_seconds = nullptr;
  CLI::Option* memread_bytes = nullptr;
};

struct DataSet {
  std::string name;  // "gaussian" or "real"
  std::vector<float> values;
};

struct CodecRow {
  std::string codec;
  std::string data;
  Timing encode;
  Timing decode;
  Timing apply;          // --apply: DecodeAddPieces into what is held and the caller's buffer
  Timing apply_unfused;  // --apply: the same result in the worker's former five steps
  Timing change;         // --apply: EncodeChange, a shard's side of a compressed pull
  double ratio = 0;
  double rel_l2_error = 0;
  uint64_t numel = 0;
};

std::vector<std::string> DefaultSpecs() {
  std::vector<std::string> specs;
  for (const codecs::testing::ExampleSpec& e : codecs::testing::ExampleSpecs()) {
    specs.push_back(e.spec);
  }
  for (const char* spec : kAggressiveSpecs) specs.emplace_back(spec);
  return specs;
}

// Splits each flag value at ';' and at commas outside parentheses ("fp16,int8(bucket=64)").
std::vector<std::string> SplitSpecs(const std::vector<std::string>& texts) {
  std::vector<std::string> specs;
  for (const std::string& text : texts) {
    for (absl::string_view part : absl::StrSplit(text, ';')) {
      for (std::string& spec : SplitList(std::string_view(part.data(), part.size()))) {
        specs.push_back(std::move(spec));
      }
    }
  }
  return specs;
}

// Reads a raw little-endian fp32 file (concatenated gradient vectors): the whole file,
// a positive multiple of 4 bytes, every value finite.
absl::StatusOr<std::vector<float>> ReadGradients(const std::string& path) {
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot open gradients file '", path, "'"));
  const std::streamoff size = file.tellg();
  if (size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("gradients file '", path, "' is empty"));
  }
  if (size % 4 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradients file '", path, "' has ", size,
                     " bytes, not a multiple of 4: expected raw little-endian float32 values"));
  }
  std::vector<float> values(static_cast<size_t>(size / 4));
  file.seekg(0);
  file.read(reinterpret_cast<char*>(values.data()), size);
  if (!file) return absl::UnavailableError(absl::StrCat("cannot read gradients file '", path, "'"));
  static_assert(std::endian::native == std::endian::little, "the file is little-endian");
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return absl::InvalidArgumentError(absl::StrCat("gradients file '", path, "': value ", i,
                                                     " (byte offset ", 4 * i, ") is not finite (",
                                                     values[i], ")"));
    }
  }
  return values;
}

// One codec instance encoding a whole data set slice by slice, the way a worker encodes
// a tensor: slice s holds values [s * slice_elems, ...), EncodeContext{round, s, worker 0}.
class SlicedCodec {
 public:
  SlicedCodec(std::unique_ptr<codecs::Codec> codec, std::span<const float> values,
              size_t slice_elems, uint32_t matrix_cols)
      : codec_(std::move(codec)),
        values_(values),
        slice_elems_(slice_elems),
        matrix_cols_(matrix_cols),
        encoded_((values.size() + slice_elems - 1) / slice_elems) {}

  size_t num_slices() const { return encoded_.size(); }
  std::span<const float> Slice(std::span<const float> all, size_t s) const {
    const size_t begin = s * slice_elems_;
    return all.subspan(begin, std::min(slice_elems_, all.size() - begin));
  }

  // Encodes every slice into `out` (one payload per slice) for `round`.
  absl::Status EncodeAll(uint64_t round, std::vector<std::string>& out) {
    for (size_t s = 0; s < encoded_.size(); ++s) {
      const std::span<const float> slice = Slice(values_, s);
      const codecs::EncodeContext ctx{
          .round = round,
          .slice_id = static_cast<uint32_t>(s),
          .worker_id = 0,
          .matrix_cols = matrix_cols_ != 0 && slice.size() % matrix_cols_ == 0 ? matrix_cols_ : 0};
      if (absl::Status st = codec_->Encode(slice, ctx, &out[s]); !st.ok()) {
        return absl::Status(st.code(), absl::StrCat("encode slice ", s, ": ", st.message()));
      }
    }
    return absl::OkStatus();
  }

  // --apply: what a worker does with a pulled change of each slice (HeldModel::Arrived):
  // the change in `in` added to `held`, the sum written to `dst` and kept in `held`. Fused:
  // DecodeAddPieces, which writes both in one pass. Unfused, as the worker did before:
  // DecodePieces into a scratch buffer, AddInto, FindNonFinite, copy into held, copy
  // into dst. Both give the same bits (MeasureCell checks it).
  absl::Status ApplyAll(const std::vector<std::string>& in, bool fused, std::span<float> held,
                        std::span<float> dst, std::span<float> scratch) const {
    for (size_t s = 0; s < in.size(); ++s) {
      const std::span<float> h = Slice(held, s);
      const std::span<float> d = Slice(dst, s);
      const std::string_view piece = in[s];
      const std::span<const std::string_view> pieces(&piece, 1);
      if (fused) {
        if (absl::Status st = codec_->DecodeAddPieces(pieces, h, d); !st.ok()) return st;
        continue;
      }
      const std::span<float> change = scratch.first(h.size());
      if (absl::Status st = codec_->DecodePieces(pieces, change); !st.ok()) return st;
      core::AddInto(change, h);
      if (core::FindNonFinite(change) >= 0) return absl::InternalError("a sum is not finite");
      std::memcpy(h.data(), change.data(), h.size_bytes());
      std::memcpy(d.data(), h.data(), h.size_bytes());
    }
    return absl::OkStatus();
  }
  // --apply: what a shard does for a compressed pull of each slice (pull_delta.h): the
  // change from `held` to the values encoded, and held advanced by its decoded values.
  absl::Status ChangeAll(std::span<float> held, std::vector<std::string>& out) {
    for (size_t s = 0; s < out.size(); ++s) {
      const size_t begin = s * slice_elems_;
      const std::span<float> h = Slice(held, s);
      if (absl::Status st =
              codec_->EncodeChange(values_.subspan(begin, h.size()), h, {}, &out[s]);
          !st.ok()) {
        return absl::Status(st.code(), absl::StrCat("change of slice ", s, ": ", st.message()));
      }
    }
    return absl::OkStatus();
  }
  std::span<float> Slice(std::span<float> all, size_t s) const {
    const size_t begin = s * slice_elems_;
    return all.subspan(begin, std::min(slice_elems_, all.size() - begin));
  }

  absl::Status DecodeAll(const std::vector<std::string>& in, std::span<float> out) const {
    for (size_t s = 0; s < in.size(); ++s) {
      const size_t begin = s * slice_elems_;
      const std::span<float> slice = out.subspan(begin, std::min(slice_elems_, out.size() - begin));
      if (absl::Status st = codec_->Decode(in[s], slice); !st.ok()) {
        return absl::Status(st.code(), absl::StrCat("decode slice ", s, ": ", st.message()));
      }
    }
    return absl::OkStatus();
  }

  const codecs::Codec& codec() const { return *codec_; }
  std::vector<std::string>& encoded() { return encoded_; }

 private:
  std::unique_ptr<codecs::Codec> codec_;
  std::span<const float> values_;
  size_t slice_elems_;
  uint32_t matrix_cols_;
  std::vector<std::string> encoded_;
};

// Measures one (codec, data) cell. The error and the ratio come from round 0 of a fresh
// codec instance (worker-side state such as a warm start has not built up); the timed
// encodes then continue with rounds 1, 2, ... on the same instance, and decode is timed
// on the round-0 payloads.
absl::StatusOr<CodecRow> MeasureCell(const std::string& spec, const DataSet& data,
                                     size_t slice_elems, const CodecsFlags& flags,
                                     const TimingOptions& timing_options) {
  absl::StatusOr<std::unique_ptr<codecs::Codec>> made =
      codecs::MakeCodec(spec, codecs::CodecOptions{.seed = flags.seed});
  if (!made.ok()) return made.status();
  SlicedCodec sliced(*std::move(made), data.values, slice_elems, flags.matrix_cols);
  std::vector<std::string>& encoded = sliced.encoded();
  if (absl::Status st = sliced.EncodeAll(0, encoded); !st.ok()) return st;
  uint64_t encoded_bytes = 0;
  for (size_t s = 0; s < encoded.size(); ++s) {
    const size_t numel = sliced.Slice(data.values, s).size();
    if (encoded[s].size() > sliced.codec().MaxEncodedBytes(numel)) {
      return absl::InternalError(absl::StrCat("slice ", s, ": ", encoded[s].size(),
                                              " bytes exceed MaxEncodedBytes(", numel,
                                              ") = ", sliced.codec().MaxEncodedBytes(numel)));
    }
    encoded_bytes += encoded[s].size();
  }
  std::vector<float> decoded(data.values.size());
  if (absl::Status st = sliced.DecodeAll(encoded, decoded); !st.ok()) return st;
  double err2 = 0, norm2 = 0;
  for (size_t i = 0; i < decoded.size(); ++i) {
    const double x = data.values[i];
    const double d = x - static_cast<double>(decoded[i]);
    err2 += d * d;
    norm2 += x * x;
  }

  CodecRow row{.codec = spec, .data = data.name, .numel = data.values.size()};
  row.ratio = static_cast<double>(data.values.size() * sizeof(float)) /
              static_cast<double>(std::max<uint64_t>(encoded_bytes, 1));
  row.rel_l2_error = norm2 > 0 ? std::sqrt(err2 / norm2) : std::sqrt(err2);

  std::vector<std::string> scratch(encoded.size());
  uint64_t round = 1;
  absl::StatusOr<Timing> encode =
      TimeCalls([&] { return sliced.EncodeAll(round++, scratch); }, timing_options);
  if (!encode.ok()) return encode.status();
  absl::StatusOr<Timing> decode =
      TimeCalls([&] { return sliced.DecodeAll(encoded, decoded); }, timing_options);
  if (!decode.ok()) return decode.status();
  row.encode = *encode;
  row.decode = *decode;
  if (!flags.apply) return row;

  // What is held starts as the data itself; each timed pass adds the round-0 change to it
  // again (values drift by a few units per thousand passes, far from overflow).
  std::vector<float> held_fused = data.values, held_unfused = data.values;
  std::vector<float> dst_fused(data.values.size()), dst_unfused(data.values.size());
  std::vector<float> change(std::min<size_t>(slice_elems, data.values.size()));
  for (bool fused : {true, false}) {
    if (absl::Status st = sliced.ApplyAll(encoded, fused, fused ? held_fused : held_unfused,
                                          fused ? dst_fused : dst_unfused, change);
        !st.ok()) {
      return st;
    }
  }
  if (std::memcmp(dst_fused.data(), dst_unfused.data(), dst_fused.size() * sizeof(float)) != 0) {
    return absl::InternalError("DecodeAddPieces and decode-then-add differ");
  }
  absl::StatusOr<Timing> apply =
      TimeCalls([&] { return sliced.ApplyAll(encoded, true, held_fused, dst_fused, change); },
                timing_options);
  if (!apply.ok()) return apply.status();
  absl::StatusOr<Timing> unfused = TimeCalls(
      [&] { return sliced.ApplyAll(encoded, false, held_unfused, dst_unfused, change); },
      timing_options);
  if (!unfused.ok()) return unfused.status();
  row.apply = *apply;
  row.apply_unfused = *unfused;
  // What the shard holds starts at half the data, so the first changes are its other
  // half; each pass then encodes what is left (the codec's residual, as rounds would).
  std::vector<float> shard_held = data.values;
  for (float& v : shard_held) v *= 0.5f;
  absl::StatusOr<Timing> encode_change =
      TimeCalls([&] { return sliced.ChangeAll(shard_held, scratch); }, timing_options);
  if (!encode_change.ok()) return encode_change.status();
  row.change = *encode_change;
  return row;
}

// `--device cuda`: per spec with a GPU encoder, Encode of device-resident Gaussian
// values (the payload ends in host memory) against a device-to-device copy of the same
// bytes, whose bandwidth counts read + write (2 x bytes / time).
int RunCodecsOnDevice(const CodecsFlags& flags, uint64_t numel) {
  const absl::StatusOr<std::string> device = gpu::CudaDevice();
  if (!device.ok()) {
    std::fprintf(stderr, "ps-bench codecs --device cuda: no CUDA device to measure: %s\n",
                 std::string(device.status().message()).c_str());
    return 2;
  }
  std::vector<std::string> specs = flags.codecs.empty()
                                       ? std::vector<std::string>{"fp16",
                                                                  "bf16",
                                                                  "sign",
                                                                  "terngrad",
                                                                  "3lc(s=1.9)",
                                                                  "topk(0.01)",
                                                                  "topk(0.01)+varint+fp16",
                                                                  "topk(0.001, method=sampled)"}
                                       : SplitSpecs(flags.codecs);
  std::vector<float> values(numel);
  for (uint64_t j = 0; j < numel; ++j) values[j] = GaussianAt(flags.seed, 0, j);
  Table table({"codec", "ratio", "encode GB/s", "copy GB/s (2x)", "enc/copy", "to-host GB/s",
               "floor/enc"});
  std::vector<cli::JsonObjectWriter> json_rows;
  int errors = 0;
  for (const std::string& spec : specs) {
    absl::StatusOr<codecs::EncodeTiming> t = codecs::TimeDeviceEncode(
        spec, codecs::CodecOptions{.seed = flags.seed}, values, std::max(flags.repeats, 1));
    if (!t.ok()) {
      std::fprintf(stderr, "error %s: %s\n", spec.c_str(),
                   std::string(t.status().message()).c_str());
      ++errors;
      continue;
    }
    const double bytes = 4.0 * static_cast<double>(numel);
    const double enc = bytes / t->encode_seconds / 1e9;
    const double copy = 2 * bytes / t->copy_seconds / 1e9;
    const double ratio = bytes / static_cast<double>(std::max<size_t>(t->payload_bytes, 1));
    // The payload's own transfer to host memory, alone: the part of an Encode no kernel
    // can shorten. floor/enc near 1 means the encoding costs little beyond it.
    const double to_host = static_cast<double>(t->payload_bytes) / t->to_host_seconds / 1e9;
    const double floor_share = t->to_host_seconds / t->encode_seconds;
    table.AddRow({spec, FormatG(ratio, 4), absl::StrFormat("%.1f", enc),
                  absl::StrFormat("%.1f", copy), absl::StrFormat("%.3f", enc / copy),
                  absl::StrFormat("%.1f", to_host), absl::StrFormat("%.3f", floor_share)});
    cli::JsonObjectWriter json;
    json.Add("codec", spec)
        .Add("device", *device)
        .Add("encode_gbps", enc)
        .Add("copy_gbps", copy)
        .Add("to_host_gbps", to_host)
        .Add("floor_share", floor_share)
        .Add("ratio", ratio);
    json_rows.push_back(std::move(json));
  }
  std::printf("%s; %s Gaussian values on the device\n", device->c_str(), FormatSize(numel).c_str());
  std::printf(
      "encode GB/s: fp32 input bytes per second of a whole Encode (kernels, payload copied to "
      "host memory and framed), best of %d; copy GB/s: cudaMemcpyAsync device-to-device of the "
      "same bytes, counted as read + write (2 x bytes / time); to-host GB/s: cudaMemcpyAsync of "
      "the payload's bytes into pinned host memory; floor/enc: that copy's time over the "
      "Encode's\n\n",
      std::max(flags.repeats, 1));
  return FinishReport("codecs", table, "", {}, flags.json, json_rows, errors);
}

int RunCodecs(CodecsFlags flags, const CodecsGiven& given) {
  if (flags.list) {
    for (const std::string& spec : DefaultSpecs()) std::printf("%s\n", spec.c_str());
    return 0;
  }
  if (flags.quick) {
    if (given.numel->count() == 0) flags.numel = "2^16";
    if (given.slice_elems->count() == 0) flags.slice_elems = "2^14";
    if (given.repeats->count() == 0) flags.repeats = 1;
    if (given.min_seconds->count() == 0) flags.min_seconds = 0;
    if (given.memread_bytes->count() == 0) flags.memread_bytes = "64M";
  }
  auto fail = [](const absl::Status& st) {
    std::fprintf(stderr, "ps-bench codecs: %s\n", std::string(st.message()).c_str());
    return 2;
  };
  absl::StatusOr<uint64_t> numel = ParseSize(flags.numel);
  if (!numel.ok()) return fail(numel.status());
  absl::StatusOr<uint64_t> slice_elems = ParseSize(flags.slice_elems);
  if (!slice_elems.ok()) return fail(slice_elems.status());
  absl::StatusOr<uint64_t> memread_bytes = ParseSize(flags.memread_bytes);
  if (!memread_bytes.ok()) return fail(memread_bytes.status());
  if (*numel < 1 || *numel > (uint64_t{1} << 32)) {
    return fail(absl::InvalidArgumentError("--numel must be in [1, 2^32]"));
  }
  if (*slice_elems < 1 || *slice_elems > core::kMaxSliceElems) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("--slice-elems must be in [1, ", core::kMaxSliceElems, "]")));
  }
  absl::StatusOr<core::Device> device = core::ParseDevice(flags.device);
  if (!device.ok()) return fail(device.status());
  if (*device == core::Device::kCuda) return RunCodecsOnDevice(flags, *numel);

  bool want_gaussian = true, want_real = !flags.gradients.empty();
  if (!flags.data.empty()) {
    want_gaussian = flags.data == "gaussian" || flags.data == "both";
    want_real = flags.data == "real" || flags.data == "both";
    if (!want_gaussian && !want_real) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("--data must be gaussian, real or both, got '", flags.data, "'")));
    }
  }
  if (want_real && flags.gradients.empty()) {
    return fail(absl::InvalidArgumentError(
        "--data real needs --gradients FILE, raw little-endian float32 gradients; make one "
        "with the Fashion-MNIST example: ps-fashion-mnist --dump-gradients FILE"));
  }

  // Every spec is made once before anything is measured: an explicit spec that does
  // not parse is an error; a default one is skipped with a note.
  const bool explicit_specs = !flags.codecs.empty();
  std::vector<std::string> specs = explicit_specs ? SplitSpecs(flags.codecs) : DefaultSpecs();
  std::vector<std::string> skipped;
  {
    std::vector<std::string> kept;
    std::set<std::string> seen;  // a spec listed twice runs once
    for (const std::string& spec : specs) {
      if (!seen.insert(spec).second) continue;
      absl::StatusOr<std::unique_ptr<codecs::Codec>> codec = codecs::MakeCodec(spec);
      if (!codec.ok()) {
        if (explicit_specs) return fail(codec.status());
        skipped.push_back(absl::StrCat(spec, ": ", codec.status().message()));
        continue;
      }
      kept.push_back(spec);
    }
    specs = std::move(kept);
  }
  if (specs.empty()) return fail(absl::InvalidArgumentError("no codec to measure"));

  std::vector<DataSet> data_sets;
  if (want_gaussian) {
    DataSet& g = data_sets.emplace_back(DataSet{.name = "gaussian"});
    g.values.resize(*numel);
    for (uint64_t j = 0; j < *numel; ++j) g.values[j] = GaussianAt(flags.seed, 0, j);
  }
  if (want_real) {
    absl::StatusOr<std::vector<float>> values = ReadGradients(flags.gradients);
    if (!values.ok()) return fail(values.status());
    data_sets.push_back(DataSet{.name = "real", .values = *std::move(values)});
  }

  MemreadBaseline baseline(*memread_bytes);

  const TimingOptions timing_options{.repeats = flags.repeats, .min_seconds = flags.min_seconds};
  std::vector<CodecRow> rows;
  int errors = 0;
  for (const DataSet& data : data_sets) {
    for (const std::string& spec : specs) {
      absl::StatusOr<CodecRow> row = MeasureCell(spec, data, *slice_elems, flags, timing_options);
      if (!row.ok()) {
        std::fprintf(stderr, "error %s on %s: %s\n", spec.c_str(), data.name.c_str(),
                     std::string(row.status().message()).c_str());
        ++errors;
        continue;
      }
      const double bytes = static_cast<double>(row->numel) * 4.0;
      std::fprintf(stderr, "%s on %s: encode %.2f GB/s, decode %.2f GB/s, ratio %s, error %s\n",
                   spec.c_str(), data.name.c_str(), bytes / row->encode.best_seconds / 1e9,
                   bytes / row->decode.best_seconds / 1e9, FormatG(row->ratio, 4).c_str(),
                   FormatG(row->rel_l2_error, 3).c_str());
      rows.push_back(*std::move(row));
    }
  }

  const double memread = baseline.Finish();

  std::vector<std::string> columns = {"codec",       "data",        "ratio",
                                      "rel L2 error", "encode GB/s", "enc/memread",
                                      "decode GB/s",  "dec/memread", "enc median",
                                      "dec median"};
  if (flags.apply) {
    columns.insert(columns.end(),
                   {"apply GB/s", "unfused GB/s", "apply/unfused", "change GB/s", "change/enc"});
  }
  Table table(columns);
  std::vector<cli::JsonObjectWriter> json_rows;
  for (const CodecRow& row : rows) {
    const double bytes = static_cast<double>(row.numel) * 4.0;
    const double enc = bytes / row.encode.best_seconds / 1e9;
    const double dec = bytes / row.decode.best_seconds / 1e9;
    std::vector<std::string> cells = {
        row.codec, row.data, FormatG(row.ratio, 4), FormatG(row.rel_l2_error, 3),
        absl::StrFormat("%.2f", enc), absl::StrFormat("%.3f", enc / memread),
        absl::StrFormat("%.2f", dec), absl::StrFormat("%.3f", dec / memread),
        absl::StrFormat("%.2f", bytes / row.encode.median_seconds / 1e9),
        absl::StrFormat("%.2f", bytes / row.decode.median_seconds / 1e9)};
    const double apply = flags.apply ? bytes / row.apply.best_seconds / 1e9 : 0;
    const double unfused = flags.apply ? bytes / row.apply_unfused.best_seconds / 1e9 : 0;
    const double change = flags.apply ? bytes / row.change.best_seconds / 1e9 : 0;
    if (flags.apply) {
      cells.insert(cells.end(), {absl::StrFormat("%.2f", apply), absl::StrFormat("%.2f", unfused),
                                 absl::StrFormat("%.2f", apply / unfused),
                                 absl::StrFormat("%.2f", change),
                                 absl::StrFormat("%.2f", change / enc)});
    }
    table.AddRow(cells);
    cli::JsonObjectWriter json;
    json.Add("codec", row.codec)
        .Add("data", row.data)
        .Add("encode_gbps", enc)
        .Add("decode_gbps", dec)
        .Add("ratio", row.ratio)
        .Add("rel_l2_error", row.rel_l2_error)
        .Add("memread_gbps", memread);
    if (flags.apply) {
      json.Add("apply_gbps", apply)
          .Add("apply_unfused_gbps", unfused)
          .Add("change_gbps", change);
    }
    json_rows.push_back(std::move(json));
  }

  std::printf("%s\n", baseline.Describe().c_str());
  for (const DataSet& data : data_sets) {
    std::printf("%s: %s values in slices of %s\n", data.name.c_str(),
                FormatSize(data.values.size()).c_str(), FormatSize(*slice_elems).c_str());
  }
  std::printf(
      "GB/s: fp32 input bytes (4 * values) per second, 1 thread, best of %d repeat(s) (median "
      "in the enc/dec median columns); ratio = input bytes / encoded bytes\n",
      std::max(flags.repeats, 1));
  if (flags.apply) {
    std::printf(
        "apply: a pulled change applied to what a worker holds, DecodeAddPieces into what is "
        "held and the caller's buffer in one pass; unfused: DecodePieces, AddInto, "
        "FindNonFinite and two copies (the worker's former steps); change: EncodeChange, a "
        "shard's encoding of a pull's change from what it holds for its workers (change/enc: "
        "against encode of the same values)\n");
  }
  std::printf("\n");
  return FinishReport("codecs", table, "skipped (default specs this build does not make)", skipped,
                      flags.json, json_rows, errors);
}

}  // namespace

Command AddCodecsCommand(CLI::App& app) {
  auto flags = std::make_shared<CodecsFlags>();
  auto given = std::make_shared<CodecsGiven>();
  CLI::App* sub = app.add_subcommand(
      "codecs",
      "Per codec spec: single-thread encode and decode GB/s (also as a ratio against memory "
      "read bandwidth), compression ratio and relative L2 error, on Gaussian and real "
      "gradients");
  sub->add_option("--codecs,--codec", flags->codecs,
                  "Codec specs, separated by ';' or by commas outside parentheses; repeatable. "
                  "Default: every ExampleSpecs() entry plus a few aggressive settings (--list)");
  sub->add_option("--data", flags->data,
                  "gaussian, real or both; default: gaussian, plus real when --gradients is "
                  "given");
  sub->add_option("--gradients", flags->gradients,
                  "Real gradients: raw little-endian float32 values (concatenated gradient "
                  "vectors, e.g. from ps-fashion-mnist --dump-gradients FILE), read whole")
      ->option_text("FILE");
  given->numel = sub->add_option("--numel", flags->numel, "Values of the Gaussian data set")
                     ->capture_default_str();
  given->slice_elems =
      sub->add_option("--slice-elems", flags->slice_elems,
                      "Encode in slices of this many values, like a worker (default: the "
                      "layout default, core::kDefaultSliceElems)")
          ->capture_default_str();
  sub->add_option("--matrix-cols", flags->matrix_cols,
                  "EncodeContext::matrix_cols for slices whose size it divides (PowerSGD "
                  "factorizes those); 0: none")
      ->capture_default_str();
  given->repeats = sub->add_option("--repeats", flags->repeats,
                                   "Timed repeats of encode and of decode (after one warm-up); "
                                   "the best is reported")
                       ->capture_default_str();
  given->min_seconds = sub->add_option("--min-seconds", flags->min_seconds,
                                       "Each repeat makes enough passes to last at least this "
                                       "long")
                           ->capture_default_str();
  given->memread_bytes = sub->add_option("--memread-bytes", flags->memread_bytes,
                                         "Buffer size of the memory read baseline")
                             ->capture_default_str();
  sub->add_option("--json", flags->json, "Also write the rows as a JSON array to FILE")
      ->option_text("FILE");
  sub->add_option("--seed", flags->seed, "Seed of the Gaussian generator and CodecOptions::seed")
      ->capture_default_str();
  sub->add_flag("--quick", flags->quick,
                "Small run for smoke tests: 2^16 values in slices of 2^14, 1 repeat, no "
                "minimum time, a 64 MiB baseline (flags given explicitly still win)");
  sub->add_flag("--list", flags->list, "Print the default codec specs and exit");
  sub->add_flag("--apply", flags->apply,
                "Also time applying each payload as a pulled change to held values: "
                "DecodeAddPieces (held and the caller's buffer in one pass) against the unfused "
                "decode, add, check and two copies (columns apply, unfused; JSON apply_gbps, "
                "apply_unfused_gbps), and a shard's EncodeChange of them (column change; JSON "
                "change_gbps)");
  sub->add_option("--device", flags->device,
                  "cpu, or cuda: encode throughput of the GPU encoders on device-resident "
                  "values against a device-to-device copy (exits non-zero without a device)")
      ->capture_default_str();
  return Command{.app = sub, .run = [flags, given] { return RunCodecs(*flags, *given); }};
}

}  // namespace ps::bench
