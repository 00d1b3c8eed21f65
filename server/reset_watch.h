// ResetWatch: which connections of a gRPC port reset streams abusively (HTTP/2 "rapid
// reset", CVE-2023-44487), from what the front sees of their calls (docs/connections.md,
// "Abusive connections"). gRPC 1.51 has no bound of its own on resets, so the front
// reports each call's start, early cancel and end here, keyed by the connection (gRPC's
// peer string, which names the client's port), and closes a connection this names.
//
// Two signs, both of streams the client opened and reset at once:
// - cancels before the request arrived, max_early_cancels within a second (the front
//   got the call and then its cancel: an honest client cancels a call this way only when
//   it gives up on it, a few at a time);
// - calls held: more calls of one connection alive in the front than
//   max_held_per_connection. HTTP/2 lets a client keep at most
//   SETTINGS_MAX_CONCURRENT_STREAMS streams open, and an honest client's call ends in
//   the front as its stream ends; a client that resets its streams closes them at its
//   end at once, while the shard may still hold their calls. When the shard falls
//   behind such a flood, gRPC delivers the cancels (and ends the refused calls) only
//   after it has read all the flood has sent, so the first sign sees nothing while the
//   calls, tens of KiB each, pile up: measured, 54,000 calls and 1.2 GiB in 4 s from
//   one connection, whose cancels all came after it stopped.
//
// Each rule names a connection once: it is reported again only after its calls have all
// ended (a new connection from the same port) or its second has passed.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "core/clock.h"

namespace ps::server {

struct ResetLimits {
  uint32_t max_early_cancels = 64;        // within a second, per connection
  uint32_t max_held_per_connection = 128;  // calls alive in the front at once

  // For a port whose connections may have `max_streams` streams open
  // (SETTINGS_MAX_CONCURRENT_STREAMS): four times that, at least 64 (room for the ends
  // the front has not yet been told of), at most UINT32_MAX.
  static ResetLimits ForStreams(uint32_t max_streams);
};

class ResetWatch {
 public:
  ResetWatch(const ResetLimits& limits, core::Clock* clock) : limits_(limits), clock_(clock) {}

  const ResetLimits& limits() const { return limits_; }

  // A call of `connection` begins. True when the connection now holds more calls than
  // the bound, the first time since it last held none: the caller closes it.
  bool Begin(const std::string& connection);
  // A call that Begin counted ended.
  void End(const std::string& connection);
  // A call of `connection` was cancelled before its request arrived. True at the
  // max_early_cancels-th within a second: the caller closes the connection.
  bool EarlyCancel(const std::string& connection);
  // Forgets early-cancel counts older than a second (call now and then).
  void Sweep();

  // Connections with calls held, and those with early cancels counted (for tests).
  size_t connections() const;

 private:
  struct Held {
    uint32_t calls = 0;
    bool reported = false;
  };
  struct Cancels {
    core::SteadyTime since{};
    uint32_t count = 0;
  };

  const ResetLimits limits_;
  core::Clock* const clock_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Held> held_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Cancels> cancels_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::server
