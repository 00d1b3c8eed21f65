// Tarpit: a client whose refused requests go beyond its budget waits for the answers to
// its next refusals (docs/operations.md, "Threat model and limits").
//
// A refusal costs its server what the request's size costs, and a client that waits for
// its answers (every gRPC client that keeps a bounded number of calls in flight) sends
// its next request as soon as the last one is refused. Cheap, precise refusals alone
// therefore let one client take as much of the shard as it likes. The tarpit gives every
// client (identity, or "anonymous") a token bucket of refused work: while the bucket has
// enough, a refusal is answered at once; beyond it, the answer is held for `hold`. Such a
// client then gets at most (calls it keeps in flight) / hold refusals per second, its
// accepted requests are not delayed, and a correct client, which is refused now and then
// (a late push of a straggler, a retried duplicate), never notices.
//
// Held answers are bounded per client and in total; beyond either bound a refusal is
// answered at once. Thread-safe. Answers run on the caller's thread (at once) or on the
// tarpit's own thread (held), never under its lock.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "core/clock.h"
#include "core/token_bucket.h"

namespace ps::server {

struct TarpitOptions {
  // Budget refill in cost units per second; 0 turns the tarpit off (every refusal is
  // answered at once).
  double rate = 64;
  // Budget size in cost units (a client's first refusals, and those after a quiet spell).
  double burst = 256;
  // How long an answer over the budget is held.
  std::chrono::milliseconds hold{1000};
  // Held answers of one client, and of all together.
  uint32_t max_held_per_client = 8;
  uint32_t max_held = 32;
};

class Tarpit {
 public:
  // A refused request costs 1 unit plus one per kBytesPerUnit of its size.
  static constexpr uint64_t kBytesPerUnit = 64 << 10;

  // Whether a refusal with `code` is charged: refusals of what the client sent, not
  // those of the server's state (UNAVAILABLE) or of the call's end (CANCELLED,
  // DEADLINE_EXCEEDED).
  static bool Charges(absl::StatusCode code);

  // `clock` times the budget's refill (a ManualClock in tests); holds are measured on
  // the steady clock.
  Tarpit(const TarpitOptions& options, core::Clock* clock);
  ~Tarpit();
  Tarpit(const Tarpit&) = delete;
  Tarpit& operator=(const Tarpit&) = delete;

  // Charges `client` for a refused request of `bytes` and runs `answer`: now, in this
  // call, while the client's budget covers it (or the hold bounds are reached, or the
  // tarpit is stopped); else `hold` later on the tarpit's thread. Returns whether it
  // was held.
  bool Refuse(std::string_view client, uint64_t bytes, absl::AnyInvocable<void() &&> answer);

  // Runs every held answer now; refusals after it are answered at once. Idempotent.
  // Before the gRPC server shuts down: it waits for the calls whose answers are held.
  void Stop();

  struct Stats {
    uint64_t held_total = 0;  // answers held so far
    uint32_t held_now = 0;
  };
  Stats stats() const;

 private:
  struct Client {
    core::TokenBucket budget;  // of refused work, into debt as deep as one burst
    uint32_t held = 0;
  };
  struct Held {
    std::chrono::steady_clock::time_point due;
    std::string client;
    absl::AnyInvocable<void() &&> answer;
  };

  void Run();
  // Forgets clients with a full bucket and nothing held, when there are many.
  void TrimLocked(core::SteadyTime now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const TarpitOptions options_;
  core::Clock* const clock_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Client> clients_ ABSL_GUARDED_BY(mu_);
  // Due times in order: every hold has the same length.
  std::deque<Held> held_ ABSL_GUARDED_BY(mu_);
  uint64_t held_total_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ps::server
