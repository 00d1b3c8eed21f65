#include "server/adoption.h"

#include <algorithm>

namespace ps::server {

uint32_t Adoption::QuorumFor(uint32_t n, uint32_t f, uint32_t round_quorum) {
  return std::min(n, std::max({round_quorum, n > f ? n - f : n, f + 1}));
}

Adoption::Adoption(uint32_t num_workers, uint32_t quorum)
    : quorum_(quorum), ballots_(num_workers) {}

Adoption::Tally Adoption::Vote(uint32_t worker, uint64_t round, uint32_t root) {
  absl::MutexLock lock(&mu_);
  ballots_[worker] = Ballot{.cast = true, .round = round, .root = root};
  Tally t{.quorum = quorum_};
  for (const Ballot& b : ballots_) {
    if (b.cast && b.round == round && b.root == root) ++t.votes;
  }
  const bool same = passed_.has_value() && passed_->round == round && passed_->root == root;
  t.now = !same && t.votes >= quorum_;
  if (t.now) passed_ = Passed{.round = round, .root = root};
  t.passed = same || t.now;
  return t;
}

std::optional<Adoption::Passed> Adoption::passed() const {
  absl::MutexLock lock(&mu_);
  return passed_;
}

bool Adoption::Done(uint64_t round) {
  absl::MutexLock lock(&mu_);
  const bool done = passed_.has_value() && passed_->round <= round;
  if (done) passed_.reset();
  for (Ballot& b : ballots_) {
    if (b.cast && b.round <= round) b = Ballot{};
  }
  return done;
}

}  // namespace ps::server
