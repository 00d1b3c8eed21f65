#include "net/grpc_status.h"

#include <string>

#include "core/refusal.h"

namespace ps::net {

using core::ParseRefusal;
using core::Refusal;
using core::RefusalCode;
using core::RefusalName;
using core::RefusalOf;
using core::Refused;

namespace {

// The status details hold "ps-refusal:NAME"; anything else there (another service's
// google.rpc.Status) is not ours and is ignored.
constexpr std::string_view kDetailsPrefix = "ps-refusal:";

}  // namespace

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  std::string details;
  if (std::optional<Refusal> r = RefusalOf(status)) {
    details = std::string(kDetailsPrefix) + std::string(RefusalName(*r));
  }
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()),
                      details);
}

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(status.error_code());
  const std::string& details = status.error_details();
  if (details.starts_with(kDetailsPrefix)) {
    const std::optional<Refusal> r =
        ParseRefusal(std::string_view(details).substr(kDetailsPrefix.size()));
    // A refusal whose code does not match its kind is not one of ours.
    if (r.has_value() && RefusalCode(*r) == code) return Refused(*r, status.error_message());
  }
  return absl::Status(code, status.error_message());
}

}  // namespace ps::net
