#include "net/shaper.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <deque>
#include <set>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

// GCC 12 warns (-Wtsan) that TSan cannot model the atomic_thread_fence inside Asio's
// handler invocation, and -Werror makes that fatal in PS_SANITIZE=thread builds. Asio
// also hands operations between threads under mutexes, which TSan does see.
#if defined(__SANITIZE_THREAD__)
#pragma GCC diagnostic ignored "-Wtsan"
#endif
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "net/address.h"

namespace ps::net {

using core::AsAbsl;
using core::Clock;
using core::Duration;
using core::SteadyTime;

// ---------------------------------------------------------------------------------------
// TokenBucket.

TokenBucket::TokenBucket(double bytes_per_second, uint64_t burst_bytes, Clock* clock)
    : unlimited_(bytes_per_second <= 0),
      clock_(clock != nullptr ? clock : Clock::Real()),
      bucket_(unlimited_ ? 1 : bytes_per_second, static_cast<double>(burst_bytes), clock_->Now()) {}

SteadyTime TokenBucket::Reserve(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  const SteadyTime now = clock_->Now();
  if (unlimited_ || bucket_.Take(static_cast<double>(bytes), now)) return now;
  return bucket_.RepaidAt();
}

// ---------------------------------------------------------------------------------------
// ShapingRelay.

namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

constexpr size_t kChunkBytes = 16 * 1024;
constexpr int kSocketBufferBytes = 64 * 1024;
constexpr uint64_t kHoldSlackBytes = 64 * 1024;
constexpr uint64_t kUnlimitedRateHoldBytes = uint64_t{16} << 20;
constexpr uint64_t kMaxHoldBytes = uint64_t{64} << 20;

// How much one direction of one connection may hold: what is in flight on the modelled
// wire (rate * latency) plus a little, or two buckets' worth, whichever is more. Less
// would cap throughput below the rate; more would hide queues from the sender.
uint64_t HoldLimit(const ShapingOptions& options) {
  const double latency_s = std::chrono::duration<double>(options.latency).count();
  if (options.mbps <= 0) {
    return options.latency.count() > 0 ? kUnlimitedRateHoldBytes : kHoldSlackBytes;
  }
  const double bytes_per_second = options.mbps * 1e6 / 8;
  const double limit = std::max(2.0 * static_cast<double>(options.burst_bytes),
                                bytes_per_second * latency_s + kHoldSlackBytes);
  return static_cast<uint64_t>(std::min(limit, static_cast<double>(kMaxHoldBytes)));
}

// Small kernel buffers keep the queue in the sender's application; no Nagle, so the
// relay's chunking adds no delay of its own. Failures only weaken the model: ignored.
void TuneSocket(tcp::socket& socket) {
  error_code ignored;
  socket.set_option(asio::socket_base::send_buffer_size(kSocketBufferBytes), ignored);
  socket.set_option(asio::socket_base::receive_buffer_size(kSocketBufferBytes), ignored);
  socket.set_option(tcp::no_delay(true), ignored);
}

// What one direction of a relay shares across its connections.
struct DirectionShared {
  std::chrono::microseconds latency{0};
  uint64_t hold_limit = 0;
  std::unique_ptr<TokenBucket> bucket;  // null: unlimited
  std::atomic<uint64_t> bytes{0};
  // CutAfter: the bytes still to read before the cut; -1: none armed.
  std::atomic<int64_t> cut_in{-1};
};

// Of `n` bytes just read in a direction, how many to relay: all, unless an armed cut
// falls within them (then up to the cut, and `*cut` is set; the cut is taken).
size_t TakeCut(DirectionShared& shared, size_t n, bool* cut) {
  int64_t left = shared.cut_in.load(std::memory_order_acquire);
  while (left >= 0) {
    if (static_cast<uint64_t>(left) > n) {
      if (shared.cut_in.compare_exchange_weak(left, left - static_cast<int64_t>(n))) return n;
    } else if (shared.cut_in.compare_exchange_weak(left, -1)) {
      *cut = true;
      return static_cast<size_t>(left);
    }
  }
  return n;
}

class Connection;

// State shared by the relay's connections. Everything but the byte counters (and the
// buckets, which lock) is touched only by the io thread, or after it has been joined.
struct RelayState {
  asio::io_context io;  // first member: destroyed last, after all sockets and timers
  DirectionShared up;
  DirectionShared down;
  std::vector<tcp::endpoint> upstream;  // tried in order
  std::set<std::shared_ptr<Connection>> connections;
  std::atomic<uint64_t> accepted{0};
  std::atomic<uint64_t> cuts{0};
};

// One client connection and its upstream twin. Lives as long as a pending handler or
// RelayState::connections holds it; all methods run on the io thread.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(RelayState* state, tcp::socket client)
      : state_(state),
        client_(std::move(client)),
        upstream_(state->io),
        up_(state->io, client_, upstream_, state->up),
        down_(state->io, upstream_, client_, state->down) {}

