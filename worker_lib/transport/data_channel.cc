#include "worker_lib/transport/data_channel.h"

#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"

#include "core/status.h"

namespace ps::internal {

std::string OutgoingPush::Bytes() const {
  std::string out;
  out.reserve(payload_size());
  if (payload != nullptr) out += *payload;
  out.append(borrowed.data(), borrowed.size());
  return out;
}

absl::Status DeliverPullFrame(const net::PullFrame& frame, PullSink& sink) {
  std::string codec_scratch;
  const net::PullHeader h{frame, frame.codec.Contiguous(&codec_scratch)};
  PS_ASSIGN_OR_RETURN(const std::span<char> place, sink.Place(h, frame.values.size()));
  if (place.empty()) return sink.Arrived(h, frame.values.parts());
  if (place.size() != frame.values.size()) {
    return absl::InternalError("the pull's sink placed a slice's values in a span of another size");
  }
  frame.values.CopyTo(place.data());
  const std::string_view placed(place.data(), place.size());
  return sink.Arrived(h, net::Pieces(&placed, 1));
}

namespace {
constexpr absl::string_view kUnreachablePayload = "type.ps-server/data-endpoint-unreachable";
}  // namespace

absl::Status DataEndpointUnreachable(std::string message) {
  absl::Status s = absl::UnavailableError(std::move(message));
  s.SetPayload(kUnreachablePayload, absl::Cord("1"));
  return s;
}

bool CallsForRejoin(const absl::Status& s) {
  return absl::IsUnauthenticated(s) ||
         (absl::IsUnavailable(s) && s.GetPayload(kUnreachablePayload).has_value());
}

}  // namespace ps::internal
