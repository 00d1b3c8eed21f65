#include "worker_lib/transport/udp/channel.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "crypto/auth_proof.h"

namespace ps::internal::udp_path {

// Chunks signed and queued as soon as Start sees them: the sender starts with the
// first while the rest are signed. Then one end (and its copies) for all the pushes
// whose last chunk went, queued behind them.
class UdpChannel::Push final : public DataChannel::PushCall {
 public:
  Push(const UdpChannel* channel, Route route, std::vector<const OutgoingPush*> pushes)
      : channel_(channel), route_(std::move(route)), pushes_(std::move(pushes)) {}

  uint64_t epoch() const override { return route_.epoch; }

  void Start(std::function<void(size_t, absl::Status)> done) override {
    // One failure ends the push: what follows is not sent (a chunk too large for a
    // datagram has siblings as large).
    absl::Status failed = cancelled_.load() ? absl::CancelledError("cancelled before sending")
                                            : route_.key == nullptr
                                                ? absl::FailedPreconditionError(absl::StrCat(
                                                      ShardName(channel_->shard_,
                                                                channel_->address_),
                                                      " gave no UDP key"))
                                                : absl::OkStatus();
    const size_t n = pushes_.size();  // the last `done` may destroy this call
    std::vector<absl::Status> sent(n);
    std::vector<const OutgoingPush*> ended;  // pushes whose last chunk went
    for (size_t i = 0; i < n; ++i) {
      if (failed.ok()) failed = Send(*pushes_[i]);
      sent[i] = failed;
      if (failed.ok() && pushes_[i]->chunk_index + 1u == pushes_[i]->chunk_count) {
        ended.push_back(pushes_[i]);
      }
    }
    if (const absl::Status st = SendEnds(ended); !st.ok()) {
      for (absl::Status& s : sent) s.Update(st);
    }
    for (size_t i = 0; i < n; ++i) done(i, sent[i]);
  }

  // Nothing is ever in flight once Start returned.
  void Cancel() override { cancelled_.store(true); }

 private:
  net::DatagramHeader HeaderOf(const OutgoingPush& p) const {
    net::DatagramHeader h;
    h.session_id = route_.session;
    h.worker_id = channel_->worker_id_;
    h.slice_id = p.slice_id;
    h.round = p.round;
    h.chunk_elems = p.chunk_elems;
    h.chunk_index = p.chunk_index;
    h.chunk_count = p.chunk_count;
    return h;
  }

  absl::Status Send(const OutgoingPush& p) const {
    const UdpOptions& options = channel_->options_;
    const net::DatagramHeader h = HeaderOf(p);
    net::SignedDatagram datagram;
    // A borrowed push's values go from the caller's buffer, after the payload's head; the
    // guard holds the buffer until the datagram has left (WaitPushes waits for it).
    DatagramPayload payload;
    if (p.payload != nullptr) {
      payload.pieces[0] = *p.payload;
      payload.keep[0] = p.payload;
    }
    if (!p.borrowed.empty()) {
      payload.pieces[1] = std::string_view(p.borrowed.data(), p.borrowed.size());
      payload.keep[1] = p.borrowed_guard;
    }
    const absl::Status st = net::SignDatagram(h, p.codec, payload.pieces, *route_.key, &datagram);
    if (!st.ok()) {
      return absl::Status(st.code(), absl::StrCat("UDP chunk ", h.chunk_index, " of slice ",
                                                  h.slice_id, ": ", st.message(),
                                                  " (lower udp.chunk_elems)"));
    }
    channel_->sender_->Enqueue(
        p.priority, p.round, route_.endpoint, std::move(datagram), std::move(payload),
        InjectedLoss(options, channel_->worker_id_, p.round, p.slice_id, p.chunk_index));
    return absl::OkStatus();
  }

  // The ends of `ended` (pushes of this call, in order), in as few datagrams as fit: a
  // new one where the round or codec changes (a call holds one tensor's pushes, so
  // normally one in all). Each is queued end_copies times behind its pushes' chunks, at
  // the priority of theirs that leaves last.
  absl::Status SendEnds(const std::vector<const OutgoingPush*>& ended) const {
    const UdpOptions& options = channel_->options_;
    if (options.end_copies == 0) return absl::OkStatus();
    for (size_t first = 0; first < ended.size();) {
      const OutgoingPush& head = *ended[first];
      net::DatagramHeader h = HeaderOf(head);
      h.kind = net::DatagramKind::kEnd;
      h.chunk_index = 0;
      int32_t priority = head.priority;
      std::string entries;
      const size_t last = std::min(ended.size(), first + net::MaxEndedPushes(head.codec.size()));
      size_t next = first + 1;
      for (; next < last && ended[next]->round == head.round && ended[next]->codec == head.codec;
           ++next) {
        net::AppendEndEntry(ended[next]->slice_id, ended[next]->chunk_count, &entries);
        priority = std::max(priority, ended[next]->priority);
      }
      for (uint32_t copy = 0; copy < options.end_copies; ++copy) {
        std::string datagram;
        PS_RETURN_IF_ERROR(net::EncodeDatagram(h, head.codec, entries, *route_.key, &datagram));
        channel_->sender_->Enqueue(priority, head.round, route_.endpoint, std::move(datagram),
                                   InjectedLoss(options, channel_->worker_id_, head.round,
                                                head.slice_id, kInjectedEndIndex + copy));
      }
      first = next;
    }
    return absl::OkStatus();
  }

