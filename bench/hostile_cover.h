// Worker 3's own pushes over gRPC in `ps-bench hostile` (docs/bench.md, "Hostile
// clients"): the "cover" of a Byzantine worker that wants to stay in the rounds, so that
// rounds close on four pushes and the round rate measures the server rather than the
// round deadline. (The cover of a shard on the TCP data plane is DataPortCover,
// bench/hostile_data_phases.h.)
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "harness/honest_training.h"
#include "bench/hostile_clients.h"
#include "bench/push_counts.h"
#include "core/layout.h"

namespace ps::bench {

// Once an honest worker pulled version t, round t is open, and the cover pushes a valid
// fp32 gradient for every slice of it. While poisoned (codec_poison), every slice first
// gets a garbage push under a codec spec never seen before (counted for the attack), and
// the valid gradient goes under another new spec: each makes the shard build (and its
// cache drop) a decoder. The cover waits for the answers to its valid pushes only: a
// Byzantine worker that wants to stay in the rounds does not wait for its garbage (whose
// answers the shard's tarpit may hold). A push refused as unauthenticated because an
// attack's join replaced worker 3's session is sent again under the newest one.
// `attacker`, `training`, `layout` and `specs` outlive the cover. Thread-safe.
class Cover {
 public:
  Cover(Attacker& attacker, const harness::HonestTraining& training, const core::ModelLayout& layout,
        SpecSource& specs);
  ~Cover();
  Cover(const Cover&) = delete;
  Cover& operator=(const Cover&) = delete;

  // `tally` (borrowed until the next call) counts the garbage pushes; nullptr: plain,
  // once every garbage push sent has its answer.
  void SetPoison(Tally* tally);
  // The valid pushes the shard took and refused ("CODE: message" for the last).
  const PushCounts& counts() const { return counts_; }

 private:
  struct Poisoned;
  struct PushCall;

  std::vector<Poisoned> PreparePoison(uint64_t round, std::mt19937_64& rng);
  std::unique_ptr<PushCall> MakePush(uint64_t round, uint32_t slice, const std::string& codec,
                                     const std::string& payload) const;
  Tally* Poison();
  void SendGarbage(v1::WorkerService::Stub& stub, std::unique_ptr<PushCall> call, Tally* tally);
  static void SendAll(v1::WorkerService::Stub& stub,
                      const std::vector<std::unique_ptr<PushCall>>& calls);
  void Loop();

  Attacker& attacker_;
  const harness::HonestTraining& training_;
  const core::ModelLayout& layout_;
  SpecSource& specs_;
  std::vector<std::string> payloads_;  // fp32 payload per slice id
  // The poison tally, and the garbage pushes counted on it still in flight.
  std::mutex garbage_mu_;
  std::condition_variable garbage_done_;
  Tally* poison_ = nullptr;    // guarded by garbage_mu_
  uint32_t garbage_open_ = 0;  // guarded by garbage_mu_
  std::atomic<bool> stop_{false};
  PushCounts counts_;
  std::thread thread_;
};

}  // namespace ps::bench
