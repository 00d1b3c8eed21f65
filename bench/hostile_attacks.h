// The catalogue of `ps-bench hostile`'s attacks (docs/bench.md, "Hostile clients"):
// what each sends, with how many threads, and how its phases run. hostile_bench.cc runs
// each against a fresh ps-server; the attacks act as worker 3 (hostile_clients.h).
//
// The catalogue is hostile_attacks.cc; the attacks' bodies are, by kind,
// hostile_grpc_attacks.cc (requests that are wrong or in another's name),
// hostile_flood_attacks.cc (floods of large or many requests and connections),
// hostile_h2_attacks.cc (below the messages, tests/support/h2_attacker.h) and
// hostile_data_phases.cc (on the TCP data port).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "harness/honest_training.h"
#include "bench/hostile_clients.h"
#include "core/layout.h"

namespace ps::bench {

// How much each attack may do; --quick shrinks it.
struct Limits {
  uint64_t max_requests = 200000;  // per attack phase, all of the attack's threads together
  uint32_t pull_batch = 64;        // far-future pulls opened at once (above the per-worker limit)
  uint32_t idle_streams = 16;      // never-read pulls opened at once
  std::chrono::milliseconds idle_deadline{1000};
  uint32_t grpc_connections = 128;  // conn_flood: channels of their own, one call each
  uint32_t raw_connections = 256;   // conn_flood: TCP connections that never speak
  double prelude_seconds = 1;       // layout attacks before the honest layout exists
  double warmup_seconds = 0.5;
  uint32_t inflight = 4;  // layout_tensors, big_messages: 7 MB requests in flight at once
};

// What an attack thread works with. Borrowed pointers live until the attack's threads
// are joined.
struct AttackEnv {
  Attacker* attacker = nullptr;
  const core::ModelLayout* layout = nullptr;
  const harness::HonestTraining* training = nullptr;  // null before the honest layout exists
  Tally* tally = nullptr;
  const Limits* limits = nullptr;
  SpecSource* specs = nullptr;
  const std::atomic<bool>* stop = nullptr;

  // Whether to send another request: not told to stop, and within this phase's budget.
  bool more() const { return !stop->load() && tally->phase_requests() < limits->max_requests; }
  uint64_t open_round() const { return training != nullptr ? training->open_version() : 0; }
};

struct AttackCheck {
  std::string text;
  bool ok = true;
};

struct Attack {
  std::string name;
  std::string what;  // one line for --list
  int threads = 1;   // copies of `run`, told apart by their index
  std::function<void(AttackEnv&, int)> run;
  bool before_layout = false;  // also run against the shard before the honest layout exists
  bool poison_cover = false;   // the cover pushes with new specs and garbage too
  // After the attack phases (may be empty): whether the server is back to normal.
  std::function<AttackCheck(AttackEnv&, pid_t server)> check;
  // Worker 3 pushes no cover in this attack's run (as --no-cover): the attack is worker
  // 3's push itself.
  bool without_cover = false;
  bool by_name = false;  // runs only when --attacks names it
  // The server runs --data-plane tcp: the honest workers train over its data port (worker
  // 3's cover still pushes over gRPC, which the shard takes on either plane).
  bool tcp_data_plane = false;
};

// Every attack, in the order they run (those with by_name last).
std::vector<Attack> AllAttacks();

// ---- The attacks' bodies (their one-line descriptions are in AllAttacks) ----------------

// hostile_grpc_attacks.cc
void LayoutWrap(AttackEnv& env, int thread);
void LayoutHuge(AttackEnv& env, int thread);
void CodecPoison(AttackEnv& env, int thread);
void PullLeak(AttackEnv& env, int thread);
// After pull_leak: every one of worker 3's pull slots must be free again.
AttackCheck PullSlotsFree(AttackEnv& env, pid_t server);
void Impersonation(AttackEnv& env, int thread);
void LogFlood(AttackEnv& env, int thread);
void JunkRequests(AttackEnv& env, int thread);

// hostile_flood_attacks.cc
void LayoutTensors(AttackEnv& env, int thread);
void BigMessages(AttackEnv& env, int thread);
void AnonMessages(AttackEnv& env, int thread);
void UdpQuorum(AttackEnv& env, int thread);
void PullSlices(AttackEnv& env, int thread);
void ConnFlood(AttackEnv& env, int thread);

#if PS_HAVE_H2_ATTACKER
// hostile_h2_attacks.cc: the h2_* attacks, each run only by name.
void AddH2Attacks(std::vector<Attack>& attacks);
#endif

}  // namespace ps::bench
