// SpareDescriptor: one descriptor held back for the moment the process runs out of them
// (EMFILE and its kin), so that a listening socket can still take its pending connection
// and close it at once: the client hears (a reset) and the backlog drains, where an
// accept that keeps failing would leave it queued and the accept loop waking for it
// forever. The gRPC ports' Listener and the TCP data port share it
// (docs/connections.md, "Why the shard owns its listening socket").
//
// Not thread-safe: one owner, the thread that accepts.
#pragma once

#include <cstddef>

namespace ps::server {

class SpareDescriptor {
 public:
  SpareDescriptor();  // takes the spare (/dev/null)
  ~SpareDescriptor();
  SpareDescriptor(const SpareDescriptor&) = delete;
  SpareDescriptor& operator=(const SpareDescriptor&) = delete;

  // Whether an accept's errno means the process or system has no descriptor, buffer or
  // memory for a new connection: the cases DropPending is for.
  static bool OutOfDescriptors(int err);
  // Unproven connections a listener closes at each exhaustion, oldest first, so that the
  // next client finds a descriptor (ConnectionTable::ShedUnproven).
  static constexpr size_t kShedUnproven = 16;
  // Gives the spare up, takes one pending connection of `listen_fd` and resets it, then
  // takes the spare again. Whether a connection was dropped (false: none was pending, or
  // even the spare's descriptor did not let one be taken).
  bool DropPending(int listen_fd);
  // Takes the spare again if a DropPending could not (call once descriptors were freed).
  void Refill();
  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace ps::server