  void Start() { ConnectTo(0); }

  // `reset`: abort both sides (RST) rather than close them in order.
  void Close(bool reset) {
    if (closed_) return;
    closed_ = true;
    error_code ignored;
    for (tcp::socket* socket : {&client_, &upstream_}) {
      if (reset && socket->is_open()) {
        socket->set_option(asio::socket_base::linger(true, 0), ignored);
      }
      socket->close(ignored);
    }
    for (Direction* d : {&up_, &down_}) {
      d->token_timer.cancel();
      d->hold_timer.cancel();
    }
    state_->connections.erase(shared_from_this());
  }

 private:
  struct Chunk {
    std::vector<char> data;
    SteadyTime deliver_at;
  };

  // Copies src -> dst. `reading` covers the read and the wait for tokens after it;
  // `writing` covers the hold until delivery and the write.
  struct Direction {
    Direction(asio::io_context& io, tcp::socket& src_socket, tcp::socket& dst_socket,
              DirectionShared& shared_state)
        : src(src_socket), dst(dst_socket), shared(shared_state), token_timer(io), hold_timer(io) {}
    tcp::socket& src;
    tcp::socket& dst;
    DirectionShared& shared;
    std::array<char, kChunkBytes> buffer;
    std::deque<Chunk> queue;
    uint64_t queued_bytes = 0;
    bool reading = false;
    bool writing = false;
    bool eof = false;   // src said EOF
    bool done = false;  // ... and everything before it was written, dst shut down
    bool cut = false;   // a cut was taken here: reset once the queue is written
    asio::steady_timer token_timer;
    asio::steady_timer hold_timer;
  };

  void ConnectTo(size_t index) {
    if (closed_) return;
    if (index >= state_->upstream.size()) {
      Close(/*reset=*/true);  // the client sees a refused upstream as a reset
      return;
    }
    const tcp::endpoint& endpoint = state_->upstream[index];
    error_code ec;
    upstream_.close(ec);
    upstream_.open(endpoint.protocol(), ec);
    if (ec) {
      ConnectTo(index + 1);
      return;
    }
    TuneSocket(upstream_);  // before connecting, so the window scale matches the buffer
    upstream_.async_connect(endpoint, [self = shared_from_this(), index](const error_code& ec) {
      if (self->closed_) return;
      if (ec) {
        self->ConnectTo(index + 1);
        return;
      }
      self->StartRead(self->up_);
      self->StartRead(self->down_);
    });
  }

  void StartRead(Direction& d) {
    if (closed_ || d.reading || d.eof || d.cut || d.queued_bytes >= d.shared.hold_limit) return;
    d.reading = true;
    d.src.async_read_some(asio::buffer(d.buffer),
                          [self = shared_from_this(), &d](const error_code& ec, size_t n) {
                            self->OnRead(d, ec, n);
                          });
  }

  void OnRead(Direction& d, const error_code& ec, size_t n) {
    if (closed_) return;
    if (ec) {
      d.reading = false;
      if (ec == asio::error::eof) {
        d.eof = true;
        Pump(d);  // shuts dst down once the queue has drained
      } else {
        Close(/*reset=*/true);
      }
      return;
    }
    n = TakeCut(d.shared, n, &d.cut);
    if (d.cut) state_->cuts.fetch_add(1, std::memory_order_relaxed);
    if (n == 0) {  // a cut armed at 0 bytes
      d.reading = false;
      Pump(d);
      return;
    }
    std::vector<char> data(d.buffer.begin(), d.buffer.begin() + static_cast<ptrdiff_t>(n));
    const SteadyTime sent_at = d.shared.bucket ? d.shared.bucket->Reserve(n) : SteadyTime::min();
    if (sent_at <= std::chrono::steady_clock::now()) {
      Enqueue(d, std::move(data), std::chrono::steady_clock::now());
      return;
    }
    // Not reading while waiting: the next bytes stay with the sender until these leave.
    d.token_timer.expires_at(sent_at);
    d.token_timer.async_wait([self = shared_from_this(), &d, data = std::move(data),
                              sent_at](const error_code&) mutable {
      if (self->closed_) return;
      self->Enqueue(d, std::move(data), sent_at);
    });
  }

