#include "core/refusal.h"

#include <string>

#include "absl/strings/cord.h"

namespace ps::core {

std::string_view RefusalName(Refusal r) {
  switch (r) {
    case Refusal::kUnknownSession:
      return "unknown_session";
    case Refusal::kBadWorkerId:
      return "bad_worker_id";
    case Refusal::kNoLayout:
      return "no_layout";
    case Refusal::kLayoutMismatch:
      return "layout_mismatch";
    case Refusal::kBadLayout:
      return "bad_layout";
    case Refusal::kNotReady:
      return "not_ready";
    case Refusal::kUnknownSlice:
      return "unknown_slice";
    case Refusal::kWrongShard:
      return "wrong_shard";
    case Refusal::kUnknownCodec:
      return "unknown_codec";
    case Refusal::kMalformed:
      return "malformed";
    case Refusal::kDuplicate:
      return "duplicate";
    case Refusal::kLate:
      return "late";
    case Refusal::kFutureRound:
      return "future_round";
    case Refusal::kShuttingDown:
      return "shutting_down";
    case Refusal::kUnauthenticated:
      return "unauthenticated";
    case Refusal::kPermissionDenied:
      return "permission_denied";
    case Refusal::kRateLimited:
      return "rate_limited";
    case Refusal::kOverLimit:
      return "over_limit";
    case Refusal::kQuarantined:
      return "quarantined";
    case Refusal::kCodecNotAllowed:
      return "codec_not_allowed";
    case Refusal::kDecodeBudget:
      return "decode_budget";
    case Refusal::kStalled:
      return "stalled";
    case Refusal::kCatchingUp:
      return "catching_up";
    case Refusal::kDataPlane:
      return "data_plane";
    case Refusal::kWrongRun:
      return "wrong_run";
    case Refusal::kCount:
      break;
  }
  return "unknown";
}

std::optional<Refusal> ParseRefusal(std::string_view name) {
  for (int i = 0; i < static_cast<int>(Refusal::kCount); ++i) {
    if (RefusalName(static_cast<Refusal>(i)) == name) return static_cast<Refusal>(i);
  }
  return std::nullopt;
}

absl::StatusCode RefusalCode(Refusal r) {
  switch (r) {
    case Refusal::kUnknownSession:
    case Refusal::kUnauthenticated:
      return absl::StatusCode::kUnauthenticated;
    case Refusal::kBadWorkerId:
    case Refusal::kBadLayout:
    case Refusal::kUnknownSlice:
    case Refusal::kWrongShard:
    case Refusal::kUnknownCodec:
    case Refusal::kMalformed:
    case Refusal::kCodecNotAllowed:
      return absl::StatusCode::kInvalidArgument;
    case Refusal::kNoLayout:
    case Refusal::kLayoutMismatch:
    case Refusal::kNotReady:
    case Refusal::kFutureRound:
    case Refusal::kQuarantined:
    case Refusal::kDataPlane:
    case Refusal::kWrongRun:
      return absl::StatusCode::kFailedPrecondition;
    case Refusal::kDuplicate:
      return absl::StatusCode::kAlreadyExists;
    case Refusal::kLate:
      return absl::StatusCode::kOutOfRange;
    case Refusal::kShuttingDown:
    case Refusal::kCatchingUp:
      return absl::StatusCode::kUnavailable;
    case Refusal::kPermissionDenied:
      return absl::StatusCode::kPermissionDenied;
    case Refusal::kRateLimited:
    case Refusal::kOverLimit:
    case Refusal::kDecodeBudget:
      return absl::StatusCode::kResourceExhausted;
    case Refusal::kStalled:
      return absl::StatusCode::kDeadlineExceeded;
    case Refusal::kCount:
      break;
  }
  return absl::StatusCode::kUnknown;
}

absl::Status Refused(Refusal r, absl::string_view message) {
  absl::Status s(RefusalCode(r), message);
  const std::string_view name = RefusalName(r);
  s.SetPayload(absl::string_view(kRefusalPayload.data(), kRefusalPayload.size()),
               absl::Cord(absl::string_view(name.data(), name.size())));
  return s;
}

std::optional<Refusal> RefusalOf(const absl::Status& status) {
  if (status.ok()) return std::nullopt;
  const auto payload =
      status.GetPayload(absl::string_view(kRefusalPayload.data(), kRefusalPayload.size()));
  if (!payload.has_value()) return std::nullopt;
  return ParseRefusal(std::string(*payload));
}

}  // namespace ps::core
