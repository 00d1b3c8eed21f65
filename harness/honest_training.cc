#include "harness/honest_training.h"

#include <algorithm>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ps::harness {

using std::chrono::milliseconds;

absl::StatusOr<std::unique_ptr<HonestTraining>> HonestTraining::Start(const core::ModelLayout& layout,
                                                                     HonestTrainingOptions options) {
  if (options.tokens.size() < options.workers) {
    return absl::InvalidArgumentError(absl::StrCat(options.workers, " honest workers need as many tokens, not ",
                                                   options.tokens.size()));
  }
  std::unique_ptr<HonestTraining> t(new HonestTraining(layout, std::move(options)));
  const HonestTrainingOptions& o = t->options_;
  std::vector<std::vector<float>> init;
  for (const core::TensorSpec& s : layout.tensors()) init.emplace_back(s.numel, o.init);
  const std::vector<std::span<const float>> init_spans(init.begin(), init.end());
  for (uint32_t w = 0; w < o.workers; ++w) {
    WorkerOptions wo;
    wo.shard_addresses = {o.address};
    wo.worker_id = w;
    wo.credentials.token = o.tokens[w];
    wo.rpc_timeout = o.rpc_timeout;
    wo.connect_timeout = o.connect_timeout;
    wo.max_attempts = o.max_attempts;
    absl::StatusOr<std::unique_ptr<Worker>> worker = Worker::Start(wo, layout, init_spans);
    if (!worker.ok()) {
      return absl::Status(
          worker.status().code(),
          absl::StrCat("honest worker ", w, " could not start: ", worker.status().message()));
    }
    t->workers_.push_back(*std::move(worker));
  }
  for (size_t w = 0; w < o.workers; ++w) t->threads_.emplace_back([p = t.get(), w] { p->Loop(w); });
  return t;
}

void HonestTraining::Stop() {
  stop_.store(true);
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  open_cv_.notify_all();
}

bool HonestTraining::AdvancesBy(uint64_t more, milliseconds within) const {
  const uint64_t goal = lead_rounds() + more;
  const auto until = std::chrono::steady_clock::now() + within;
  while (lead_rounds() < goal && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  return lead_rounds() >= goal;
}

double HonestTraining::RateOver(milliseconds period) const {
  const uint64_t before = lead_rounds();
  const auto start = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(period);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(lead_rounds() - before) / seconds;
}

std::string HonestTraining::last_error() const {
  absl::MutexLock lock(&error_mu_);
  return last_error_;
}

uint64_t HonestTraining::open_version() const {
  std::lock_guard lock(open_mu_);
  return open_;
}

bool HonestTraining::WaitOpen(uint64_t version, milliseconds timeout) const {
  std::unique_lock lock(open_mu_);
  return open_cv_.wait_for(lock, timeout, [&] { return open_ >= version || stop_.load(); }) &&
         open_ >= version;
}

void HonestTraining::Fail(const absl::Status& st) {
  errors_.fetch_add(1);
  absl::MutexLock lock(&error_mu_);
  last_error_ = std::string(st.message());
}

void HonestTraining::Loop(size_t w) {
  Worker& worker = *workers_[w];
  std::vector<std::vector<float>> params, grads;
  const float g = options_.gradient(static_cast<uint32_t>(w));
  for (const core::TensorSpec& s : layout_.tensors()) {
    params.emplace_back(s.numel);
    grads.emplace_back(s.numel, g);
  }
  const std::vector<std::span<float>> outs(params.begin(), params.end());
  uint64_t t = worker.start_version();
  while (!stop_.load()) {
    absl::StatusOr<uint64_t> v = worker.PullAll(t, outs, options_.pull_timeout);
    if (!v.ok()) {
      if (!stop_.load()) Fail(v.status());
      continue;
    }
    t = std::max(t, *v);
    {
      std::lock_guard lock(open_mu_);
      open_ = std::max(open_, t);
    }
    open_cv_.notify_all();
    bool ok = true;
    for (size_t i = 0; i < grads.size() && ok; ++i) {
      if (absl::Status st = worker.Push(i, t, grads[i]); !st.ok()) {
        Fail(st);
        ok = false;
      }
    }
    if (absl::Status st = worker.WaitPushes(); !st.ok()) {
      Fail(st);
      ok = false;
    }
    if (ok) rounds_.fetch_add(1);
    if (w == 0) lead_rounds_.fetch_add(1);
    ++t;
  }
}

}  // namespace ps::harness
