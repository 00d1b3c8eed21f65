#include "server/peers.h"

#include <utility>

#include "net/channel_auth.h"
#include "server/peer_monitor.h"
#include "server/service_internal.h"
#include "server/serving_state.h"
#include "server/share_sender.h"

namespace ps::server {

absl::StatusOr<std::unique_ptr<Peers>> Peers::Start(const ServerOptions& options,
                                                     const Authenticator& auth, Shard* shard,
                                                     ServingState* serving, core::Clock* clock) {
  std::unique_ptr<Peers> p(new Peers());
  const auto self = static_cast<uint32_t>(options.shard_id);
  absl::StatusOr<PeerLinks> links = ConnectPeers(options, auth.PeerCredentials(self));
  if (!links.ok()) return links.status();
  p->links_ = std::make_unique<PeerLinks>(*std::move(links));
  if (shard->model_scope()) {
    p->sender_ = std::make_unique<ShareSender>(options, p->links_->channels, p->links_->auths);
    shard->SetShareSender([s = p->sender_.get()](std::shared_ptr<const RoundShare> share) {
      s->Send(std::move(share));
    });
  }
  p->greeter_ = std::make_unique<GrpcPeerGreeter>(PeerIdentityOf(options), shard, *p->links_);
  PeerMonitor::Hooks hooks{
      .agreement = [serving](bool agree) { serving->SetPeersAgree(agree); },
      .catching_up = [serving] { return !serving->admitting()->load(); },
      .own_version = [shard] { return shard->MaxVersion(); },
      .fast_forward = [shard](uint64_t version) { return shard->FastForward(version); },
      .admit = [serving] { serving->SetAdmitting(true); }};
  p->monitor_ = std::make_unique<PeerMonitor>(
      PeerMonitor::Options{
          .self = self,
          .peers = options.peers,
          .peer_timeout = std::chrono::duration_cast<core::Duration>(options.peer_timeout)},
      p->greeter_.get(), clock, std::move(hooks));
  p->monitor_->Start();
  return p;
}

Peers::~Peers() {
  Stop();
  monitor_.reset();
  greeter_.reset();
  sender_.reset();
  links_.reset();
}

void Peers::Stop() {
  if (monitor_ != nullptr) monitor_->Stop();
  if (sender_ != nullptr) sender_->Stop();
}

}  // namespace ps::server
