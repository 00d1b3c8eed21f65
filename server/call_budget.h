// CallBudget: how many calls each client may have open on a port, and how many request
// bodies the port receives at once, per client and in all (docs/connections.md).
// Pure bookkeeping on a clock, without gRPC: server/grpc_front.h asks it before each
// call and each read.
//
// Why bodies are counted and not bytes: once a shard asks gRPC for a call's message,
// gRPC opens the stream's HTTP/2 window to the whole message (up to
// --max-message-bytes) and keeps what arrives in memory until the last byte; until then
// the stream holds at most its initial window. So a body being received costs up to the
// largest message, and a shard that lets each client receive `max_reads_per_client`
// bodies at once, and all clients `max_reads` in all, bounds that memory by
// max_reads x max message, whatever the clients send. A body that has not arrived
// `read_timeout` after its read started is stalled (half-sent, or a link slower than
// any honest client's): Overdue() names it and the front ends its call.
//
// A read waits while its client is at its bound or all reads are taken; waiting reads
// start in the order they asked, skipping clients at their bound.
//
// Thread safety: every method may be called from any thread; `start` callbacks run on
// the calling thread of RequestRead or ReadDone, outside the lock.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "core/clock.h"

namespace ps::server {

struct CallLimits {
  uint32_t max_calls_per_client = 128;
  uint32_t max_reads_per_client = 4;
  uint32_t max_reads = 32;
  core::Duration read_timeout = std::chrono::seconds(10);
};

class CallBudget {
 public:
  using Ticket = uint64_t;

  CallBudget(const CallLimits& limits, core::Clock* clock) : limits_(limits), clock_(clock) {}

  const CallLimits& limits() const { return limits_; }

  // A call of `client` opens: RESOURCE_EXHAUSTED when it has max_calls_per_client open.
  absl::Status OpenCall(const std::string& client);
  // One of its calls ended (only after an OpenCall that succeeded).
  void CloseCall(const std::string& client);

  // `client` wants to receive one request body: `start` runs once it may (at once, on
  // this thread, or later on the thread of a ReadDone), with the read's ticket, which
  // names it for ReadDone and CancelRead (RequestRead returns the same).
  using Start = absl::AnyInvocable<void(Ticket) &&>;
  Ticket RequestRead(const std::string& client, Start start);
  // The read ended (the body arrived, or the call ended while it was being received):
  // its place goes to the next waiting read. A no-op for a read that never started
  // (CancelRead) or already ended.
  void ReadDone(Ticket ticket);
  // The call ended before its read started: the read stops waiting and `start` is
  // dropped unrun. Returns false when it had started already (call ReadDone).
  bool CancelRead(Ticket ticket);
  // Reads that started at least read_timeout ago and have not ended.
  std::vector<Ticket> Overdue(core::SteadyTime now) const;

  struct Stats {
    uint32_t clients = 0;      // clients with open calls
    uint32_t calls = 0;        // open calls
    uint32_t reading = 0;      // bodies being received
    uint32_t waiting = 0;      // reads waiting for a place
  };
  Stats stats() const;

 private:
  struct Client {
    uint32_t calls = 0;
    uint32_t reading = 0;
  };
  struct Waiting {
    Ticket ticket;
    std::string client;
    Start start;
  };
  struct Reading {
    std::string client;
    core::SteadyTime since;
  };
  // Moves waiting reads into free places; returns their callbacks to run unlocked.
  std::vector<std::pair<Ticket, Start>> StartWaitingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropClientIfIdleLocked(const std::string& client) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CallLimits limits_;
  core::Clock* const clock_;
  mutable absl::Mutex mu_;
  Ticket next_ ABSL_GUARDED_BY(mu_) = 1;
  uint32_t reading_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, Client> clients_ ABSL_GUARDED_BY(mu_);
  std::list<Waiting> waiting_ ABSL_GUARDED_BY(mu_);
  std::map<Ticket, Reading> reads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::server
