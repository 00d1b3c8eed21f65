// Refusal: why a shard refused a request, carried inside the absl::Status that refuses
// it (docs/protocol.md, "Status codes"). Every refusal has a fixed status code and a stable
// name (the `reason` label of ps_refusals_total); callers branch on RefusalOf(status),
// never on the message text. The kind crosses gRPC in the status details
// (net/grpc_status.h), so a client or a peer shard sees the same kind.
#pragma once

#include <optional>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ps::core {

enum class Refusal : int {
  kUnknownSession = 0,  // UNAUTHENTICATED
  kBadWorkerId,         // INVALID_ARGUMENT
  kNoLayout,            // FAILED_PRECONDITION
  kLayoutMismatch,      // FAILED_PRECONDITION
  kBadLayout,           // INVALID_ARGUMENT
  kNotReady,            // FAILED_PRECONDITION
  kUnknownSlice,        // INVALID_ARGUMENT
  kWrongShard,          // INVALID_ARGUMENT
  kUnknownCodec,        // INVALID_ARGUMENT
  kMalformed,           // INVALID_ARGUMENT (decode error, wrong size, NaN/Inf)
  kDuplicate,           // ALREADY_EXISTS
  kLate,                // OUT_OF_RANGE
  kFutureRound,         // FAILED_PRECONDITION
  kShuttingDown,        // UNAVAILABLE
  kUnauthenticated,     // UNAUTHENTICATED (no, unknown or contradictory credentials)
  kPermissionDenied,    // PERMISSION_DENIED (an identity calling beyond its rights)
  kRateLimited,         // RESOURCE_EXHAUSTED
  kOverLimit,           // RESOURCE_EXHAUSTED (a resource bound: pull streams, model size)
  kQuarantined,         // FAILED_PRECONDITION (the worker sent a malformed push lately)
  kCodecNotAllowed,     // INVALID_ARGUMENT (a codec stage outside --allowed-codecs)
  kDecodeBudget,        // RESOURCE_EXHAUSTED (a worker's pushes of a round over --max-decode-ms)
  kStalled,             // DEADLINE_EXCEEDED (a request body not received in time; call cancelled)
  kCatchingUp,          // UNAVAILABLE (a Join while a restored shard catches up with its peers)
  kDataPlane,           // FAILED_PRECONDITION (worker and shard on different data planes)
  kWrongRun,            // FAILED_PRECONDITION (a worker of another run: --run-id)
  kCount,
};

// "unknown_session", "bad_worker_id", ...; "unknown" for kCount.
std::string_view RefusalName(Refusal r);
// The refusal named `name`, if any.
std::optional<Refusal> ParseRefusal(std::string_view name);
// The status code every refusal of kind `r` carries.
absl::StatusCode RefusalCode(Refusal r);

// The payload type URL under which a status carries its refusal's name.
inline constexpr std::string_view kRefusalPayload = "type.ps-server/refusal";

// A status refusing a request: r's code, `message`, and r as its payload.
absl::Status Refused(Refusal r, absl::string_view message);
// The refusal a status carries, if any (none for OK or a status made otherwise).
std::optional<Refusal> RefusalOf(const absl::Status& status);

}  // namespace ps::core
