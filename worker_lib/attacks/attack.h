// Byzantine gradient attacks (docs/evaluation.md, "Attacks"): what a lying worker
// pushes instead of its honest gradient, for experiments and robustness tests. An
// attack is made from a spec string in the grammar of core/spec.h, one stage with
// optional arguments: "signflip", "ipm(eps=0.5)", "alie", "alie_opt", "gaussian(sigma=200)".
//
// Omniscient attacks (ipm, alie, their optimized variants, mimic) are computed from the
// honest gradients of the round, which the caller supplies in AttackContext::honest: an
// in-process cluster sees them directly; separate processes share them through the
// side channel of docs/evaluation.md. Without them an attack falls back to the
// attacker's own gradient as its only sample (documented per attack).
//
// The optimized variants search the scale of their base attack against the aggregation
// rule actually configured (AttackContext::rule): the scale that moves the rule's output
// farthest from the honest mean, ByzFL's objective. Colluding attackers in one process
// (AttackContext::shared_search) search once per round and all push the result.
//
// Thread safety: Apply() is const and may run concurrently on one instance; the rule
// passed in the context must allow that too (every Aggregator does).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace ps::aggregators {
class Aggregator;
}  // namespace ps::aggregators
namespace ps::core {
class ThreadPool;
}  // namespace ps::core

namespace ps::attacks {

// The optimized attacks' searches, shared by the attackers of one process: every
// attacker of a round sees the same honest gradients and the same rule, so the first to
// ask for a key searches and the others wait for its answer (an error too). Keeps the
// newest `capacity` keys. Thread-safe.
class SharedSearch {
 public:
  explicit SharedSearch(size_t capacity = 16) : capacity_(capacity == 0 ? 1 : capacity) {}
  SharedSearch(const SharedSearch&) = delete;
  SharedSearch& operator=(const SharedSearch&) = delete;

  // The value for `key`: `search()` in the first caller, the same value for the others.
  absl::StatusOr<double> Get(const std::string& key,
                             const std::function<absl::StatusOr<double>()>& search);
  // How many Get calls searched, and how many took another's answer.
  uint64_t searches() const;
  uint64_t reused() const;

 private:
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_future<absl::StatusOr<double>>> entries_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> order_ ABSL_GUARDED_BY(mu_);  // keys, oldest first
  uint64_t searches_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reused_ ABSL_GUARDED_BY(mu_) = 0;
};

// What an attack sees in one round. Borrowed for the call.
struct AttackContext {
  // The attacker's own honest gradient (from its own data; with labelflip, from
  // flipped labels). Its size is the gradient's size.
  std::span<const float> own;
  // The honest workers' gradients of this round, each of own.size() floats; empty when
  // the attacker cannot see them.
  std::span<const std::span<const float>> honest;
  // n workers in all, f of them Byzantine (every Byzantine worker pushes the same
  // vector, so an optimized attack places f copies of it among the inputs).
  int num_workers = 1;
  int num_byzantine = 0;
  // The configured rule, for the optimized variants; nullptr otherwise.
  const aggregators::Aggregator* rule = nullptr;
  // Where the attackers of this process share their searches (optimized variants);
  // nullptr: each searches alone. Equal inputs give equal results either way.
  SharedSearch* shared_search = nullptr;
  // Threads for the optimized variants' runs of the rule; nullptr: the calling thread.
  // The result does not depend on it.
  core::ThreadPool* pool = nullptr;
  // Randomness (gaussian): the vector is a function of (seed, worker, round).
  uint64_t seed = 0;
  uint32_t worker_id = 0;
  uint64_t round = 0;
};

class Attack {
 public:
  virtual ~Attack() = default;
  Attack(const Attack&) = delete;
  Attack& operator=(const Attack&) = delete;

  // The canonical spec with every argument written out: "ipm(eps=0.1)".
  virtual std::string_view spec() const = 0;
  // Whether the attack is computed from the honest gradients (ctx.honest); it still
  // runs without them, on ctx.own alone.
  virtual bool omniscient() const { return false; }
  // Whether the attacker trains on flipped labels (label -> classes - 1 - label); its
  // push is then its own gradient of the flipped data.
  virtual bool flips_labels() const { return false; }
  // Whether Apply() needs ctx.rule (the optimized variants).
  virtual bool needs_rule() const { return false; }

  // Writes the Byzantine vector into out (out.size() == ctx.own.size()). Refuses honest
  // vectors of another size, a missing rule for an optimized variant, and f outside
  // [1, n) where the attack needs it.
  virtual absl::Status Apply(const AttackContext& ctx, std::span<float> out) const = 0;

 protected:
  Attack() = default;
};

// Makes the attack named by `spec`; refuses unknown names (listing the known ones) and
// bad arguments with a message naming them.
absl::StatusOr<std::unique_ptr<Attack>> MakeAttack(std::string_view spec);

// The attack names MakeAttack accepts, in a stable order.
std::vector<std::string> AttackNames();

// z of "a little is enough" (Baruch et al., NeurIPS 2019) for n workers of which f are
// Byzantine: s = floor(n / 2 + 1) - f supporters are needed, z = Phi^-1((n - s) / n).
// Refuses f outside [1, n).
absl::StatusOr<double> AlieZ(int num_workers, int num_byzantine);

}  // namespace ps::attacks
