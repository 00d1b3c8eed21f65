// Loopback sockets for the fuzz targets that play one end of a real connection
// (data_connection: a worker against the shard's TCP backend; data_channel: a shard
// against the worker's TCP channel). Non-blocking POSIX sockets driven by poll() with a
// deadline, so that a peer that says nothing, or never closes, fails the harness's
// bound instead of hanging the fuzzer; every send also reads what the peer writes
// meanwhile, so that neither side blocks on a full socket buffer. ReadDataFrame reads one
// frame of the TCP data plane (net/data_frame.h) from such a socket.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "net/data_frame.h"

namespace ps::fuzz {

using SteadyClock = std::chrono::steady_clock;

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { Close(); }
  Socket(Socket&& other) noexcept
      : fd_(std::exchange(other.fd_, -1)), clean_end_(other.clean_end_) {}
  Socket& operator=(Socket&& other) noexcept {
    if (this != &other) {
      Close();
      fd_ = std::exchange(other.fd_, -1);
      clean_end_ = other.clean_end_;
    }
    return *this;
  }

  bool ok() const { return fd_ >= 0; }
  int fd() const { return fd_; }

  // A connection to 127.0.0.1:`port` by `deadline`, non-blocking; not ok() when it
  // fails (errno says why). Connecting does not block, so no signal (libFuzzer's alarm)
  // interrupts it; a moment without a free local port (EADDRNOTAVAIL, while closed
  // connections wait in TIME_WAIT) is waited out until the deadline.
  static Socket Connect(uint16_t port, SteadyClock::time_point deadline) {
    while (true) {
      Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
      if (!s.ok()) return s;
      const sockaddr_in addr = Loopback(port);
      if (::connect(s.fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0 ||
          errno == EINPROGRESS || errno == EINTR) {
        if (!s.Wait(POLLOUT, deadline)) return Socket();
        int error = 0;
        socklen_t len = sizeof(error);
        if (::getsockopt(s.fd_, SOL_SOCKET, SO_ERROR, &error, &len) != 0) return Socket();
        if (error == 0) {
          s.Prepare();
          return s;
        }
        errno = error;
      }
      if ((errno != EADDRNOTAVAIL && errno != EAGAIN) || SteadyClock::now() >= deadline) {
        return Socket();
      }
      ::usleep(10000);
    }
  }

  // A listener on 127.0.0.1 with a port the kernel picks (`*port`); not ok() on failure.
  static Socket Listen(uint16_t* port) {
    Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!s.ok()) return s;
    sockaddr_in addr = Loopback(0);
    socklen_t len = sizeof(addr);
    if (::bind(s.fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::listen(s.fd_, 16) != 0 ||
        ::getsockname(s.fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return Socket();
    }
    *port = ntohs(addr.sin_port);
    return s;
  }

  // On a listener: the next connection, non-blocking; not ok() when none came by
  // `deadline`.
  Socket Accept(SteadyClock::time_point deadline) {
    while (true) {
      Socket s(::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC));
      if (s.ok()) {
        s.Prepare();
        return s;
      }
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return Socket();
      if (!Wait(POLLIN, deadline)) return Socket();
    }
  }

  // Sends all of `bytes` by `deadline`, appending whatever the peer writes meanwhile to
  // `in`. False when the deadline passed or the connection failed (the peer closed or
  // reset it: the rest is not sent) first.
  bool Send(std::string_view bytes, SteadyClock::time_point deadline, std::string* in) {
    bool ended = false;  // the peer's stream: once it ends, only room to write is awaited
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n > 0) {
        bytes.remove_prefix(static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
      if (!Wait(ended ? POLLOUT : POLLIN | POLLOUT, deadline)) return false;
      // After the peer's end, what it still reads of ours it reads; a reset fails the
      // next send.
      if (!ended) ended = Drain(in) == Drained::kEnd;
    }
    return true;
  }

  // Reads into `in` until it holds at least `n` bytes. False at the end of the stream,
  // on an error, or when the deadline passes first.
  bool ReadAtLeast(size_t n, std::string* in, SteadyClock::time_point deadline) {
    while (in->size() < n) {
      if (!Wait(POLLIN, deadline)) return false;
      if (Drain(in) == Drained::kEnd && in->size() < n) return false;
    }
    return true;
  }

  // Reads into `in` until the peer ends the stream (or resets the connection). False when
  // the deadline passes first.
  bool ReadToEnd(std::string* in, SteadyClock::time_point deadline) {
    while (true) {
      if (Drain(in) == Drained::kEnd) return true;
      if (!Wait(POLLIN, deadline)) return false;
    }
  }

  // Whether the last end of the stream ReadToEnd (or another read) saw was the peer's
  // orderly end (a FIN), not a reset or an error.
  bool ended_cleanly() const { return clean_end_; }

  // No more bytes from this end (the peer reads the end of the stream); reading goes on.
  void ShutdownWrite() {
    if (ok()) ::shutdown(fd_, SHUT_WR);
  }

  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  enum class Drained { kMore, kEnd };

  static sockaddr_in Loopback(uint16_t port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return addr;
  }

  void Prepare() {
    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
    const int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }

  // Reads what is there now. kEnd: the stream ended, was reset, or failed.
  Drained Drain(std::string* in) {
    char buf[16384];
    while (true) {
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n > 0) {
        in->append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Drained::kMore;
      clean_end_ = n == 0;
      return Drained::kEnd;
    }
  }

  // Whether `events` came before `deadline` (any error or hang-up counts as an event).
  bool Wait(short events, SteadyClock::time_point deadline) {
    while (true) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
      if (left.count() <= 0) return false;
      pollfd p{.fd = fd_, .events = events, .revents = 0};
      const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count() + 1, 1000)));
      if (r > 0) return true;
      if (r < 0 && errno != EINTR) return false;
    }
  }

  int fd_ = -1;
  bool clean_end_ = false;
};

// One frame of the data plane as it came: its header, meta and body.
struct DataFrame {
  net::FrameHeader header;
  std::string meta, body;
};

// The next whole frame from `sock` by `deadline` (bytes already read wait in
// `*buffered`, and what follows the frame stays there). False when the header does not
// parse or the stream ends, fails or stalls first.
inline bool ReadDataFrame(Socket& sock, std::string* buffered, DataFrame* frame,
                          SteadyClock::time_point deadline) {
  if (!sock.ReadAtLeast(net::kFrameHeaderBytes, buffered, deadline)) return false;
  auto h = net::ParseHeader(
      std::span<const char, net::kFrameHeaderBytes>(buffered->data(), net::kFrameHeaderBytes));
  if (!h.ok()) return false;
  const size_t size = net::kFrameHeaderBytes + h->meta_bytes + h->body_bytes;
  if (!sock.ReadAtLeast(size, buffered, deadline)) return false;
  frame->header = *h;
  frame->meta = buffered->substr(net::kFrameHeaderBytes, h->meta_bytes);
  frame->body = buffered->substr(net::kFrameHeaderBytes + h->meta_bytes, h->body_bytes);
  buffered->erase(0, size);
  return true;
}

}  // namespace ps::fuzz
