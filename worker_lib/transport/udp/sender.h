// UdpSender: the worker's end of the lossy UDP gradient path (docs/transport.md). It
// owns one UDP socket and one thread that sends queued datagrams most urgent first
// (the data plane's P3 send queue, send_queue_internal.h, taken a datagram at a time),
// paced by a token bucket, dropping the ones the seeded loss injection picks. Datagrams
// arrive here already signed, from the UDP channels to every shard (channel.h), which
// share one sender.
//
// Thread safety: all methods may be called from any thread. The destructor drops what
// is still queued and joins the thread.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include <utility>  // before Asio: Boost 1.74 uses std::exchange without it

#include <boost/asio.hpp>

#include "absl/status/statusor.h"
#include "net/shaper.h"
#include "net/udp_frame.h"
#include "worker_lib/send_queue_internal.h"
#include "worker_lib/worker.h"

namespace ps::internal::udp_path {

// Whether loss injection drops this datagram: a counter-based hash of the identifiers,
// uniform in [0, 1), compared with `loss`. The same inputs drop the same datagrams in
// every run.
bool InjectedLoss(const UdpOptions& options, uint32_t worker, uint64_t round, uint32_t slice,
                  uint32_t chunk);
// The `chunk` under which InjectedLoss decides copy c of an end datagram:
// kInjectedEndIndex + c, with the end's first slice. Past every chunk index (16 bits), so
// an end is lost on its own.
inline constexpr uint32_t kInjectedEndIndex = 1u << 16;

// "host:port" or "[v6]:port" -> the UDP endpoint of `host` at `port`, resolved now.
absl::StatusOr<boost::asio::ip::udp::endpoint> ResolveUdp(const std::string& address, uint16_t port);

// The MTU of this host's route to `endpoint` (the kernel's IP_MTU or IPV6_MTU of a UDP
// socket connected there: the outgoing device's, or a smaller path MTU it learnt);
// UNAVAILABLE, saying why, where it cannot be read (no route, or not Linux).
absl::StatusOr<size_t> RouteMtu(const boost::asio::ip::udp::endpoint& endpoint);

// A queued datagram's payload, sent from where it lies: up to two pieces one after the
// other (a push's encoded bytes; or a borrowed push's head and the caller's values,
// PushOptions::borrow), each kept alive by its `keep` until the datagram is sent or
// dropped.
struct DatagramPayload {
  std::array<std::string_view, 2> pieces;
  std::array<std::shared_ptr<const void>, 2> keep;

  size_t size() const { return pieces[0].size() + pieces[1].size(); }
};

class UdpSender {
 public:
  // priority_order: datagrams leave by (priority, round, arrival), as the gRPC send
  // queue; false: by arrival (FIFO).
  static absl::StatusOr<std::unique_ptr<UdpSender>> Start(const UdpOptions& options,
                                                         bool priority_order = true);
  ~UdpSender();
  UdpSender(const UdpSender&) = delete;
  UdpSender& operator=(const UdpSender&) = delete;

  // Queues one signed datagram of a slice with `priority` for `to`, sent as
  // `signed_parts.head`, the payload's pieces, `signed_parts.mac` in one system call
  // (scatter-gather: the payload is not copied; its `keep`s hold it until then); `lost`
  // says the loss injection drops it.
  void Enqueue(int32_t priority, uint64_t round, boost::asio::ip::udp::endpoint to,
               net::SignedDatagram signed_parts, DatagramPayload payload, bool lost);
  // Queues `datagram` as it is (tests).
  void Enqueue(int32_t priority, uint64_t round, boost::asio::ip::udp::endpoint to,
               std::string datagram, bool lost);
  // Waits until everything queued so far has been sent (or dropped). A datagram the
  // local kernel refuses (a firewall's drop on output: EPERM; too large; no route) is
  // lost as the network would lose it and counted in send_errors(); UNAVAILABLE, naming
  // the destination and the error, only where every datagram to one destination since
  // the previous call was refused (nothing of this worker can reach that shard).
  absl::Status WaitIdle();

  uint64_t datagrams_sent() const;
  uint64_t datagrams_dropped() const;  // by the loss injection
  uint64_t send_errors() const;        // refused by the local kernel
  uint64_t bytes_sent() const;

 private:
  // A datagram: head, payload, tail (the MAC; none for a datagram queued whole).
  struct Item {
    boost::asio::ip::udp::endpoint to;
    std::string head;
    DatagramPayload payload;
    std::array<uint8_t, net::kDatagramMacBytes> tail{};
    size_t tail_bytes = 0;
    bool lost = false;

    size_t size() const { return head.size() + payload.size() + tail_bytes; }
  };
  UdpSender(const UdpOptions& options, bool priority_order);
  void Loop();

  const UdpOptions options_;
  boost::asio::io_context io_;
  boost::asio::ip::udp::socket socket_;
  std::unique_ptr<net::TokenBucket> pacer_;  // null when unpaced

  mutable std::mutex mu_;
  std::condition_variable cv_;
  SendQueue<Item> queue_;  // taken with TakeNext: the token bucket paces, not its window
  // Since the previous WaitIdle, per destination: datagrams sent, refused, and the first
  // refusal's message.
  struct Window {
    uint64_t sent = 0, refused = 0;
    std::string error;
  };
  bool busy_ = false;  // the thread holds an item
  bool stopping_ = false;
  std::map<boost::asio::ip::udp::endpoint, Window> windows_;
  uint64_t sent_ = 0, dropped_ = 0, send_errors_ = 0, bytes_ = 0;
  std::thread thread_;
};

}  // namespace ps::internal::udp_path
