// `ps-bench p3`: priority-ordered propagation (P3, docs/transport.md) against FIFO in the same
// run. A VGG-19-shaped model (tensor sizes scaled by --scale) trains for a few
// iterations with simulated per-layer compute (sleeps proportional to each layer's
// FLOPs) over shaped links (a token bucket per direction and worker, docs/transport.md).
// Each iteration pulls with per-tensor readiness and runs forward layer by layer as its
// parameters arrive, then backward from the last layer, pushing each layer's gradient as
// it is produced; the next version's pull starts with backward. FIFO sends, aggregates and streams slices in the order they become
// ready; P3 most urgent (first layer) first. Reported: the mean iteration time after a
// warm-up iteration, and the time from the end of backward until the first layer's
// parameters arrive.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "bench/commands.h"
#include "core/layout.h"
#include "core/status.h"
#include "net/shaper.h"
#include "server/server.h"
#include "spdlog/spdlog.h"
#include "worker_lib/worker.h"

namespace ps::bench {
namespace {

struct P3Flags {
  std::vector<std::string> bandwidths = {"100", "400"};  // Mbit/s per direction
  double latency_ms = 1.0;
  double scale = 1.0 / 128;
  int workers = 2;
  int iterations = 5;
  // Forward + backward per iteration (1 : 2): about what 100 Mbit/s needs to move the
  // default model one way, so compute and communication can overlap fully.
  double compute_ms = 360;
  uint64_t inflight = 512 * 1024;
  uint32_t window = 0;
  uint32_t slice_elems = kJobSliceElems;
  std::string json;
  bool quick = false;
};

struct Layer {
  std::string name;
  uint64_t weights = 0, biases = 0;
  double flops = 0;
};

// VGG-19 at 224 x 224: 16 3x3 convolutions in 5 blocks, then 3 fully connected layers.
std::vector<Layer> Vgg19() {
  std::vector<Layer> layers;
  const int blocks[5][2] = {{2, 64}, {2, 128}, {4, 256}, {4, 512}, {4, 512}};
  int in = 3, side = 224;
  for (int b = 0; b < 5; ++b) {
    for (int i = 0; i < blocks[b][0]; ++i) {
      const int out = blocks[b][1];
      layers.push_back({absl::StrCat("conv", b + 1, "_", i + 1), uint64_t(9) * in * out, uint64_t(out),
                        9.0 * in * out * side * side});
      in = out;
    }
    side /= 2;
  }
  const uint64_t fc[3][2] = {{512 * 7 * 7, 4096}, {4096, 4096}, {4096, 1000}};
  for (int i = 0; i < 3; ++i) {
    layers.push_back({absl::StrCat("fc", i + 6), fc[i][0] * fc[i][1], fc[i][1], double(fc[i][0] * fc[i][1])});
  }
  return layers;
}

struct Result {
  double iteration_seconds = 0;
  double first_layer_seconds = 0;
  // Per iteration: forward's waits for later layers, and backward (compute and pushes).
  double stall_seconds = 0;
  double backward_seconds = 0;
};

absl::StatusOr<Result> RunMode(const P3Flags& f, bool p3, double mbps,
                               const std::vector<Layer>& layers) {
  std::vector<core::TensorSpec> tensors;
  for (size_t l = 0; l < layers.size(); ++l) {
    const auto scaled = [&](uint64_t n) { return std::max<uint64_t>(1, uint64_t(double(n) * f.scale)); };
    tensors.push_back({layers[l].name + ".weight", scaled(layers[l].weights), int32_t(l)});
    tensors.push_back({layers[l].name + ".bias", scaled(layers[l].biases), int32_t(l)});
  }
  // Checked before the server starts; the workers cut the tensors themselves, into
  // slices of f.slice_elems or (0) of the job's size, which the first one chooses from
  // the shaped link.
  PS_RETURN_IF_ERROR(
      core::ModelLayout::Check(tensors, f.slice_elems == 0 ? core::kDefaultSliceElems : f.slice_elems, 1)
          .status());
  server::ServerOptions so;
  so.insecure = true;  // the data path alone; docs/bench.md
  so.port = 0;
  so.num_workers = uint32_t(f.workers);
  so.schedule = p3 ? server::Schedule::kPriority : server::Schedule::kFifo;
  so.learning_rate = 0.01f;
  so.log_level = "warn";
  PS_ASSIGN_OR_RETURN(std::unique_ptr<server::Server> server, server::Server::Start(so));
  double flops = 0;
  for (const Layer& l : layers) flops += l.flops;
  std::vector<double> fwd_ms;
  for (const Layer& l : layers) fwd_ms.push_back(f.compute_ms / 3 * l.flops / flops);

  std::vector<std::vector<float>> init;
  for (const core::TensorSpec& t : tensors) init.emplace_back(t.numel, 0.01f);
  std::vector<std::span<const float>> init_spans(init.begin(), init.end());
  WorkerOptions wo;
  wo.shard_addresses = {absl::StrCat("127.0.0.1:", server->port())};
  wo.priority_order = p3;
  wo.max_inflight_bytes = f.inflight;
  wo.receive_window_bytes = f.window;
  wo.shaping.up.mbps = wo.shaping.down.mbps = mbps;
  wo.shaping.up.latency = wo.shaping.down.latency =
      std::chrono::microseconds(int64_t(f.latency_ms * 1000));
  std::vector<std::unique_ptr<Worker>> workers;
  for (int w = 0; w < f.workers; ++w) {
    wo.worker_id = uint32_t(w);
    PS_ASSIGN_OR_RETURN(std::unique_ptr<Worker> worker,
                        Worker::Start(wo, tensors, f.slice_elems, init_spans));
    workers.push_back(std::move(worker));
  }
  std::vector<Result> results(workers.size());
  std::vector<absl::Status> errors(workers.size());
  std::vector<std::thread> threads;
  for (size_t w = 0; w < workers.size(); ++w) {
    threads.emplace_back([&, w] {
      Worker& worker = *workers[w];
      std::vector<std::vector<float>> params = init;
      std::vector<std::span<float>> outs(params.begin(), params.end());
      const auto sleep_ms = [](double ms) {
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
      };
      double iter_sum = 0, first_sum = 0, stall_sum = 0, backward_sum = 0;
      double start = NowSeconds();
      auto ticket = worker.StartPullAll(0, outs, std::chrono::seconds(120));
      for (int it = 0; it < f.iterations + 1; ++it) {
        if (!ticket.ok()) { errors[w] = ticket.status(); return; }
        for (size_t l = 0; l < layers.size(); ++l) {
          const double wait_from = NowSeconds();
          for (size_t t : {2 * l, 2 * l + 1}) {
            if (absl::Status st = (*ticket)->WaitTensor(t); !st.ok()) { errors[w] = st; return; }
          }
          if (l == 0 && it > 0) first_sum += NowSeconds() - start;
          if (l > 0 && it > 0) stall_sum += NowSeconds() - wait_from;
          sleep_ms(fwd_ms[l]);
        }
        if (auto v = (*ticket)->Wait(); !v.ok()) { errors[w] = v.status(); return; }
        // The next version is asked for before backward: a slice of it can only come
        // once this worker pushed that slice, so it never overwrites a parameter that
        // backward still needs, and it streams back while backward goes on.
        ticket = worker.StartPullAll(uint64_t(it) + 1, outs, std::chrono::seconds(120));
        const double backward_from = NowSeconds();
        for (size_t l = layers.size(); l-- > 0;) {
          sleep_ms(2 * fwd_ms[l]);
          for (size_t t : {2 * l + 1, 2 * l}) {
            if (absl::Status st = worker.Push(t, uint64_t(it), params[t]); !st.ok()) { errors[w] = st; return; }
          }
        }
        const double now = NowSeconds();
        if (it > 0) {  // iteration 0 warms up
          iter_sum += now - start;
          backward_sum += now - backward_from;
        }
        start = now;
      }
      if (ticket.ok()) {
        if (auto v = (*ticket)->Wait(); !v.ok()) errors[w] = v.status();
      }
      if (absl::Status st = worker.WaitPushes(); !st.ok()) errors[w] = st;
      results[w] = {iter_sum / f.iterations, first_sum / f.iterations, stall_sum / f.iterations,
                    backward_sum / f.iterations};
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& st : errors) PS_RETURN_IF_ERROR(st);
  Result mean;
  for (const Result& r : results) {
    mean.iteration_seconds += r.iteration_seconds / double(results.size());
    mean.first_layer_seconds += r.first_layer_seconds / double(results.size());
    mean.stall_seconds += r.stall_seconds / double(results.size());
    mean.backward_seconds += r.backward_seconds / double(results.size());
  }
  workers.clear();
  server->Shutdown();
  return mean;
}

int RunP3(P3Flags f) {
  spdlog::set_level(spdlog::level::warn);
  if (f.quick) {
    f.bandwidths = {"200"};
    f.scale = 1.0 / 1024;
    f.iterations = 2;
    f.compute_ms = 60;
  }
  const std::vector<Layer> layers = Vgg19();
  uint64_t total = 0;
  for (const Layer& l : layers) total += uint64_t(double(l.weights + l.biases) * f.scale);
  std::fprintf(stderr,
               "ps-bench p3: VGG-19 shapes x %.5g (%llu parameters, %.1f MB per direction and "
               "iteration), %d workers, %d iterations after 1 warm-up, %.0f ms compute per "
               "iteration, window %llu bytes, latency %.2f ms\n",
               f.scale, (unsigned long long)total, double(total) * 4 / 1e6, f.workers,
               f.iterations, f.compute_ms, (unsigned long long)f.inflight, f.latency_ms);
  Table table({"bandwidth Mbit/s", "fifo iter s", "p3 iter s", "p3 / fifo", "fifo first-layer s",
               "p3 first-layer s"});
  std::vector<cli::JsonObjectWriter> rows;
  int errors = 0;
  for (const std::string& b : f.bandwidths) {
    double mbps = 0;
    if (!absl::SimpleAtod(b, &mbps) || !(mbps > 0)) {
      std::fprintf(stderr, "ps-bench p3: bad bandwidth '%s'\n", b.c_str());
      return 2;
    }
    Result r[2];
    for (int p3 = 0; p3 < 2; ++p3) {
      absl::StatusOr<Result> res = RunMode(f, p3 == 1, mbps, layers);
      if (!res.ok()) {
        std::fprintf(stderr, "ps-bench p3: %s at %g Mbit/s: %s\n", p3 ? "p3" : "fifo", mbps,
                     std::string(res.status().message()).c_str());
        ++errors;
        continue;
      }
      r[p3] = *res;
      rows.push_back(cli::JsonObjectWriter()
                         .Add("mode", p3 ? "p3" : "fifo")
                         .Add("bandwidth_mbps", mbps)
                         .Add("iteration_seconds", r[p3].iteration_seconds)
                         .Add("first_layer_seconds", r[p3].first_layer_seconds)
                         .Add("forward_stall_seconds", r[p3].stall_seconds)
                         .Add("backward_seconds", r[p3].backward_seconds)
                         .Add("workers", f.workers)
                         .Add("parameters", total)
                         .Add("compute_ms", f.compute_ms));
    }
    table.AddRow({FormatG(mbps, 4), FormatG(r[0].iteration_seconds, 4), FormatG(r[1].iteration_seconds, 4),
                  FormatG(r[0].iteration_seconds > 0 ? r[1].iteration_seconds / r[0].iteration_seconds : 0, 3),
                  FormatG(r[0].first_layer_seconds, 4), FormatG(r[1].first_layer_seconds, 4)});
  }
  return FinishReport("p3", table, "", {}, f.json, rows, errors);
}

}  // namespace

Command AddP3Command(CLI::App& app) {
  auto f = std::make_shared<P3Flags>();
  CLI::App* sub = app.add_subcommand(
      "p3", "P3 priority propagation against FIFO on a VGG-19-shaped model over shaped links: "
            "iteration time and time until the first layer's parameters arrive");
  sub->add_option("--bandwidth", f->bandwidths, "Link rates in Mbit/s per direction (list)")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--latency-ms", f->latency_ms, "Added one-way latency")->capture_default_str();
  sub->add_option("--scale", f->scale, "Tensor sizes as a fraction of VGG-19's")->capture_default_str();
  sub->add_option("--workers", f->workers, "Workers, each with its own shaped link")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  sub->add_option("--iterations", f->iterations, "Timed iterations (after one warm-up)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  sub->add_option("--compute-ms", f->compute_ms,
                  "Simulated forward + backward time per iteration, split by layer FLOPs (1 : 2)")
      ->capture_default_str();
  sub->add_option("--inflight", f->inflight, "WorkerOptions::max_inflight_bytes")->capture_default_str();
  sub->add_option("--window", f->window, "WorkerOptions::receive_window_bytes (0: gRPC's default)")
      ->capture_default_str();
  sub->add_option("--slice-elems", f->slice_elems,
                  "Layout slice size (0: the job's, chosen from the measured link)")
      ->capture_default_str();
  sub->add_option("--json", f->json, "Also write the rows as a JSON array to FILE")->option_text("FILE");
  sub->add_flag("--quick", f->quick, "Tiny run for smoke tests");
  return Command{.app = sub, .run = [f] { return RunP3(*f); }};
}

}  // namespace ps::bench
