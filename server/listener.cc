#include "server/listener.h"

#include <arpa/inet.h>
#include <linux/tcp.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace ps::server {
namespace {

constexpr auto kSweepEvery = std::chrono::milliseconds(250);
// How often the bytes of unproven connections are read (TCP_INFO): a flood of control
// frames (PINGs at 25 MB/s) must meet the 256 KiB bound before gRPC's own policing
// closes the connection without a penalty (too_many_pings took about 125 ms).
constexpr auto kByteCheckEvery = std::chrono::milliseconds(50);
// How often the bytes of connections on probation (from a penalized source) are read:
// a flood's reconnection is caught after about 10 ms of frames, not gRPC's 125 ms.
// They are few (max_probation_per_source each), so the check is cheap.
constexpr auto kProbationCheckEvery = std::chrono::milliseconds(10);
// Connections accepted in one go before the loop sweeps and polls again.
constexpr int kAcceptBatch = 256;

// What the connection on `fd` received so far (TCP_INFO); 0 when unknown.
uint64_t ReceivedBytes(int fd) {
  tcp_info info{};
  socklen_t len = sizeof(info);
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0 ||
      len < offsetof(tcp_info, tcpi_bytes_received) + sizeof(info.tcpi_bytes_received)) {
    return 0;
  }
  return info.tcpi_bytes_received;
}

#if defined(__SANITIZE_THREAD__)
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
#endif

// The inode of the socket on `fd`, 0 when `fd` is closed or not a socket. `fd` may have
// been closed by gRPC and its number reused by any thread since: that is what the inode
// tells apart. ThreadSanitizer models a descriptor number as memory, so this fstat on a
// number another thread just reused (popen in a test) reads as a race; the read is
// exempted from it, the only one of its kind.
uint64_t InodeOf(int fd) {
  struct stat st{};
#if defined(__SANITIZE_THREAD__)
  AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
#endif
  const int rc = ::fstat(fd, &st);
#if defined(__SANITIZE_THREAD__)
  AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
#endif
  if (rc != 0 || !S_ISSOCK(st.st_mode)) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

// The address of `sa` without its port, and gRPC's peer string for it ("ipv4:A:P",
// "ipv6:[A]:P"; IPv4-mapped IPv6 addresses as IPv4, as gRPC writes them).
std::pair<std::string, std::string> Describe(const sockaddr_storage& sa) {
  char text[INET6_ADDRSTRLEN] = {};
  if (sa.ss_family == AF_INET6) {
    const auto* a6 = reinterpret_cast<const sockaddr_in6*>(&sa);
    const uint16_t port = ntohs(a6->sin6_port);
    if (IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr)) {
      in_addr v4{};
      std::memcpy(&v4, &a6->sin6_addr.s6_addr[12], 4);
      ::inet_ntop(AF_INET, &v4, text, sizeof(text));
      return {text, absl::StrCat("ipv4:", text, ":", port)};
    }
    ::inet_ntop(AF_INET6, &a6->sin6_addr, text, sizeof(text));
    return {text, absl::StrCat("ipv6:[", text, "]:", port)};
  }
  const auto* a4 = reinterpret_cast<const sockaddr_in*>(&sa);
  ::inet_ntop(AF_INET, &a4->sin_addr, text, sizeof(text));
  return {text, absl::StrCat("ipv4:", text, ":", ntohs(a4->sin_port))};
}

// Closes `fd` with a reset: the client learns at once, and no TIME_WAIT stays here.
void Reset(int fd) {
  linger l{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  ::close(fd);
}

absl::StatusOr<int> BindOne(const addrinfo& ai, uint16_t port, bool dual_stack) {
  sockaddr_storage addr{};
  std::memcpy(&addr, ai.ai_addr, ai.ai_addrlen);
  if (addr.ss_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = htons(port);
  } else {
    reinterpret_cast<sockaddr_in*>(&addr)->sin_port = htons(port);
  }
  const int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  const int one = 1;
  // SO_REUSEADDR lets a restarted shard take its port while old connections sit in
  // TIME_WAIT. No SO_REUSEPORT: a second process could then share the port.
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (addr.ss_family == AF_INET6) {
    const int v6only = dual_stack ? 0 : 1;
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof(v6only));
  }
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), ai.ai_addrlen) != 0 ||
      ::listen(fd, SOMAXCONN) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(std::strerror(err));
  }
  return fd;
}

uint16_t BoundPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                    : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

}  // namespace

uint64_t RaiseOpenFileLimit() {
  rlimit l{};
  if (::getrlimit(RLIMIT_NOFILE, &l) != 0) return 0;
  if (l.rlim_cur < l.rlim_max) {
    rlimit raised = l;
    raised.rlim_cur = l.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) l = raised;
  }
  return l.rlim_cur == RLIM_INFINITY ? UINT64_MAX : static_cast<uint64_t>(l.rlim_cur);
}

