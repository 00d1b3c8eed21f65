#include "server/transport/tcp/backend.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "net/address.h"
#include "net/data_stream_internal.h"
#include "net/tcp_options.h"
#include "server/server_settings.h"
#include "server/spare_descriptor.h"
#include "server/transport/tcp/connection.h"
#include "spdlog/spdlog.h"

namespace ps::server::transport::tcp {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

// After an accept fails (no descriptors, no memory), the next one waits this long: the
// pending connection stays in the backlog rather than the loop spinning.
constexpr auto kAcceptRetry = std::chrono::milliseconds(10);

std::string HostPort(const asio::ip::address& address, uint16_t port) {
  return address.is_v6() ? absl::StrCat("[", address.to_string(), "]:", port)
                         : absl::StrCat(address.to_string(), ":", port);
}

}  // namespace

Options OptionsFrom(const ServerOptions& o, const ConnectionLimits& limits) {
  Options t;
  t.host = o.host;
  t.port = o.data_port;
  t.threads = o.data_threads;
  // Server::Start resolved -1 (auto); a backend started otherwise keeps the kernel's.
  t.tcp_rto_min = std::max(o.tcp_rto_min, std::chrono::milliseconds(0));
  t.max_body_bytes = o.max_message_bytes;
  t.idle_timeout = std::chrono::duration_cast<core::Duration>(o.max_connection_idle);
  t.read_timeout = std::chrono::duration_cast<core::Duration>(o.request_read_timeout);
  t.limits = limits;
  return t;
}

class Backend::Impl final : public Hub {
 public:
  Impl(const Options& options, ShardFront* front, core::Clock* clock)
      : options_(options),
        front_(front),
        clock_(clock),
        table_(options.limits),
        contexts_(MakeContexts(options.threads)),
        acceptor_(contexts_[0]->io),
        retry_(acceptor_.get_executor()) {}

  ~Impl() override { Stop(); }

