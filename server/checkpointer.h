// A shard's checkpoints over time (--checkpoint-dir; docs/operations.md, "Backing up and
// restoring"): the restore at start, a writer thread that writes every
// --checkpoint-interval-s and every --checkpoint-every-rounds versions when anything
// changed, writes on demand (ps-admin checkpoint) and the final one at shutdown. The
// files themselves are CheckpointStore's (checkpoint.h). Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/clock.h"
#include "server/checkpoint.h"
#include "server/options.h"
#include "server/shard.h"

namespace ps::server {

class Checkpointer {
 public:
  // Checkpoints of `shard` in options.checkpoint_dir (not empty). `on_written` is called
  // with the wall time (Unix seconds) of every checkpoint written; may be empty. `options`, `shard`
  // and `clock` outlive the Checkpointer.
  Checkpointer(const ServerOptions& options, Shard* shard, core::Clock* clock,
               std::function<void(int64_t unix_s)> on_written);
  ~Checkpointer();  // Stop()
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Restores the newest usable checkpoint into the shard. Returns whether there was one
  // (false: starting fresh); FAILED_PRECONDITION when the shard refuses it. Before
  // Start().
  absl::StatusOr<bool> Restore();

  // Starts the writer thread; Stop() ends it (waits for a write in progress). Once.
  void Start();
  void Stop();

  // Captures and writes a checkpoint now; `why` goes into the log line. Returns the
  // file's path and the highest version in it.
  absl::StatusOr<std::pair<std::string, uint64_t>> Write(std::string_view why);

  struct Info {
    std::string last_path;  // empty before the first write
    int64_t last_unix_s = 0;
    std::string restored_from;  // empty when started fresh
    int64_t restored_unix_s = 0;
  };
  Info info() const;

 private:
  void Loop();

  const ServerOptions& options_;
  Shard& shard_;
  core::Clock* const clock_;
  const std::function<void(int64_t)> on_written_;
  CheckpointStore store_;
  absl::Mutex write_mu_;  // one write at a time
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Info info_ ABSL_GUARDED_BY(mu_);
  uint64_t last_version_ ABSL_GUARDED_BY(mu_) = 0;
  core::SteadyTime last_time_ ABSL_GUARDED_BY(mu_){};
  std::thread thread_;
};

}  // namespace ps::server
