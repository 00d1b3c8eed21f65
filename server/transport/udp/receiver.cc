#include "server/transport/udp/receiver.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include <boost/asio.hpp>

#include "absl/strings/str_cat.h"
#include "core/refusal.h"
#include "core/status.h"
#include "net/address.h"
#include "net/udp_frame.h"
#include "server/server_settings.h"
#include "spdlog/spdlog.h"

namespace ps::server::transport::udp {

namespace asio = boost::asio;
using asio::ip::udp;

// Datagrams one recvmmsg call takes at most; each thread owns this many buffers.
constexpr unsigned kBatch = 16;

class Receiver::Impl {
 public:
  explicit Impl(ShardFront* front) : front_(front), shard_(front->shard()), socket_(io_) {}

  ~Impl() { Stop(); }

  void Stop() {
    if (stopping_.exchange(true)) return;
    // Wakes every thread waiting in poll (the socket reads as readable, and recvmmsg
    // returns 0): on Linux this works on an unconnected UDP socket too, although the
    // call reports ENOTCONN.
    if (socket_.is_open()) ::shutdown(socket_.native_handle(), SHUT_RDWR);
    for (std::thread& t : threads_) t.join();
  }

  absl::Status Open(const std::string& host, uint16_t port, uint32_t receive_buffer,
                    uint32_t threads) {
    host_ = host;
    PS_ASSIGN_OR_RETURN(const asio::ip::address address,
                        net::ResolveHost(host, "UDP listen address"));
    boost::system::error_code ec;
    const udp::endpoint endpoint(address, port);
    socket_.open(endpoint.protocol(), ec);
    if (!ec) SetReceiveBuffer(receive_buffer);
    if (!ec) socket_.bind(endpoint, ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat("UDP: cannot bind ", host, ":", port, ": ", ec.message()));
    }
    port_ = socket_.local_endpoint().port();
    num_threads_ = threads;
    phase_ = std::make_unique<std::atomic<uint64_t>[]>(threads);
    for (uint32_t i = 0; i < threads; ++i) phase_[i].store(0);
    for (uint32_t i = 0; i < threads; ++i) threads_.emplace_back([this, i] { ReceiveLoop(i); });
    return absl::OkStatus();
  }

  uint16_t port() const { return port_; }
  const std::string& host() const { return host_; }

  Stats stats() const {
    Stats s;
    s.received = received_.load();
    s.bytes = bytes_.load();
    s.malformed = malformed_.load();
    s.unknown_session = unknown_session_.load();
    s.forged = forged_.load();
    s.replayed = replayed_.load();
    s.stale = stale_.load();
    s.refused = refused_.load();
    s.ends = ends_.load();
    s.ends_after_close = ends_after_close_.load();
    s.end_datagrams = end_datagrams_.load();
    return s;
  }

  // Handle(): an end is applied at once.
  absl::Status Handle(std::string_view datagram) {
    absl::StatusOr<net::DatagramView> view = Check(datagram);
    if (!view.ok()) return view.status();
    return Apply(view->header, view->codec, view->payload);
  }

 private:
  // An end waiting for other threads' batches: waits[t], thread t's phase then.
  struct PendingEnd {
    std::vector<uint64_t> waits;
    net::DatagramHeader header;
    std::string codec;
    std::string pushes;  // the payload: the further pushes it ends
  };

  // Steps 1-3 of Handle (docs/transport.md, "Receiving"): the datagram parses, its
  // session is known, its MAC verifies and it names the session's worker. Counts and
  // returns why not.
  absl::StatusOr<net::DatagramView> Check(std::string_view datagram) {
    bytes_.fetch_add(datagram.size(), std::memory_order_relaxed);
    absl::StatusOr<net::DatagramView> view = net::ParseDatagram(datagram);
    if (!view.ok()) return Drop(malformed_, "malformed", view.status());
    absl::StatusOr<std::shared_ptr<const DataSession>> peer =
        shard_->FindDataSession(view->header.session_id, "datagram");
    if (!peer.ok()) return Drop(unknown_session_, "unknown session", peer.status());
    if (!(*peer)->key.Verify(view->nonce, view->signed_bytes, view->mac)) {
      return Drop(forged_, "forged",
                  absl::UnauthenticatedError(absl::StrCat(
                      "datagram under the UDP session of worker ", (*peer)->worker_id,
                      " fails its MAC")));
    }
    if (view->header.worker_id != (*peer)->worker_id) {
      return Drop(forged_, "forged",
                  absl::PermissionDeniedError(absl::StrCat(
                      "datagram names worker ", view->header.worker_id,
                      " under the UDP session of worker ", (*peer)->worker_id)));
    }
    return view;
  }

