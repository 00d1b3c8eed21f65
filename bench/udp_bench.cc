// `ps-bench udp`: goodput of the lossy UDP gradient path (docs/transport.md) against both
// data planes (gRPC, native TCP; docs/data-plane.md) in the same run, on loopback. One
// worker pushes a whole model per round to one shard; goodput counts only the gradient
// bytes the shard took (fp32 coordinates, so lost chunks do not count), over the time
// from the first push until the last datagram was taken (UDP) or the last push answered
// (the data planes).
//
// Where the loss happens:
// - By default the UDP sender drops datagrams by its seeded hash (`--loss`); the kernel
//   may lose more on a full receive buffer, reported apart. The data planes' rows run
//   without loss, once, and are the baselines of every UDP row.
// - With --kernel-loss the kernel drops each packet arriving on loopback with the given
//   probability, for every transport alike (TCP segments and acknowledgements too), in
//   a network namespace of this process's own (harness/lossy_loopback.h; root and nft).
//   Each loss rate gets its own grpc, tcp and udp rows, and the ratios are to the data
//   planes at the same loss.
// Every row's shard runs the default data plane (TCP) but for the gRPC row: the pushes'
// plane in the data planes' rows, the pulls' in all of them.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "bench/commands.h"
#include "codecs/codec.h"
#include "core/data_plane.h"
#include "core/layout.h"
#include "core/status.h"
#include "harness/lossy_loopback.h"
#include "net/udp_frame.h"
#include "server/server.h"
#include "spdlog/spdlog.h"
#include "worker_lib/transport/udp/channel.h"
#include "worker_lib/transport/udp/sender.h"
#include "worker_lib/worker.h"

