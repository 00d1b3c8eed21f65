#include "worker_lib/transport/udp/sender.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "net/address.h"

namespace ps::internal::udp_path {

namespace asio = boost::asio;
using asio::ip::udp;

namespace {

uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

bool InjectedLoss(const UdpOptions& options, uint32_t worker, uint64_t round, uint32_t slice,
                  uint32_t chunk) {
  if (options.loss <= 0) return false;
  uint64_t h = Mix(options.loss_seed);
  h = Mix(h ^ worker);
  h = Mix(h ^ round);
  h = Mix(h ^ ((uint64_t{slice} << 16) | chunk));
  const double u = static_cast<double>(h >> 11) * 0x1.0p-53;
  return u < options.loss;
}

absl::StatusOr<udp::endpoint> ResolveUdp(const std::string& address, uint16_t port) {
  PS_ASSIGN_OR_RETURN(const net::HostPort split, net::SplitHostPort(address, "shard address"));
  PS_ASSIGN_OR_RETURN(const asio::ip::address host,
                      net::ResolveHost(split.host, "shard address for UDP"));
  return udp::endpoint(host, port);
}

absl::StatusOr<size_t> RouteMtu(const udp::endpoint& endpoint) {
#ifdef __linux__
  const bool v6 = endpoint.address().is_v6();
  const int fd = ::socket(v6 ? AF_INET6 : AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("no UDP socket to ask the route's MTU: ",
                                               std::strerror(errno)));
  }
  int mtu = 0;
  socklen_t len = sizeof(mtu);
  // Connecting a UDP socket sends nothing: it only picks the route.
  const bool ok =
      ::connect(fd, endpoint.data(), static_cast<socklen_t>(endpoint.size())) == 0 &&
      ::getsockopt(fd, v6 ? IPPROTO_IPV6 : IPPROTO_IP, v6 ? IPV6_MTU : IP_MTU, &mtu, &len) == 0;
  const int error = errno;
  ::close(fd);
  if (!ok || mtu <= 0) {
    return absl::UnavailableError(absl::StrCat("the MTU of the route to ",
                                               endpoint.address().to_string(), " is unknown: ",
                                               ok ? "the kernel gave none" : std::strerror(error)));
  }
  return static_cast<size_t>(mtu);
#else
  return absl::UnavailableError("the route's MTU is read only on Linux");
#endif
}

UdpSender::UdpSender(const UdpOptions& options, bool priority_order)
    : options_(options),
      socket_(io_),
      queue_(priority_order, /*window=*/std::numeric_limits<uint64_t>::max()) {}

absl::StatusOr<std::unique_ptr<UdpSender>> UdpSender::Start(const UdpOptions& options,
                                                           bool priority_order) {
  if (!(options.loss >= 0 && options.loss < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("UDP loss must lie in [0, 1), got ", options.loss));
  }
  if (!(options.rate_mbps >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("UDP rate must be >= 0 Mbit/s, got ", options.rate_mbps));
  }
  std::unique_ptr<UdpSender> s(new UdpSender(options, priority_order));
  if (options.rate_mbps > 0) {
    s->pacer_ = std::make_unique<net::TokenBucket>(options.rate_mbps * 1e6 / 8, 64 * 1024);
  }
  s->thread_ = std::thread([p = s.get()] { p->Loop(); });
  return s;
}

UdpSender::~UdpSender() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    queue_.TakeAll();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void UdpSender::Enqueue(int32_t priority, uint64_t round, udp::endpoint to,
                        net::SignedDatagram signed_parts, DatagramPayload payload, bool lost) {
  Item item{.to = to,
            .head = std::move(signed_parts.head),
            .payload = std::move(payload),
            .tail = signed_parts.mac,
            .tail_bytes = signed_parts.mac.size(),
            .lost = lost};
  {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t size = item.size();
    queue_.Push(priority, round, size, std::move(item));
  }
  cv_.notify_all();
}

void UdpSender::Enqueue(int32_t priority, uint64_t round, udp::endpoint to, std::string datagram,
                        bool lost) {
  Item item{.to = to, .head = std::move(datagram), .lost = lost};
  {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t size = item.size();
    queue_.Push(priority, round, size, std::move(item));
  }
  cv_.notify_all();
}

absl::Status UdpSender::WaitIdle() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return (queue_.empty() && !busy_) || stopping_; });
  std::map<udp::endpoint, Window> windows;
  windows.swap(windows_);
  for (const auto& [to, w] : windows) {
    if (w.sent == 0 && w.refused > 0) {
      return absl::UnavailableError(absl::StrCat(w.error, " (all ", w.refused,
                                                 " datagrams to it since the last wait)"));
    }
  }
  return absl::OkStatus();
}