  absl::Status Open() {
    if (!options_.tls_cert_pem.empty()) {
      PS_ASSIGN_OR_RETURN(tls_, net::ServerTlsContext(options_.tls_cert_pem, options_.tls_key_pem,
                                                      options_.tls_ca_pem));
    }
    PS_ASSIGN_OR_RETURN(const asio::ip::address address,
                        net::ResolveHost(options_.host, "data plane listen address"));
    const tcp::endpoint endpoint(address, options_.port);
    boost::system::error_code ec;
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat("data plane: cannot listen on ",
                                                 HostPort(address, options_.port), ": ",
                                                 ec.message()));
    }
    // Where the kernel cannot set the timeout, the shard does not start: the operator
    // asked for it.
    if (const absl::Status st = net::SetTcpRtoMin(acceptor_.native_handle(), options_.tcp_rto_min);
        !st.ok()) {
      return absl::Status(st.code(), absl::StrCat("data plane: --tcp-rto-min-ms ",
                                                  options_.tcp_rto_min.count() / 1000, ": ",
                                                  st.message()));
    }
    port_ = acceptor_.local_endpoint().port();
    Accept();
    for (size_t i = 0; i < contexts_.size(); ++i) {
      contexts_[i]->thread = std::thread([io = &contexts_[i]->io, i] {
        core::NameThisThread(absl::StrCat("ps-data-", i));
        io->run();
      });
    }
    return absl::OkStatus();
  }

  uint16_t port() const { return port_; }

  Stats stats() const {
    Stats s;
    s.accepted = accepted_.load();
    s.refused = refused_.load();
    s.admitted = admitted_.load();
    for (size_t i = 0; i < s.closed.size(); ++i) s.closed[i] = closed_[i].load();
    absl::MutexLock lock(&mu_);
    s.open = connections_.size();
    return s;
  }

  void Stop() {
    if (stopping_.exchange(true)) return;
    asio::post(acceptor_.get_executor(), [this] {
      boost::system::error_code ec;
      acceptor_.close(ec);
      retry_.cancel();
    });
    std::vector<std::shared_ptr<Connection>> open;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [id, c] : connections_) open.push_back(c);
    }
    for (const std::shared_ptr<Connection>& c : open) c->Close();
    open.clear();
    // With the acceptor and every connection closed nothing re-arms: the threads run
    // what is left (the last handlers free each connection) and return.
    for (const std::unique_ptr<Context>& c : contexts_) c->work.reset();
    for (const std::unique_ptr<Context>& c : contexts_) {
      if (c->thread.joinable()) c->thread.join();
    }
    // Each closed connection left the map; none may outlive the io_context.
    absl::flat_hash_map<ConnectionTable::Id, std::shared_ptr<Connection>> left;
    {
      absl::MutexLock lock(&mu_);
      left.swap(connections_);
    }
  }

  // Hub
  ShardFront* front() override { return front_; }
  const Options& options() const override { return options_; }
  net::TlsContext* tls() override { return tls_.get(); }
  void Admitted(ConnectionTable::Id id, const std::string& peer,
                const std::string& identity) override {
    admitted_.fetch_add(1, std::memory_order_relaxed);
    CloseAll(table_.Proven(peer, identity, clock_->Now()));
  }
  void ClosedFor(CloseReason reason) override { Count(reason); }
  void Abusive(ConnectionTable::Id id) override {
    // The connection itself closes after its GOAWAY; the table penalizes its source.
    Count(CloseReason::kUnprovenBytes);
    std::vector<ConnectionTable::Victim> victims =
        table_.Abusive(id, CloseReason::kUnprovenBytes, clock_->Now());
    std::erase_if(victims, [id](const ConnectionTable::Victim& v) { return v.id == id; });
    CloseAll(victims);
  }
  void Closed(ConnectionTable::Id id) override {
    table_.Closed(id);
    std::shared_ptr<Connection> gone;  // dropped outside the lock (its caller holds it too)
    absl::MutexLock lock(&mu_);
    if (auto it = connections_.find(id); it != connections_.end()) {
      gone = std::move(it->second);
      connections_.erase(it);
    }
  }

 private:
  void Accept() {
    // Each connection lives on one thread's io_context, taken in turn: its handlers run
    // where its socket's readiness is seen, with no hand-off between threads.
    Context& next = *contexts_[next_context_++ % contexts_.size()];
    acceptor_.async_accept(next.io, [this](const boost::system::error_code& ec,
                                                          tcp::socket socket) {
      if (stopping_.load()) return;
      if (ec) {
        if (ec == asio::error::operation_aborted) return;
        if (ec.category() == boost::system::system_category() &&
            SpareDescriptor::OutOfDescriptors(ec.value())) {
          if (Exhausted(ec)) return Accept();  // one pending connection dropped: next
        } else {
          spdlog::warn("shard {}: data plane accept failed: {}", front_->shard()->shard_id(),
                       ec.message());
        }
        retry_.expires_after(kAcceptRetry);
        retry_.async_wait([this](const boost::system::error_code& e) {
          if (!e && !stopping_.load()) Accept();
        });
        return;
      }
      Admit(std::move(socket));
      Accept();
    });
  }

  // Out of descriptors (the acceptor's handler): unproven connections give theirs up,
  // oldest first, and the pending connection is taken with the spare and reset, so its
  // client hears at once and the backlog drains (as on the gRPC ports, listener.cc).
  // Whether a connection was dropped.
  bool Exhausted(const boost::system::error_code& ec) {
    CloseAll(table_.ShedUnproven(SpareDescriptor::kShedUnproven));
    const bool dropped = spare_.DropPending(acceptor_.native_handle());
    Count(CloseReason::kDescriptors);
    const uint64_t n = ++exhausted_;  // the acceptor's handler only
    // The 1st, 2nd, 4th, 8th, ... at warn: an exhausted process logs a few lines.
    spdlog::log(std::has_single_bit(n) ? spdlog::level::warn : spdlog::level::debug,
                "shard {}: data port out of file descriptors ({}): a new connection was "
                "closed at once ({} so far)",
                front_->shard()->shard_id(), ec.message(), n);
    return dropped;
  }

  // The table decides whether `socket` stays and whom it evicts.
  void Admit(tcp::socket socket) {
    boost::system::error_code ec;
    const tcp::endpoint remote = socket.remote_endpoint(ec);
    if (ec) return;  // gone already
    const std::string source = remote.address().to_string();
    std::string peer = HostPort(remote.address(), remote.port());
    ConnectionTable::Admission admission = table_.Open(source, peer, clock_->Now());
    CloseAll(admission.evict);
    if (!admission.accepted) {
      refused_.fetch_add(1, std::memory_order_relaxed);
      Count(admission.refused);
      socket.close(ec);
      return;
    }
    accepted_.fetch_add(1, std::memory_order_relaxed);
    // Open() showed that the kernel takes it.
    net::SetTcpRtoMin(socket.native_handle(), options_.tcp_rto_min).IgnoreError();
    const core::Duration proof_timeout =
        admission.probation ? options_.limits.probation_timeout : options_.limits.proof_timeout;
    auto connection = std::make_shared<Connection>(this, std::move(socket), admission.id,
                                                   std::move(peer), proof_timeout);
    {
      absl::MutexLock lock(&mu_);
      connections_.emplace(admission.id, connection);
    }
    connection->Start();
    // Stop() closes what its look at the map found; one admitted after it is closed here.
    if (stopping_.load()) connection->Close();
  }

  // Closes the connections the table named (they are forgotten there already).
  void CloseAll(const std::vector<ConnectionTable::Victim>& victims) {
    for (const ConnectionTable::Victim& v : victims) {
      std::shared_ptr<Connection> c;
      {
        absl::MutexLock lock(&mu_);
        auto it = connections_.find(v.id);
        if (it != connections_.end()) c = it->second;
      }
      if (c != nullptr) {
        Count(v.reason);
        spdlog::debug("shard {}: data connection from {} closed ({})",
                      front_->shard()->shard_id(), v.source, CloseReasonName(v.reason));
        c->Close();
      }
    }
  }

  const Options options_;
  ShardFront* const front_;
  core::Clock* const clock_;
  std::shared_ptr<net::TlsContext> tls_;  // null: plaintext
  ConnectionTable table_;
  SpareDescriptor spare_;  // the acceptor's handler only
  uint64_t exhausted_ = 0;  // accepts that found no descriptor (the acceptor's handler only)
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> accepted_{0}, refused_{0}, admitted_{0};
  std::array<std::atomic<uint64_t>, static_cast<size_t>(CloseReason::kCount)> closed_{};

  void Count(CloseReason reason) {
    if (const auto i = static_cast<size_t>(reason); i < closed_.size()) {
      closed_[i].fetch_add(1, std::memory_order_relaxed);
    }
  }

  mutable absl::Mutex mu_;
  // The open connections, owned here until they close: a connection waiting for answers
  // the tarpit holds has no operation in flight to keep it.
  absl::flat_hash_map<ConnectionTable::Id, std::shared_ptr<Connection>> connections_
      ABSL_GUARDED_BY(mu_);

  // One io_context per thread (--data-threads of them), each run by its thread alone:
  // a connection's handlers are serialized by running on one thread, and a completion
  // is handled by the thread whose epoll saw it (one io_context run by several threads
  // hands each completion to another thread: two context switches per read).
  struct Context {
    asio::io_context io{1};
    std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work{
        asio::make_work_guard(io)};
    std::thread thread;
  };
  static std::vector<std::unique_ptr<Context>> MakeContexts(uint32_t threads) {
    std::vector<std::unique_ptr<Context>> out;
    for (uint32_t i = 0; i < std::max<uint32_t>(threads, 1); ++i) {
      out.push_back(std::make_unique<Context>());
    }
    return out;
  }

  // Last: destroyed first, with the handlers still queued (and the connections they hold)
  // while the table and the map above are alive.
  std::vector<std::unique_ptr<Context>> contexts_;
  tcp::acceptor acceptor_;  // on contexts_[0]; its handlers and retry_'s run there only
  asio::steady_timer retry_;
  size_t next_context_ = 0;  // the acceptor's handler only
  uint16_t port_ = 0;
};