  // The chunk left the modelled NIC at `sent_at`; it arrives one latency later.
  void Enqueue(Direction& d, std::vector<char> data, SteadyTime sent_at) {
    d.reading = false;
    d.queued_bytes += data.size();
    d.queue.push_back(Chunk{std::move(data), sent_at + d.shared.latency});
    StartRead(d);
    Pump(d);
  }

  void Pump(Direction& d) {
    if (closed_ || d.writing) return;
    if (d.queue.empty()) {
      if (d.cut) {
        Close(/*reset=*/true);
        return;
      }
      if (d.eof && !d.done) {
        d.done = true;
        error_code ignored;
        d.dst.shutdown(tcp::socket::shutdown_send, ignored);
        if (up_.done && down_.done) Close(/*reset=*/false);
      }
      return;
    }
    const Chunk& chunk = d.queue.front();
    d.writing = true;
    if (chunk.deliver_at > std::chrono::steady_clock::now()) {
      d.hold_timer.expires_at(chunk.deliver_at);
      d.hold_timer.async_wait([self = shared_from_this(), &d](const error_code&) {
        if (self->closed_) return;
        d.writing = false;
        self->Pump(d);
      });
      return;
    }
    // Counted before the write, so a peer that has read N bytes sees a count >= N.
    d.shared.bytes.fetch_add(chunk.data.size(), std::memory_order_relaxed);
    asio::async_write(d.dst, asio::buffer(chunk.data),
                      [self = shared_from_this(), &d](const error_code& ec, size_t n) {
                        const size_t size = d.queue.front().data.size();
                        if (ec) d.shared.bytes.fetch_sub(size - n, std::memory_order_relaxed);
                        if (self->closed_) return;
                        if (ec) {
                          self->Close(/*reset=*/true);
                          return;
                        }
                        d.writing = false;
                        d.queued_bytes -= size;
                        d.queue.pop_front();
                        self->StartRead(d);
                        self->Pump(d);
                      });
  }

  RelayState* const state_;  // owns this connection's io_context; outlives it
  tcp::socket client_;
  tcp::socket upstream_;
  Direction up_;    // client_ -> upstream_
  Direction down_;  // upstream_ -> client_
  bool closed_ = false;
};

void ConfigureDirection(const ShapingOptions& options, DirectionShared& shared) {
  shared.latency = options.latency;
  shared.hold_limit = HoldLimit(options);
  if (options.mbps > 0) {
    shared.bucket = std::make_unique<TokenBucket>(options.mbps * 1e6 / 8, options.burst_bytes);
  }
}

}  // namespace

class ShapingRelay::Impl {
 public:
  Impl() : acceptor_(state_.io), retry_timer_(state_.io), work_(state_.io.get_executor()) {}

  ~Impl() {
    state_.io.stop();
    if (thread_.joinable()) thread_.join();
    // The io thread is gone: nothing else touches the sockets now. Handlers still
    // pending hold connections; io_context's destructor releases them.
    error_code ignored;
    acceptor_.close(ignored);
    retry_timer_.cancel();
    const auto connections = std::move(state_.connections);
    state_.connections.clear();
    for (const auto& connection : connections) connection->Close(/*reset=*/false);
    // Run the handlers the closes aborted (each sees its connection closed and returns),
    // so connections die here rather than inside io_context's destructor.
    work_.reset();
    state_.io.restart();
    state_.io.poll();
  }

