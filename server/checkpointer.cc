#include "server/checkpointer.h"

#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "spdlog/spdlog.h"

namespace ps::server {

Checkpointer::Checkpointer(const ServerOptions& options, Shard* shard, core::Clock* clock,
                           std::function<void(int64_t unix_s)> on_written)
    : options_(options),
      shard_(*shard),
      clock_(clock),
      on_written_(std::move(on_written)),
      store_(options.checkpoint_dir, static_cast<uint32_t>(options.shard_id),
             options.checkpoint_keep) {}

Checkpointer::~Checkpointer() { Stop(); }

absl::StatusOr<bool> Checkpointer::Restore() {
  PS_ASSIGN_OR_RETURN(std::optional<CheckpointStore::Loaded> loaded, store_.LoadLatest());
  if (!loaded.has_value()) {
    spdlog::info("shard {}: no checkpoint in {}; starting fresh", options_.shard_id,
                 store_.directory());
    return false;
  }
  if (absl::Status st = shard_.Restore(loaded->checkpoint); !st.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", loaded->path, ": ", st.message()));
  }
  if (loaded->checkpoint.config_summary != options_.ConsistencySummary()) {
    spdlog::warn(
        "shard {}: checkpoint {} was written with another configuration [{}]; "
        "continuing with [{}]",
        options_.shard_id, loaded->path, loaded->checkpoint.config_summary,
        options_.ConsistencySummary());
  }
  {
    absl::MutexLock lock(&mu_);
    info_.restored_from = loaded->path;
    info_.restored_unix_s = loaded->checkpoint.written_unix_s;
    last_version_ = loaded->checkpoint.MaxVersion();
  }
  return true;
}

void Checkpointer::Start() {
  {
    absl::MutexLock lock(&mu_);
    last_time_ = clock_->Now();
  }
  thread_ = std::thread([this] { Loop(); });
}

void Checkpointer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<std::pair<std::string, uint64_t>> Checkpointer::Write(std::string_view why) {
  absl::MutexLock write_lock(&write_mu_);
  PS_ASSIGN_OR_RETURN(ShardCheckpoint c, shard_.Capture());
  const auto start = std::chrono::steady_clock::now();
  PS_ASSIGN_OR_RETURN(std::string path, store_.Write(c));
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  spdlog::info("shard {}: checkpoint ({}) of version {} written to {} in {:.1f} ms",
               options_.shard_id, why, c.MaxVersion(), path, ms);
  if (on_written_) on_written_(c.written_unix_s);
  absl::MutexLock lock(&mu_);
  info_.last_path = path;
  info_.last_unix_s = c.written_unix_s;
  last_version_ = c.MaxVersion();
  last_time_ = clock_->Now();
  return std::make_pair(path, c.MaxVersion());
}

Checkpointer::Info Checkpointer::info() const {
  absl::MutexLock lock(&mu_);
  return info_;
}

void Checkpointer::Loop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      // Every N rounds: look often (checkpoints trail the rounds by up to this much).
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.checkpoint_every_rounds > 0
                                                            ? absl::Milliseconds(10)
                                                            : absl::Milliseconds(100));
      if (stopping_) return;
    }
    if (!shard_.ready()) continue;
    const uint64_t version = shard_.MaxVersion();
    bool due = false;
    {
      absl::MutexLock lock(&mu_);
      const bool changed = version != last_version_ || info_.last_path.empty();
      if (changed && options_.checkpoint_interval.count() > 0 &&
          clock_->Now() - last_time_ >= options_.checkpoint_interval) {
        due = true;
      }
      if (options_.checkpoint_every_rounds > 0 &&
          version >= last_version_ + options_.checkpoint_every_rounds) {
        due = true;
      }
    }
    if (!due) continue;
    absl::StatusOr<std::pair<std::string, uint64_t>> written = Write("periodic");
    if (!written.ok()) {
      spdlog::error("shard {}: checkpoint failed: {}", options_.shard_id,
                    std::string(written.status().message()));
      absl::MutexLock lock(&mu_);
      last_time_ = clock_->Now();  // retry at the next interval, not at once
    }
  }
}

}  // namespace ps::server
