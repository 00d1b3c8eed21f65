// `ps-bench hostile`'s attacks on the shard's TCP data port (docs/bench.md, "Hostile
// clients"; docs/data-plane.md, "Per-connection bounds"). Their phases run a server with
// --data-plane tcp, so the honest workers train over the data port the attacks hit;
// hostile_bench.cc runs them as it runs every attack (a baseline phase, then the attack,
// alternately) and reports them in the same rows.
//
// The attackers are clients of tests/support/data_port_client.h, each from a loopback
// source of its own (127.0.0.2 and up, as other hosts would be), so that the port's
// per-source bounds apply to them and not to the honest workers on 127.0.0.1.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "bench/push_counts.h"
#include "core/layout.h"

namespace ps::bench {

// The shard's data port and what worker 3 (the attacker's identity) holds for it.
struct DataPortTarget {
  uint16_t port = 0;
  uint32_t worker = 0;
  std::string token;
  uint64_t data_session = 0;  // from worker 3's newest Join, with its secret
  std::string data_secret;
};

// How a data-port attack thread learns what to hit and tells what happened. The
// functions are thread-safe and live until the phase's threads are joined.
struct DataPortControl {
  std::function<DataPortTarget()> target;  // worker 3's newest session
  std::function<bool()> more;              // not told to stop, within the request budget
  std::function<bool()> stopped;           // told to stop
  uint32_t max_connections = 64;           // connections a thread holds open at once
  // A refusal the shard answered (a GOAWAY's status) to one request.
  std::function<void(const absl::Status&)> refused;
  // Requests that got no answer (connections held, frames the shard closed on).
  std::function<void(uint64_t)> unanswered;
  // Something the shard should have refused but did not.
  std::function<void(std::string)> accepted;
  std::function<void(std::string)> note;
};

struct DataPortAttack {
  std::string name;
  std::string what;  // one line for --list
  int threads = 1;
  std::function<void(const DataPortControl&, int thread)> run;
};

std::vector<DataPortAttack> DataPortAttacks();

// Worker 3's own pushes where the data moves over the data port (the gRPC cover of
// hostile_cover.h, whose pushes such a shard refuses as another plane's): once round t
// is open, a valid fp32 gradient for every slice of `layout`, all sent at once over
// worker 3's own data connection, then their answers awaited. A connection that fails
// (an attack's join replaced the session) is opened again under the newest session,
// and the round sent again (its copies the shard took come back as duplicates, which
// count as pushed).
class DataPortCover {
 public:
  struct Rounds {
    // Whether round `next` or a later one opened within the time given.
    std::function<bool(uint64_t next, std::chrono::milliseconds)> wait_open;
    std::function<uint64_t()> open_version;  // the newest open round
  };
  DataPortCover(std::function<DataPortTarget()> target, const core::ModelLayout& layout,
                Rounds rounds);
  ~DataPortCover();
  DataPortCover(const DataPortCover&) = delete;
  DataPortCover& operator=(const DataPortCover&) = delete;

  // The pushes the shard took (duplicates too) and refused (with the shard's message).
  const PushCounts& counts() const { return counts_; }

 private:
  void Loop();

  const std::function<DataPortTarget()> target_;
  const core::ModelLayout& layout_;
  const Rounds rounds_;
  std::vector<std::string> payloads_;  // per slice
  std::atomic<bool> stop_{false};
  PushCounts counts_;
  std::thread thread_;
};

}  // namespace ps::bench
