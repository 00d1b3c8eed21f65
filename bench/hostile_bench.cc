// `ps-bench hostile`: how well honest training keeps going while a hostile client
// attacks a real ps-server process, as a ratio against a baseline measured alternately
// in the same run (docs/bench.md, "Hostile clients").
//
// Every attack gets a fresh ps-server (the binary, authenticated by the secret of a
// fresh private run directory) on 127.0.0.1 with n = 4 workers, f = 1 and the trimmed
// mean. Three honest ps::Worker clients (workers 0..2, each with its own token) train a
// two-tensor model in this process, round after round: pull version t, push round t,
// wait for the answers. The attacker holds worker 3's token (an authenticated Byzantine
// worker; it proves it as every client does) and, for the impersonation attack, no token
// or forged ones (it sends their proofs, which the shard refuses).
//
// Worker 3 also pushes a valid gradient in every round, as a Byzantine worker that wants
// to stay in the rounds would (the "cover"; --no-cover turns it off). Rounds then close
// on four pushes, and the round rate measures the server rather than the round
// deadline, which every round would otherwise wait for (a silent worker 3 makes each
// round last --round-deadline-ms).
//
// Phases alternate: baseline (no attack) for --seconds, attack for --seconds, repeated
// --alternations times. Reported per attack: honest rounds per second in both kinds of
// phase and the median over alternations of their ratio; the server's peak VmRSS
// (/proc/PID/status every 50 ms, and VmHWM restarted at every phase) during the attack
// against --max-shard-bytes; the attack's requests and the status codes it got; how much
// the server's log (its stderr, a file) grew; the server's and this process's CPU time.
// Attacks on the layout also run before the honest workers register theirs, the only
// time a shard builds a layout from a request.
//
// The server, the honest workers and the attacker share one machine: an attack that
// burns client CPU slows honest training even where the server does no extra work. The
// CPU columns tell the two apart.
//
// This file runs the phases and writes the report; the parts it runs are the attacks
// (hostile_attacks.h, acting as worker 3 through hostile_clients.h), worker 3's cover
// (hostile_cover.h) and the rows (hostile_report.h); the server process, its
// resident-memory sampler and the honest workers are the harness's
// (harness/server_process.h, process_stats.h, honest_training.h).
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/bench_util.h"
#include "bench/commands.h"
#include "bench/hostile_attacks.h"
#include "bench/hostile_clients.h"
#include "bench/hostile_cover.h"
#include "bench/hostile_report.h"
#include "bench/push_counts.h"
#include "core/status.h"
#include "harness/honest_training.h"
#include "harness/process_stats.h"
#include "harness/server_process.h"
#include "ps/v1/ps.grpc.pb.h"
#include "spdlog/spdlog.h"
#if PS_HAVE_DATA_PORT_CLIENT
#include "bench/hostile_data_phases.h"
#endif

namespace ps::bench {
namespace {

using std::chrono::milliseconds;

struct HostileFlags {
  double seconds = 5;
  int alternations = 2;
  std::vector<std::string> attacks;
  bool quick = false;
  std::string server_bin;
  std::string max_shard_bytes = "512M";
  uint32_t inflight = 4;
  uint32_t round_deadline_ms = 500;
  // The server's --quarantine-ms; every baseline phase waits until worker 3 is out of a
  // quarantine its attack earned, so that it measures the rounds with worker 3 in them.
  uint32_t quarantine_ms = 2000;
  bool no_cover = false;
  bool keep_dirs = false;
  bool list = false;
  std::string json;
};

// Options whose count() tells whether the user gave them (--quick fills the rest).
struct HostileGiven {
  CLI::Option* seconds = nullptr;
  CLI::Option* alternations = nullptr;
  CLI::Option* inflight = nullptr;
  CLI::Option* quarantine = nullptr;
};

// ---- One attack against a fresh server ------------------------------------------------------

class Runner {
 public:
  Runner(const HostileFlags& f, const Limits& limits, uint64_t max_shard_bytes)
      : f_(f), limits_(limits), max_shard_bytes_(max_shard_bytes) {}