namespace ps::bench {
namespace {

struct UdpFlags {
  std::vector<std::string> losses = {"0", "0.01", "0.05", "0.1"};
  uint64_t numel = 1u << 22;
  uint32_t slice_elems = kJobSliceElems;  // Worker::Start's: the job's
  int rounds = 5;
  uint32_t chunk_elems = 0;  // UdpOptions' default: one packet of loopback's MTU
  uint32_t end_copies = 2;  // UdpOptions::end_copies
  // Sender pacing (0: unpaced). The shard's receiving threads keep up with an unpaced
  // sender on loopback (docs/transport.md); pacing is for links slower than the sender.
  double rate_mbps = 0;
  std::string json;
  bool quick = false;
  bool kernel_loss = false;  // the kernel drops packets, not the UDP sender
  bool borrow = false;       // PushOptions::borrow on every transport
  int tcp_rto_min_ms = -1;   // ServerOptions::tcp_rto_min (the TCP plane's rows; -1 auto)
};

// The values per datagram of the worker's UDP channel to a shard on loopback with the
// fp32 codec (UdpChannel::chunk_elems).
uint32_t ChunkElemsOf(const UdpOptions& o) {
  const boost::asio::ip::udp::endpoint shard(boost::asio::ip::make_address("127.0.0.1"), 9);
  const std::unique_ptr<codecs::Codec> fp32 = codecs::MakeCodec("fp32").value();
  return internal::udp_path::ChunkElemsFor(
      o, internal::udp_path::RouteMtu(shard).value_or(0), /*ipv6=*/false,
      fp32->spec().size(), [&fp32](size_t n) { return fp32->MaxEncodedBytes(n); });
}

struct Measured {
  double seconds = 0;
  double delivered = 0;  // fraction of the coordinates the shard took
  uint64_t kernel_lost = 0;
};

// The pushes over UDP, or over the shard's data plane.
struct Transport {
  bool udp = false;
  // The shard's data plane: the pushes' (not UDP) and the pulls' (every row).
  core::DataPlane plane = core::DataPlane::kTcp;
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
  so.tcp_rto_min = std::chrono::milliseconds(f.tcp_rto_min_ms);
  so.num_workers = 1;
  so.learning_rate = 1e-6f;
  so.round_deadline = std::chrono::milliseconds(100);
  so.log_level = "warn";
  PS_ASSIGN_OR_RETURN(std::unique_ptr<server::Server> server, server::Server::Start(so));
  std::vector<float> params(f.numel, 0.0f), grad(f.numel);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = GaussianAt(1, 0, i);
  const std::vector<std::span<const float>> init = {params};
  WorkerOptions wo;
  wo.shard_addresses = {absl::StrCat("127.0.0.1:", server->port())};
  wo.push.path = udp ? PushPath::kUdp : PushPath::kDataPlane;
  wo.udp.chunk_elems = f.chunk_elems;
  wo.udp.end_copies = f.end_copies;
  wo.udp.loss = loss;
  wo.udp.rate_mbps = f.rate_mbps;
  wo.push.borrow = f.borrow;  // `grad` stays unchanged over the run
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Worker> worker,
                      Worker::Start(wo, {{"w", f.numel, 0}}, f.slice_elems, init));
  const core::ModelLayout& layout = worker->layout();
  const std::vector<std::span<float>> outs = {params};
  Measured m;
  uint64_t taken_before = 0, chunks_before = 0;
  // The chunks each round offers (sent or dropped by the injection); the end datagrams
  // besides carry no coordinates.
  uint64_t chunks_per_round = 0;
  const uint32_t chunk_elems = ChunkElemsOf(wo.udp);
  for (const core::SliceInfo& s : layout.slices()) {
    chunks_per_round += net::ChunkCount(s.numel, chunk_elems);
  }
  for (int r = 0; r <= f.rounds; ++r) {
    PS_RETURN_IF_ERROR(worker->PullAll(uint64_t(r), outs, std::chrono::seconds(60)).status());
    const uint64_t sent_before = worker->stats().udp_datagrams_sent;
    const double t0 = NowSeconds();
    PS_RETURN_IF_ERROR(worker->Push(0, uint64_t(r), grad));
    PS_RETURN_IF_ERROR(worker->WaitPushes());
    uint64_t taken = 0, chunks_taken = 0;
    if (udp) {
      // Wait until every datagram sent was taken, or nothing more came for 20 ms. The
      // push ends with end_copies end datagrams, counted apart from the chunks.
      const uint64_t sent = worker->stats().udp_datagrams_sent - sent_before;
      double last_change = NowSeconds(), last_seen_at = t0;
      uint64_t last = ~uint64_t{0};
      for (;;) {
        const server::transport::udp::Stats u = *server->udp_stats();
        taken = u.received + u.end_datagrams - taken_before;
        chunks_taken = u.received - chunks_before;
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
      chunks_before += chunks_taken;
    } else if (r > 0) {
      m.seconds += NowSeconds() - t0;
    }
    if (r > 0) {
      // The fraction of chunks taken (chunks are equal but the last of each slice).
      m.delivered +=
          udp ? double(chunks_taken) / double(std::max<uint64_t>(1, chunks_per_round)) : 1.0;
    }
  }
  m.delivered /= f.rounds;
  worker.reset();
  server->Shutdown();
  return m;
}

// One row of the report: a transport's goodput at one loss rate.
struct UdpRow {
  const char* transport = "";
  double loss = 0;
  double gbps = 0;
  double delivered = 1;                // fraction of the coordinates the shard took
  uint64_t kernel_lost = 0;            // UDP datagrams sent but never taken
  std::optional<uint64_t> packets_dropped;  // --kernel-loss: the rule's drops in this row
};

int RunUdp(UdpFlags f) {
  spdlog::set_level(spdlog::level::warn);
  if (f.quick) {
    f.numel = 1u << 18;
    f.rounds = 2;
    f.losses = {"0", "0.1"};
  }
  std::vector<double> losses;
  for (const std::string& text : f.losses) {
    double loss = 0;
    if (!absl::SimpleAtod(text, &loss) || !(loss >= 0 && loss < 1)) {
      std::fprintf(stderr, "ps-bench udp: bad loss '%s' (want [0, 1))\n", text.c_str());
      return 2;
    }
    losses.push_back(loss);
  }
  // Before any thread starts: the servers' and workers' threads must be in the lossy
  // namespace.
  std::optional<harness::LossyLoopback> loopback;
  if (f.kernel_loss) {
    absl::StatusOr<harness::LossyLoopback> entered = harness::LossyLoopback::Enter();
    if (!entered.ok()) {
      std::fprintf(stderr, "ps-bench udp --kernel-loss: %s\n",
                   std::string(entered.status().message()).c_str());
      return 1;
    }
    loopback.emplace(*std::move(entered));
  }
  std::fprintf(stderr,
               "ps-bench udp: %llu fp32 values per round (%.1f MB), %d timed rounds after 1 "
               "warm-up (and a warm-up pass of each transport), chunks of %u values, pacing %s, "
               "loss %s\n",
               (unsigned long long)f.numel, double(f.numel) * 4 / 1e6, f.rounds,
               ChunkElemsOf(UdpOptions{.chunk_elems = f.chunk_elems}),
               f.rate_mbps > 0 ? absl::StrCat(f.rate_mbps, " Mbit/s").c_str() : "off",
               f.kernel_loss ? "by the kernel, every transport (private network namespace)"
                             : "at the UDP sender");
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
  // One row: `sender_loss` is the UDP sender's injected loss, `loss` what the row shows.
  const auto measure = [&](const char* name, Transport t, double loss,
                           double sender_loss) -> absl::StatusOr<UdpRow> {
    std::optional<uint64_t> dropped_before;
    if (loopback) {
      PS_ASSIGN_OR_RETURN(dropped_before, loopback->Dropped());
    }
    PS_ASSIGN_OR_RETURN(const Measured m, RunTransport(f, t, sender_loss));
    UdpRow row{.transport = name, .loss = loss};
    row.delivered = m.delivered;  // 1 for the data planes
    row.gbps = bytes_per_round * row.delivered * f.rounds * 8 / 1e9 / m.seconds;
    row.kernel_lost = m.kernel_lost;
    if (loopback) {
      PS_ASSIGN_OR_RETURN(const uint64_t dropped_after, loopback->Dropped());
      row.packets_dropped = dropped_after - *dropped_before;
    }
    return row;
  };
  std::vector<std::string> columns = {"transport", "loss", "goodput Gbit/s", "ratio to grpc",
                                      "ratio to tcp", "delivered", "kernel lost"};
  if (loopback) columns.push_back("packets dropped");
  Table table(columns);
  std::vector<cli::JsonObjectWriter> json_rows;
  int errors = 0;
  // Adds `rows` (the baselines first) with ratios to the baselines' goodput.
  const auto report = [&](const std::vector<UdpRow>& rows, double grpc_gbps, double tcp_gbps) {
    for (const UdpRow& r : rows) {
      std::vector<std::string> cells = {r.transport,           FormatG(r.loss, 3),
                                        FormatG(r.gbps, 4),    FormatG(r.gbps / grpc_gbps, 3),
                                        FormatG(r.gbps / tcp_gbps, 3), FormatG(r.delivered, 4),
                                        absl::StrCat(r.kernel_lost)};
      if (loopback) cells.push_back(absl::StrCat(r.packets_dropped.value_or(0)));
      table.AddRow(cells);
      cli::JsonObjectWriter json;
      json.Add("transport", r.transport)
          .Add("loss", r.loss)
          .Add("loss_at", f.kernel_loss ? "kernel" : "sender")
          .Add("goodput_gbps", r.gbps)
          .Add("ratio_to_grpc", r.gbps / grpc_gbps)
          .Add("ratio_to_tcp", r.gbps / tcp_gbps)
          .Add("delivered_fraction", r.delivered)
          .Add("borrow", f.borrow)
          .Add("tcp_rto_min_ms", f.tcp_rto_min_ms);
      if (std::string_view(r.transport) == "udp") json.Add("kernel_lost", r.kernel_lost);
      if (r.packets_dropped) json.Add("packets_dropped", *r.packets_dropped);
      json_rows.push_back(std::move(json));
    }
  };
  // The data planes at `loss` (the kernel's, or none), then the UDP rows they are the
  // baselines of.
  const auto run_group = [&](double plane_loss, const std::vector<double>& udp_losses) -> bool {
    if (loopback) {
      if (absl::Status st = loopback->SetLoss(plane_loss); !st.ok()) {
        std::fprintf(stderr, "ps-bench udp: %s\n", std::string(st.message()).c_str());
        return false;
      }
    }
    std::vector<UdpRow> rows;
    for (const auto& [name, t] : kPlanes) {
      absl::StatusOr<UdpRow> row = measure(name, t, plane_loss, 0);
      if (!row.ok()) {
        std::fprintf(stderr, "ps-bench udp: %s at loss %g: %s\n", name, plane_loss,
                     std::string(row.status().message()).c_str());
        return false;
      }
      rows.push_back(*row);
    }
    for (const double loss : udp_losses) {
      absl::StatusOr<UdpRow> row = measure("udp", kUdp, loss, loopback ? 0 : loss);
      if (!row.ok()) {
        std::fprintf(stderr, "ps-bench udp: loss %g: %s\n", loss,
                     std::string(row.status().message()).c_str());
        ++errors;
        continue;
      }
      rows.push_back(*row);
    }
    report(rows, rows[0].gbps, rows[1].gbps);
    return true;
  };
  if (loopback) {
    for (const double loss : losses) {
      if (!run_group(loss, {loss})) return 1;
    }
  } else if (!run_group(0, losses)) {
    return 1;
  }
  return FinishReport("udp", table, "", {}, f.json, json_rows, errors);
}

}  // namespace

Command AddUdpCommand(CLI::App& app) {
  auto f = std::make_shared<UdpFlags>();
  CLI::App* sub = app.add_subcommand(
      "udp", "Goodput of the UDP gradient path at several injected loss rates against both "
             "data planes (gRPC, TCP), same run, loopback");
  sub->add_option("--loss", f->losses, "Loss rates in [0, 1) (list): the UDP sender's, or the kernel's with --kernel-loss")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--numel", f->numel, "fp32 values pushed per round")->capture_default_str();
  sub->add_option("--slice-elems", f->slice_elems,
                  "Layout slice size (0: the job's, chosen from the measured link)")
      ->capture_default_str();
  sub->add_option("--rounds", f->rounds, "Timed rounds (after one warm-up)")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  sub->add_option("--chunk-elems", f->chunk_elems,
                  "Values per datagram (0: UdpOptions' default, as many fp32 values as fill one "
                  "packet of loopback's MTU)")
      ->capture_default_str();
  sub->add_option("--end-copies", f->end_copies,
                  "Copies of the end datagram after the push's chunks (UdpOptions::end_copies)")
      ->capture_default_str()
      ->check(CLI::Range(0, 16));
  sub->add_option("--rate-mbps", f->rate_mbps, "UDP sender pacing in Mbit/s (0: unpaced)")
      ->capture_default_str();
  sub->add_option("--json", f->json, "Also write the rows as a JSON array to FILE")->option_text("FILE");
  sub->add_flag("--kernel-loss", f->kernel_loss,
                "Let the kernel drop the --loss fraction of every packet on loopback, for "
                "every transport (a network namespace of its own: root and nft)");
  sub->add_flag("--borrow", f->borrow,
                "Push from the gradient buffer without copying it (PushOptions::borrow), on "
                "every transport: the UDP path and the TCP plane borrow, gRPC copies");
  AddTcpRtoMinOption(sub, &f->tcp_rto_min_ms);
  sub->add_flag("--quick", f->quick, "Tiny run for smoke tests");
  return Command{.app = sub, .run = [f] { return RunUdp(*f); }};
}

}  // namespace ps::bench