  // Step 4: the shard takes the chunk, or the end of each push an end names, or refuses
  // it (counted by its kind). For an end, the first refusal among its pushes.
  absl::Status Apply(const net::DatagramHeader& header, std::string_view codec,
                     std::string_view payload) {
    if (header.kind != net::DatagramKind::kEnd) return ApplyOne(header, codec, payload);
    end_datagrams_.fetch_add(1, std::memory_order_relaxed);
    absl::Status first;
    for (const net::DatagramHeader& push : net::EndedPushes(header, payload)) {
      first.Update(ApplyOne(push, codec, {}));
    }
    return first;
  }

  // A chunk, or the end of one push.
  absl::Status ApplyOne(const net::DatagramHeader& header, std::string_view codec,
                        std::string_view payload) {
    const bool end = header.kind == net::DatagramKind::kEnd;
    absl::Status st = front_->PushChunk(header, codec, payload);
    if (st.ok()) {
      (end ? ends_ : received_).fetch_add(1, std::memory_order_relaxed);
      return st;
    }
    const Refusal kind = core::RefusalOf(st).value_or(Refusal::kCount);
    // A worker sends each end more than once (UdpOptions::end_copies); the copy after
    // the one that closed the round is expected, not a sign of trouble.
    if (end && kind == Refusal::kLate) {
      ends_after_close_.fetch_add(1, std::memory_order_relaxed);
      return st;
    }
    // By the refusal's kind, not its code: an unknown slice or a codec outside the policy
    // is a refusal like a future round, not a malformed datagram.
    switch (kind) {
      case Refusal::kDuplicate:
        return Drop(replayed_, "replayed", st);
      case Refusal::kLate:
        return Drop(stale_, "stale", st);
      case Refusal::kMalformed:
        return Drop(malformed_, "malformed", st);
      default:
        return Drop(refused_, "refused", st);
    }
  }

