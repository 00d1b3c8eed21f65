#include "bench/honest_training.h"

#include <algorithm>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ps::bench {

using std::chrono::milliseconds;

absl::StatusOr<std::unique_ptr<Training>> Training::Start(const std::string& address,
                                                          const std::vector<std::string>& tokens,
                                                          const core::ModelLayout& layout,
                                                          uint32_t honest) {
  std::unique_ptr<Training> t(new Training(layout));
  std::vector<std::vector<float>> init;
  for (const core::TensorSpec& s : layout.tensors()) init.emplace_back(s.numel, 0.01f);
  const std::vector<std::span<const float>> init_spans(init.begin(), init.end());
  for (uint32_t w = 0; w < honest; ++w) {
    WorkerOptions wo;
    wo.shard_addresses = {address};
    wo.worker_id = w;
    wo.credentials.token = tokens[w];
    wo.rpc_timeout = milliseconds(3000);
    wo.connect_timeout = milliseconds(15000);
    wo.max_attempts = 3;
    absl::StatusOr<std::unique_ptr<Worker>> worker = Worker::Start(wo, layout, init_spans);
    if (!worker.ok()) {
      return absl::Status(
          worker.status().code(),
          absl::StrCat("honest worker ", w, " could not start: ", worker.status().message()));
    }
    t->workers_.push_back(*std::move(worker));
  }
  for (size_t w = 0; w < honest; ++w) t->threads_.emplace_back([p = t.get(), w] { p->Loop(w); });
  return t;
}

void Training::Stop() {
  stop_.store(true);
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  open_cv_.notify_all();
}

std::string Training::last_error() const {
  absl::MutexLock lock(&error_mu_);
  return last_error_;
}

uint64_t Training::open_version() const {
  std::lock_guard lock(open_mu_);
  return open_;
}

bool Training::WaitOpen(uint64_t version, milliseconds timeout) const {
  std::unique_lock lock(open_mu_);
  return open_cv_.wait_for(lock, timeout, [&] { return open_ >= version || stop_.load(); }) &&
         open_ >= version;
}

void Training::Fail(const absl::Status& st) {
  errors_.fetch_add(1);
  absl::MutexLock lock(&error_mu_);
  last_error_ = std::string(st.message());
}

void Training::Loop(size_t w) {
  Worker& worker = *workers_[w];
  std::vector<std::vector<float>> params, grads;
  for (const core::TensorSpec& s : layout_.tensors()) {
    params.emplace_back(s.numel);
    grads.emplace_back(s.numel, 1e-4f * float(w + 1));
  }
  const std::vector<std::span<float>> outs(params.begin(), params.end());
  uint64_t t = worker.start_version();
  while (!stop_.load()) {
    absl::StatusOr<uint64_t> v = worker.PullAll(t, outs, milliseconds(1000));
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
    ++t;
  }
}

}  // namespace ps::bench
