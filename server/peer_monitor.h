// PeerMonitor: a shard's view of its peers (docs/operations.md, "Several shards"). Until
// shutdown it greets every peer, quickly at start (every 250 ms, twenty times) and every
// 5 s after: a peer that disagrees on the configuration or the layout turns the verdict to
// "not serving" (the reason logged once), an unreachable one does not (it may be
// starting). A shard restored from a checkpoint catches up before it admits workers: once
// every peer answered, or the peer timeout passed, it moves up to the highest version
// among the ready peers (the workers are at that round; the updates in between were lost
// with the old process) and admits them.
//
// The greetings go through a PeerGreeter (gRPC's PeerService in the server; a fake in
// tests). Round() is one greeting of every peer and what follows from it; Start() runs
// rounds on a thread of its own.
//
// Thread safety: Start and Stop from one thread; Round on one thread at a time (the
// monitor's, or a test's). The hooks run on that thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/clock.h"

namespace ps::server {

// What a peer answered.
struct PeerReply {
  // OK, or FAILED_PRECONDITION saying how its configuration or layout differs.
  absl::Status agreement;
  bool ready = false;        // its model is registered and initialized
  uint64_t max_version = 0;  // its newest slice version
};

class PeerGreeter {
 public:
  virtual ~PeerGreeter() = default;
  // Greets shard `peer`: its reply, or the call's error. UNAVAILABLE and DEADLINE_EXCEEDED
  // mean unreachable; any other error is a disagreement.
  virtual absl::StatusOr<PeerReply> Hello(uint32_t peer) = 0;
};

class PeerMonitor {
 public:
  struct Options {
    uint32_t self = 0;
    std::vector<std::string> peers;  // by shard id, this shard's own entry included
    core::Duration peer_timeout{};   // how long a restored shard waits for every peer
  };
  struct Hooks {
    // The verdict, at the first round and at every change.
    std::function<void(bool peers_agree)> agreement;
    // Whether the shard is catching up (restored, not admitting workers yet).
    std::function<bool()> catching_up;
    // The shard's newest version, and the move up to `version` (returns the slices moved).
    std::function<uint64_t()> own_version;
    std::function<uint32_t(uint64_t version)> fast_forward;
    // Admit workers: the catch-up is over.
    std::function<void()> admit;
  };

  // `greeter` and `clock` are borrowed and outlive the monitor.
  PeerMonitor(Options options, PeerGreeter* greeter, core::Clock* clock, Hooks hooks);
  ~PeerMonitor();  // Stop()
  PeerMonitor(const PeerMonitor&) = delete;
  PeerMonitor& operator=(const PeerMonitor&) = delete;

  void Round();
  void Start();
  void Stop();  // idempotent; returns once the thread has ended

 private:
  void Loop();
  void CatchUp();

  const Options options_;
  PeerGreeter* const greeter_;
  core::Clock* const clock_;
  const Hooks hooks_;
  const core::SteadyTime catch_up_until_;
  // Across rounds: the peers that answered, the highest version of a ready one.
  std::vector<bool> heard_;
  uint64_t peers_version_ = 0;
  std::string last_problem_ = "unchecked";
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ps::server