absl::StatusOr<std::unique_ptr<Listener>> Listener::Bind(const std::string& host, uint16_t port,
                                                         const ConnectionLimits& limits,
                                                         std::string name, core::Clock* clock) {
  // "" and the wildcard addresses listen on every interface, IPv6 and IPv4 on one
  // dual-stack socket where the system has IPv6 (as gRPC does).
  const bool wildcard = host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
  std::string node = host;
  if (node.size() > 2 && node.front() == '[' && node.back() == ']') node = node.substr(1, node.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_ADDRCONFIG;
  hints.ai_family = wildcard && host != "0.0.0.0" ? AF_INET6 : AF_UNSPEC;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(wildcard && host != "0.0.0.0" ? nullptr : node.c_str(), "0", &hints, &res);
  if (rc != 0 && wildcard && host != "0.0.0.0") {
    hints.ai_family = AF_INET;  // no IPv6 here
    ::getaddrinfo("0.0.0.0", "0", &hints, &res);
  } else if (rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host, ": ", gai_strerror(rc)));
  }
  std::vector<int> fds;
  std::string errors;
  uint16_t bound = port;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    absl::StatusOr<int> fd = BindOne(*ai, bound, wildcard);
    if (!fd.ok()) {
      absl::StrAppend(&errors, errors.empty() ? "" : "; ", fd.status().message());
      continue;
    }
    fds.push_back(*fd);
    if (bound == 0) bound = BoundPort(*fd);  // the others take the same port
  }
  if (res != nullptr) ::freeaddrinfo(res);
  if (fds.empty()) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", host, ":", port, " (", errors,
                                               ")"));
  }
  return std::unique_ptr<Listener>(new Listener(std::move(fds), bound, limits, std::move(name), clock));
}

Listener::Listener(std::vector<int> fds, uint16_t port, const ConnectionLimits& limits,
                   std::string name, core::Clock* clock)
    : listen_fds_(std::move(fds)), port_(port), name_(std::move(name)), clock_(clock), table_(limits) {
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
}

Listener::~Listener() {
  Stop();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void Listener::Start(std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor) {
  acceptor_ = std::move(acceptor);
  thread_ = std::thread([this] { Loop(); });
}

void Listener::Stop() {
  if (stopping_.exchange(true)) return;
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
  for (int fd : listen_fds_) ::close(fd);
}

void Listener::Loop() {
  std::vector<pollfd> polled;
  for (int fd : listen_fds_) polled.push_back({fd, POLLIN, 0});
  polled.push_back({wake_fd_, POLLIN, 0});
  auto next_sweep = clock_->Now();
  auto next_byte_check = next_sweep;
  while (!stopping_.load()) {
    const bool probation = table_.stats().probation > 0;
    const int n = ::poll(polled.data(), polled.size(),
                         static_cast<int>((probation ? kProbationCheckEvery : kByteCheckEvery).count()));
    if (stopping_.load()) break;
    if (n > 0) {
      for (size_t i = 0; i + 1 < polled.size(); ++i) {
        if (polled[i].revents != 0) AcceptFrom(polled[i].fd);
      }
    }
    if (clock_->Now() >= next_sweep) {
      Sweep();
      next_sweep = clock_->Now() + kSweepEvery;
    }
    if (probation) CheckBytes(table_.OnProbation(), table_.limits().max_probation_bytes);
    if (clock_->Now() >= next_byte_check) {
      CheckBytes(table_.Unproven(), table_.limits().max_unproven_bytes);
      next_byte_check = clock_->Now() + kByteCheckEvery;
    }
  }
}

void Listener::AcceptFrom(int listen_fd) {
  for (int i = 0; i < kAcceptBatch; ++i) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      Admit(listen_fd, fd);
      continue;
    }
    switch (errno) {
      case EINTR:
      case ECONNABORTED:
      case EPROTO:
        continue;
      default: {
        const int err = errno;
        if (!SpareDescriptor::OutOfDescriptors(err)) return;  // EAGAIN: nothing pending
        // No descriptor for it: take the pending connection with the spare one and
        // close it, so the client hears at once and the backlog drains.
        Sweep();  // connections gRPC closed free theirs
        // Unauthenticated connections give theirs up first (gRPC releases them once it
        // sees the shutdown), so the next client finds one.
        CloseVictims(table_.ShedUnproven(SpareDescriptor::kShedUnproven));
        const bool dropped = spare_.DropPending(listen_fd);
        Count(CloseReason::kDescriptors,
              absl::StrCat("out of file descriptors (", std::strerror(err),
                           "): a new connection was closed at once"));
        if (!dropped) return;  // the backlog is empty or nothing can be taken now
        continue;
      }
    }
  }
}

