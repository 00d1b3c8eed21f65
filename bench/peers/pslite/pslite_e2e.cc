// pslite_e2e: the `ps-bench e2e` measurement (push plus pull of a whole fp32 model per
// worker and round, synchronous SGD rounds) on the public ps-lite (github.com/dmlc/ps-lite)
// instead of ps-server, for comparing goodput side by side by hand. See README.md.
//
// One binary for every role; ps-lite reads the role and the cluster from DMLC_* variables
// (run.sh sets them). Arguments, the same for every process:
//
//   pslite_e2e [params=4194304] [rounds=10] [warmup=2] [lr=0.1]
//
// Model: `params` fp32 values, split over the S servers in equal contiguous ranges
// (server s holds [params*s/S, params*(s+1)/S)). Each range is ONE ps-lite key (the first
// key of that server's key range), so a worker's push to a server is one message carrying
// the server's whole range, and so is the answer to a pull.
//
// Each round every worker ZPushes its gradient of the whole model and Waits, then ZPulls
// the whole model into its buffer and Waits. Server s sums the round's W pushes into an
// accumulator and holds their answers; when the W-th push arrives it applies
// w -= lr * (sum / W) and answers all W pushes. A pull is answered with a copy of the
// current weights. Since a worker only pulls after its push was answered, and only pushes
// round r+1 after pulling, every pull sees exactly the weights after its round.
//
// Timing: after `warmup` untimed rounds all workers meet at a ps-lite barrier; worker 0
// times from there to a second barrier after the `rounds` timed rounds, which every
// worker reaches only after its last pull, so the time covers every worker's rounds
// (the max over workers, plus one barrier's latency).
//
// Goodput (as ps-bench e2e counts it): per worker and timed round, 4 bytes pushed plus
// 4 bytes pulled per parameter:
//   goodput_gbps = W * params * 8 * rounds * 8 / 1e9 / seconds
//
// Check: every worker compares its last pulled model with the value after
// warmup + rounds SGD steps; worker 0 prints the result line, and any worker that finds
// a mismatch prints it and exits 1.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "ps/ps.h"