  Row Run(const Attack& attack) {
    Row row;
    row.attack = attack.name;
    char dir_template[] = "/tmp/ps-bench-hostile-XXXXXX";
    const char* dir = ::mkdtemp(dir_template);
    if (dir == nullptr) {
      row.error = absl::StrCat("mkdtemp: ", std::strerror(errno));
      return row;
    }
    const std::string run_dir = dir;
    if (absl::Status st = RunIn(attack, run_dir, row); !st.ok())
      row.error = std::string(st.message());
    if (f_.keep_dirs) {
      std::fprintf(stderr, "ps-bench hostile: %s: run directory and server log kept in %s\n",
                   attack.name.c_str(), run_dir.c_str());
    } else {
      std::error_code ec;
      std::filesystem::remove_all(run_dir, ec);
    }
    return row;
  }

 private:
  absl::Status RunIn(const Attack& attack, const std::string& run_dir, Row& row) {
    const std::string port_file = run_dir + "/port", log_file = run_dir + "/server.log";
    std::vector<std::string> args = {
        "--host", "127.0.0.1", "--port", "0", "--port-file", port_file, "--run-dir", run_dir,
        "--workers", absl::StrCat(kWorkers), "--byzantine", "1", "--aggregator", "trimmed_mean",
        "--round-deadline-ms", absl::StrCat(f_.round_deadline_ms), "--threads", "2",
        "--max-shard-bytes", absl::StrCat(max_shard_bytes_),
        "--max-pulls-per-worker", absl::StrCat(kMaxPullsPerWorker),
        "--drain-timeout-ms", "1000", "--quarantine-ms", absl::StrCat(f_.quarantine_ms),
        "--udp-port", "0"};
    // The gRPC attackers speak ps.v1 on the control port, so their shards run gRPC's plane.
    if (attack.tcp_data_plane) {
      args.insert(args.end(), {"--data-plane", "tcp", "--data-port", "0"});
    } else {
      args.insert(args.end(), {"--data-plane", "grpc"});
    }
    PS_ASSIGN_OR_RETURN(std::unique_ptr<harness::ServerProcess> server,
                        harness::ServerProcess::Start(f_.server_bin, args, log_file));
    PS_ASSIGN_OR_RETURN(const uint16_t port, server->WaitForPort(port_file, milliseconds(20000)));
    const std::string address = absl::StrCat("127.0.0.1:", port);
    AttackerProofs::Get().Reset(address);
    PS_ASSIGN_OR_RETURN(const std::vector<std::string> tokens,
                        harness::ReadWorkerTokens(run_dir, kWorkers));
    const core::ModelLayout layout = HonestLayout();
    harness::PeakSampler sampler(server->pid());
    Attacker attacker(address, port, tokens[kAttackerId], layout.hash());
    {
      std::unique_ptr<v1::WorkerService::Stub> stub =
          v1::WorkerService::NewStub(OwnChannel(address));
      if (grpc::Status s = attacker.Join(*stub); !s.ok()) {
        return absl::InternalError(absl::StrCat("worker 3 could not join: ", s.error_message()));
      }
    }
    Tally tally;
    SpecSource specs;
    AttackEnv env{&attacker, &layout, nullptr, &tally, &limits_, &specs, nullptr};
    const auto finish = [&](absl::Status st) {
      row.requests = tally.requests();
      row.accepted = tally.accepted();
      for (int c = 1; c < kStatusCodes; ++c) {
        if (tally.code(c) > 0) row.refusals[CodeName(c)] = tally.code(c);
      }
      if (tally.code(0) > 0 && attack.name != "impersonation") {
        row.notes.push_back(absl::StrCat(tally.code(0), " requests answered OK"));
      }
      for (std::string& n : tally.notes()) row.notes.push_back(std::move(n));
      row.server_end = server->Stop(milliseconds(5000));
      return st;
    };

    if (attack.before_layout) {
      row.ran_prelude = true;
      row.prelude = RunPhase(attack, env, *server, sampler, nullptr, limits_.prelude_seconds, true);
    }
    absl::StatusOr<std::unique_ptr<harness::HonestTraining>> training =
        harness::HonestTraining::Start(layout, {.address = address, .tokens = tokens, .workers = kHonest});
    if (!training.ok()) return finish(training.status());
    env.training = training->get();
    std::unique_ptr<Cover> cover;
#if PS_HAVE_DATA_PORT_CLIENT
    std::unique_ptr<DataPortCover> data_cover;  // the cover of a shard on the TCP plane
    if (!f_.no_cover && !attack.without_cover && attack.tcp_data_plane) {
      const harness::HonestTraining* t = training->get();
      data_cover = std::make_unique<DataPortCover>(
          [&attacker] { return attacker.data_target(); }, layout,
          DataPortCover::Rounds{
              .wait_open = [t](uint64_t next, milliseconds within) { return t->WaitOpen(next, within); },
              .open_version = [t] { return t->open_version(); }});
    }
#endif
    if (!f_.no_cover && !attack.without_cover && !attack.tcp_data_plane)
      cover = std::make_unique<Cover>(attacker, **training, layout, specs);
    std::this_thread::sleep_for(std::chrono::duration<double>(limits_.warmup_seconds));
    for (int a = 0; a < f_.alternations && !server->Exited(); ++a) {
      row.base.push_back(
          RunPhase(attack, env, *server, sampler, training->get(), f_.seconds, false));
      if (cover != nullptr && attack.poison_cover) cover->SetPoison(&tally);
      row.attack_phases.push_back(
          RunPhase(attack, env, *server, sampler, training->get(), f_.seconds, true));
      if (cover != nullptr) cover->SetPoison(nullptr);
      // The next baseline measures the rounds with worker 3 in them again (an attack
      // phase may have earned it a quarantine).
      if (a + 1 < f_.alternations)
        std::this_thread::sleep_for(milliseconds(f_.quarantine_ms + 300));
    }
    if (cover != nullptr) CoverCounts(cover->counts(), row);
    cover.reset();
#if PS_HAVE_DATA_PORT_CLIENT
    if (data_cover != nullptr) CoverCounts(data_cover->counts(), row);
    data_cover.reset();
#endif
    (*training)->Stop();
    row.honest_last_error = (*training)->last_error();
    if (attack.check && !server->Exited()) {
      std::atomic<bool> stop{false};
      env.stop = &stop;
      row.check = attack.check(env, server->pid());
      row.has_check = true;
    }
    if (server->Exited()) {
      return finish(absl::InternalError(absl::StrCat(
          "ps-server ", server->Describe(), " during the attack:\n", server->LogTail(2000))));
    }
    return finish(absl::OkStatus());
  }