void Listener::Admit(int listen_fd, int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);  // already gone
    return;
  }
  auto [source, peer] = Describe(addr);
  ConnectionTable::Admission a = table_.Open(source, peer, clock_->Now());
  if (!a.accepted && a.refused == CloseReason::kFull) {
    // Connections gRPC closed may still be counted: look, and try once more.
    Sweep();
    a = table_.Open(source, peer, clock_->Now());
  }
  CloseVictims(a.evict);
  if (!a.accepted) {
    Reset(fd);
    Count(a.refused,
          a.refused == CloseReason::kPenalized
              ? absl::StrCat("refused a connection from ", source,
                             ": penalized for an abusive connection, and its connections on "
                             "probation this second are used up")
              : absl::StrCat("refused a connection from ", source, ": ", table_.stats().proven,
                             " authenticated connections fill the table (--max-connections)"));
    return;
  }
  // What gRPC's own listener sets on the sockets it accepts: no Nagle (small frames,
  // window updates and acknowledgements go out at once, not after a delayed ACK).
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  {
    absl::MutexLock lock(&mu_);
    handed_[a.id] = Handed{fd, InodeOf(fd)};
  }
  accepted_.fetch_add(1, std::memory_order_relaxed);
  grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters p;
  p.listener_fd = listen_fd;
  p.fd = fd;
  acceptor_->HandleNewConnection(&p);  // gRPC owns fd from here
}

void Listener::Proven(const std::string& peer, std::string_view identity) {
  std::vector<ConnectionTable::Victim> victims = table_.Proven(peer, identity, clock_->Now());
  if (!victims.empty()) CloseVictims(victims);
}

void Listener::Abusive(const std::string& peer, CloseReason reason) {
  CloseVictims(table_.Abusive(peer, reason, clock_->Now()));
}

void Listener::CloseVictims(const std::vector<ConnectionTable::Victim>& victims) {
  for (const ConnectionTable::Victim& v : victims) {
    Handed h;
    {
      absl::MutexLock lock(&mu_);
      auto it = handed_.find(v.id);
      if (it == handed_.end()) continue;
      h = it->second;
      handed_.erase(it);
    }
    // The descriptor may have been closed by gRPC and its number reused since: act only
    // while it still names the socket handed out.
    if (h.inode != 0 && InodeOf(h.fd) == h.inode) ::shutdown(h.fd, SHUT_RDWR);
    Count(v.reason, absl::StrCat("closed a connection from ", v.source, ": ",
                                 std::string(CloseReasonName(v.reason))));
  }
}

size_t Listener::CloseAll() {
  absl::flat_hash_map<ConnectionTable::Id, Handed> handed;
  {
    absl::MutexLock lock(&mu_);
    handed.swap(handed_);
  }
  size_t closed = 0;
  for (const auto& [id, h] : handed) {
    // As CloseVictims: only while the descriptor still names the socket handed out.
    if (h.inode == 0 || InodeOf(h.fd) != h.inode) continue;
    ::shutdown(h.fd, SHUT_RDWR);
    ++closed;
  }
  closed_[static_cast<size_t>(CloseReason::kShutdown)].fetch_add(closed);
  return closed;
}

void Listener::Sweep() {
  std::vector<ConnectionTable::Id> gone;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = handed_.begin(); it != handed_.end();) {
      if (InodeOf(it->second.fd) != it->second.inode) {
        gone.push_back(it->first);
        handed_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  for (ConnectionTable::Id id : gone) table_.Closed(id);
  CloseVictims(table_.Expired(clock_->Now()));
  spare_.Refill();
}

void Listener::CheckBytes(const std::vector<ConnectionTable::Id>& ids, uint64_t limit) {
  // What unproven connections received: a flood of calls the credential check refuses
  // (each costs the shard a stream's processing), or of control frames, shows as bytes
  // without a proof.
  for (ConnectionTable::Id id : ids) {
    int fd;
    {
      absl::MutexLock lock(&mu_);
      auto it = handed_.find(id);
      if (it == handed_.end()) continue;
      fd = it->second.fd;
    }
    if (ReceivedBytes(fd) > limit) {
      CloseVictims(table_.Abusive(id, CloseReason::kUnprovenBytes, clock_->Now()));
    }
  }
}

void Listener::Count(CloseReason reason, std::string_view detail) {
  const uint64_t n = closed_[static_cast<size_t>(reason)].fetch_add(1) + 1;
  // The 1st, 2nd, 4th, 8th, ... of each reason at warn (a flood logs a few lines).
  spdlog::log(std::has_single_bit(n) ? spdlog::level::warn : spdlog::level::debug,
              "{} {}: {} ({} so far)", name_, port_, detail, n);
}

ListenerStats Listener::stats() const {
  ListenerStats s;
  s.accepted = accepted_.load();
  for (size_t i = 0; i < s.closed.size(); ++i) s.closed[i] = closed_[i].load();
  s.table = table_.stats();
  return s;
}

}  // namespace ps::server