namespace {

using ps::Key;
using ps::KVMeta;
using ps::KVPairs;
using ps::KVServer;
using ps::KVWorker;
using ps::SArray;

constexpr float kInit = 0.01f;  // every weight's initial value (as ps-bench e2e's)

struct Config {
  uint64_t params = uint64_t(1) << 22;
  int rounds = 10;
  int warmup = 2;
  float lr = 0.1f;
};

// The fixed gradient pattern; worker `rank` pushes Base(i) * (rank + 1), so that a lost
// or doubled push shows in the check.
inline float Base(uint64_t i) { return float(int(i % 17) - 8) * 0.01f; }

// Parameter index range [begin, end) of server `s` of `servers`.
inline uint64_t RangeBegin(uint64_t params, int s, int servers) {
  return params * uint64_t(s) / uint64_t(servers);
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The synchronous SGD server of one range: the request handle that a ps-lite user
// writes (cf. tests/test_kv_app*.cc), with the round logic added. ps-lite calls it from
// the one receiving thread of the KVServer's customer, so it needs no lock.
class SyncSgdHandle {
 public:
  SyncSgdHandle(Key key, size_t len, int workers, float lr)
      : key_(key), workers_(workers), lr_(lr), weights_(len, kInit), sum_(len, 0.0f) {}

  void operator()(const KVMeta& req, const KVPairs<float>& data, KVServer<float>* server) {
    CHECK(!(req.push && req.pull)) << "PushPull is not used by this benchmark";
    CHECK_EQ(data.keys.size(), size_t(1)) << "one key per server expected";
    CHECK_EQ(data.keys[0], key_) << "key of another server";
    const size_t n = weights_.size();
    if (req.push) {
      // data.vals points into the received ZMQ message (ps-lite's receive is zero-copy).
      CHECK_EQ(data.vals.size(), n) << "push of the wrong length";
      for (const KVMeta& p : pending_) {
        CHECK(!(p.sender == req.sender && p.customer_id == req.customer_id))
            << "second push from node " << req.sender << " in one round";
      }
      const float* g = data.vals.data();
      float* s = sum_.data();
      if (pending_.empty()) {
        std::memcpy(s, g, n * sizeof(float));
      } else {
        for (size_t i = 0; i < n; ++i) s[i] += g[i];
      }
      pending_.push_back(req);
      if (int(pending_.size()) == workers_) {
        const float scale = lr_ / float(workers_);  // w -= lr * mean
        float* w = weights_.data();
        for (size_t i = 0; i < n; ++i) w[i] -= scale * s[i];
        for (const KVMeta& p : pending_) server->Response(p);  // the round is done
        pending_.clear();
      }
    } else {
      // The answer must own its data: ZMQ sends it asynchronously, and the weights may
      // change before it is gone. One copy, into a fresh array that the message frees.
      KVPairs<float> res;
      res.keys = data.keys;
      float* copy = new float[n];
      std::memcpy(copy, weights_.data(), n * sizeof(float));
      res.vals.reset(copy, n, [](float* p) { delete[] p; });
      server->Response(req, res);
    }
  }

 private:
  Key key_;
  int workers_;
  float lr_;
  std::vector<float> weights_;
  std::vector<float> sum_;        // sum of this round's pushes
  std::vector<KVMeta> pending_;   // this round's pushes, answered when it completes
};

void StartServer(const Config& cfg) {
  const int s = ps::MyRank(), servers = ps::NumServers();
  const uint64_t begin = RangeBegin(cfg.params, s, servers);
  const uint64_t end = RangeBegin(cfg.params, s + 1, servers);
  const Key key = ps::Postoffice::Get()->GetServerKeyRanges()[s].begin();
  SyncSgdHandle handle(key, size_t(end - begin), ps::NumWorkers(), cfg.lr);
  auto* server = new KVServer<float>(0);
  server->set_request_handle(std::move(handle));
  ps::RegisterExitCallback([server]() { delete server; });
}

int RunWorker(const Config& cfg) {
  const int rank = ps::MyRank(), workers = ps::NumWorkers(), servers = ps::NumServers();
  const uint64_t n = cfg.params;
  KVWorker<float> kv(0, 0);

  // One key per server, the first of its key range, sorted as ps-lite requires; lens
  // only when the ranges are not all the same length (else the slicer divides evenly).
  const std::vector<ps::Range>& ranges = ps::Postoffice::Get()->GetServerKeyRanges();
  SArray<Key> keys(servers);
  for (int s = 0; s < servers; ++s) keys[s] = ranges[s].begin();
  SArray<int> lens;
  if (n % uint64_t(servers) != 0) {
    lens.resize(servers);
    for (int s = 0; s < servers; ++s) {
      lens[s] = int(RangeBegin(n, s + 1, servers) - RangeBegin(n, s, servers));
    }
  }

  SArray<float> grad(n);   // pushed without a copy (ZPush): the message references it
  SArray<float> model(n);  // ZPull copies each server's answer into it
  for (uint64_t i = 0; i < n; ++i) grad[i] = Base(i) * float(rank + 1);

  const auto round = [&] {
    kv.Wait(kv.ZPush(keys, grad, lens));
    kv.Wait(kv.ZPull(keys, &model));
  };

  for (int r = 0; r < cfg.warmup; ++r) round();
  ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup);
  const double t0 = Now();
  for (int r = 0; r < cfg.rounds; ++r) round();
  ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup);
  const double seconds = Now() - t0;

