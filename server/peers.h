// Peers: a shard's side of the other shards of its run (--num-shards > 1): the channels to
// them (each peer proves it is shard-i before this shard proves its token), the
// ShareSender that hands them this shard's share of each model-scope round, and the
// PeerMonitor that greets them over PeerService, turning disagreement into "not serving"
// and catching a restored shard up before it admits workers.
//
// Thread safety: Start and Stop from the server's thread.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "core/clock.h"
#include "server/options.h"

namespace ps::server {

class Authenticator;
class GrpcPeerGreeter;
class PeerMonitor;
class ServingState;
class Shard;
class ShareSender;
struct PeerLinks;

class Peers {
 public:
  // Connects (the channels connect lazily), starts the sender in model scope and the
  // monitor. Borrowed, for the Peers' life: all but `options`, which is copied by the parts.
  static absl::StatusOr<std::unique_ptr<Peers>> Start(const ServerOptions& options,
                                                      const Authenticator& auth, Shard* shard,
                                                      ServingState* serving, core::Clock* clock);
  ~Peers();  // Stop(), then the monitor, the greeter, the sender and the channels
  Peers(const Peers&) = delete;
  Peers& operator=(const Peers&) = delete;

  // Ends the greetings and the sender's thread. Idempotent.
  void Stop();

 private:
  Peers() = default;

  std::unique_ptr<PeerLinks> links_;
  std::unique_ptr<ShareSender> sender_;
  std::unique_ptr<GrpcPeerGreeter> greeter_;
  std::unique_ptr<PeerMonitor> monitor_;
};

}  // namespace ps::server
