// Protocol attacks (docs/evaluation.md, "Attacks"): pushes no honest worker sends,
// from a hostile client that joins one shard like ps::Worker, with a worker's credentials
// (its token, proven as ps::Worker proves it, and TLS), and then speaks raw ps.v1.
// For reliability tests: each attack gets its own refusal status from the shard while
// the honest workers' rounds complete.
//
//   garbage       random bytes of a wrong length as an fp32 payload   INVALID_ARGUMENT
//   oversize      a payload above the message limit       RESOURCE_EXHAUSTED
//   duplicate     the last valid push again, same round    ALREADY_EXISTS
//   replay        the last valid push again, after its round closed   OUT_OF_RANGE (late)
//   impersonate   the last valid push under a forged session (another worker's
//                 identity: ids come only from the session bound at join)   UNAUTHENTICATED
//   old_round     a valid payload for round - 1             OUT_OF_RANGE (late) once closed
//   future_round  a valid payload for round + 5             FAILED_PRECONDITION
//
// The shard's layout must be registered (honest workers do that when they start).
// Thread safety: one thread uses an attacker. No gRPC type appears here.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/credentials.h"
#include "core/layout.h"

namespace ps::harness {

enum class ProtocolAttack { kGarbage, kOversize, kDuplicate, kReplay, kImpersonate, kOldRound, kFutureRound };

// "garbage", "oversize", "duplicate", "replay", "impersonate", "old_round", "future_round".
absl::StatusOr<ProtocolAttack> ParseProtocolAttack(std::string_view name);
std::vector<std::string> ProtocolAttackNames();

class ProtocolAttacker {
 public:
  // Joins the shard at `address` as `worker_id` for `layout`, with `credentials` (a
  // worker's token and TLS files, as WorkerOptions::credentials; none for an --insecure
  // shard). Errors: the credentials' files, the challenge's and the Join's.
  static absl::StatusOr<std::unique_ptr<ProtocolAttacker>> Join(
      const std::string& address, uint32_t worker_id, const core::ModelLayout& layout,
      std::chrono::milliseconds timeout, const core::ClientCredentials& credentials = {});
  ~ProtocolAttacker();
  ProtocolAttacker(const ProtocolAttacker&) = delete;
  ProtocolAttacker& operator=(const ProtocolAttacker&) = delete;

  // An honest-looking fp32 push of `values` (the slice's size) for (round, slice); it is
  // remembered for duplicate, replay and impersonate. Returns the shard's answer.
  absl::Status PushValid(uint64_t round, uint32_t slice_id, std::span<const float> values);

  // Sends `attack` for (round, slice) and returns the shard's answer (OK if accepted).
  // duplicate, replay and impersonate need an earlier PushValid.
  absl::Status Send(ProtocolAttack attack, uint64_t round, uint32_t slice_id);

 private:
  struct Impl;
  explicit ProtocolAttacker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ps::harness
