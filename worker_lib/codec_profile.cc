#include "worker_lib/codec_profile_internal.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codecs/codec.h"
#include "core/status.h"

namespace ps::internal {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

constexpr int kMaxRepeats = 16;

}  // namespace

absl::StatusOr<CodecCost> ProfileCodec(std::string_view spec, uint64_t numel,
                                       double budget_seconds, core::Device device) {
  if (numel == 0) return absl::InvalidArgumentError("profiling a codec needs at least one value");
  codecs::CodecOptions codec_options;
  codec_options.device = device;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<codecs::Codec> codec,
                      codecs::MakeCodec(spec, codec_options));
  std::vector<float> values(numel);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (float& v : values) v = normal(rng);
  std::vector<float> decoded(numel);
  std::string payload;
  CodecCost cost;
  cost.spec = std::string(codec->spec());
  cost.numel = numel;
  cost.device = codec->device_note().empty() ? device : core::Device::kCpu;
  double best_encode = std::numeric_limits<double>::infinity();
  double best_decode = best_encode;
  const auto start = Clock::now();
  while (cost.repeats < kMaxRepeats &&
         (cost.repeats == 0 || SecondsSince(start) < budget_seconds)) {
    codecs::EncodeContext ctx;
    ctx.round = static_cast<uint64_t>(cost.repeats);
    const auto encode_start = Clock::now();
    PS_RETURN_IF_ERROR(codec->Encode(values, ctx, &payload));
    best_encode = std::min(best_encode, SecondsSince(encode_start));
    const auto decode_start = Clock::now();
    PS_RETURN_IF_ERROR(codec->Decode(payload, decoded));
    best_decode = std::min(best_decode, SecondsSince(decode_start));
    ++cost.repeats;
  }
  const double n = static_cast<double>(numel);
  cost.encode_seconds_per_value = best_encode / n;
  cost.decode_seconds_per_value = best_decode / n;
  cost.bytes_per_value = static_cast<double>(payload.size()) / n;
  return cost;
}

PlanOption OptionFromCost(const CodecCost& cost) {
  return {.name = cost.spec,
          .device = cost.device,
          .bytes_per_value = cost.bytes_per_value,
          .encode_seconds_per_value = cost.encode_seconds_per_value,
          .decode_seconds_per_value = cost.decode_seconds_per_value};
}

}  // namespace ps::internal