  // SO_RCVBUFFORCE passes net.core.rmem_max where the process may (CAP_NET_ADMIN): a
  // shard is often the only user of its host's UDP buffers. Otherwise SO_RCVBUF, which
  // the kernel caps at rmem_max.
  void SetReceiveBuffer(uint32_t bytes) {
    const int fd = socket_.native_handle();
    const int size = static_cast<int>(std::min<uint32_t>(bytes, INT32_MAX));
    if (::setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof(size)) == 0) return;
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
  }

  // Counts a dropped datagram; logs the 1st, 2nd, 4th, 8th, ... of each kind, so a
  // flood cannot fill the log. The shard has logged its own refusals already.
  absl::Status Drop(std::atomic<uint64_t>& counter, const char* kind, absl::Status why) {
    const uint64_t n = counter.fetch_add(1) + 1;
    if (std::has_single_bit(n)) {
      spdlog::warn("shard {}: UDP datagram dropped ({}, {} so far): {}", shard_->shard_id(), kind,
                   n, std::string(why.message()));
    }
    return why;
  }

  // Whether every thread `waits` names has moved past the phase it was in: waits[t] odd
  // is a phase in which thread t held a batch (or was taking one) when the end came.
  bool Passed(const std::vector<uint64_t>& waits) const {
    for (size_t t = 0; t < waits.size(); ++t) {
      if ((waits[t] & 1) != 0 && phase_[t].load() == waits[t]) return false;
    }
    return true;
  }

  // An end taken by thread `thread`: applied once every other thread that held a batch,
  // or was taking one, when the end came has handled it. A chunk the worker sent before
  // the end was ahead of it in the socket's queue, so it was taken before the end was:
  // by one of those batches, or earlier in this thread's own.
  void EndFromThread(const net::DatagramView& view, uint32_t thread) {
    std::vector<uint64_t> waits(num_threads_, 0);
    bool wait = false;
    for (size_t t = 0; t < waits.size(); ++t) {
      if (t == thread) continue;
      waits[t] = phase_[t].load();
      wait |= (waits[t] & 1) != 0;
    }
    if (wait) {
      std::lock_guard<std::mutex> lock(gate_mu_);
      // Checked again under the lock, after the end is counted as pending: a thread that
      // moved on in between either sees the count (Settle) or is seen here.
      pending_count_.fetch_add(1);
      if (!Passed(waits)) {
        pending_.push_back(
            {std::move(waits), view.header, std::string(view.codec), std::string(view.payload)});
        return;
      }
      pending_count_.fetch_sub(1);
    }
    Apply(view.header, view.codec, view.payload).IgnoreError();
  }

  // A thread moved to an even phase: applies the ends that waited for it.
  void Settle() {
    if (pending_count_.load() == 0) return;
    std::vector<PendingEnd> ready;
    {
      std::lock_guard<std::mutex> lock(gate_mu_);
      auto waiting = std::partition(pending_.begin(), pending_.end(),
                                    [this](const PendingEnd& e) { return !Passed(e.waits); });
      ready.assign(std::make_move_iterator(waiting), std::make_move_iterator(pending_.end()));
      pending_.erase(waiting, pending_.end());
      pending_count_.fetch_sub(ready.size());
    }
    for (const PendingEnd& e : ready) Apply(e.header, e.codec, e.pushes).IgnoreError();
  }

  // One receiving thread: up to kBatch datagrams per system call (recvmmsg takes what is
  // queued without waiting), each handled in turn; when the socket is empty it waits in
  // poll, holding nothing. The threads share the socket, so one busy sender's datagrams
  // spread over all of them. Each thread's phase is odd from just before it takes a batch
  // until it handled it, even while it waits: what an end waits for (EndFromThread).
  void ReceiveLoop(uint32_t thread) {
    // One more byte than the largest datagram, so an oversized one shows as too long.
    constexpr size_t kBufferBytes = net::kMaxDatagramBytes + 1;
    std::vector<char> buffers(kBatch * kBufferBytes);
    std::array<iovec, kBatch> iov{};
    std::array<mmsghdr, kBatch> msgs{};
    const int fd = socket_.native_handle();
    std::atomic<uint64_t>& phase = phase_[thread];
    while (!stopping_.load(std::memory_order_relaxed)) {
      for (unsigned i = 0; i < kBatch; ++i) {
        iov[i] = {buffers.data() + i * kBufferBytes, kBufferBytes};
        msgs[i] = {};
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
      }
      phase.fetch_add(1);  // odd: taking a batch
      const int n = ::recvmmsg(fd, msgs.data(), kBatch, MSG_DONTWAIT, nullptr);
      const int error = n < 0 ? errno : 0;
      // After the shutdown in Stop a call returns at once, with an empty "datagram".
      for (int i = 0; i < n && !stopping_.load(std::memory_order_relaxed); ++i) {
        absl::StatusOr<net::DatagramView> view =
            Check(std::string_view(buffers.data() + i * kBufferBytes, msgs[i].msg_len));
        if (!view.ok()) continue;
        if (view->header.kind == net::DatagramKind::kEnd) {
          EndFromThread(*view, thread);
        } else {
          Apply(view->header, view->codec, view->payload).IgnoreError();
        }
      }
      phase.fetch_add(1);  // even: holds nothing
      Settle();
      if (stopping_.load()) break;
      if (n > 0) continue;
      if (n == 0 || error == EAGAIN || error == EWOULDBLOCK || error == EINTR) {
        // Bounded, so that a thread notices the stop flag even if the wake-up were lost.
        pollfd readable{fd, POLLIN, 0};
        ::poll(&readable, 1, 200);
        continue;
      }
      spdlog::error("shard {}: UDP receive failed: {}", shard_->shard_id(), std::strerror(error));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // no busy loop
    }
  }

  ShardFront* const front_;
  Shard* const shard_;
  asio::io_context io_;
  udp::socket socket_;
  std::string host_;
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::vector<std::thread> threads_;
  uint32_t num_threads_ = 0;  // set before the threads start
  // phase_[t]: thread t's phase (ReceiveLoop); ends waiting for other threads' batches.
  std::unique_ptr<std::atomic<uint64_t>[]> phase_;
  std::mutex gate_mu_;
  std::vector<PendingEnd> pending_;  // guarded by gate_mu_
  std::atomic<size_t> pending_count_{0};
  std::atomic<uint64_t> received_{0}, bytes_{0}, malformed_{0}, unknown_session_{0}, forged_{0},
      replayed_{0}, stale_{0}, refused_{0}, ends_{0}, ends_after_close_{0}, end_datagrams_{0};
};