  absl::Status Init(const std::string& upstream, const LinkShaping& shaping,
                    const RelayOptions& options) {
    PS_ASSIGN_OR_RETURN(HostPort target, SplitHostPort(upstream, "upstream address"));
    error_code ec;
    const auto literal = asio::ip::make_address(target.host, ec);
    if (!ec) {
      state_.upstream.emplace_back(literal, target.port);
    } else {
      tcp::resolver resolver(state_.io);
      // No address_configured flag: a machine with only loopback still has ::1.
      const auto results = resolver.resolve(target.host, std::to_string(target.port),
                                            tcp::resolver::numeric_service, ec);
      if (ec) {
        return absl::UnavailableError(
            absl::StrCat("cannot resolve upstream '", upstream, "': ", ec.message()));
      }
      for (const auto& entry : results) state_.upstream.push_back(entry.endpoint());
      if (state_.upstream.empty()) {
        return absl::UnavailableError(absl::StrCat("upstream '", upstream, "' has no address"));
      }
    }
    ConfigureDirection(shaping.up, state_.up);
    ConfigureDirection(shaping.down, state_.down);

    const auto listen_ip = asio::ip::make_address(options.listen_host, ec);
    if (ec) {
      return absl::InvalidArgumentError(absl::StrCat("shaping relay for '", upstream,
                                                     "': listen host '", options.listen_host,
                                                     "' is not a literal IP address"));
    }
    const tcp::endpoint listen_at(listen_ip, options.listen_port);
    const auto fail = [&](std::string_view step) {
      return absl::UnavailableError(absl::StrCat("shaping relay for '", upstream, "': cannot ",
                                                 AsAbsl(step), " ", options.listen_host, " port ",
                                                 options.listen_port, ": ", ec.message()));
    };
    acceptor_.open(listen_at.protocol(), ec);
    if (ec) return fail("open a socket for");
    // Accepted sockets inherit these; they must be set before listen() to shape the
    // window the kernel advertises.
    error_code ignored;
    acceptor_.set_option(asio::socket_base::receive_buffer_size(kSocketBufferBytes), ignored);
    acceptor_.set_option(asio::socket_base::send_buffer_size(kSocketBufferBytes), ignored);
    acceptor_.bind(listen_at, ec);
    if (ec) return fail("bind");
    acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return fail("listen on");
    const tcp::endpoint local = acceptor_.local_endpoint(ec);
    if (ec) return fail("read the port of");
    address_ = listen_ip.is_v6() ? absl::StrCat("[", listen_ip.to_string(), "]:", local.port())
                                 : absl::StrCat(listen_ip.to_string(), ":", local.port());

    Accept();
    thread_ = std::thread([this] { state_.io.run(); });
    return absl::OkStatus();
  }

  const std::string& address() const { return address_; }
  uint64_t bytes_up() const { return state_.up.bytes.load(std::memory_order_relaxed); }
  uint64_t bytes_down() const { return state_.down.bytes.load(std::memory_order_relaxed); }
  uint64_t connections() const { return state_.accepted.load(std::memory_order_relaxed); }
  uint64_t cuts() const { return state_.cuts.load(std::memory_order_relaxed); }
  void CutAfter(RelayDirection direction, uint64_t bytes) {
    DirectionShared& d = direction == RelayDirection::kUp ? state_.up : state_.down;
    d.cut_in.store(static_cast<int64_t>(std::min<uint64_t>(bytes, INT64_MAX)),
                   std::memory_order_release);
  }

 private:
  void Accept() {
    acceptor_.async_accept([this](const error_code& ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (ec) {
        // Out of descriptors and the like: retry later rather than spin.
        retry_timer_.expires_after(std::chrono::milliseconds(10));
        retry_timer_.async_wait([this](const error_code& wait_ec) {
          if (!wait_ec) Accept();
        });
        return;
      }
      TuneSocket(socket);
      state_.accepted.fetch_add(1, std::memory_order_relaxed);
      auto connection = std::make_shared<Connection>(&state_, std::move(socket));
      state_.connections.insert(connection);
      connection->Start();
      Accept();
    });
  }

  RelayState state_;  // first: its io_context must outlive the members below
  tcp::acceptor acceptor_;
  asio::steady_timer retry_timer_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::string address_;
  std::thread thread_;
};

absl::StatusOr<std::unique_ptr<ShapingRelay>> ShapingRelay::Start(std::string upstream,
                                                                  LinkShaping shaping,
                                                                  RelayOptions options) {
  auto impl = std::make_unique<Impl>();
  PS_RETURN_IF_ERROR(impl->Init(upstream, shaping, options));
  return std::unique_ptr<ShapingRelay>(new ShapingRelay(std::move(impl)));
}

ShapingRelay::ShapingRelay(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShapingRelay::~ShapingRelay() = default;

std::string ShapingRelay::address() const { return impl_->address(); }
uint64_t ShapingRelay::bytes_up() const { return impl_->bytes_up(); }
uint64_t ShapingRelay::bytes_down() const { return impl_->bytes_down(); }
uint64_t ShapingRelay::connections() const { return impl_->connections(); }
void ShapingRelay::CutAfter(RelayDirection direction, uint64_t bytes) {
  impl_->CutAfter(direction, bytes);
}
uint64_t ShapingRelay::cuts() const { return impl_->cuts(); }

}  // namespace ps::net
