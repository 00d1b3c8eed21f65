// ServingState: what a shard's health says (docs/operations.md, "Health"), from the facts
// its parts report: whether it is stopping, whether its peers agree on the configuration,
// whether it admits workers (false while a restored shard catches up with its peers), and
// whether the model is ready. Three services follow from them:
//   ""                     alive: started and not stopping;
//   ps.v1.WorkerService    serving: alive, peers agree and workers are admitted;
//   ps.v1.Model            alive and the model registered and initialized.
// Every change is published at once to each port's health statuses.
//
// Thread safety: every method from any thread; publishing happens under the state's lock,
// so the statuses follow the facts in the order they changed.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace ps::server {

struct HealthView {
  bool alive = false;
  bool serving = false;  // WorkerService
  bool model = false;

  bool operator==(const HealthView&) const = default;
};

class ServingState {
 public:
  // Sets (service, serving) on a port's health statuses.
  using Publish = std::function<void(const std::string& service, bool serving)>;

  // `model_ready` is asked at each publication (the shard's registration is its own).
  // Nothing is published before the first change: a port starts NOT_SERVING, so call
  // SetPeersAgree(true) once the ports are up.
  ServingState(std::vector<Publish> ports, std::function<bool()> model_ready);

  void SetPeersAgree(bool agree);
  void SetAdmitting(bool admitting);
  // The model's readiness may have changed: publish again.
  void Refresh();
  // Stopping: NOT_SERVING everywhere from now on. Idempotent.
  void Stop();

  // What the pure rule gives for these facts.
  static HealthView ViewOf(bool stopping, bool peers_agree, bool admitting, bool model_ready);

  HealthView view() const;
  bool serving() const { return view().serving; }
  // Read by the services on every call (CallGate): a plain flag, no lock.
  const std::atomic<bool>* admitting() const { return &admitting_; }

 private:
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::vector<Publish> ports_;
  const std::function<bool()> model_ready_;
  std::atomic<bool> admitting_{true};
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool peers_agree_ ABSL_GUARDED_BY(mu_) = true;
  HealthView view_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::server
