#include "worker_lib/udp_sender_internal.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "net/address.h"

namespace ps::internal {

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

UdpSender::UdpSender(const UdpOptions& options, bool priority_order)
    : options_(options), priority_order_(priority_order), socket_(io_) {}

absl::StatusOr<std::unique_ptr<UdpSender>> UdpSender::Start(const UdpOptions& options,
                                                           bool priority_order) {
  if (!(options.loss >= 0 && options.loss < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("UDP loss must lie in [0, 1), got ", options.loss));
  }
  if (!(options.rate_mbps >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("UDP rate must be >= 0 Mbit/s, got ", options.rate_mbps));
  }
  if (options.chunk_elems == 0) return absl::InvalidArgumentError("UDP chunk_elems must be positive");
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
    queue_.clear();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void UdpSender::Enqueue(int32_t priority, uint64_t round, udp::endpoint to, std::string datagram,
                        bool lost) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t seq = next_seq_++;
    const Key key = priority_order_ ? Key{priority, round, seq} : Key{0, 0, seq};
    queue_.emplace(key, Item{to, std::move(datagram), lost});
  }
  cv_.notify_all();
}

absl::Status UdpSender::WaitIdle() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return (queue_.empty() && !busy_) || stopping_; });
  std::string error = std::move(error_);
  error_.clear();
  if (!error.empty()) return absl::UnavailableError(error);
  return absl::OkStatus();
}

void UdpSender::Loop() {
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      busy_ = false;
      cv_.notify_all();
      cv_.wait(lock, [&] { return !queue_.empty() || stopping_; });
      if (stopping_) return;
      item = std::move(queue_.begin()->second);
      queue_.erase(queue_.begin());
      busy_ = true;
    }
    if (item.lost) {
      std::lock_guard<std::mutex> lock(mu_);
      ++dropped_;
      continue;
    }
    if (pacer_ != nullptr) std::this_thread::sleep_until(pacer_->Reserve(item.bytes.size()));
    boost::system::error_code ec;
    if (!socket_.is_open()) {
      socket_.open(item.to.protocol(), ec);
      if (!ec) socket_.set_option(asio::socket_base::send_buffer_size(4 << 20), ec);
    }
    if (!ec) socket_.send_to(asio::buffer(item.bytes), item.to, 0, ec);
    std::lock_guard<std::mutex> lock(mu_);
    if (ec) {
      // A full socket buffer or an unreachable port loses the datagram like the network
      // would; the error is reported once, by WaitIdle().
      if (error_.empty()) error_ = absl::StrCat("UDP send to ", item.to.address().to_string(), ":", item.to.port(), ": ", ec.message());
      ++dropped_;
    } else {
      ++sent_;
      bytes_ += item.bytes.size();
    }
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
uint64_t UdpSender::bytes_sent() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

}  // namespace ps::internal
