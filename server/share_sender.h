// ShareSender: delivers this shard's model-scope round shares to every peer shard
// (PeerService.ShareRound). One thread per peer sends that peer's queue in order,
// retrying while the peer is unreachable or not ready (no layout yet) until the share
// is --peer-timeout-ms old; a refusal for any other reason is logged and the share
// dropped (the peer then drops the round at its own timeout).
//
// Thread safety: Send() may be called from any thread. Stop() (also run by the
// destructor) ends the threads; queued shares are dropped.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/synchronization/mutex.h"
#include "net/channel_auth.h"
#include "server/options.h"
#include "server/shard.h"

namespace ps::server {

class ShareSender {
 public:
  // `peers` are the channels to every shard by id (null for this one), `auths` their
  // ChannelAuth (this shard's proof of its token; shared with the peer checks).
  ShareSender(const ServerOptions& options, std::vector<std::shared_ptr<grpc::Channel>> peers,
              std::vector<std::shared_ptr<net::ChannelAuth>> auths);
  ~ShareSender();
  ShareSender(const ShareSender&) = delete;
  ShareSender& operator=(const ShareSender&) = delete;

  void Send(std::shared_ptr<const RoundShare> share);
  void Stop();

 private:
  struct Peer;
  void Loop(Peer* peer);

  const ServerOptions options_;
  std::vector<std::unique_ptr<Peer>> peers_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ps::server
