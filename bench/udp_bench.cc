// `ps-bench udp`: goodput of the lossy UDP gradient path (docs/transport.md) against both
// data planes (gRPC, native TCP; docs/data-plane.md) in the same run, on loopback. One
// worker pushes a whole model per round to one shard; goodput counts only the gradient
// bytes the shard took (fp32 coordinates, so lost chunks do not count), over the time
// from the first push until the last datagram was taken (UDP) or the last push answered
// (the data planes). Loss is injected at the sender by its seeded hash; the kernel may
// lose more on a full receive buffer, reported apart. Both data planes run over TCP,
// which cannot be made to lose packets here (no kernel traffic control), so their rows
// are the lossless baselines of every UDP row.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "bench/commands.h"
#include "core/data_plane.h"
#include "core/layout.h"
#include "core/status.h"
#include "server/server.h"
#include "spdlog/spdlog.h"
#include "worker_lib/worker.h"

namespace ps::bench {
namespace {

struct UdpFlags {
  std::vector<std::string> losses = {"0", "0.01", "0.05", "0.1"};
  uint64_t numel = 1u << 22;
  int rounds = 5;
  uint32_t chunk_elems = 8192;
  // Sender pacing (0: unpaced). The shard's receiving threads keep up with an unpaced
  // sender on loopback (docs/transport.md); pacing is for links slower than the sender.
  double rate_mbps = 0;
  std::string json;
  bool quick = false;
};

struct Measured {
  double seconds = 0;
  double delivered = 0;  // fraction of the coordinates the shard took
  uint64_t kernel_lost = 0;
};

// The pushes over UDP, or over the shard's data plane.
struct Transport {
  bool udp = false;
  core::DataPlane plane = core::DataPlane::kGrpc;  // the shard's (UDP: gRPC's)
};

// One transport. Returns the totals over the timed rounds.
absl::StatusOr<Measured> RunTransport(const UdpFlags& f, Transport transport, double loss) {
  const bool udp = transport.udp;
  server::ServerOptions so;
  so.insecure = true;  // the data path alone; docs/bench.md
  so.port = 0;
  so.udp_port = udp ? 0 : -1;
  so.data_plane = transport.plane;
  so.data_port = 0;
  so.num_workers = 1;
  so.learning_rate = 1e-6f;
  so.round_deadline = std::chrono::milliseconds(100);
  so.log_level = "warn";
  PS_ASSIGN_OR_RETURN(std::unique_ptr<server::Server> server, server::Server::Start(so));
  PS_ASSIGN_OR_RETURN(core::ModelLayout layout, core::ModelLayout::Create({{"w", f.numel, 0}}));
  std::vector<float> params(f.numel, 0.0f), grad(f.numel);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = GaussianAt(1, 0, i);
  const std::vector<std::span<const float>> init = {params};
  WorkerOptions wo;
  wo.shard_addresses = {absl::StrCat("127.0.0.1:", server->port())};
  wo.push.path = udp ? PushPath::kUdp : PushPath::kDataPlane;
  wo.udp.chunk_elems = f.chunk_elems;
  wo.udp.loss = loss;
  wo.udp.rate_mbps = f.rate_mbps;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Worker> worker, Worker::Start(wo, layout, init));
  const std::vector<std::span<float>> outs = {params};
  Measured m;
  uint64_t taken_before = 0;
  for (int r = 0; r <= f.rounds; ++r) {
    PS_RETURN_IF_ERROR(worker->PullAll(uint64_t(r), outs, std::chrono::seconds(60)).status());
    const uint64_t dropped_before = worker->stats().udp_datagrams_dropped;
    const uint64_t sent_before = worker->stats().udp_datagrams_sent;
    const double t0 = NowSeconds();
    PS_RETURN_IF_ERROR(worker->Push(0, uint64_t(r), grad));
    PS_RETURN_IF_ERROR(worker->WaitPushes());
    uint64_t taken = 0;
    if (udp) {
      // Wait until every datagram sent was taken, or nothing more came for 20 ms.
      const uint64_t sent = worker->stats().udp_datagrams_sent - sent_before;
      double last_change = NowSeconds(), last_seen_at = t0;
      uint64_t last = ~uint64_t{0};
      for (;;) {
        taken = server->udp_stats()->received - taken_before;
        const double now = NowSeconds();
        if (taken != last) {
          last = taken;
          last_change = now;
          last_seen_at = now;
        }
        if (taken >= sent || now - last_change > 0.02 || now - t0 > 30) break;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      if (r > 0) {
        m.seconds += last_seen_at - t0;
        m.kernel_lost += sent - taken;
      }
      taken_before += taken;
    } else if (r > 0) {
      m.seconds += NowSeconds() - t0;
    }
    if (r > 0) {
      // The fraction of chunks taken (chunks are equal but the last of each slice).
      // Offered: what was sent (taken or lost in the kernel) plus what injection dropped.
      const uint64_t offered = (worker->stats().udp_datagrams_sent - sent_before) +
                               (worker->stats().udp_datagrams_dropped - dropped_before);
      m.delivered += udp ? double(taken) / double(std::max<uint64_t>(1, offered)) : 1.0;
    }
  }
  m.delivered /= f.rounds;
  worker.reset();
  server->Shutdown();
  return m;
}

int RunUdp(UdpFlags f) {
  spdlog::set_level(spdlog::level::warn);
  if (f.quick) {
    f.numel = 1u << 18;
    f.rounds = 2;
    f.losses = {"0", "0.1"};
  }
  std::fprintf(stderr,
               "ps-bench udp: %llu fp32 values per round (%.1f MB), %d timed rounds after 1 "
               "warm-up (and a warm-up pass of each transport), chunks of %u values, pacing %s\n",
               (unsigned long long)f.numel, double(f.numel) * 4 / 1e6, f.rounds, f.chunk_elems,
               f.rate_mbps > 0 ? absl::StrCat(f.rate_mbps, " Mbit/s").c_str() : "off");
  const double bytes_per_round = double(f.numel) * 4;
  // One untimed pass of each transport first: the first run in the process pays for
  // growing the heap and faulting its pages (the first UDP row came out 10-30% below
  // the others, whatever its loss), which would bias the comparison.
  const Transport kUdp{.udp = true};
  const std::pair<const char*, Transport> kPlanes[] = {
      {"grpc", Transport{.plane = core::DataPlane::kGrpc}},
      {"tcp", Transport{.plane = core::DataPlane::kTcp}}};
  for (const Transport t : {kPlanes[0].second, kPlanes[1].second, kUdp}) {
    UdpFlags warm = f;
    warm.rounds = 1;
    if (absl::StatusOr<Measured> m = RunTransport(warm, t, 0); !m.ok()) {
      std::fprintf(stderr, "ps-bench udp: warm-up: %s\n", std::string(m.status().message()).c_str());
      return 1;
    }
  }
  Table table({"transport", "loss", "goodput Gbit/s", "ratio to grpc", "ratio to tcp",
               "delivered", "kernel lost"});
  std::vector<cli::JsonObjectWriter> rows;
  double plane_gbps[2] = {0, 0};  // grpc, tcp
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<Measured> m = RunTransport(f, kPlanes[i].second, 0);
    if (!m.ok()) {
      std::fprintf(stderr, "ps-bench udp: %s: %s\n", kPlanes[i].first,
                   std::string(m.status().message()).c_str());
      return 1;
    }
    plane_gbps[i] = bytes_per_round * f.rounds * 8 / 1e9 / m->seconds;
  }
  const double grpc_gbps = plane_gbps[0], tcp_gbps = plane_gbps[1];
  for (int i = 0; i < 2; ++i) {
    table.AddRow({kPlanes[i].first, "0", FormatG(plane_gbps[i], 4),
                  FormatG(plane_gbps[i] / grpc_gbps, 3), FormatG(plane_gbps[i] / tcp_gbps, 3), "1",
                  "0"});
    rows.push_back(cli::JsonObjectWriter()
                       .Add("transport", kPlanes[i].first)
                       .Add("loss", 0.0)
                       .Add("goodput_gbps", plane_gbps[i])
                       .Add("ratio_to_grpc", plane_gbps[i] / grpc_gbps)
                       .Add("ratio_to_tcp", plane_gbps[i] / tcp_gbps)
                       .Add("delivered_fraction", 1.0));
  }
  int errors = 0;
  for (const std::string& text : f.losses) {
    double loss = 0;
    if (!absl::SimpleAtod(text, &loss) || !(loss >= 0 && loss < 1)) {
      std::fprintf(stderr, "ps-bench udp: bad loss '%s' (want [0, 1))\n", text.c_str());
      return 2;
    }
    absl::StatusOr<Measured> m = RunTransport(f, kUdp, loss);
    if (!m.ok()) {
      std::fprintf(stderr, "ps-bench udp: loss %g: %s\n", loss, std::string(m.status().message()).c_str());
      ++errors;
      continue;
    }
    const double gbps = bytes_per_round * m->delivered * f.rounds * 8 / 1e9 / m->seconds;
    table.AddRow({"udp", FormatG(loss, 3), FormatG(gbps, 4), FormatG(gbps / grpc_gbps, 3),
                  FormatG(gbps / tcp_gbps, 3), FormatG(m->delivered, 4),
                  absl::StrCat(m->kernel_lost)});
    rows.push_back(cli::JsonObjectWriter()
                       .Add("transport", "udp")
                       .Add("loss", loss)
                       .Add("goodput_gbps", gbps)
                       .Add("ratio_to_grpc", gbps / grpc_gbps)
                       .Add("ratio_to_tcp", gbps / tcp_gbps)
                       .Add("delivered_fraction", m->delivered)
                       .Add("kernel_lost", m->kernel_lost));
  }
  return FinishReport("udp", table, "", {}, f.json, rows, errors);
}

}  // namespace

Command AddUdpCommand(CLI::App& app) {
  auto f = std::make_shared<UdpFlags>();
  CLI::App* sub = app.add_subcommand(
      "udp", "Goodput of the UDP gradient path at several injected loss rates against both "
             "data planes (gRPC, TCP), same run, loopback");
  sub->add_option("--loss", f->losses, "Injected loss rates in [0, 1) (list)")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--numel", f->numel, "fp32 values pushed per round")->capture_default_str();
  sub->add_option("--rounds", f->rounds, "Timed rounds (after one warm-up)")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  sub->add_option("--chunk-elems", f->chunk_elems, "Values per datagram")->capture_default_str();
  sub->add_option("--rate-mbps", f->rate_mbps, "UDP sender pacing in Mbit/s (0: unpaced)")
      ->capture_default_str();
  sub->add_option("--json", f->json, "Also write the rows as a JSON array to FILE")->option_text("FILE");
  sub->add_flag("--quick", f->quick, "Tiny run for smoke tests");
  return Command{.app = sub, .run = [f] { return RunUdp(*f); }};
}

}  // namespace ps::bench
