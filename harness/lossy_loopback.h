// Loss applied by the kernel to every packet on loopback, for benchmarks that compare
// transports under loss (`ps-bench udp --kernel-loss`, docs/bench.md), and other nftables
// rules on a loopback of its own, for tests of what the kernel does to a sender (a drop
// on output).
//
// Enter() moves the calling thread into a network namespace of its own (unshare) with
// its loopback up, so threads, sockets and child processes it starts afterwards see
// only that loopback and nothing outside is touched. SetLoss() installs an nftables
// rule there that drops each packet arriving on loopback with a given probability:
// TCP segments and acknowledgements, UDP datagrams, every direction and every
// transport alike, the way a lossy link loses them (the sender is not told; a drop on
// the output path would instead fail the sender's call with EPERM). The namespace, and
// its rule, go away when the last thread and socket in it do.
//
// Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and the nft program (Debian: nftables);
// the errors say which is missing. Call Enter() before starting any thread that should
// use the lossy loopback: a thread started earlier stays in the namespace it had.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace ps::harness {

class LossyLoopback {
 public:
  static absl::StatusOr<LossyLoopback> Enter();

  // Drops each packet arriving on loopback with probability `loss` in [0, 1), replacing
  // the previous rule (0: no rule at all).
  absl::Status SetLoss(double loss);
  // Packets the rule has dropped since the last SetLoss() (0 without a rule).
  absl::StatusOr<uint64_t> Dropped() const;

  // Runs `nft -f` on `script` in the namespace (a table of the caller's own, beside the
  // loss rule's): what nft printed, or its error with the script.
  absl::StatusOr<std::string> Nft(const std::string& script) const;

 private:
  explicit LossyLoopback(std::string nft) : nft_(std::move(nft)) {}

  std::string nft_;     // the nft program's path
  bool rule_ = false;   // a dropping rule is installed
};

}  // namespace ps::harness