void UdpSender::Loop() {
  // Up to this many datagrams, and about this many bytes, leave in one sendmmsg call:
  // few system calls per round, yet pacing stays finer than the receiver's buffer.
  constexpr size_t kBatch = 32;
  constexpr size_t kBatchBytes = 256 * 1024;
  std::vector<Item> batch;
  std::vector<mmsghdr> msgs;
  std::vector<iovec> iov;
  for (;;) {
    batch.clear();
    size_t dropped = 0, batch_bytes = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      busy_ = false;
      cv_.notify_all();
      cv_.wait(lock, [&] { return !queue_.empty() || stopping_; });
      if (stopping_) return;
      while (!queue_.empty() && batch.size() < kBatch &&
             (batch.empty() || batch_bytes + queue_.next_bytes() <= kBatchBytes)) {
        Item item = queue_.TakeNext();
        if (item.lost) {
          ++dropped;
          continue;
        }
        batch_bytes += item.size();
        batch.push_back(std::move(item));
      }
      dropped_ += dropped;
      busy_ = !batch.empty();
    }
    if (batch.empty()) continue;
    if (pacer_ != nullptr) std::this_thread::sleep_until(pacer_->Reserve(batch_bytes));
    boost::system::error_code ec;
    if (!socket_.is_open()) {
      socket_.open(batch.front().to.protocol(), ec);
      if (!ec) socket_.set_option(asio::socket_base::send_buffer_size(4 << 20), ec);
    }
    msgs.assign(batch.size(), mmsghdr{});
    constexpr size_t kPieces = 4;  // head, the payload's two pieces, the MAC
    iov.resize(kPieces * batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      Item& item = batch[i];
      iovec* v = &iov[kPieces * i];
      size_t pieces = 0;
      // An empty piece is left out (an empty payload may have a null data()).
      const auto add = [&](const void* data, size_t size) {
        if (size > 0) v[pieces++] = {const_cast<void*>(data), size};
      };
      add(item.head.data(), item.head.size());
      for (std::string_view piece : item.payload.pieces) add(piece.data(), piece.size());
      add(item.tail.data(), item.tail_bytes);
      msgs[i].msg_hdr.msg_name = item.to.data();
      msgs[i].msg_hdr.msg_namelen = static_cast<socklen_t>(item.to.size());
      msgs[i].msg_hdr.msg_iov = v;
      msgs[i].msg_hdr.msg_iovlen = pieces;
    }
    // Sends the batch; a datagram the kernel refuses (a firewall's drop on output, one
    // too large, no route) is lost like the network would lose it, counted per
    // destination for WaitIdle().
    size_t next = 0, sent = 0, sent_bytes = 0, failed = 0;
    // What each datagram came to: sent, or the error that refused it.
    std::vector<std::pair<size_t, std::string>> refusals;  // (index in batch, error)
    while (next < batch.size()) {
      int n = -1;
      if (!ec) {
        n = ::sendmmsg(socket_.native_handle(), msgs.data() + next,
                       static_cast<unsigned>(batch.size() - next), 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) ec = boost::system::error_code(errno, boost::system::system_category());
      }
      if (n <= 0) {
        refusals.emplace_back(next, ec.message());
        ++failed;
        ++next;
        if (socket_.is_open()) ec.clear();  // the next datagram may go through
        continue;
      }
      for (int i = 0; i < n; ++i) sent_bytes += batch[next + i].size();
      sent += n;
      next += n;
    }
    std::lock_guard<std::mutex> lock(mu_);
    size_t r = 0;
    Window* w_at = nullptr;  // the window of batch[i - 1].to: one lookup per run of one shard's
    for (size_t i = 0; i < batch.size(); ++i) {
      if (w_at == nullptr || !(batch[i].to == batch[i - 1].to)) w_at = &windows_[batch[i].to];
      Window& w = *w_at;
      if (r < refusals.size() && refusals[r].first == i) {
        if (w.refused++ == 0) {
          w.error = absl::StrCat("UDP send to ", batch[i].to.address().to_string(), ":",
                                 batch[i].to.port(), ": ", refusals[r].second);
        }
        ++r;
      } else {
        ++w.sent;
      }
    }
    send_errors_ += failed;
    sent_ += sent;
    bytes_ += sent_bytes;
  }
}

uint64_t UdpSender::datagrams_sent() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sent_;
}
uint64_t UdpSender::datagrams_dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}
uint64_t UdpSender::send_errors() const {
  std::lock_guard<std::mutex> lock(mu_);
  return send_errors_;
}
uint64_t UdpSender::bytes_sent() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

}  // namespace ps::internal::udp_path