  // What worker 3's cover (of either plane) pushed, into `row`.
  static void CoverCounts(const PushCounts& counts, Row& row) {
    row.cover_pushed = counts.pushed();
    row.cover_refused = counts.refused();
    if (row.cover_refused > 0)
      row.notes.push_back(absl::StrCat("worker 3's last refused push: ", counts.last_refusal()));
  }

  // One phase of `seconds`: with the attack's threads running when `attacking`.
  Phase RunPhase(const Attack& attack, AttackEnv& env, harness::ServerProcess& server,
                 harness::PeakSampler& sampler, const harness::HonestTraining* training, double seconds, bool attacking) {
    Phase p;
    std::atomic<bool> stop{false};
    env.stop = &stop;
    env.tally->StartPhase();
    sampler.Reset();
    const uint64_t log0 = server.LogBytes();
    const double cpu0 = harness::CpuSeconds(server.pid());
    const double own_cpu0 = harness::CpuSeconds(::getpid());
    const uint64_t rounds0 = training != nullptr ? training->rounds() : 0;
    const uint64_t errors0 = training != nullptr ? training->errors() : 0;
    const double t0 = NowSeconds();
    std::vector<std::thread> threads;
    if (attacking) {
      for (int i = 0; i < attack.threads; ++i)
        threads.emplace_back([&env, &attack, i] { attack.run(env, i); });
    }
    while (NowSeconds() - t0 < seconds && !server.Exited())
      std::this_thread::sleep_for(milliseconds(20));
    p.seconds = NowSeconds() - t0;
    if (training != nullptr) {
      p.rounds_per_s = double(training->rounds() - rounds0) / kHonest / p.seconds;
      p.honest_errors = training->errors() - errors0;
    }
    stop.store(true);
    for (std::thread& t : threads) t.join();
    p.requests = env.tally->phase_requests();
    p.log_bytes = server.LogBytes() - log0;
    p.server_cpu = (harness::CpuSeconds(server.pid()) - cpu0) / (NowSeconds() - t0);
    p.bench_cpu = (harness::CpuSeconds(::getpid()) - own_cpu0) / (NowSeconds() - t0);
    p.peak_rss_mib = sampler.peak_rss_mib();
    p.peak_fds = sampler.peak_fds();
    return p;
  }

