// The GPU engine of the sparse codecs (topk and threshold): selection on the device,
// then the index and value stages of the CPU codec (sparse_internal.h) over the kept
// coordinates, so the bytes are the CPU codec's own.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codecs/codec_internal.h"
#include "codecs/cuda/kernels.h"
#include "codecs/device_engine_internal.h"
#include "codecs/sparse_internal.h"
#include "codecs/wire_internal.h"
#include "core/status.h"
#include "gpu/cuda_internal.h"

namespace ps::codecs::internal {
namespace {

using gpu::DeviceBuffer;

class SparseEngine final : public Engine {
 public:
  SparseEngine(Context* context, SparseConfig config, uint64_t seed)
      : Engine(context), config_(std::move(config)), seed_(seed) {}

  absl::Status Encode(const float* x, size_t n, const EncodeContext& ctx, std::string* out,
                      float* residual) override {
    if (n > std::numeric_limits<uint32_t>::max()) return c_.EncodeOnHost(x, n, ctx, out, residual);
    const cudaStream_t s = c_.stream;
    // Inf and NaN first, as the CPU codec checks them first.
    PS_RETURN_IF_ERROR(Reserve(n));
    PS_RETURN_IF_ERROR(Launched(cudaMemsetAsync(max_.as<void>(), 0, 4, s), "cudaMemsetAsync"));
    PS_RETURN_IF_ERROR(
        Launched(cuda::LaunchBucketMaxAbs(x, n, n, max_.as<uint32_t>(), s), "max kernel"));
    PS_RETURN_IF_ERROR(c_.staging.Reserve(16));
    PS_RETURN_IF_ERROR(c_.ToStaging(0, max_.as<void>(), 4));
    PS_RETURN_IF_ERROR(c_.Sync());
    if (c_.staging.as<uint32_t>()[0] >= 0x7f800000u)
      return c_.EncodeOnHost(x, n, ctx, out, nullptr);

    const uint64_t stream = StreamSeed(seed_, ctx);
    size_t kept = 0;
    if (config_.sparsifier == Sparsifier::kThreshold) {
      PS_ASSIGN_OR_RETURN(kept,
                          KeepAtLeast(x, n, AbsBits(static_cast<float>(config_.tau))));
    } else {
      const size_t k = KeepCount(config_.ratio, n);
      if (k >= n) {
        PS_ASSIGN_OR_RETURN(kept, KeepAtLeast(x, n, 0));
      } else if (config_.sampled) {
        PS_ASSIGN_OR_RETURN(kept, Sampled(x, n, k, stream));
      } else {
        PS_RETURN_IF_ERROR(Exact(x, n, k));
        kept = k;
      }
    }
    // The kept coordinates and values to the host.
    PS_RETURN_IF_ERROR(c_.staging.Reserve(8 * kept + 16));
    PS_RETURN_IF_ERROR(c_.ToStaging(0, indices_.as<void>(), 4 * kept));
    PS_RETURN_IF_ERROR(c_.ToStaging(4 * kept, values_.as<void>(), 4 * kept));
    PS_RETURN_IF_ERROR(c_.Sync());
    const std::span<const uint32_t> kept_indices(c_.staging.as<uint32_t>(), kept);
    const std::span<const float> kept_values(c_.staging.as<float>() + kept, kept);

    const bool sends_kept = config_.index.kind != IndexKind::kBloom;
    const auto gather = [&](std::span<const uint32_t> sent, std::span<float> values) {
      if (sends_kept) {
        std::copy(kept_values.begin(), kept_values.end(), values.begin());
        return absl::OkStatus();
      }
      return GatherOnDevice(x, sent, values);
    };
    std::vector<uint32_t> sent;
    std::vector<float> decoded;
    std::string payload;
    PS_RETURN_IF_ERROR(EncodeSelected(config_, kept_indices, n, stream, gather, &payload,
                                                residual != nullptr ? &sent : nullptr,
                                                residual != nullptr ? &decoded : nullptr));
    if (residual != nullptr) PS_RETURN_IF_ERROR(Residual(x, n, sent, decoded, residual));
    *out = std::move(payload);
    return absl::OkStatus();
  }

 private:
  absl::Status Reserve(size_t n) {
    const size_t tiles = (n + cuda::kTopkTile - 1) / cuda::kTopkTile;
    PS_RETURN_IF_ERROR(max_.Reserve(4));
    PS_RETURN_IF_ERROR(state_.Reserve(sizeof(cuda::SelectState)));
    PS_RETURN_IF_ERROR(hist_.Reserve(4 * cuda::kMaxBins));
    PS_RETURN_IF_ERROR(tile_counts_.Reserve(8 * tiles));
    PS_RETURN_IF_ERROR(tile_offsets_.Reserve(8 * tiles));
    scratch_bytes_ = cuda::ScanScratchBytes(tiles);
    return scratch_.Reserve(scratch_bytes_);
  }

