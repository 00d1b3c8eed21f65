// Socket options of the TCP data plane's connections, set on both of its ends.
#pragma once

#include <chrono>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ps::net {

// The least retransmission timeout of the TCP socket `fd` (TCP_RTO_MIN_US, Linux 6.15 and
// later). A lost segment that no duplicate acknowledgement reveals (the last of a message,
// or a retransmission lost again) is sent again after max(this, the smoothed round-trip
// time + 4 x its variation): on a link whose round trip takes microseconds it is this
// alone, and the kernel's 200 ms default is what each such loss costs. 0 leaves the
// kernel's. FAILED_PRECONDITION naming the kernel's release where it has no such option,
// INVALID_ARGUMENT where it refuses the value (below two of its clock ticks, or above 200
// ms).
absl::Status SetTcpRtoMin(int fd, std::chrono::microseconds rto_min);
// The socket's value (the kernel rounds a value set up to its clock ticks).
absl::StatusOr<std::chrono::microseconds> TcpRtoMin(int fd);
// Whether this kernel sets `rto_min` on a TCP socket: SetTcpRtoMin's answer on a fresh
// one, closed again.
absl::Status TryTcpRtoMin(std::chrono::microseconds rto_min);

}  // namespace ps::net
