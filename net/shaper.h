// Bandwidth shaping in the transport: kernel traffic shaping (tc/netem) is not available
// on the machines we run on, so a shaped link is modelled in user space instead.
//
//   LinkShaping     what a link looks like (rate, one-way latency and bucket depth per
//                   direction), parsed from a flag value like "rate=100mbps,latency=2ms".
//   TokenBucket     the rate limiter: a bucket that may go into debt and says when the
//                   bytes just taken may leave.
//   ShapingRelay    a loopback TCP relay that a client dials instead of its upstream; it
//                   shapes each direction with one bucket shared by all its connections
//                   (they model one NIC) and delays delivery by the latency.
//
// Ownership: TokenBucket borrows its Clock; ShapingRelay owns its thread, sockets and
// buckets and releases them all in its destructor.
// Thread safety: the option structs are plain values. TokenBucket and ShapingRelay are
// thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/clock.h"
#include "core/token_bucket.h"

namespace ps::net {

// One direction of a shaped link.
struct ShapingOptions {
  double mbps = 0;                       // rate in megabits per second (1e6 bit/s); 0 = unlimited
  std::chrono::microseconds latency{0};  // added one-way delay
  uint64_t burst_bytes = 64 * 1024;      // bucket depth; ignored when the rate is unlimited

  bool enabled() const { return mbps > 0 || latency.count() > 0; }
  bool operator==(const ShapingOptions&) const = default;
};

struct LinkShaping {
  ShapingOptions up;    // client -> upstream (a worker's pushes)
  ShapingOptions down;  // upstream -> client (pulls)

  bool enabled() const { return up.enabled() || down.enabled(); }
  bool operator==(const LinkShaping&) const = default;
};

// Parses a flag value. "" or "off" -> disabled. Keys (comma separated, each at most once):
//   rate=<R>     both directions;   up=<R>, down=<R>  one direction (overrides rate);
//   latency=<D>  one-way delay added to both directions;
//   burst=<B>    bucket depth of both directions (needs a rate).
// R: number + "kbps" | "mbps" | "gbps" (100mbps, 1.5gbps), at most 10000gbps;
// D: number + "us" | "ms" | "s", at most 60s; B: integer bytes with an optional k or m
// suffix (64k = 65536). Units are case-insensitive. Errors are INVALID_ARGUMENT and quote
// the spec: "link shaping 'rate=100': rate '100': missing unit (kbps, mbps or gbps)".
absl::StatusOr<LinkShaping> ParseLinkShaping(std::string_view spec);

// Human-readable form for logs and JSON rows: "up=100mbps,down=100mbps,latency=2ms",
// "off" when disabled. ParseLinkShaping(DescribeLinkShaping(s)) == s for every s that
// ParseLinkShaping produces; directions with different latencies or bursts (which the
// grammar cannot express) are written as up_latency=/down_latency=, up_burst=/down_burst=.
std::string DescribeLinkShaping(const LinkShaping& shaping);

// A thread-safe core::TokenBucket of bytes on a clock: refills at `bytes_per_second` up
// to `burst_bytes` and starts full. Reserve() never refuses: the bucket goes into debt
// and the caller waits until the time returned, so a chunk larger than the bucket still
// passes at the average rate.
class TokenBucket {
 public:
  // `clock` is borrowed and must outlive the bucket; nullptr = Clock::Real().
  // bytes_per_second <= 0 means unlimited: Reserve() always returns Now().
  TokenBucket(double bytes_per_second, uint64_t burst_bytes, core::Clock* clock = nullptr);
  TokenBucket(const TokenBucket&) = delete;
  TokenBucket& operator=(const TokenBucket&) = delete;

  // Takes `bytes` from the bucket (it may go into debt) and returns the time at which
  // these bytes may be sent: Now() if the bucket covered them, else when the debt is
  // repaid (rounded up to the nanosecond, so never early).
  core::SteadyTime Reserve(uint64_t bytes);

 private:
  const bool unlimited_;
  core::Clock* const clock_;
  absl::Mutex mu_;
  core::TokenBucket bucket_ ABSL_GUARDED_BY(mu_);
};

// Where a ShapingRelay listens.
struct RelayOptions {
  // A literal IP address of this machine. Another loopback address than 127.0.0.1 lets
  // a relay take the very port its upstream has on 127.0.0.1, so that a client which
  // derives one port from another (a worker dials the data port its Join answer names
  // on the host of its control address) goes through relays for both.
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 0;  // 0: one the kernel picks
};

enum class RelayDirection { kUp, kDown };

// A TCP relay on loopback that shapes a link: listens where RelayOptions say
// (127.0.0.1:<ephemeral port> by default), and for every accepted connection opens one to
// `upstream` and copies bytes both ways.
//
// Each direction reads a chunk (at most 16 KiB), waits for tokens, holds the chunk until
// it has "left the NIC" + latency, and writes it. Data arrives unchanged and in order.
// EOF propagates as a half-close (shutdown(send) on the other side once everything read
// before it is delivered); a reset or a failed write resets both sides. A connection to
// an upstream that refuses is reset.
//
// Backpressure: a direction of a connection reads nothing while it waits for tokens, and
// reads on only while it holds less than max(2 * burst, rate * latency + 64 KiB) bytes
// (16 MiB when the rate is unlimited but a latency is set; 64 MiB at most), and all
// sockets have 64 KiB kernel buffers, so queues build in the sender's application (where
// priorities apply), not in the relay. TCP_NODELAY: the relay adds no Nagle delay.
//
// One thread runs every connection (Boost.Asio, asynchronous); unshaped, a relay moves
// about 5 Gbit/s on a loaded 2-core machine. The bucket forgets tokens beyond its depth,
// so when the relay's thread is descheduled longer than burst / rate, the link runs a
// little below its rate: give rates of Gbit/s a deeper burst (256k or more).
class ShapingRelay {
 public:
  // `upstream`: "host:port" or "[v6-address]:port", resolved once here; "localhost" tries
  // each address it resolves to. Fails with INVALID_ARGUMENT on an unparsable address,
  // UNAVAILABLE when it does not resolve or the listening socket cannot be set up.
  // A listen host that is no literal IP address is INVALID_ARGUMENT.
  static absl::StatusOr<std::unique_ptr<ShapingRelay>> Start(std::string upstream,
                                                             LinkShaping shaping,
                                                             RelayOptions options = {});
  // Stops accepting, closes every connection (its peers see EOF or a reset) and joins
  // the relay's thread; does not wait for queued data to drain.
  ~ShapingRelay();
  ShapingRelay(const ShapingRelay&) = delete;
  ShapingRelay& operator=(const ShapingRelay&) = delete;

  std::string address() const;  // "<listen host>:<port>", "[<v6 host>]:<port>"
  // Bytes relayed so far in each direction: counted when handed to the destination
  // socket (so a peer that has read N bytes sees a count >= N), less any a failed write
  // did not send.
  uint64_t bytes_up() const;
  uint64_t bytes_down() const;
  // Connections accepted so far.
  uint64_t connections() const;

  // Fault injection (tests, benchmarks): once `bytes` more bytes have been read in
  // `direction` (over all connections, counted from this call), the connection that read
  // the last of them relays them, reads no more that way and, once they are written, is
  // reset on both sides: a connection lost in the middle of what it carried (its peers
  // may not see all of those bytes: a reset drops what their kernels had not delivered).
  // One cut per call; a call replaces a cut still armed in that direction.
  void CutAfter(RelayDirection direction, uint64_t bytes);
  // Connections cut by CutAfter so far.
  uint64_t cuts() const;

 private:
  class Impl;
  explicit ShapingRelay(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ps::net
