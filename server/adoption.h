// Adoption: the votes that let the shards take one worker's parameters mid-run
// (horovod's broadcast_parameters after training started; docs/python.md, "Starting and
// resuming from rank 0's values").
//
// After training started, a worker that could overwrite the model would be the
// strongest Byzantine attack there is. So adoption is a collective, as Horovod's call is:
// every worker asks for it (a vote for a round and a root), and the shard lets the root
// upload its values for that round only once `quorum` workers (the rounds' quorum,
// n - f at least) voted for the same round and root. The f Byzantine workers alone never
// reach it; the honest workers that reach it with them chose that root in their own code.
//
// Bounded by the worker count: one vote per worker (a later vote replaces its earlier
// one), one passed adoption at a time (a later one replaces it). Thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ps::server {

class Adoption {
 public:
  // `quorum` in [1, num_workers].
  Adoption(uint32_t num_workers, uint32_t quorum);
  Adoption(const Adoption&) = delete;
  Adoption& operator=(const Adoption&) = delete;

  struct Tally {
    uint32_t votes = 0;  // workers whose current vote is this (round, root)
    uint32_t quorum = 0;
    bool passed = false;
    bool now = false;  // this vote passed it
  };
  // `worker`'s vote for adopting `root`'s values at `round` (both < num_workers; the
  // caller checks them and the round). Passes when it brings the votes to the quorum, or
  // when that (round, root) passed already.
  Tally Vote(uint32_t worker, uint64_t round, uint32_t root);
  // The passed adoption, if any: its round and root.
  struct Passed {
    uint64_t round = 0;
    uint32_t root = 0;
  };
  std::optional<Passed> passed() const;
  // Forgets the passed adoption of `round` (or an earlier one) and every vote for it or
  // an earlier round: the shard adopted it on every slice. True when it forgot a passed
  // adoption (the first caller of several).
  bool Done(uint64_t round);

  uint32_t quorum() const { return quorum_; }

  // The votes an adoption needs among n workers with f Byzantine when rounds close with
  // `round_quorum` inputs: that quorum, and never fewer than n - f nor f + 1 (a --quorum
  // below n - f closes rounds sooner; it must not let fewer workers overwrite the
  // model), at most n.
  static uint32_t QuorumFor(uint32_t n, uint32_t f, uint32_t round_quorum);

 private:
  struct Ballot {
    bool cast = false;
    uint64_t round = 0;
    uint32_t root = 0;
  };

  const uint32_t quorum_;
  mutable absl::Mutex mu_;
  std::vector<Ballot> ballots_ ABSL_GUARDED_BY(mu_);
  std::optional<Passed> passed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::server
