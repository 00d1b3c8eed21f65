// Checkpoints of one shard (docs/operations.md, "Backing up and restoring").
//
// A checkpoint holds the layout and, per owned slice, the published version and
// parameters, the SGD velocity and the rule's state (and, with a pull codec, the
// parameters apart from the published values they are sent as). Its file is written to a
// temporary name, fsynced, renamed into place and the directory fsynced, so a crash
// leaves either the old set of files or the new one; it ends with a SHA-256 of
// everything before it, so a torn or bit-flipped file is detected on load and the
// previous checkpoint is used instead. The newest `keep` files are kept.
//
// File names: <dir>/shard-<id>/checkpoint-<version, 20 digits>.pscp, where version is
// the highest published version in it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/layout.h"
#include "server/membership.h"
#include "server/suspicion.h"

namespace ps::server {

struct SliceCheckpoint {
  uint32_t slice_id = 0;
  uint64_t version = 0;
  std::string values;  // little-endian fp32, numel values
  std::vector<float> velocity;    // numel values; empty with --aggregate-only or no momentum
  // Adam's exp_avg_sq (numel values; empty for SGD) and the optimizer steps taken.
  std::vector<float> second_moment;
  uint64_t optimizer_steps = 0;
  std::vector<float> rule_state;  // a multiple of numel values
  // With --pull-codec, the parameters x (numel values), of which `values` are what the
  // workers hold (x̂): the residual x - x̂ survives a restart. Empty otherwise.
  std::vector<float> params;
};

// A worker that joined: its membership (present, left or expired) and suspicion.
struct WorkerCheckpoint {
  uint32_t worker = 0;
  Membership::State state = Membership::State::kPresent;
  WorkerSuspicion suspicion;
};

struct ShardCheckpoint {
  uint32_t shard_id = 0;
  uint32_t num_shards = 1;
  std::optional<core::ModelLayout> layout;
  std::string config_summary;
  std::string run_id;  // the writing shard's --run-id
  int64_t written_unix_s = 0;
  std::vector<SliceCheckpoint> slices;
  // Ids in increasing order, below kMaxWorkerIds; at most Suspicion::kHistoryWindows
  // windows of at most kMaxWorkerIds workers each.
  std::vector<WorkerCheckpoint> workers;
  std::vector<Suspicion::Window> suspicion_history;

  uint64_t MaxVersion() const;
};

// The file's bytes.
std::string EncodeCheckpoint(const ShardCheckpoint& checkpoint);
// The file around a serialized ps.v1.ShardCheckpoint `body`: magic, length, body,
// SHA-256 (EncodeCheckpoint uses it; the fuzz target frames arbitrary bodies with it).
std::string FrameCheckpoint(std::string_view body);
// Parses and checks a file: magic, length, checksum (DATA_LOSS on any mismatch), then
// the contents (INVALID_ARGUMENT): a valid layout whose hash matches, shard id in
// range, every slice owned by that shard once, sizes matching the layout, finite
// values. Safe on arbitrary bytes.
absl::StatusOr<ShardCheckpoint> DecodeCheckpoint(std::string_view file);

class CheckpointStore {
 public:
  // Checkpoints of shard `shard_id` under `dir`; `keep` >= 1.
  CheckpointStore(std::string dir, uint32_t shard_id, uint32_t keep);

  const std::string& directory() const { return shard_dir_; }
  // Writes `checkpoint` atomically (see above) and deletes all but the newest `keep`.
  // Returns the path written.
  absl::StatusOr<std::string> Write(const ShardCheckpoint& checkpoint);

  struct Loaded {
    ShardCheckpoint checkpoint;
    std::string path;
    // Newer files that failed to load, with the reason (already logged).
    std::vector<std::string> skipped;
  };
  // The newest checkpoint that loads, or nullopt when there is none (or only broken
  // ones, which are listed in the log). Errors only when the directory cannot be read.
  absl::StatusOr<std::optional<Loaded>> LoadLatest() const;
  // Checkpoint files, oldest first.
  absl::StatusOr<std::vector<std::string>> List() const;

 private:
  const std::string shard_dir_;
  const uint32_t keep_;
};

}  // namespace ps::server