  const UdpChannel* const channel_;
  const Route route_;
  const std::vector<const OutgoingPush*> pushes_;
  std::atomic<bool> cancelled_{false};
};

UdpChannel::UdpChannel(std::shared_ptr<UdpSender> sender, const UdpOptions& options,
                       std::string token, uint32_t worker_id, uint32_t shard, std::string address)
    : sender_(std::move(sender)),
      options_(options),
      worker_id_(worker_id),
      shard_(shard),
      address_(std::move(address)),
      token_(std::move(token)) {}

absl::StatusOr<net::DatagramKey> UdpChannel::KeyOf(const DataRoute& route) const {
  // The secret has a key's size whether or not it is bound to a token.
  PS_ASSIGN_OR_RETURN(net::DatagramKey secret, net::DatagramKey::FromBytes(route.udp_key));
  if (token_.empty()) return secret;
  return net::DatagramKey::FromBytes(crypto::BoundUdpKey(token_, absl::StrCat("shard-", shard_),
                                                         route.udp_session, route.udp_key));
}

absl::Status UdpChannel::SetRoute(const DataRoute& route) {
  Route next;
  next.epoch = route.epoch;
  next.session = route.udp_session;
  next.port = route.udp_port;
  absl::Status status;
  if (route.udp_port == 0) {
    status = absl::FailedPreconditionError(
        absl::StrCat("tensors are pushed over UDP but ", ShardName(shard_, address_),
                     " runs without the UDP path (start it with --udp-port)"));
  } else if (auto key = KeyOf(route); !key.ok()) {
    status = absl::InternalError(absl::StrCat(ShardName(shard_, address_),
                                              " handed out a bad UDP key: ",
                                              key.status().message()));
  } else {
    next.key = std::make_shared<const net::DatagramKey>(*std::move(key));
    const Route last = this->route();
    if (last.port == route.udp_port) {
      next.endpoint = last.endpoint;
      next.mtu = last.mtu;
    } else {
      auto endpoint = ResolveUdp(address_, static_cast<uint16_t>(route.udp_port));
      if (endpoint.ok()) {
        next.endpoint = *endpoint;
        // The library logs nothing: where the MTU is unknown, chunk_elems() says so by
        // its fallback (docs/transport.md).
        if (options_.chunk_elems == 0) next.mtu = RouteMtu(next.endpoint).value_or(0);
      } else {
        next.key = nullptr;
        next.port = 0;
        status = endpoint.status();
      }
    }
  }
  absl::MutexLock lock(&mu_);
  route_ = std::move(next);
  return status;
}

uint32_t ChunkElemsFor(const UdpOptions& options, size_t mtu, bool ipv6, size_t codec_bytes,
                       absl::FunctionRef<size_t(size_t)> max_encoded_bytes) {
  if (options.chunk_elems != 0) return options.chunk_elems;
  uint32_t n = mtu == 0 ? UdpChannel::kUnknownMtuChunkElems
                        : net::ChunkElemsForMtu(mtu, ipv6, codec_bytes);
  // A codec whose encoding may pass 4 bytes a value (a dense sparse code, say) gets
  // chunks its largest encoding fits in one datagram: fewer values, in proportion,
  // then one at a time (encodings grow with n).
  const size_t room = net::kMaxDatagramBytes - net::DatagramOverhead(codec_bytes);
  for (size_t need = max_encoded_bytes(n); n > 1 && need > room; need = max_encoded_bytes(n)) {
    const size_t scaled = static_cast<size_t>(n) * room / need;
    n = static_cast<uint32_t>(std::max<size_t>(1, std::min<size_t>(scaled, n - 1)));
  }
  return n;
}

uint32_t UdpChannel::chunk_elems(size_t codec_bytes,
                                 absl::FunctionRef<size_t(size_t)> max_encoded_bytes) const {
  const Route r = route();
  return ChunkElemsFor(options_, r.mtu, r.endpoint.address().is_v6(), codec_bytes,
                       max_encoded_bytes);
}

UdpChannel::Route UdpChannel::route() const {
  absl::MutexLock lock(&mu_);
  return route_;
}

std::unique_ptr<DataChannel::PushCall> UdpChannel::NewPush(std::vector<const OutgoingPush*> pushes,
                                                           RpcClock::time_point) {
  return std::make_unique<Push>(this, route(), std::move(pushes));
}

uint64_t UdpChannel::Pull(PullAsk, RpcClock::time_point, std::shared_ptr<PullSink> sink) {
  sink->Done(absl::UnimplementedError(
      absl::StrCat("the UDP path to ", ShardName(shard_, address_),
                   " carries pushes only; pulls go over the data plane")));
  return route().epoch;
}

void UdpChannel::FillStats(WorkerStats& stats) const {
  stats.udp_datagrams_sent = sender_->datagrams_sent();
  stats.udp_datagrams_dropped = sender_->datagrams_dropped();
  stats.udp_send_errors = sender_->send_errors();
  stats.udp_bytes = sender_->bytes_sent();
}

}  // namespace ps::internal::udp_path
