#include "server/serving_state.h"

#include <utility>

namespace ps::server {
namespace {
constexpr char kWorkerService[] = "ps.v1.WorkerService";
constexpr char kModel[] = "ps.v1.Model";
}  // namespace

ServingState::ServingState(std::vector<Publish> ports, std::function<bool()> model_ready)
    : ports_(std::move(ports)), model_ready_(std::move(model_ready)) {}

HealthView ServingState::ViewOf(bool stopping, bool peers_agree, bool admitting,
                                bool model_ready) {
  HealthView v;
  v.alive = !stopping;
  v.serving = v.alive && peers_agree && admitting;
  v.model = v.alive && model_ready;
  return v;
}

void ServingState::PublishLocked() {
  view_ = ViewOf(stopping_, peers_agree_, admitting_.load(), model_ready_());
  for (const Publish& port : ports_) {
    port("", view_.alive);
    port(kWorkerService, view_.serving);
    port(kModel, view_.model);
  }
}

void ServingState::SetPeersAgree(bool agree) {
  absl::MutexLock lock(&mu_);
  peers_agree_ = agree;
  PublishLocked();
}

void ServingState::SetAdmitting(bool admitting) {
  absl::MutexLock lock(&mu_);
  admitting_.store(admitting);
  PublishLocked();
}

void ServingState::Refresh() {
  absl::MutexLock lock(&mu_);
  PublishLocked();
}

void ServingState::Stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  PublishLocked();
}

HealthView ServingState::view() const {
  absl::MutexLock lock(&mu_);
  return view_;
}

}  // namespace ps::server
