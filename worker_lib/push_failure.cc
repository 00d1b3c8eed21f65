// PushFailure (worker.h): which push a WaitPushes() status is about, carried inside the
// status as a payload next to the refusal's kind, so callers (and the Python binding)
// read it without parsing the message.
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/refusal.h"
#include "worker_lib/push_pipeline_internal.h"
#include "worker_lib/worker.h"

namespace ps {
namespace {

// "<slice> <round> <shard> <tensor name>": the name last, as it may hold spaces.
constexpr std::string_view kPushFailurePayload = "type.ps-server/push-failure";

}  // namespace

namespace internal {

void MarkPushFailure(absl::Status* status, const PushFailure& failure) {
  if (status->ok()) return;
  status->SetPayload(absl::string_view(kPushFailurePayload.data(), kPushFailurePayload.size()),
                     absl::Cord(absl::StrCat(failure.slice, " ", failure.round, " ", failure.shard,
                                             " ", failure.tensor)));
}

}  // namespace internal

std::optional<PushFailure> PushFailureOf(const absl::Status& status) {
  const auto payload =
      status.GetPayload(absl::string_view(kPushFailurePayload.data(), kPushFailurePayload.size()));
  if (!payload.has_value()) return std::nullopt;
  const std::string text(*payload);
  const std::vector<absl::string_view> parts = absl::StrSplit(text, absl::MaxSplits(' ', 3));
  PushFailure f;
  if (parts.size() != 4 || !absl::SimpleAtoi(parts[0], &f.slice) ||
      !absl::SimpleAtoi(parts[1], &f.round) || !absl::SimpleAtoi(parts[2], &f.shard)) {
    return std::nullopt;
  }
  f.tensor = std::string(parts[3]);
  if (const std::optional<core::Refusal> r = core::RefusalOf(status)) {
    f.reason = std::string(core::RefusalName(*r));
  }
  return f;
}

}  // namespace ps