Backend::Backend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Backend::~Backend() { Stop(); }

absl::StatusOr<std::unique_ptr<Backend>> Backend::Start(const Options& options, ShardFront* front,
                                                        core::Clock* clock) {
  auto impl = std::make_unique<Impl>(options, front, clock);
  PS_RETURN_IF_ERROR(impl->Open());
  return std::unique_ptr<Backend>(new Backend(std::move(impl)));
}

uint16_t Backend::port() const { return impl_->port(); }
Stats Backend::stats() const { return impl_->stats(); }
void Backend::Stop() { impl_->Stop(); }

std::string Backend::ServingLine() const {
  const Options& o = impl_->options();
  return absl::StrCat("TCP data plane on ", server::HostPort(o.host, port()), " (", o.threads,
                      " threads)");
}

BackendScrape Backend::Collect(const ShardStats& /*shard*/,
                               std::span<const Membership::State> /*states*/) const {
  const Stats s = stats();
  using Type = BackendFamily::Type;
  BackendScrape out;
  out.families.push_back(BackendFamily::One("ps_data_connections_accepted_total",
                             "Connections the TCP data port took (within its bounds)",
                             Type::kCounter, static_cast<double>(s.accepted)));
  out.families.push_back(BackendFamily::One("ps_data_connections_refused_total",
                             "Connections the TCP data port closed at accept (proven ones fill it; "
                             "over a source's or the port's unproven bound, the oldest unproven "
                             "connection is closed instead)",
                             Type::kCounter, static_cast<double>(s.refused)));
  out.families.push_back(BackendFamily::One("ps_data_connections_admitted_total",
                             "Data connections whose handshake proved a worker's data session",
                             Type::kCounter, static_cast<double>(s.admitted)));
  out.families.push_back(BackendFamily::One("ps_data_connections_open", "Connections open on the TCP data port",
                             Type::kGauge, static_cast<double>(s.open)));
  BackendFamily closed{"ps_data_connections_closed_total",
                       "Connections the TCP data port closed or refused by its rules, by reason "
                       "(docs/connections.md)",
                       Type::kCounter, {}};
  for (size_t i = 0; i < s.closed.size(); ++i) {
    closed.series.push_back({{{"reason", std::string(CloseReasonName(static_cast<CloseReason>(i)))}},
                             static_cast<double>(s.closed[i])});
  }
  out.families.push_back(std::move(closed));
  return out;
}

std::string Backend::TotalsLine(const ShardStats& /*shard*/) const {
  const Stats s = stats();
  uint64_t closed = 0;
  for (uint64_t n : s.closed) closed += n;
  return absl::StrCat("TCP data plane: ", s.accepted, " connections taken, ", s.admitted,
                      " admitted, ", s.refused, " refused at accept, ", closed, " closed by its rules");
}

}  // namespace ps::server::transport::tcp
