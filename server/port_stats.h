// ListenerStats and FrontStats: what a gRPC port's Listener (server/listener.h) and
// GrpcFront (server/grpc_front.h) count, in a header without gRPC's so that the metrics
// (server/metrics.h) and their tests read them without it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "server/call_budget.h"
#include "server/connection_table.h"

namespace ps::server {

struct ListenerStats {
  // Connections admitted and handed to gRPC (refused ones are counted in `closed`).
  uint64_t accepted = 0;
  // Connections closed or refused by the listener, by CloseReason.
  std::array<uint64_t, static_cast<size_t>(CloseReason::kCount)> closed{};
  ConnectionTable::Stats table;
};

struct FrontStats {
  CallBudget::Stats budget;
  uint64_t refused_calls = 0;  // over max_calls_per_client
  uint64_t stalled = 0;        // bodies that did not arrive within read_timeout
  // Connections whose early cancels crossed the rapid-reset bound (the listener counts
  // those it closed: ListenerStats::closed[kResets]).
  uint64_t reset_connections = 0;
};

}  // namespace ps::server