  // Sets the selection state (from the host).
  absl::Status SetState(uint32_t prefix, uint64_t k) {
    const cuda::SelectState state{prefix, 0, k, 0};
    PS_RETURN_IF_ERROR(Launched(cudaMemcpyAsync(state_.as<void>(), &state, sizeof(state),
                                                cudaMemcpyHostToDevice, c_.stream),
                                "cudaMemcpyAsync (selection state)"));
    // The copy reads `state` from this stack frame: wait for it.
    return c_.Sync();
  }

  // Counts per tile and their exclusive sum for the state's threshold.
  absl::Status CountTiles(const float* x, size_t n) {
    const size_t tiles = (n + cuda::kTopkTile - 1) / cuda::kTopkTile;
    PS_RETURN_IF_ERROR(Launched(cuda::LaunchTopkTileCounts(x, n, state_.as<cuda::SelectState>(),
                                                           tile_counts_.as<uint64_t>(), c_.stream),
                                "top-k tile count kernel"));
    return Launched(cuda::ExclusiveSum(tile_counts_.as<uint64_t>(), tile_offsets_.as<uint64_t>(),
                                       tiles, scratch_.as<void>(), scratch_bytes_, c_.stream),
                    "top-k tile scan");
  }

  absl::Status Write(const float* x, size_t n, size_t count) {
    PS_RETURN_IF_ERROR(indices_.Reserve(4 * count));
    PS_RETURN_IF_ERROR(values_.Reserve(4 * count));
    return Launched(
        cuda::LaunchTopkWrite(x, n, state_.as<cuda::SelectState>(), tile_offsets_.as<uint64_t>(),
                              indices_.as<uint32_t>(), values_.as<float>(), c_.stream),
        "top-k write kernel");
  }

  // The keys > prefix and == prefix over all tiles (one synchronisation).
  absl::StatusOr<std::pair<uint64_t, uint64_t>> Totals(size_t n) {
    const size_t last = (n + cuda::kTopkTile - 1) / cuda::kTopkTile - 1;
    PS_RETURN_IF_ERROR(c_.ToStaging(0, tile_offsets_.as<uint64_t>() + last, 8));
    PS_RETURN_IF_ERROR(c_.ToStaging(8, tile_counts_.as<uint64_t>() + last, 8));
    PS_RETURN_IF_ERROR(c_.Sync());
    const uint64_t sum = c_.staging.as<uint64_t>()[0] + c_.staging.as<uint64_t>()[1];
    return std::make_pair(sum >> 32, sum & 0xffffffffu);
  }

  // Every coordinate with key >= t (threshold, or top-k keeping everything); returns
  // how many.
  absl::StatusOr<size_t> KeepAtLeast(const float* x, size_t n, uint32_t t) {
    PS_RETURN_IF_ERROR(SetState(t, std::numeric_limits<uint64_t>::max()));
    PS_RETURN_IF_ERROR(CountTiles(x, n));
    PS_ASSIGN_OR_RETURN(const auto totals, Totals(n));
    const size_t count = totals.first + totals.second;
    PS_RETURN_IF_ERROR(Write(x, n, count));
    return count;
  }

  // TopkExact: a radix select of the k-th largest key on the device (no host round
  // trip), then the compaction of the k kept coordinates.
  absl::Status Exact(const float* x, size_t n, size_t k) {
    PS_RETURN_IF_ERROR(SetState(0, k));
    for (int d = 0; d < cuda::kSelectDigits; ++d) {
      PS_RETURN_IF_ERROR(Launched(
          cudaMemsetAsync(hist_.as<void>(), 0, 4 * (size_t{1} << cuda::kDigitBits[d]), c_.stream),
          "cudaMemsetAsync"));
      PS_RETURN_IF_ERROR(
          Launched(cuda::LaunchRadixHistogram(x, n, cuda::kDigitShift[d], cuda::kDigitBits[d],
                                              state_.as<cuda::SelectState>(), hist_.as<uint32_t>(),
                                              c_.stream),
                   "radix histogram kernel"));
      PS_RETURN_IF_ERROR(Launched(cuda::LaunchSelectStep(hist_.as<uint32_t>(), cuda::kDigitBits[d],
                                                         state_.as<cuda::SelectState>(), c_.stream),
                                  "radix select kernel"));
    }
    PS_RETURN_IF_ERROR(CountTiles(x, n));
    return Write(x, n, k);
  }

