// `ps-bench e2e`: end-to-end goodput of push plus pull with n workers and S shards on
// loopback, against raw loopback TCP measured in the same run (docs/bench.md, "End to
// end"). The shards are in-process ps::server::Server instances (SGD, or aggregate-only,
// with each rule of --aggregator in turn), the workers ps::Worker clients, one thread
// each. Every round, each worker pulls the whole model (version r), then pushes a gradient of the whole model
// (round r) and waits for the answers; the next pull can only complete once every
// worker's push of round r was aggregated. Goodput counts, per worker and timed round,
// the fp32 gradient bytes pushed (4 x params, whatever the codec) plus the fp32
// parameter bytes pulled (4 x params).
//
// The baseline opens the same number of loopback TCP connections (one per worker and
// shard) and moves the same bytes per round with plain send/recv: the worker side
// sends its share of the gradient, the shard side receives all of it and sends the
// same number of bytes back. It runs before and after the cluster (after it, --repeats
// times); the fastest counts. The one-copy baseline runs --repeats times after the
// cluster; the fastest counts.
//
// Several --aggregator rules are measured on the same configuration, each against `mean`
// of the same cell (vs_mean): the robust rules' overhead on the whole path. The rules run
// one after another between the baseline's two runs, --repeats times, forward and then
// backward, and each rule's fastest repetition counts, as the baseline's faster run does.
//
// Several --data-plane values measure the same cells on each plane (docs/data-plane.md),
// interleaved like the rules: each row then says its plane, vs_mean compares with mean on
// the same plane, and vs_grpc with the same rule over gRPC. `--tls` serves both ports of
// every shard with mutual TLS (throwaway certificates for every shard and worker,
// bench/throwaway_cert.h, instead of --insecure), so that TLS's cost shows on each plane;
// the baselines stay plaintext.
//
// `--soak` runs one configuration for --seconds and reports the resident memory of the
// process (servers and workers together) at start, every --soak-interval seconds and
// at the end, as JSON rows.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <latch>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "aggregators/aggregator.h"
#include "bench/bench_util.h"
#include "bench/commands.h"
#include "bench/throwaway_cert.h"
#include "core/data_plane.h"
#include "core/layout.h"
#include "core/status.h"
#include "server/local_cluster.h"
#include "server/options.h"
#include "spdlog/spdlog.h"
#include "worker_lib/worker.h"

namespace ps::bench {
namespace {

struct E2eFlags {
  std::vector<std::string> workers = {"1", "4"};
  std::vector<std::string> shards = {"1", "2"};
  std::string params = "2^22";
  std::vector<std::string> codecs = {"fp32"};
  std::string pull_codec;  // ServerOptions::pull_codec ("": dense pulls)
  int rounds = 10;
  // Untimed rounds first. Two by default: the first timed round otherwise carries the
  // shards' first aggregation and publication (lazily sized buffers, the pool's first
  // jobs), about four times a steady round.
  int warmup = 2;
  double seconds = 0;  // > 0: run rounds until this long instead of --rounds
  uint32_t slice_elems = core::kDefaultSliceElems;
  uint64_t inflight = 0;  // 0: WorkerOptions' default
  double inflight_seconds = WorkerOptions{}.inflight_seconds;
  uint32_t server_threads = 0;
  uint32_t data_threads = server::ServerOptions{}.data_threads;
  bool aggregate_only = false;
  // Aggregation rule specs (docs/aggregators.md; a '+' chain is one spec). `mean` is
  // added first when absent: it is the baseline the others are compared with.
  std::vector<std::string> aggregators = {"mean"};
  // f for every rule; -1: per rule, the largest f its bound admits (RulesFor).
  int byzantine = -1;
  std::string aggregation_scope = "model";  // ServerOptions::aggregation_scope
  int repeats = 1;  // cluster runs per rule and cell; the fastest counts
  // The shards' data planes (ServerOptions::data_plane), each measured on every cell.
  std::vector<std::string> data_planes = {"grpc"};
  bool tls = false;
  std::shared_ptr<const ThrowawayCerts> tls_files;  // made by RunE2e with --tls
  bool no_raw = false;  // skip the baseline (for profiling the cluster alone)
  bool soak = false;
  double soak_interval = 60;
  std::string json;
  bool quick = false;
  // Running shards (ps-server processes started with --insecure and --workers equal to
  // the one --workers count) instead of in-process ones: for comparing other clients
  // against the same shards (bench/python_e2e.py).
  std::vector<std::string> shards_at;
};

// ---- Process figures ---------------------------------------------------------------

// VmRSS and VmHWM of this process in KiB (/proc/self/status), 0 when unreadable, and
// the bytes malloc has handed out and not taken back (glibc; 0 elsewhere): resident
// memory that rises while heap_in_use stays put is the heap's free space growing
// (fragmentation, the kept heap), not a leak.
struct Memory {
  uint64_t rss_kib = 0, hwm_kib = 0, heap_in_use_kib = 0;
};

Memory ReadMemory() {
  Memory m;
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    const auto value = [&] { return std::strtoull(line.c_str() + line.find(':') + 1, nullptr, 10); };
    if (line.rfind("VmRSS:", 0) == 0) m.rss_kib = value();
    if (line.rfind("VmHWM:", 0) == 0) m.hwm_kib = value();
  }
#if defined(__GLIBC__)
  const struct mallinfo2 mi = mallinfo2();
  m.heap_in_use_kib = (mi.uordblks + mi.hblkhd) / 1024;
#endif
  return m;
}

// User + system CPU seconds of every thread of this process so far.
double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  const auto s = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

// ---- Raw TCP baseline -------------------------------------------------------------

struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd, o.fd);
    return *this;
  }
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

absl::Status Errno(std::string_view what) {
  return absl::InternalError(absl::StrCat(core::AsAbsl(what), ": ", std::strerror(errno)));
}

absl::Status SendAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::send(fd, p, std::min<size_t>(n, 1u << 20), MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return Errno("send");
    p += k;
    n -= size_t(k);
  }
  return absl::OkStatus();
}

absl::Status RecvAll(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0) return absl::InternalError("recv: connection closed early");
    if (k < 0) return Errno("recv");
    p += k;
    n -= size_t(k);
  }
  return absl::OkStatus();
}

struct RawResult {
  double seconds = 0;
  double cpu_seconds = 0;
};

