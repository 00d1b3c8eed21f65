// PullPace: how many slices of a pull a TCP data connection takes at once
// (PullSink::writes_in_flight, docs/data-plane.md, "Pulls"): as many as its writes of
// slices moved in kWindowSeconds lately, from kMinSlices to kMaxSlices. On a fast link
// several slices then leave in one gather write and one wake-up of the worker; on a slow
// one at most kMinSlices are ahead of an urgent slice that becomes ready later (P3), as
// the worker's push window (WorkerOptions::inflight_seconds) does for pushes.
//
// A write's time runs from its start to its completion, so a socket the link keeps full
// shows the link's pace, and one whose buffer takes a write at once shows a fast link.
// The sums decay by 1/8 per write, so the pace follows a link that changes.
//
// Thread safety: none; a connection's thread only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/data_plane.h"

namespace ps::server::transport::tcp {

class PullPace {
 public:
  static constexpr size_t kMinSlices = 2;
  static constexpr size_t kMaxSlices = 8;
  // The worker's default push window in time (WorkerOptions::inflight_seconds).
  static constexpr double kWindowSeconds = core::kDefaultInflightSeconds;

  // A write that carried `slices` slice frames (at least one) took `seconds`.
  void Wrote(size_t slices, double seconds);
  // kMinSlices until a write of slices was measured.
  size_t WritesInFlight() const;

 private:
  double slices_ = 0;
  double seconds_ = 0;
};

}  // namespace ps::server::transport::tcp