  const HostileFlags& f_;
  const Limits& limits_;
  const uint64_t max_shard_bytes_;
};

int RunHostile(HostileFlags f, const HostileGiven& given) {
  spdlog::set_level(spdlog::level::err);
  const std::vector<Attack> all = AllAttacks();
  if (f.list) {
    for (const Attack& a : all) {
      std::printf("%-22s %s%s\n", a.name.c_str(), a.what.c_str(),
                  a.by_name ? " (only by name)" : "");
    }
    return 0;
  }
  Limits limits;
  if (f.quick) {
    if (given.seconds->count() == 0) f.seconds = 1;
    if (given.alternations->count() == 0) f.alternations = 1;
    limits.max_requests = 20000;
    limits.pull_batch = 32;
    limits.idle_deadline = milliseconds(500);
    limits.grpc_connections = 32;
    limits.raw_connections = 64;
    limits.prelude_seconds = 0.3;
    limits.warmup_seconds = 0.3;
    if (given.quarantine->count() == 0) f.quarantine_ms = 500;
    if (given.inflight->count() == 0) f.inflight = 2;
  }
  limits.inflight = f.inflight;
  if (f.seconds <= 0 || f.alternations < 1) {
    std::fprintf(stderr, "ps-bench hostile: need --seconds > 0 and --alternations >= 1\n");
    return 2;
  }
  absl::StatusOr<uint64_t> max_shard_bytes = ParseSize(f.max_shard_bytes);
  if (!max_shard_bytes.ok() || *max_shard_bytes == 0) {
    std::fprintf(stderr, "ps-bench hostile: bad --max-shard-bytes '%s'\n",
                 f.max_shard_bytes.c_str());
    return 2;
  }
  if (f.server_bin.empty()) {
    std::error_code ec;
    const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
    f.server_bin = ec ? "ps-server" : (self.parent_path() / "ps-server").string();
  }
  std::vector<const Attack*> chosen;
  if (f.attacks.empty()) {
    for (const Attack& a : all) {
      if (!a.by_name) chosen.push_back(&a);
    }
  } else {
    for (const std::string& text : f.attacks) {
      for (const std::string& name : SplitList(text)) {
        auto it =
            std::find_if(all.begin(), all.end(), [&](const Attack& a) { return a.name == name; });
        if (it == all.end()) {
          std::vector<std::string> names;
          for (const Attack& a : all) names.push_back(a.name);
          std::fprintf(stderr, "ps-bench hostile: unknown attack '%s'; known: %s\n", name.c_str(),
                       absl::StrJoin(names, ", ").c_str());
          return 2;
        }
        if (std::find(chosen.begin(), chosen.end(), &*it) == chosen.end()) chosen.push_back(&*it);
      }
    }
  }
  const double bound_mib = double(*max_shard_bytes) / double(1 << 20);
  std::fprintf(
      stderr,
      "ps-bench hostile: %s; a fresh server per attack (n = %u, f = 1, trimmed_mean, deadline %u "
      "ms, --quarantine-ms %u, "
      "--max-shard-bytes %s); %d x (baseline %.3g s, attack %.3g s); worker 3 %s\n",
      f.server_bin.c_str(), kWorkers, f.round_deadline_ms, f.quarantine_ms,
      FormatSize(*max_shard_bytes).c_str(), f.alternations, f.seconds, f.seconds,
      f.no_cover ? "never pushes (rounds wait for the deadline)" : "pushes every round (cover)");
  Runner runner(f, limits, *max_shard_bytes);
  Table table(ReportColumns());
  std::vector<std::string> json_rows;
  int failures = 0;
  for (const Attack* attack : chosen) {
    std::fprintf(stderr, "ps-bench hostile: %s ...\n", attack->name.c_str());
    const Row r = runner.Run(*attack);
    table.AddRow(ReportCells(r, bound_mib));
    json_rows.push_back(RowJson(r, bound_mib));
    for (const std::string& finding : Findings(r, bound_mib)) {
      std::fprintf(stderr, "ps-bench hostile: %s: FINDING: %s\n", r.attack.c_str(),
                   finding.c_str());
      ++failures;
    }
    for (const std::string& note : r.notes) {
      std::fprintf(stderr, "ps-bench hostile: %s: note: %s\n", r.attack.c_str(), note.c_str());
    }
    if (!r.honest_last_error.empty()) {
      std::fprintf(stderr, "ps-bench hostile: %s: last honest error: %s\n", r.attack.c_str(),
                   r.honest_last_error.c_str());
    }
  }
  return FinishReport("hostile", table, "", {}, f.json, json_rows, failures);
}

}  // namespace

Command AddHostileCommand(CLI::App& app) {
  auto f = std::make_shared<HostileFlags>();
  auto given = std::make_shared<HostileGiven>();
  CLI::App* sub = app.add_subcommand(
      "hostile",
      "Honest rounds per second of a real ps-server while a hostile client attacks it, against "
      "the same without the attack, alternately in the same run; peak RSS, refusals, log growth");
  given->seconds =
      sub->add_option("--seconds", f->seconds, "Seconds per phase")->capture_default_str();
  given->alternations =
      sub->add_option("--alternations", f->alternations, "Baseline + attack pairs per attack")
          ->capture_default_str();
  sub->add_option("--attacks", f->attacks,
                  "Attacks to run, comma-separated (default: all; see --list)");
  sub->add_option("--server-bin", f->server_bin,
                  "The ps-server binary (default: ps-server beside ps-bench)")
      ->option_text("PATH");
  sub->add_option("--max-shard-bytes", f->max_shard_bytes,
                  "The server's --max-shard-bytes, also the bound its peak RSS is checked against")
      ->capture_default_str();
  given->quarantine =
      sub->add_option("--quarantine-ms", f->quarantine_ms,
                      "The server's --quarantine-ms (each baseline phase waits this long after an "
                      "attack phase, so that worker 3 is out of quarantine)")
          ->capture_default_str();
  sub->add_option("--round-deadline-ms", f->round_deadline_ms, "The server's --round-deadline-ms")
      ->capture_default_str();
  given->inflight =
      sub->add_option("--inflight", f->inflight,
                      "layout_tensors and big_messages: 7 MB requests in flight at once")
          ->check(CLI::Range(1, 1024))
          ->capture_default_str();
  sub->add_flag("--no-cover", f->no_cover,
                "Worker 3 never pushes a valid gradient: every round waits for the round deadline");
  sub->add_flag("--keep-dirs", f->keep_dirs,
                "Keep each server's run directory and log (path on stderr)");
  sub->add_option("--json", f->json, "Also write one row per attack as a JSON array to FILE")
      ->option_text("FILE");
  sub->add_flag(
      "--quick", f->quick,
      "Smoke test: 1 s phases, one alternation, small counts (flags given explicitly still win)");
  sub->add_flag("--list", f->list, "Print the attacks and exit");
  return Command{.app = sub, .run = [f, given] { return RunHostile(*f, *given); }};
}

}  // namespace ps::bench