// `workers` x `shard_bytes.size()` connections; per round, connection (w, s) sends
// shard_bytes[s] bytes of `source` one way and the same number back.
absl::StatusOr<RawResult> RunRawTcp(int workers, const std::vector<uint64_t>& shard_bytes,
                                    int rounds, const std::vector<char>& source, bool one_copy) {
  Fd listener(::socket(AF_INET, SOCK_STREAM, 0));
  if (listener.fd < 0) return Errno("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(listener.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return Errno("bind");
  socklen_t len = sizeof(addr);
  if (::getsockname(listener.fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return Errno("getsockname");
  if (::listen(listener.fd, 1024) != 0) return Errno("listen");
  const size_t shards = shard_bytes.size();
  const size_t n = size_t(workers) * shards;
  std::vector<Fd> clients, servers;
  for (size_t c = 0; c < n; ++c) {
    Fd client(::socket(AF_INET, SOCK_STREAM, 0));
    if (client.fd < 0) return Errno("socket");
    if (::connect(client.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return Errno("connect");
    Fd server(::accept(listener.fd, nullptr, nullptr));
    if (server.fd < 0) return Errno("accept");
    const int one = 1;  // as gRPC does
    ::setsockopt(client.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ::setsockopt(server.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    clients.push_back(std::move(client));
    servers.push_back(std::move(server));
  }
  // Where each shard's share starts in the worker's buffer.
  std::vector<uint64_t> offset(shards + 1, 0);
  for (size_t s = 0; s < shards; ++s) offset[s + 1] = offset[s] + shard_bytes[s];
  std::vector<std::vector<char>> pulled(static_cast<size_t>(workers));
  for (std::vector<char>& p : pulled) p.resize(offset[shards]);
  std::vector<std::vector<char>> received(n);
  for (size_t c = 0; c < n; ++c) received[c].resize(shard_bytes[c % shards]);
  // one_copy: each side also copies what it sends and what it receives once in user
  // space, as a parameter server must at the least (the worker encodes its gradient
  // and copies the pulled values into its caller's buffers; the shard decodes each push
  // into the round's row, whose result it sends).
  std::vector<std::vector<char>> staged(one_copy ? n : 0), inbox(one_copy ? n : 0),
      rows(one_copy ? n : 0);
  for (size_t c = 0; one_copy && c < n; ++c) {
    staged[c].resize(shard_bytes[c % shards]);
    inbox[c].resize(shard_bytes[c % shards]);
    rows[c].resize(shard_bytes[c % shards]);
  }
  std::vector<absl::Status> errors(2 * n);
  // One untimed round first, as the cluster gets: the buffers' pages are faulted in and
  // the connections' windows open before the clock starts.
  std::latch warm(std::ptrdiff_t(2 * n) + 1);
  std::latch go(1);
  std::vector<std::thread> threads;
  for (size_t c = 0; c < n; ++c) {
    const size_t w = c / shards, s = c % shards;
    threads.emplace_back([&, c, w, s] {  // the worker side
      bool warmed = false;
      for (int r = -1; r < rounds && errors[c].ok(); ++r) {
        if (r == 0) {
          warmed = true;
          warm.count_down();
          go.wait();
        }
        if (!one_copy) {
          errors[c] = SendAll(clients[c].fd, source.data() + offset[s], shard_bytes[s]);
          if (errors[c].ok()) errors[c] = RecvAll(clients[c].fd, pulled[w].data() + offset[s], shard_bytes[s]);
          continue;
        }
        std::memcpy(staged[c].data(), source.data() + offset[s], shard_bytes[s]);
        errors[c] = SendAll(clients[c].fd, staged[c].data(), shard_bytes[s]);
        if (errors[c].ok()) errors[c] = RecvAll(clients[c].fd, inbox[c].data(), shard_bytes[s]);
        if (errors[c].ok()) std::memcpy(pulled[w].data() + offset[s], inbox[c].data(), shard_bytes[s]);
      }
      if (!warmed) warm.count_down();  // failed in the warm-up: do not hold the start
      if (!errors[c].ok()) ::shutdown(clients[c].fd, SHUT_RDWR);
    });
    threads.emplace_back([&, c] {  // the shard side
      bool warmed = false;
      for (int r = -1; r < rounds && errors[n + c].ok(); ++r) {
        if (r == 0) {
          warmed = true;
          warm.count_down();
          go.wait();
        }
        errors[n + c] = RecvAll(servers[c].fd, received[c].data(), received[c].size());
        if (!errors[n + c].ok()) continue;
        const char* out = received[c].data();
        if (one_copy) {
          std::memcpy(rows[c].data(), received[c].data(), received[c].size());
          out = rows[c].data();
        }
        errors[n + c] = SendAll(servers[c].fd, out, received[c].size());
      }
      if (!warmed) warm.count_down();
      if (!errors[n + c].ok()) ::shutdown(servers[c].fd, SHUT_RDWR);
    });
  }
  warm.arrive_and_wait();
  const double cpu0 = CpuSeconds(), t0 = NowSeconds();
  go.count_down();
  for (std::thread& t : threads) t.join();
  RawResult result{NowSeconds() - t0, CpuSeconds() - cpu0};
  for (const absl::Status& st : errors) PS_RETURN_IF_ERROR(st);
  return result;
}

// ---- The cluster ------------------------------------------------------------------

// One rule of --aggregator as the shards of a cell run it.
struct Rule {
  std::string spec;  // as given; "" with --shards-at: the running shards' own rule
  std::string name;  // canonical (Aggregator::name()): "mean" marks the baseline
  uint32_t byzantine = 0;  // f the shards are started with
};

// The rules of `specs` with the f each runs with at `workers` workers, and `mean` first
// when `add_mean` and it is absent. `byzantine` >= 0 applies to every rule, and a rule
// whose bound refuses it is an error naming the fix. -1: each rule gets the largest f up
// to (n - 1) / 2 (an honest majority) that its bound admits (at 4 workers trimmed_mean and
// caf f = 1, krum f = 0 as it needs n >= 2f + 3), and mean f = 0: it ignores f, which would
// only lower its quorum, and so runs as the bench always ran it.
absl::StatusOr<std::vector<Rule>> RulesFor(const std::vector<std::string>& specs, int workers,
                                           int byzantine, bool add_mean) {
  if (byzantine >= workers) {
    return absl::InvalidArgumentError(absl::StrCat("--byzantine ", byzantine, " needs more than ",
                                                   byzantine, " workers, got ", workers,
                                                   "; lower it or raise --workers"));
  }
  std::vector<Rule> rules;
  for (const std::string& spec : specs) {
    // A malformed or unknown spec is refused whatever the counts (MakeAggregator's message
    // names the stage; 1000 workers at f = 0 meet every bound); only then is a refusal the
    // bound's.
    PS_RETURN_IF_ERROR(aggregators::MakeAggregator(spec, {.num_workers = 1000}).status());
    const int most = byzantine >= 0 ? byzantine : (workers - 1) / 2;
    const int least = byzantine >= 0 ? byzantine : 0;
    absl::Status refused;
    std::optional<Rule> rule;
    for (int f = most; f >= least && !rule.has_value(); --f) {
      absl::StatusOr<std::unique_ptr<aggregators::Aggregator>> made =
          aggregators::MakeAggregator(spec, {.num_workers = workers, .num_byzantine = f});
      if (made.ok()) {
        rule = Rule{.spec = spec, .name = std::string((*made)->name()), .byzantine = uint32_t(f)};
      } else {
        refused = made.status();
      }
    }
    if (!rule.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          core::AsAbsl(spec), " at ", workers, " workers: ", refused.message(),
          byzantine >= 0 ? "; give a lower --byzantine or more --workers, or leave --byzantine "
                           "out (each rule then runs with the largest f its bound admits)"
                         : "; give more --workers or leave this rule out of --aggregator"));
    }
    if (byzantine < 0 && rule->name == "mean") rule->byzantine = 0;
    rules.push_back(std::move(*rule));
  }
  const auto is_mean = [](const Rule& r) { return r.name == "mean"; };
  if (add_mean && std::none_of(rules.begin(), rules.end(), is_mean)) {
    rules.insert(rules.begin(),
                 Rule{.spec = "mean", .name = "mean", .byzantine = uint32_t(std::max(byzantine, 0))});
  }
  return rules;
}

// The rule as the table shows it.
std::string RuleLabel(const Rule& rule) { return rule.spec.empty() ? "(theirs)" : rule.spec; }

// The shards (a server::LocalCluster, or none with --shards-at) and one worker client
// each.
struct Cluster {
  std::optional<server::LocalCluster> shards;
  std::vector<std::unique_ptr<Worker>> workers;  // destroyed before the shards

  void Shutdown() {
    workers.clear();
    if (shards.has_value()) shards->Shutdown();
  }
};

absl::StatusOr<Cluster> StartCluster(const E2eFlags& f, int workers, uint32_t shards,
                                     const std::string& codec, const Rule& rule,
                                     core::DataPlane plane, const core::ModelLayout& layout,
                                     std::span<const std::span<const float>> init) {
  Cluster c;
  server::ServerOptions so;
  so.insecure = true;  // the data path alone; docs/bench.md
  so.num_workers = uint32_t(workers);
  so.aggregate_only = f.aggregate_only;
  if (!rule.spec.empty()) so.aggregator = rule.spec;
  so.num_byzantine = rule.byzantine;
  // Validated in RunE2e.
  so.aggregation_scope =
      server::ParseAggregationScope(f.aggregation_scope).value_or(server::AggregationScope::kModel);
  so.learning_rate = 1e-6f;
  so.momentum = 0;
  so.threads = f.server_threads;
  so.data_threads = f.data_threads;
  so.log_level = "warn";
  // A round only closes early when every worker pushed; the deadline is a backstop
  // against a stalled worker, not part of the measurement.
  so.round_deadline = std::chrono::milliseconds(60000);
  so.pull_codec = f.pull_codec;
  so.data_plane = plane;
  WorkerOptions wo;
  if (f.tls_files != nullptr) {
    // Mutual TLS as deployed: identities from the certificates' common names.
    so.insecure = false;
    so.tls_ca = f.tls_files->Path("ca.pem");
    so.tls_cert = f.tls_files->Path("shard-{shard}.pem");
    so.tls_key = f.tls_files->Path("shard-{shard}.key");
    wo.credentials.tls_ca = so.tls_ca;
  }
  if (f.shards_at.empty()) {
    PS_ASSIGN_OR_RETURN(c.shards, server::LocalCluster::Start(shards, so));
    wo.shard_addresses = c.shards->addresses();
  } else {
    wo.shard_addresses = f.shards_at;
  }
  wo.push.codec = codec;
  if (f.inflight > 0) wo.max_inflight_bytes = f.inflight;
  wo.inflight_seconds = f.inflight_seconds;
  // Running shards (--shards-at) pick the plane; the workers follow their Join answers.
  if (f.shards_at.empty()) wo.data_plane = plane;
  wo.rpc_timeout = std::chrono::milliseconds(120000);
  for (int w = 0; w < workers; ++w) {
    wo.worker_id = uint32_t(w);
    if (f.tls_files != nullptr) {
      wo.credentials.tls_cert = f.tls_files->Path(absl::StrCat("worker-", w, ".pem"));
      wo.credentials.tls_key = f.tls_files->Path(absl::StrCat("worker-", w, ".key"));
    }
    PS_ASSIGN_OR_RETURN(std::unique_ptr<Worker> worker,
                        Worker::Start(wo, layout, f.aggregate_only ? decltype(init){} : init));
    c.workers.push_back(std::move(worker));
  }
  return c;
}

struct E2eResult {
  int rounds = 0;          // timed rounds
  double seconds = 0;      // from the start of the first timed round to the last push answered
  double cpu_seconds = 0;  // process CPU time over the same span
  double pull_seconds = 0;  // per round, mean over workers: waiting in PullAll
  double push_seconds = 0;  // per round, mean over workers: Push calls and WaitPushes
  // Round latency (pull start to pushes answered) over every worker's timed rounds.
  double round_p50 = 0, round_p99 = 0;
};

// The q-quantile (0 <= q <= 1) of `v` by the nearest rank; 0 for none.
double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, size_t(std::ceil(q * double(v.size()))) - (q > 0 ? 1 : 0));
  std::nth_element(v.begin(), v.begin() + ptrdiff_t(k), v.end());
  return v[k];
}

// Runs `warmup` untimed rounds and then `rounds` timed rounds, or timed rounds until
// `seconds` passed when that is positive. `on_round` (may be empty) is called by worker
// 0 after each round with the number of timed rounds done.
absl::StatusOr<E2eResult> RunRounds(Cluster& c, const core::ModelLayout& layout, int warmup,
                                    int rounds, double seconds, const std::vector<float>& grad,
                                    const std::function<void(int)>& on_round) {
  const size_t workers = c.workers.size();
  std::vector<absl::Status> errors(workers);
  std::vector<double> pull_time(workers, 0), push_time(workers, 0), end_time(workers, 0);
  std::vector<std::vector<double>> latencies(workers);
  std::vector<int> timed(workers, 0);
  // Round r is the last one once last_round <= r. Worker 0 sets it after its pull of
  // version r and before it pushes round r; every other worker reads it after its pull
  // of version r + 1, which needs that push, so all agree on the last round.
  constexpr uint64_t kNoLast = std::numeric_limits<uint64_t>::max();
  const uint64_t first_timed = uint64_t(std::max(1, warmup));
  std::atomic<uint64_t> last_round{seconds > 0 ? kNoLast : first_timed - 1 + uint64_t(rounds)};
  std::latch warm(std::ptrdiff_t(workers) + 1);
  std::atomic<double> t0{0};
  std::latch started(1);
  std::vector<std::thread> threads;
  for (size_t w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      Worker& worker = *c.workers[w];
      const size_t tensors = layout.tensors().size();
      std::vector<std::vector<float>> params;
      for (const core::TensorSpec& t : layout.tensors()) params.emplace_back(t.numel);
      std::vector<std::span<float>> outs(params.begin(), params.end());
      std::vector<std::span<const float>> grads;
      uint64_t at = 0;
      for (const core::TensorSpec& t : layout.tensors()) {
        grads.push_back(std::span<const float>(grad).subspan(at, t.numel));
        at += t.numel;
      }
      const auto fail = [&](absl::Status st) {
        errors[w] = std::move(st);
        // Unblock the others: they would wait for this worker's pushes until timeout.
        last_round.store(0);
      };
      const auto round = [&](uint64_t r, bool time_it) -> bool {
        const double a = NowSeconds();
        if (absl::StatusOr<uint64_t> v = worker.PullAll(r, outs, std::chrono::seconds(120)); !v.ok()) {
          fail(v.status());
          return false;
        }
        const double b = NowSeconds();
        if (w == 0 && time_it && seconds > 0 && last_round.load() == kNoLast &&
            b - t0.load() >= seconds) {
          last_round.store(r);
        }
        if (r > last_round.load()) return false;
        for (size_t t = 0; t < tensors; ++t) {
          if (absl::Status st = worker.Push(t, r, grads[t]); !st.ok()) {
            fail(st);
            return false;
          }
        }
        if (absl::Status st = worker.WaitPushes(); !st.ok()) {
          fail(st);
          return false;
        }
        if (time_it) {
          const double e = NowSeconds();
          pull_time[w] += b - a;
          push_time[w] += e - b;
          latencies[w].push_back(e - a);
          end_time[w] = e;
          ++timed[w];
        }
        return true;
      };
      bool ok = true;
      for (uint64_t r = 0; ok && r < first_timed; ++r) ok = round(r, false);
      warm.count_down();
      if (!ok) return;
      started.wait();
      for (uint64_t r = first_timed; round(r, true); ++r) {
        if (w == 0 && on_round) on_round(timed[0]);
      }
    });
  }
  warm.arrive_and_wait();
  const double cpu0 = CpuSeconds();
  t0.store(NowSeconds());
  started.count_down();
  for (std::thread& t : threads) t.join();
  const double cpu1 = CpuSeconds();
  for (const absl::Status& st : errors) PS_RETURN_IF_ERROR(st);
  E2eResult r;
  r.rounds = timed[0];
  for (size_t w = 0; w < workers; ++w) {
    if (timed[w] != r.rounds) {
      return absl::InternalError(absl::StrCat("worker ", w, " ran ", timed[w], " rounds, worker 0 ", r.rounds));
    }
    r.seconds = std::max(r.seconds, end_time[w] - t0.load());
    r.pull_seconds += pull_time[w] / double(workers) / std::max(1, r.rounds);
    r.push_seconds += push_time[w] / double(workers) / std::max(1, r.rounds);
  }
  r.cpu_seconds = cpu1 - cpu0;
  if (r.rounds == 0) return absl::InternalError("no timed round ran");
  std::vector<double> all;
  for (const std::vector<double>& l : latencies) all.insert(all.end(), l.begin(), l.end());
  r.round_p50 = Quantile(all, 0.5);
  r.round_p99 = Quantile(std::move(all), 0.99);
  return r;
}

absl::StatusOr<core::ModelLayout> MakeLayout(uint64_t params, uint32_t slice_elems, uint32_t shards) {
  return core::ModelLayout::Create({{"w", params, 0}}, slice_elems, shards);
}

std::vector<float> MakeGradient(uint64_t params) {
  std::vector<float> grad(params);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = GaussianAt(1, 0, i);
  return grad;
}

absl::StatusOr<std::vector<int>> ParseInts(const std::vector<std::string>& texts, int lo, int hi,
                                           std::string_view what) {
  std::vector<int> out;
  for (const std::string& text : texts) {
    for (const std::string& item : SplitList(text)) {
      int v = 0;
      if (!absl::SimpleAtoi(item, &v) || v < lo || v > hi) {
        return absl::InvalidArgumentError(
            absl::StrCat("bad ", core::AsAbsl(what), " '", item, "' (want ", lo, "..", hi, ")"));
      }
      out.push_back(v);
    }
  }
  return out;
}

// ---- The comparison ---------------------------------------------------------------

int RunComparison(const E2eFlags& f, uint64_t params, const std::vector<int>& worker_counts,
                  const std::vector<int>& shard_counts, const std::vector<std::string>& codecs,
                  const std::vector<std::string>& specs, const std::vector<core::DataPlane>& planes) {
  const std::vector<float> grad = MakeGradient(params);
  std::vector<char> source(params * 4);
  std::memcpy(source.data(), grad.data(), source.size());
  const std::vector<float> init_values(params, 0.01f);
  const std::vector<std::span<const float>> init = {init_values};
  Table table({"workers", "shards", "codec", "aggregator", "f", "plane", "rounds",
               "goodput Gbit/s", "vs mean", "vs grpc", "raw TCP Gbit/s", "ratio", "1-copy/raw",
               "vs 1-copy",
               "pull s/round", "push s/round", "round p50 s", "round p99 s", "e2e GB/cpu-s",
               "raw GB/cpu-s", "RSS B/param"});
  std::vector<core::JsonObjectWriter> rows;
  int errors = 0;
  for (int workers : worker_counts) {
    // Checked for every worker count in RunE2e; --shards-at runs the shards' own rule.
    absl::StatusOr<std::vector<Rule>> rules =
        f.shards_at.empty() ? RulesFor(specs, workers, f.byzantine, /*add_mean=*/true)
                            : absl::StatusOr<std::vector<Rule>>(std::vector<Rule>{Rule{}});
    if (!rules.ok()) {
      std::fprintf(stderr, "ps-bench e2e: %s\n", std::string(rules.status().message()).c_str());
      return 2;
    }
    const auto is_mean = [](const Rule& r) { return r.name == "mean"; };
    // rules->size() when there is none (--shards-at).
    const size_t base_rule = size_t(std::find_if(rules->begin(), rules->end(), is_mean) - rules->begin());
    // What each cell measures: every rule on every plane, variant v = plane * rules + rule.
    const size_t variants = rules->size() * planes.size();
    const auto rule_of = [&](size_t v) -> const Rule& { return (*rules)[v % rules->size()]; };
    const auto plane_of = [&](size_t v) { return planes[v / rules->size()]; };
    const auto variant = [&](size_t plane_index, size_t rule) { return plane_index * rules->size() + rule; };
    for (int shards : shard_counts) {
      absl::StatusOr<core::ModelLayout> layout = MakeLayout(params, f.slice_elems, uint32_t(shards));
      if (!layout.ok()) {
        std::fprintf(stderr, "ps-bench e2e: layout: %s\n", std::string(layout.status().message()).c_str());
        return 2;
      }
      std::vector<uint64_t> shard_bytes;
      for (uint64_t load : layout->ShardLoads()) shard_bytes.push_back(load * 4);
      const double bytes_per_round = double(workers) * double(params) * 4 * 2;
      for (const std::string& codec : codecs) {
        const std::string cell = absl::StrCat(workers, " workers x ", shards, " shards, ", codec);
        const auto raw_once = [&](int rounds) -> absl::StatusOr<RawResult> {
          return RunRawTcp(workers, shard_bytes, rounds, source, /*one_copy=*/false);
        };
        // A baseline's fastest of `times` runs, as each rule's fastest repetition counts:
        // the baselines' own run-to-run spread would otherwise move every ratio.
        const auto fastest = [&](bool one_copy, int rounds, int times) -> absl::StatusOr<RawResult> {
          absl::StatusOr<RawResult> best = RunRawTcp(workers, shard_bytes, rounds, source, one_copy);
          for (int t = 1; best.ok() && t < times; ++t) {
            absl::StatusOr<RawResult> r = RunRawTcp(workers, shard_bytes, rounds, source, one_copy);
            if (!r.ok() || r->seconds < best->seconds) best = std::move(r);
          }
          return best;
        };
        // The cluster first when --seconds decides the round count, the baseline
        // moving the same rounds before (with --rounds) and after.
        absl::StatusOr<RawResult> raw_before =
            f.seconds > 0 || f.no_raw ? absl::StatusOr<RawResult>(RawResult{}) : raw_once(f.rounds);
        if (!raw_before.ok()) {
          std::fprintf(stderr, "ps-bench e2e: %s: raw TCP: %s\n", cell.c_str(),
                       std::string(raw_before.status().message()).c_str());
          ++errors;
          continue;
        }
        // Each rule's fastest repetition, and the resident memory of the whole process
        // with that cluster up, after its rounds.
        struct Measured {
          E2eResult e2e;
          uint64_t rss_kib = 0;
        };
        std::vector<std::optional<Measured>> best(variants);
        std::vector<bool> failed(variants, false);
        for (int rep = 0; rep < f.repeats; ++rep) {
          for (size_t k = 0; k < variants; ++k) {
            // Forward, then backward: a drift of the machine's speed over the repetitions
            // favours no rule and no plane.
            const size_t i = rep % 2 == 0 ? k : variants - 1 - k;
            if (failed[i]) continue;
            const Rule& rule = rule_of(i);
            uint64_t rss_kib = 0;
            absl::StatusOr<E2eResult> e2e = [&]() -> absl::StatusOr<E2eResult> {
              PS_ASSIGN_OR_RETURN(Cluster c, StartCluster(f, workers, uint32_t(shards), codec, rule,
                                                          plane_of(i), *layout, init));
              absl::StatusOr<E2eResult> r = RunRounds(c, *layout, f.warmup, f.rounds, f.seconds, grad, {});
              rss_kib = ReadMemory().rss_kib;
              c.Shutdown();
              return r;
            }();
            if (!e2e.ok()) {
              std::fprintf(stderr, "ps-bench e2e: %s, %s over %s: %s\n", cell.c_str(),
                           RuleLabel(rule).c_str(), std::string(core::DataPlaneName(plane_of(i))).c_str(),
                           std::string(e2e.status().message()).c_str());
              ++errors;
              failed[i] = true;
              best[i].reset();
              continue;
            }
            const auto rate = [](const E2eResult& r) { return double(r.rounds) / r.seconds; };
            if (!best[i].has_value() || rate(*e2e) > rate(best[i]->e2e)) best[i] = Measured{*e2e, rss_kib};
          }
        }
        // The baseline moves the baseline rule's rounds (they differ between rules only
        // with --seconds); its rate is per round, so it compares with every rule.
        const auto measured = [&](size_t i) { return i < best.size() && best[i].has_value(); };
        size_t reference = base_rule < rules->size() ? variant(0, base_rule) : variants;
        for (size_t i = 0; !measured(reference) && i < best.size(); ++i) reference = i;
        if (!measured(reference)) continue;  // every rule failed, each reported
        const int raw_rounds = f.seconds > 0 ? best[reference]->e2e.rounds : f.rounds;
        absl::StatusOr<RawResult> raw_after =
            f.no_raw ? absl::StatusOr<RawResult>(RawResult{.seconds = 1, .cpu_seconds = 1})
                     : fastest(/*one_copy=*/false, raw_rounds, f.repeats);
        if (!raw_after.ok()) {
          std::fprintf(stderr, "ps-bench e2e: %s: raw TCP: %s\n", cell.c_str(),
                       std::string(raw_after.status().message()).c_str());
          ++errors;
          continue;
        }
        const RawResult raw = raw_before->seconds > 0 && raw_before->seconds < raw_after->seconds
                                  ? *raw_before
                                  : *raw_after;
        absl::StatusOr<RawResult> one_copy =
            f.no_raw ? absl::StatusOr<RawResult>(RawResult{.seconds = 1, .cpu_seconds = 1})
                     : fastest(/*one_copy=*/true, raw_rounds, f.repeats);
        if (!one_copy.ok()) {
          std::fprintf(stderr, "ps-bench e2e: %s: raw TCP with one copy: %s\n", cell.c_str(),
                       std::string(one_copy.status().message()).c_str());
          ++errors;
          continue;
        }
        const double raw_bytes = bytes_per_round * raw_rounds;
        const double raw_gbps = raw_bytes * 8 / 1e9 / raw.seconds;
        const double raw_per_cpu = raw_bytes / 1e9 / raw.cpu_seconds;
        const double one_copy_gbps = raw_bytes * 8 / 1e9 / one_copy->seconds;
        const auto goodput_of = [&](const E2eResult& e2e) {
          return bytes_per_round * e2e.rounds * 8 / 1e9 / e2e.seconds;
        };
        const size_t grpc_plane = size_t(
            std::find(planes.begin(), planes.end(), core::DataPlane::kGrpc) - planes.begin());
        for (size_t i = 0; i < variants; ++i) {
          if (!measured(i)) continue;
          const Rule& rule = rule_of(i);
          const size_t plane_index = i / rules->size();
          const std::string plane(core::DataPlaneName(plane_of(i)));
          const E2eResult& e2e = best[i]->e2e;
          const uint64_t rss_kib = best[i]->rss_kib;
          const double goodput = goodput_of(e2e);
          const double e2e_per_cpu = bytes_per_round * e2e.rounds / 1e9 / e2e.cpu_seconds;
          // Goodput relative to mean's in this cell on the same plane; none when mean failed.
          const size_t base = base_rule < rules->size() ? variant(plane_index, base_rule) : variants;
          const bool has_base = measured(base);
          const double vs_mean = has_base ? goodput / goodput_of(best[base]->e2e) : 0;
          // Relative to the same rule over gRPC, when gRPC ran too and this is another plane.
          const size_t over_grpc =
              grpc_plane < planes.size() ? variant(grpc_plane, i % rules->size()) : variants;
          const bool has_grpc = over_grpc != i && measured(over_grpc);
          const double vs_grpc = has_grpc ? goodput / goodput_of(best[over_grpc]->e2e) : 0;
          const std::string shown =
              f.pull_codec.empty() ? codec : absl::StrCat(codec, " / pull ", f.pull_codec);
          table.AddRow({absl::StrCat(workers), absl::StrCat(shards), shown, RuleLabel(rule),
                        rule.spec.empty() ? "-" : absl::StrCat(rule.byzantine), plane,
                        absl::StrCat(e2e.rounds), FormatG(goodput, 4),
                        has_base ? FormatG(vs_mean, 3) : "-", has_grpc ? FormatG(vs_grpc, 3) : "-",
                        FormatG(raw_gbps, 4), FormatG(goodput / raw_gbps, 3),
                        FormatG(one_copy_gbps / raw_gbps, 3), FormatG(goodput / one_copy_gbps, 3),
                        FormatG(e2e.pull_seconds, 3), FormatG(e2e.push_seconds, 3),
                        FormatG(e2e.round_p50, 3), FormatG(e2e.round_p99, 3),
                        FormatG(e2e_per_cpu, 3), FormatG(raw_per_cpu, 3),
                        FormatG(double(rss_kib) * 1024 / double(params), 3)});
          core::JsonObjectWriter row;
          row.Add("workers", workers)
              .Add("shards", shards)
              .Add("model_params", params)
              .Add("codec", codec)
              .Add("goodput_gbps", goodput)
              .Add("raw_tcp_gbps", raw_gbps)
              .Add("ratio", goodput / raw_gbps)
              .Add("one_copy_tcp_gbps", one_copy_gbps)
              .Add("one_copy_ratio", one_copy_gbps / raw_gbps)
              .Add("vs_one_copy", goodput / one_copy_gbps)
              .Add("data_plane", plane)
              .Add("tls", f.tls)
              .Add("rounds", e2e.rounds)
              .Add("warmup_rounds", f.warmup)
              .Add("seconds", e2e.seconds)
              .Add("raw_tcp_rounds", raw_rounds)
              .Add("raw_tcp_seconds", raw.seconds)
              .Add("pull_seconds_per_round", e2e.pull_seconds)
              .Add("push_seconds_per_round", e2e.push_seconds)
              .Add("cpu_seconds", e2e.cpu_seconds)
              .Add("raw_tcp_cpu_seconds", raw.cpu_seconds)
              .Add("aggregate_only", f.aggregate_only)
              .Add("pull_codec", f.pull_codec)
              .Add("round_seconds_p50", e2e.round_p50)
              .Add("round_seconds_p99", e2e.round_p99)
              .Add("rss_bytes_per_param", double(rss_kib) * 1024 / double(params))
              .Add("aggregator", rule.spec)
              .Add("repeats", f.repeats);
          // With --shards-at the running shards chose the rule, f and scope.
          if (!rule.spec.empty()) {
            row.Add("num_byzantine", rule.byzantine).Add("aggregation_scope", f.aggregation_scope);
          }
          if (has_base) row.Add("vs_mean", vs_mean);
          if (has_grpc) row.Add("vs_grpc", vs_grpc);
          rows.push_back(std::move(row));
        }
      }
    }
  }
  return FinishReport("e2e", table, "", {}, f.json, rows, errors);
}

// ---- Soak -------------------------------------------------------------------------

int RunSoak(const E2eFlags& f, uint64_t params, int workers, int shards, const std::string& codec,
            const Rule& rule, core::DataPlane plane) {
  std::vector<core::JsonObjectWriter> rows;
  Table table({"phase", "elapsed s", "rounds", "VmRSS KiB", "VmHWM KiB", "heap in use KiB"});
  std::mutex mu;  // rows and table, from worker 0's thread and this one
  const double t_begin = NowSeconds();
  const auto sample = [&](std::string_view phase, int rounds) {
    const Memory m = ReadMemory();
    std::fprintf(stderr,
                 "ps-bench e2e --soak: %-8s t=%7.1f s rounds=%6d VmRSS=%8llu KiB VmHWM=%8llu KiB "
                 "heap in use=%8llu KiB\n",
                 std::string(phase).c_str(), NowSeconds() - t_begin, rounds,
                 (unsigned long long)m.rss_kib, (unsigned long long)m.hwm_kib,
                 (unsigned long long)m.heap_in_use_kib);
    std::lock_guard lock(mu);
    table.AddRow({std::string(phase), FormatG(NowSeconds() - t_begin, 4), absl::StrCat(rounds),
                  absl::StrCat(m.rss_kib), absl::StrCat(m.hwm_kib), absl::StrCat(m.heap_in_use_kib)});
    rows.push_back(core::JsonObjectWriter()
                       .Add("phase", phase)
                       .Add("elapsed_seconds", NowSeconds() - t_begin)
                       .Add("rounds", rounds)
                       .Add("vm_rss_kib", m.rss_kib)
                       .Add("vm_hwm_kib", m.hwm_kib)
                       .Add("heap_in_use_kib", m.heap_in_use_kib)
                       .Add("workers", workers)
                       .Add("shards", shards)
                       .Add("model_params", params)
                       .Add("codec", codec)
                       .Add("data_plane", core::DataPlaneName(plane))
                       .Add("aggregator", rule.spec));
  };
  sample("start", 0);
  const std::vector<float> grad = MakeGradient(params);
  const std::vector<float> init_values(params, 0.01f);
  const std::vector<std::span<const float>> init = {init_values};
  absl::StatusOr<core::ModelLayout> layout = MakeLayout(params, f.slice_elems, uint32_t(shards));
  if (!layout.ok()) {
    std::fprintf(stderr, "ps-bench e2e: layout: %s\n", std::string(layout.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<Cluster> c =
      StartCluster(f, workers, uint32_t(shards), codec, rule, plane, *layout, init);
  if (!c.ok()) {
    std::fprintf(stderr, "ps-bench e2e --soak: %s\n", std::string(c.status().message()).c_str());
    return 1;
  }
  sample("ready", 0);
  double next = NowSeconds() + f.soak_interval;
  int done = 0;
  absl::StatusOr<E2eResult> r = RunRounds(*c, *layout, f.warmup, f.rounds, f.seconds, grad, [&](int rounds) {
    done = rounds;
    if (NowSeconds() >= next) {
      next += f.soak_interval;
      sample("sample", rounds);
    }
  });
  sample("end", done);
  c->workers.clear();
  c->shards->Shutdown();
  c->shards->Stop();
  sample("stopped", done);
  if (!r.ok()) {
    std::fprintf(stderr, "ps-bench e2e --soak: %s\n", std::string(r.status().message()).c_str());
    return 1;
  }
  const double bytes = double(workers) * double(params) * 8 * r->rounds;
  std::fprintf(stderr, "ps-bench e2e --soak: %d rounds in %.1f s, goodput %.3f Gbit/s\n", r->rounds,
               r->seconds, bytes * 8 / 1e9 / r->seconds);
  return FinishReport("e2e", table, "", {}, f.json, rows, 0);
}

int RunE2e(E2eFlags f) {
  spdlog::set_level(spdlog::level::warn);
  if (f.quick) {
    f.workers = {"2"};
    f.shards = {"2"};
    f.params = "2^16";
    f.slice_elems = 4096;
    f.rounds = 3;
  }
  absl::StatusOr<uint64_t> params = ParseSize(f.params);
  absl::StatusOr<std::vector<int>> workers = ParseInts(f.workers, 1, 256, "worker count");
  absl::StatusOr<std::vector<int>> shards = ParseInts(f.shards, 1, 64, "shard count");
  for (const absl::Status& st : {params.status(), workers.status(), shards.status()}) {
    if (!st.ok()) {
      std::fprintf(stderr, "ps-bench e2e: %s\n", std::string(st.message()).c_str());
      return 2;
    }
  }
  std::vector<std::string> codecs;
  for (const std::string& text : f.codecs) {
    for (std::string& c : SplitList(text)) codecs.push_back(std::move(c));
  }
  std::vector<std::string> specs;
  for (const std::string& text : f.aggregators) {
    for (std::string& a : SplitList(text)) specs.push_back(std::move(a));
  }
  std::vector<core::DataPlane> planes;
  for (const std::string& text : f.data_planes) {
    for (const std::string& item : SplitList(text)) {
      absl::StatusOr<core::DataPlane> plane = core::ParseDataPlane(item);
      if (!plane.ok()) {
        std::fprintf(stderr, "ps-bench e2e: --data-plane: %s\n", std::string(plane.status().message()).c_str());
        return 2;
      }
      if (std::find(planes.begin(), planes.end(), *plane) == planes.end()) planes.push_back(*plane);
    }
  }
  if (*params == 0 || codecs.empty() || specs.empty() || workers->empty() || shards->empty() ||
      planes.empty()) {
    std::fprintf(stderr,
                 "ps-bench e2e: need --params > 0, a codec, an aggregator, a data plane, a worker "
                 "and a shard count\n");
    return 2;
  }
  if (!server::ParseAggregationScope(f.aggregation_scope).ok()) {
    std::fprintf(stderr, "ps-bench e2e: --aggregation-scope '%s': give model or slice\n",
                 f.aggregation_scope.c_str());
    return 2;
  }
  if (!f.shards_at.empty()) {
    if (workers->size() != 1 || codecs.size() != 1 || planes.size() != 1 || f.soak) {
      std::fprintf(stderr,
                   "ps-bench e2e --shards-at: give one --workers, --codec and --data-plane (the "
                   "running shards' plane decides), no --soak\n");
      return 2;
    }
    if (specs != std::vector<std::string>{"mean"} || f.byzantine >= 0) {
      std::fprintf(stderr,
                   "ps-bench e2e --shards-at: the running shards aggregate with their own "
                   "--aggregator and --byzantine; leave both out here\n");
      return 2;
    }
    *shards = {int(f.shards_at.size())};
  }
  if (f.tls) {
    if (!f.shards_at.empty()) {
      std::fprintf(stderr, "ps-bench e2e: --tls serves in-process shards; not with --shards-at\n");
      return 2;
    }
    absl::StatusOr<std::shared_ptr<const ThrowawayCerts>> cert = MakeThrowawayCerts(
        uint32_t(*std::max_element(shards->begin(), shards->end())),
        uint32_t(*std::max_element(workers->begin(), workers->end())));
    if (!cert.ok()) {
      std::fprintf(stderr, "ps-bench e2e --tls: %s\n", std::string(cert.status().message()).c_str());
      return 1;
    }
    f.tls_files = *std::move(cert);
  }
  // Every rule checked at every worker count before anything runs: a refusal costs no
  // measurement.
  for (int w : *workers) {
    if (!f.shards_at.empty()) break;
    if (absl::StatusOr<std::vector<Rule>> r = RulesFor(specs, w, f.byzantine, !f.soak); !r.ok()) {
      std::fprintf(stderr, "ps-bench e2e: %s\n", std::string(r.status().message()).c_str());
      return 2;
    }
  }
  if (f.soak) {
    if (workers->size() != 1 || shards->size() != 1 || codecs.size() != 1 || specs.size() != 1 ||
        planes.size() != 1) {
      std::fprintf(stderr,
                   "ps-bench e2e --soak: give one --workers, --shards, --codec, --aggregator and "
                   "--data-plane\n");
      return 2;
    }
    if (f.seconds <= 0) f.seconds = 300;
    std::fprintf(stderr,
                 "ps-bench e2e --soak: %d workers x %d shards, %llu parameters, %s, %s, %.0f s, "
                 "memory every %.0f s\n",
                 workers->front(), shards->front(), (unsigned long long)*params, codecs.front().c_str(),
                 specs.front().c_str(), f.seconds, f.soak_interval);
    return RunSoak(f, *params, workers->front(), shards->front(), codecs.front(),
                   RulesFor(specs, workers->front(), f.byzantine, /*add_mean=*/false)->front(),
                   planes.front());
  }
  const std::string rules =
      !f.shards_at.empty()
          ? std::string("their own rule")
          : absl::StrCat(absl::StrJoin(specs, ", "),
                         f.byzantine >= 0 ? absl::StrCat(", f = ", f.byzantine) : "", " (",
                         f.aggregation_scope, " scope)",
                         f.repeats > 1 ? absl::StrCat(", each the fastest of ", f.repeats, " interleaved runs")
                                       : "");
  std::fprintf(stderr,
               "ps-bench e2e: %llu parameters (%.1f MB fp32), slices of %u, %s, %s with %s; goodput = "
               "workers x (4 B pushed + 4 B pulled) x params x rounds / seconds\n",
               (unsigned long long)*params, double(*params) * 4 / 1e6, f.slice_elems,
               f.seconds > 0 ? absl::StrCat("timed rounds for ", f.seconds, " s").c_str()
                             : absl::StrCat(f.rounds, " timed rounds after ", f.warmup, " warm-up").c_str(),
               f.aggregate_only ? "aggregate-only shards" : "SGD shards", rules.c_str());
  return RunComparison(f, *params, *workers, *shards, codecs, specs, planes);
}

}  // namespace

Command AddE2eCommand(CLI::App& app) {
  auto f = std::make_shared<E2eFlags>();
  CLI::App* sub = app.add_subcommand(
      "e2e", "End-to-end push + pull goodput of n workers and S in-process shards on loopback, "
             "against raw loopback TCP in the same run; --soak: resident memory over minutes");
  sub->add_option("--workers", f->workers, "Worker counts (list)")->delimiter(',')->capture_default_str();
  sub->add_option("--shards", f->shards, "Shard counts (list)")->delimiter(',')->capture_default_str();
  sub->add_option("--params", f->params, "Model parameters (2^22, 4M, ...)")->capture_default_str();
  sub->add_option("--codec,--codecs", f->codecs, "Gradient codec specs (list)")->capture_default_str();
  sub->add_option("--pull-codec", f->pull_codec,
                  "The shards' --pull-codec: pulls as changes encoded with this spec (default: "
                  "dense fp32)");
  sub->add_option("--rounds", f->rounds, "Timed rounds after the warm-up rounds")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  sub->add_option("--warmup", f->warmup,
                  "Untimed rounds first (the first carries the shards' first aggregation)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  sub->add_option("--seconds", f->seconds,
                  "Run timed rounds for this long instead of --rounds (--soak: default 300)");
  sub->add_option("--slice-elems", f->slice_elems, "Layout slice size")->capture_default_str();
  sub->add_option("--inflight-seconds", f->inflight_seconds,
                  "WorkerOptions::inflight_seconds (0: the window stays at --inflight)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--inflight", f->inflight, "WorkerOptions::max_inflight_bytes (0: its default)")
      ->capture_default_str();
  sub->add_option("--server-threads", f->server_threads, "ServerOptions::threads (0: one per core)")
      ->capture_default_str();
  sub->add_option("--data-threads", f->data_threads,
                  "ServerOptions::data_threads: threads of each shard's TCP data plane")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));
  sub->add_flag("--aggregate-only", f->aggregate_only, "Shards publish the aggregate instead of applying SGD");
  sub->add_option("--aggregator,--aggregators", f->aggregators,
                  "Aggregation rule specs (list; docs/aggregators.md), each run on the same "
                  "configuration and compared with mean of the same run (added when absent)")
      ->capture_default_str();
  sub->add_option("--byzantine", f->byzantine,
                  "f for every rule (default: per rule, the largest f <= (n - 1) / 2 its bound "
                  "admits; mean 0)")
      ->check(CLI::Range(0, 255));
  sub->add_option("--aggregation-scope", f->aggregation_scope,
                  "model or slice: where distance rules measure (ServerOptions::aggregation_scope)")
      ->capture_default_str();
  sub->add_option("--repeats", f->repeats,
                  "Cluster runs per rule and cell, the rules interleaved (forward, then backward); "
                  "the fastest counts")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  sub->add_option("--data-plane,--data-planes", f->data_planes,
                  "The shards' data planes, grpc or tcp (list; docs/data-plane.md), each measured "
                  "on every cell, interleaved with the rules, and compared with grpc (vs grpc)")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_flag("--tls", f->tls,
                "Shards serve mutual TLS on every port with throwaway certificates for every "
                "shard and worker; the baselines stay plaintext");
  sub->add_flag("--no-raw", f->no_raw,
                "Skip the raw TCP baseline (its columns then mean nothing); for profiling the cluster");
  sub->add_flag("--soak", f->soak, "Memory over a long run (one configuration)");
  sub->add_option("--soak-interval", f->soak_interval, "Seconds between memory samples")->capture_default_str();
  sub->add_option("--json", f->json, "Also write the rows as a JSON array to FILE")->option_text("FILE");
  sub->add_flag("--quick", f->quick, "Tiny run for smoke tests");
  sub->add_option("--shards-at", f->shards_at,
                  "host:port of running shards (ps-server --insecure --workers N) to use instead "
                  "of in-process ones, by shard id (list; bench/python_e2e.py)")
      ->delimiter(',');
  return Command{.app = sub, .run = [f] { return RunE2e(*f); }};
}

}  // namespace ps::bench
