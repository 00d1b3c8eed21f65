// ps-bench aggregators --device cuda (docs/gpu.md, docs/bench.md): each rule on inputs
// already in device memory, as input GB/s and as a ratio against the device's memory
// bandwidth measured in the same run by a device-to-device copy of the same n x d
// floats (counted as read + write: 2 x bytes / time).
#include "bench/aggregators_cuda_bench.h"

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "aggregators/aggregator.h"
#include "core/device.h"
#include "core/status.h"
#include "gpu/cuda_device.h"

#if PS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ps::bench {

#if PS_HAVE_CUDA
namespace {

absl::Status Cuda(cudaError_t e, const char* what) {
  return e == cudaSuccess ? absl::OkStatus()
                          : absl::InternalError(absl::StrFormat("%s: %s", what, cudaGetErrorString(e)));
}

// Device memory for one cell, freed on scope exit.
struct DeviceFloats {
  float* data = nullptr;
  ~DeviceFloats() {
    if (data != nullptr) cudaFree(data);
  }
};

}  // namespace

int RunAggregatorsCuda(const CudaAggregatorsGrid& grid) {
  const absl::StatusOr<std::string> device = gpu::CudaDevice();
  if (!device.ok()) {
    std::fprintf(stderr, "ps-bench aggregators --device cuda: %s\n",
                 std::string(device.status().message()).c_str());
    return 2;
  }
  Table table({"rule", "n", "f", "d", "seconds", "input GB/s", "copy GB/s", "ratio vs copy"});
  std::vector<cli::JsonObjectWriter> json_rows;
  std::vector<std::string> skipped;
  int errors = 0;
  for (uint64_t d : grid.ds) {
    for (uint64_t n : grid.ns) {
      const size_t floats = static_cast<size_t>(n * d);
      DeviceFloats inputs, copy, out, state;
      absl::Status st = Cuda(cudaMalloc(reinterpret_cast<void**>(&inputs.data), floats * sizeof(float)), "cudaMalloc");
      if (st.ok()) st = Cuda(cudaMalloc(reinterpret_cast<void**>(&copy.data), floats * sizeof(float)), "cudaMalloc");
      if (st.ok()) st = Cuda(cudaMalloc(reinterpret_cast<void**>(&out.data), d * sizeof(float)), "cudaMalloc");
      if (st.ok()) st = Cuda(cudaMalloc(reinterpret_cast<void**>(&state.data), d * sizeof(float)), "cudaMalloc");
      if (!st.ok()) {
        skipped.push_back(absl::StrFormat("n=%d d=%s: %s", n, FormatSize(d), st.message()));
        continue;
      }
      // The CPU benchmark's inputs (FillInputs), made on the host and uploaded once.
      std::vector<const float*> rows(n);
      {
        std::vector<float> host(floats);
        std::vector<float*> host_rows(n);
        for (uint64_t i = 0; i < n; ++i) {
          host_rows[i] = host.data() + i * d;
          rows[i] = inputs.data + i * d;
        }
        FillInputs(grid.seed, host_rows, d, nullptr);
        st = Cuda(cudaMemcpy(inputs.data, host.data(), floats * sizeof(float), cudaMemcpyHostToDevice),
                  "upload");
      }
      if (st.ok()) st = Cuda(cudaMemset(state.data, 0, d * sizeof(float)), "cudaMemset");
      // The baseline: a device-to-device copy of the same bytes (cudaMemcpy does not wait
      // for a device-to-device copy; the synchronize does).
      absl::StatusOr<Timing> copy_timing = TimeCalls(
          [&] {
            PS_RETURN_IF_ERROR(Cuda(cudaMemcpy(copy.data, inputs.data, floats * sizeof(float),
                                               cudaMemcpyDeviceToDevice),
                                    "device copy"));
            return Cuda(cudaDeviceSynchronize(), "device copy");
          },
          grid.timing);
      if (!st.ok() || !copy_timing.ok()) {
        std::fprintf(stderr, "error n=%d d=%s: %s\n", static_cast<int>(n), FormatSize(d).c_str(),
                     std::string((st.ok() ? copy_timing.status() : st).message()).c_str());
        ++errors;
        continue;
      }
      const double bytes = static_cast<double>(floats) * sizeof(float);
      const double copy_gbps = 2 * bytes / copy_timing->best_seconds / 1e9;
      for (const std::string& spec : grid.rules) {
        // The largest f the rule accepts up to n / 4 (or exactly --f), as on the CPU.
        std::unique_ptr<aggregators::Aggregator> rule;
        int f = grid.f >= 0 ? grid.f : static_cast<int>(n / 4);
        for (; f >= 0; --f) {
          aggregators::AggregatorOptions options;
          options.num_workers = static_cast<int>(n);
          options.num_byzantine = f;
          options.device = core::Device::kCuda;
          absl::StatusOr<std::unique_ptr<aggregators::Aggregator>> made =
              aggregators::MakeAggregator(spec, options);
          if (made.ok()) {
            rule = *std::move(made);
            break;
          }
          if (grid.f >= 0) break;
        }
        if (rule == nullptr) {
          skipped.push_back(absl::StrFormat("%s n=%d: no f accepted", spec, n));
          continue;
        }
        aggregators::AggregationContext ctx;
        ctx.device_memory = true;
        if (rule->StateRows() > 0) ctx.state = std::span<float>(state.data, d);
        absl::StatusOr<Timing> timing = TimeCalls(
            [&] { return rule->Aggregate(rows, std::span<float>(out.data, d), ctx); }, grid.timing);
        if (!timing.ok()) {
          std::fprintf(stderr, "error %s n=%d d=%s: %s\n", spec.c_str(), static_cast<int>(n),
                       FormatSize(d).c_str(), std::string(timing.status().message()).c_str());
          ++errors;
          continue;
        }
        const double gbps = bytes / timing->best_seconds / 1e9;
        table.AddRow({spec, absl::StrCat(n), absl::StrCat(f), FormatSize(d),
                      FormatG(timing->best_seconds, 4), absl::StrFormat("%.1f", gbps),
                      absl::StrFormat("%.1f", copy_gbps), absl::StrFormat("%.3f", gbps / copy_gbps)});
        cli::JsonObjectWriter json;
        json.Add("rule", spec)
            .Add("device", *device)
            .Add("n", n)
            .Add("f", f)
            .Add("d", d)
            .Add("seconds", timing->best_seconds)
            .Add("input_gbps", gbps)
            .Add("copy_gbps", copy_gbps)
            .Add("ratio_vs_copy", gbps / copy_gbps);
        json_rows.push_back(std::move(json));
      }
    }
  }
  std::printf("device: %s\ncopy GB/s: a device-to-device copy of the same n x d floats, read + "
              "write (2 x bytes / seconds); input GB/s = n * d * 4 bytes / seconds\n\n",
              device->c_str());
  return FinishReport("aggregators", table, "skipped", skipped, grid.json, json_rows, errors);
}

#else

int RunAggregatorsCuda(const CudaAggregatorsGrid&) {
  std::fprintf(stderr, "ps-bench aggregators --device cuda: %s\n",
               std::string(gpu::CudaDevice().status().message()).c_str());
  return 2;
}

#endif

}  // namespace ps::bench