  // TopkSampled: the threshold is the CPU's (the same sampled positions and rank); the
  // coordinates at or above it are kept unless they are more than 2k, and then the
  // exact top k, which lie among them, are kept instead (what the CPU's BestOf picks).
  absl::StatusOr<size_t> Sampled(const float* x, size_t n, size_t k, uint64_t seed) {
    const double ratio = static_cast<double>(k) / static_cast<double>(n);
    const size_t samples = std::max<size_t>(1024, static_cast<size_t>(std::ceil(64 / ratio)));
    if (2 * samples >= n) {
      PS_RETURN_IF_ERROR(Exact(x, n, k));
      return k;
    }
    PS_RETURN_IF_ERROR(samples_.Reserve(4 * samples));
    PS_RETURN_IF_ERROR(c_.staging.Reserve(4 * samples));
    PS_RETURN_IF_ERROR(
        Launched(cuda::LaunchSampleKeys(x, n, seed, samples, samples_.as<uint32_t>(), c_.stream),
                 "sample kernel"));
    PS_RETURN_IF_ERROR(c_.ToStaging(0, samples_.as<void>(), 4 * samples));
    PS_RETURN_IF_ERROR(c_.Sync());
    std::vector<uint32_t> keys(c_.staging.as<uint32_t>(), c_.staging.as<uint32_t>() + samples);
    const size_t rank = std::clamp<size_t>(
        static_cast<size_t>(std::llround(ratio * static_cast<double>(samples))), 1, samples);
    std::nth_element(keys.begin(), keys.begin() + static_cast<ptrdiff_t>(rank - 1), keys.end(),
                     std::greater<uint32_t>());
    PS_RETURN_IF_ERROR(SetState(keys[rank - 1], std::numeric_limits<uint64_t>::max()));
    PS_RETURN_IF_ERROR(CountTiles(x, n));
    PS_ASSIGN_OR_RETURN(const auto totals, Totals(n));
    const size_t count = totals.first + totals.second;
    if (count > 2 * k) {
      PS_RETURN_IF_ERROR(Exact(x, n, k));
      return k;
    }
    PS_RETURN_IF_ERROR(Write(x, n, count));
    return count;
  }

  // values[j] = x[sent[j]] for coordinates the host chose (a Bloom filter's positives).
  absl::Status GatherOnDevice(const float* x, std::span<const uint32_t> sent,
                              std::span<float> values) {
    if (sent.empty()) return absl::OkStatus();
    PS_RETURN_IF_ERROR(gather_indices_.Reserve(4 * sent.size()));
    PS_RETURN_IF_ERROR(gather_values_.Reserve(4 * sent.size()));
    PS_RETURN_IF_ERROR(Launched(cudaMemcpyAsync(gather_indices_.as<void>(), sent.data(),
                                                4 * sent.size(), cudaMemcpyHostToDevice, c_.stream),
                                "cudaMemcpyAsync (Bloom positives)"));
    PS_RETURN_IF_ERROR(Launched(cuda::LaunchGather(x, gather_indices_.as<uint32_t>(), sent.size(),
                                                   gather_values_.as<float>(), c_.stream),
                                "gather kernel"));
    PS_RETURN_IF_ERROR(Launched(cudaMemcpyAsync(values.data(), gather_values_.as<void>(),
                                                4 * sent.size(), cudaMemcpyDeviceToHost, c_.stream),
                                "cudaMemcpyAsync (gathered values)"));
    return c_.Sync();
  }

  // residual = x, minus the decoded values at the coordinates sent.
  absl::Status Residual(const float* x, size_t n, std::span<const uint32_t> sent,
                        std::span<const float> decoded, float* residual) {
    if (residual != x) {
      PS_RETURN_IF_ERROR(
          Launched(cudaMemcpyAsync(residual, x, 4 * n, cudaMemcpyDeviceToDevice, c_.stream),
                   "cudaMemcpyAsync (residual)"));
    }
    if (sent.empty()) return c_.Sync();
    PS_RETURN_IF_ERROR(gather_indices_.Reserve(4 * sent.size()));
    PS_RETURN_IF_ERROR(gather_values_.Reserve(4 * sent.size()));
    PS_RETURN_IF_ERROR(Launched(cudaMemcpyAsync(gather_indices_.as<void>(), sent.data(),
                                                4 * sent.size(), cudaMemcpyHostToDevice, c_.stream),
                                "cudaMemcpyAsync (coordinates sent)"));
    PS_RETURN_IF_ERROR(Launched(cudaMemcpyAsync(gather_values_.as<void>(), decoded.data(),
                                                4 * sent.size(), cudaMemcpyHostToDevice, c_.stream),
                                "cudaMemcpyAsync (decoded values)"));
    PS_RETURN_IF_ERROR(Launched(
        cuda::LaunchScatterResidual(x, gather_indices_.as<uint32_t>(), gather_values_.as<float>(),
                                    sent.size(), residual, c_.stream),
        "residual kernel"));
    // The host vectors must outlive the copies.
    return c_.Sync();
  }

  const SparseConfig config_;
  const uint64_t seed_;
  size_t scratch_bytes_ = 0;
  DeviceBuffer max_, state_, hist_, tile_counts_, tile_offsets_, scratch_, indices_, values_,
      samples_, gather_indices_, gather_values_;
};

}  // namespace

std::unique_ptr<Engine> MakeSparseEngine(Context* context, SparseConfig config, uint64_t seed) {
  return std::make_unique<SparseEngine>(context, std::move(config), seed);
}

}  // namespace ps::codecs::internal