Receiver::Receiver(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Receiver::~Receiver() = default;

absl::StatusOr<std::unique_ptr<Receiver>> Receiver::Start(const std::string& host, uint16_t port,
                                                          uint32_t receive_buffer, uint32_t threads,
                                                          ShardFront* front) {
  if (threads == 0) return absl::InvalidArgumentError("UDP: at least one receiving thread");
  auto impl = std::make_unique<Impl>(front);
  if (absl::Status st = impl->Open(host, port, receive_buffer, threads); !st.ok()) return st;
  return std::unique_ptr<Receiver>(new Receiver(std::move(impl)));
}

uint16_t Receiver::port() const { return impl_->port(); }
Stats Receiver::stats() const { return impl_->stats(); }
absl::Status Receiver::Handle(std::string_view datagram) { return impl_->Handle(datagram); }
void Receiver::Stop() { impl_->Stop(); }

std::string Receiver::ServingLine() const {
  return absl::StrCat("UDP gradient path on ", HostPort(impl_->host(), port()));
}

BackendScrape Receiver::Collect(const ShardStats& shard,
                                std::span<const Membership::State> states) const {
  const Stats u = stats();
  BackendScrape out;
  out.received_bytes = u.bytes;
  using Type = BackendFamily::Type;
  out.families.push_back(BackendFamily::One("ps_udp_chunks_accepted_total",
                                            "UDP chunks taken by the shard", Type::kCounter,
                                            static_cast<double>(shard.udp_chunks_accepted)));
  out.families.push_back(BackendFamily::One(
      "ps_udp_chunks_lost_total",
      "UDP chunks missing when their round closed (masked in the aggregate)", Type::kCounter,
      static_cast<double>(shard.udp_chunks_lost)));
  out.families.push_back(BackendFamily::One(
      "ps_udp_chunks_held_from_before_total",
      "UDP chunks a restarted worker resent under its new session that the shard already "
      "held from its predecessor (that copy counts)",
      Type::kCounter, static_cast<double>(shard.udp_chunks_held_from_before)));
  BackendFamily dropped{"ps_udp_datagrams_dropped_total", "UDP datagrams dropped, by reason",
                        BackendFamily::Type::kCounter, {}};
  const std::pair<const char*, uint64_t> reasons[] = {
      {"malformed", u.malformed}, {"unknown_session", u.unknown_session},
      {"forged", u.forged},       {"replayed", u.replayed},
      {"stale", u.stale},         {"refused", u.refused}};
  for (const auto& [reason, count] : reasons) {
    dropped.series.push_back({{{"reason", reason}}, static_cast<double>(count)});
  }
  out.families.push_back(std::move(dropped));
  BackendFamily ends{"ps_udp_push_ends_total",
                     "Ends of UDP pushes (each sent more than once), by what the shard did",
                     BackendFamily::Type::kCounter, {}};
  ends.series.push_back({{{"outcome", "taken"}}, static_cast<double>(u.ends)});
  ends.series.push_back({{{"outcome", "after_close"}}, static_cast<double>(u.ends_after_close)});
  out.families.push_back(std::move(ends));
  // Per worker id, as the shard's per-worker families (spares that never joined: none).
  BackendFamily chunks{"ps_worker_udp_chunks_total", "UDP chunks of a worker taken into a round",
                       BackendFamily::Type::kCounter, {}};
  for (size_t w = 0; w < shard.workers.size(); ++w) {
    if (w < states.size() && states[w] == Membership::State::kSpare) continue;
    chunks.series.push_back({{{"worker", absl::StrCat(w)}},
                             static_cast<double>(shard.workers[w].chunks_accepted)});
  }
  out.families.push_back(std::move(chunks));
  return out;
}

std::string Receiver::TotalsLine(const ShardStats& shard) const {
  const Stats u = stats();
  // A restarted worker's resend of a chunk its predecessor sent is taken as that copy
  // (it counts once, in the round): said apart, so the totals do not count it twice.
  const std::string held =
      shard.udp_chunks_held_from_before == 0
          ? std::string()
          : absl::StrCat(" (", shard.udp_chunks_held_from_before,
                         " of them already held from a restarted worker's predecessor)");
  return absl::StrCat("UDP: ", u.received, " chunks taken", held, ", ", shard.udp_chunks_lost,
                      " lost, ", u.ends, " push ends taken, ", u.malformed,
                      " malformed, ", u.unknown_session, " unknown session, ", u.forged,
                      " forged, ", u.replayed, " replayed, ", u.stale, " stale, ", u.refused,
                      " refused");
}

}  // namespace ps::server::transport::udp