  // Expected weights after T = warmup + rounds steps of w -= lr * mean(grad):
  // mean over ranks of Base(i) * (rank + 1) = Base(i) * (W + 1) / 2.
  const int steps = cfg.warmup + cfg.rounds;
  const double mean_factor = double(workers + 1) / 2.0;
  uint64_t bad = 0, first_bad = 0;
  double worst = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const double want = double(kInit) - double(steps) * double(cfg.lr) * double(Base(i)) * mean_factor;
    const double err = std::fabs(double(model[i]) - want);
    if (err > 1e-5 + 1e-4 * std::fabs(want)) {
      if (bad == 0) first_bad = i;
      ++bad;
    }
    if (err > worst) worst = err;
  }
  if (bad != 0) {
    const uint64_t i = first_bad;
    std::fprintf(stderr,
                 "pslite_e2e ERROR: worker %d: %llu of %llu weights wrong after %d steps; "
                 "first at %llu: got %.9g want %.9g\n",
                 rank, (unsigned long long)bad, (unsigned long long)n, steps, (unsigned long long)i,
                 double(model[i]),
                 double(kInit) - double(steps) * double(cfg.lr) * double(Base(i)) * mean_factor);
    return 1;
  }
  if (rank == 0) {
    const double gbps = double(workers) * double(n) * 8.0 * double(cfg.rounds) * 8.0 / 1e9 / seconds;
    std::printf("pslite_e2e workers=%d servers=%d params=%llu rounds=%d seconds=%.6f goodput_gbps=%.3f\n",
                workers, servers, (unsigned long long)n, cfg.rounds, seconds, gbps);
    std::fflush(stdout);
    std::fprintf(stderr, "pslite_e2e: worker 0 check ok (%d steps, max abs error %.3g)\n", steps, worst);
  }
  return 0;
}

bool ParseArgs(int argc, char** argv, Config* cfg) {
  char* end = nullptr;
  if (argc > 1) {
    const unsigned long long v = std::strtoull(argv[1], &end, 10);
    if (*end != '\0' || v == 0) return false;
    cfg->params = v;
  }
  if (argc > 2) {
    cfg->rounds = int(std::strtol(argv[2], &end, 10));
    if (*end != '\0' || cfg->rounds < 1) return false;
  }
  if (argc > 3) {
    cfg->warmup = int(std::strtol(argv[3], &end, 10));
    if (*end != '\0' || cfg->warmup < 0) return false;
  }
  if (argc > 4) {
    cfg->lr = std::strtof(argv[4], &end);
    if (*end != '\0') return false;
  }
  return argc <= 5;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  if (!ParseArgs(argc, argv, &cfg)) {
    std::fprintf(stderr, "usage: %s [params>0] [rounds>0] [warmup>=0] [lr]   (role etc. from DMLC_*)\n",
                 argv[0]);
    return 2;
  }
  // StartAsync, then the server's KVServer, then the start barrier (what ps::Start does,
  // with the server created in between; MXNet's kvstore starts ps-lite the same way).
  // With ps::Start first (tests/test_kv_app*.cc), a worker's first push can reach a
  // server before the scheduler's end-of-barrier message, or between the KVServer's
  // construction and set_request_handle: the server's receive thread then waits 5 s for
  // a customer that its main thread can only create after that message, and aborts
  // ("timeout (5 sec) to wait App 0 customer 0 ready"), or fails
  // "Check failed: request_handle_". Both happened in smoke runs here.
  ps::StartAsync(0, argv[0]);
  if (ps::IsServer()) {
    const uint64_t per = cfg.params / uint64_t(ps::NumServers());
    CHECK_GT(per, uint64_t(0)) << "fewer params than servers";
    CHECK_LE(per + 1, uint64_t(INT32_MAX)) << "a server range must fit ps-lite's int lens";
    StartServer(cfg);
  }
  ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup + ps::kServerGroup + ps::kScheduler);
  int rc = 0;
  if (ps::IsWorker()) rc = RunWorker(cfg);
  ps::Finalize(0, true);
  return rc;
}
