#include "server/udp_receiver.h"

#include <array>
#include <atomic>
#include <bit>
#include <thread>

#include <boost/asio.hpp>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "net/address.h"
#include "net/udp_frame.h"
#include "spdlog/spdlog.h"

namespace ps::server {

namespace asio = boost::asio;
using asio::ip::udp;

class UdpReceiver::Impl {
 public:
  explicit Impl(Shard* shard) : shard_(shard), socket_(io_) {}

  ~Impl() {
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }

  absl::Status Open(const std::string& host, uint16_t port, uint32_t receive_buffer) {
    PS_ASSIGN_OR_RETURN(const asio::ip::address address,
                        net::ResolveHost(host, "UDP listen address"));
    boost::system::error_code ec;
    const udp::endpoint endpoint(address, port);
    socket_.open(endpoint.protocol(), ec);
    if (!ec) socket_.set_option(asio::socket_base::receive_buffer_size(static_cast<int>(receive_buffer)), ec);
    if (!ec) socket_.bind(endpoint, ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat("UDP: cannot bind ", host, ":", port, ": ", ec.message()));
    }
    port_ = socket_.local_endpoint().port();
    Receive();
    thread_ = std::thread([this] { io_.run(); });
    return absl::OkStatus();
  }

  uint16_t port() const { return port_; }

  UdpStats stats() const {
    UdpStats s;
    s.received = received_.load();
    s.bytes = bytes_.load();
    s.malformed = malformed_.load();
    s.unknown_session = unknown_session_.load();
    s.forged = forged_.load();
    s.replayed = replayed_.load();
    s.stale = stale_.load();
    s.refused = refused_.load();
    return s;
  }

  absl::Status Handle(std::string_view datagram) {
    bytes_.fetch_add(datagram.size());
    absl::StatusOr<net::DatagramView> view = net::ParseDatagram(datagram);
    if (!view.ok()) return Drop(malformed_, "malformed", view.status());
    absl::StatusOr<std::shared_ptr<const UdpPeer>> peer = shard_->UdpSession(view->header.session_id);
    if (!peer.ok()) return Drop(unknown_session_, "unknown session", peer.status());
    if (!(*peer)->key.Verify(view->signed_bytes, view->mac)) {
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
    absl::Status st = shard_->PushChunk(view->header, view->codec, view->payload);
    switch (st.code()) {
      case absl::StatusCode::kOk:
        received_.fetch_add(1);
        return st;
      case absl::StatusCode::kAlreadyExists:
        return Drop(replayed_, "replayed", st);
      case absl::StatusCode::kOutOfRange:
        return Drop(stale_, "stale", st);
      case absl::StatusCode::kInvalidArgument:
        return Drop(malformed_, "malformed", st);
      default:
        return Drop(refused_, "refused", st);
    }
  }

 private:
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

  void Receive() {
    socket_.async_receive_from(asio::buffer(buffer_), sender_,
                               [this](const boost::system::error_code& ec, size_t n) {
                                 if (ec == asio::error::operation_aborted) return;
                                 if (!ec) Handle(std::string_view(buffer_.data(), n)).IgnoreError();
                                 Receive();
                               });
  }

  Shard* const shard_;
  asio::io_context io_;
  udp::socket socket_;
  udp::endpoint sender_;
  // One more than the largest datagram, so an oversized one shows as too long.
  std::array<char, net::kMaxDatagramBytes + 1> buffer_{};
  uint16_t port_ = 0;
  std::thread thread_;
  std::atomic<uint64_t> received_{0}, bytes_{0}, malformed_{0}, unknown_session_{0}, forged_{0},
      replayed_{0}, stale_{0}, refused_{0};
};

UdpReceiver::UdpReceiver(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
UdpReceiver::~UdpReceiver() = default;

absl::StatusOr<std::unique_ptr<UdpReceiver>> UdpReceiver::Start(const std::string& host, uint16_t port,
                                                                uint32_t receive_buffer, Shard* shard) {
  auto impl = std::make_unique<Impl>(shard);
  if (absl::Status st = impl->Open(host, port, receive_buffer); !st.ok()) return st;
  return std::unique_ptr<UdpReceiver>(new UdpReceiver(std::move(impl)));
}

uint16_t UdpReceiver::port() const { return impl_->port(); }
UdpStats UdpReceiver::stats() const { return impl_->stats(); }
absl::Status UdpReceiver::Handle(std::string_view datagram) { return impl_->Handle(datagram); }

}  // namespace ps::server
