// Quarantine: workers that sent a malformed push sit out the rounds for a while
// (docs/operations.md, "Threat model and limits").
//
// worker_lib never sends a malformed push (it encodes with the codec it names and refuses
// non-finite gradients before they leave), so one is proof of a faulty or hostile
// worker. Refusing it costs what its size costs, but that is not enough: a Byzantine
// worker that sends garbage under ever new codec specs next to each of its real pushes
// makes the shard build decoders and decode for nothing at the round rate, and the
// rounds wait for it. A quarantined worker's pushes and chunks are refused before any
// decoding (kQuarantined), and no round waits for it: a round closes once every worker
// that is not quarantined pushed and it has its quorum. A re-join does not lift the
// quarantine (it is the worker id's, not the session's); it ends by itself after its
// duration, and the next malformed push starts another.
//
// Thread-safe and lock-free: one atomic deadline per worker.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "core/clock.h"

namespace ps::server {

class Quarantine {
 public:
  // `duration` 0 turns quarantines off (Start does nothing).
  Quarantine(uint32_t num_workers, core::Duration duration);
  Quarantine(const Quarantine&) = delete;
  Quarantine& operator=(const Quarantine&) = delete;

  // Quarantines `worker` from `now` for the duration. True when the worker was not
  // quarantined at `now` (the caller then closes the rounds that waited only for it).
  bool Start(uint32_t worker, core::SteadyTime now);
  // Whether `worker` is quarantined at `now`.
  bool Contains(uint32_t worker, core::SteadyTime now) const;
  // When `worker`'s quarantine ends, if it is quarantined at `now`.
  std::optional<core::SteadyTime> Until(uint32_t worker, core::SteadyTime now) const;
  // Whether any worker is quarantined at `now` (one atomic load: the rounds' fast path).
  bool Any(core::SteadyTime now) const;
  // OK, or the (uncounted) kQuarantined refusal of a push or chunk of `worker` at `now`.
  absl::Status Check(uint32_t worker, core::SteadyTime now) const;

  core::Duration duration() const { return duration_; }

 private:
  static int64_t Ticks(core::SteadyTime t) { return t.time_since_epoch().count(); }

  const uint32_t num_workers_;
  const core::Duration duration_;
  // Per worker, the end of its quarantine in SteadyTime ticks (0: never quarantined).
  const std::unique_ptr<std::atomic<int64_t>[]> until_;
  // The latest end over all workers.
  std::atomic<int64_t> latest_{0};
};

}  // namespace ps::server
