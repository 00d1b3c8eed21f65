#include "net/http_endpoint.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <exception>
#include <list>
#include <thread>

#include <boost/asio.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "net/address.h"

namespace ps::net {

// ---------------------------------------------------------------------------------------
// Parsing.

namespace {

// RFC 9110 5.6.2: token characters.
bool IsTchar(unsigned char c) {
  if (absl::ascii_isalnum(c)) return true;
  switch (c) {
    case '!': case '#': case '$': case '%': case '&': case '\'': case '*': case '+':
    case '-': case '.': case '^': case '_': case '`': case '|': case '~':
      return true;
    default:
      return false;
  }
}

bool IsToken(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(),
                                   [](char c) { return IsTchar(static_cast<unsigned char>(c)); });
}

// A visible ASCII character: what a request target may contain.
bool IsVchar(unsigned char c) { return c >= 0x21 && c <= 0x7e; }

// RFC 9110 5.5: field-vchar, SP, HTAB (obs-text allowed, control characters not).
bool IsFieldValueChar(unsigned char c) { return c == ' ' || c == '\t' || IsVchar(c) || c >= 0x80; }

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// (absl's string functions take absl::string_view, which is not std::string_view in the
// Debian build of abseil.)
bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return absl::ascii_tolower(static_cast<unsigned char>(x)) ==
                  absl::ascii_tolower(static_cast<unsigned char>(y));
         });
}

bool StartsWithIgnoreCase(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && EqualsIgnoreCase(s.substr(0, prefix.size()), prefix);
}

absl::Status Invalid(const char* what) {
  return absl::InvalidArgumentError(absl::StrCat("bad HTTP request head: ", what));
}

// Splits a request target into path and query (RFC 9112 3.2: origin-form, or
// absolute-form with an http or https scheme).
absl::Status ParseTarget(std::string_view target, HttpRequestHead* head) {
  if (target.empty()) return Invalid("empty request target");
  for (char c : target) {
    if (!IsVchar(static_cast<unsigned char>(c))) {
      return Invalid("request target with a control, blank or non-ASCII character");
    }
  }
  if (target.find('#') != std::string_view::npos) return Invalid("request target with a fragment");
  std::string_view rest = target;
  if (rest.front() != '/') {
    size_t scheme = 0;
    if (StartsWithIgnoreCase(rest, "http://")) {
      scheme = 7;
    } else if (StartsWithIgnoreCase(rest, "https://")) {
      scheme = 8;
    } else {
      return Invalid("request target neither origin-form nor absolute-form http(s)");
    }
    rest.remove_prefix(scheme);
    const size_t authority_end = rest.find_first_of("/?");
    if (authority_end == 0 || rest.empty()) return Invalid("absolute-form target without a host");
    rest.remove_prefix(std::min(authority_end, rest.size()));
  }
  const size_t question = rest.find('?');
  std::string_view path = rest.substr(0, question);
  head->path = path.empty() ? "/" : std::string(path);
  head->query = question == std::string_view::npos ? "" : std::string(rest.substr(question + 1));
  return absl::OkStatus();
}

absl::Status ParseRequestLine(std::string_view line, HttpRequestHead* head) {
  const size_t sp1 = line.find(' ');
  if (sp1 == std::string_view::npos) return Invalid("request line without blanks");
  const size_t sp2 = line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos) return Invalid("request line without a version");
  const std::string_view method = line.substr(0, sp1);
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  if (!IsToken(method)) return Invalid("method is not a token");
  head->method = std::string(method);
  if (absl::Status st = ParseTarget(target, head); !st.ok()) return st;
  if (version.size() != 8 || !version.starts_with("HTTP/") || !IsDigit(version[5]) ||
      version[6] != '.' || !IsDigit(version[7])) {
    return Invalid("version is not HTTP/<digit>.<digit>");
  }
  head->version_major = version[5] - '0';
  head->version_minor = version[7] - '0';
  return absl::OkStatus();
}

absl::Status ParseField(std::string_view line, HttpRequestHead* head) {
  if (line.front() == ' ' || line.front() == '\t') return Invalid("obsolete line folding");
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos) return Invalid("header field without a colon");
  const std::string_view name = line.substr(0, colon);
  if (!IsToken(name)) return Invalid("header field name is not a token");
  std::string_view value = line.substr(colon + 1);
  for (char c : value) {
    if (!IsFieldValueChar(static_cast<unsigned char>(c))) {
      return Invalid("header field value with a control character");
    }
  }
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
  head->headers.emplace_back(std::string(name), std::string(value));
  return absl::OkStatus();
}

}  // namespace

const std::string* HttpRequestHead::FindHeader(std::string_view name) const {
  for (const auto& [field, value] : headers) {
    if (EqualsIgnoreCase(field, name)) return &value;
  }
  return nullptr;
}

size_t FindHttpHeadEnd(std::string_view bytes, size_t from) {
  for (size_t i = bytes.find('\n', from); i != std::string_view::npos;
       i = bytes.find('\n', i + 1)) {
    if (i + 1 < bytes.size() && bytes[i + 1] == '\n') return i + 2;
    if (i + 2 < bytes.size() && bytes[i + 1] == '\r' && bytes[i + 2] == '\n') return i + 3;
  }
  return std::string_view::npos;
}

absl::StatusOr<HttpRequestHead> ParseHttpRequestHead(std::string_view bytes) {
  // RFC 9112 2.2: a server should ignore at least one empty line before the request
  // line. One only: a second would end the head for FindHttpHeadEnd.
  if (bytes.starts_with("\r\n")) bytes.remove_prefix(2);
  if (bytes.empty()) return Invalid("no request line");
  if (!bytes.ends_with("\r\n\r\n")) return Invalid("does not end with CRLF CRLF");
  // Every line of `lines` ends in CRLF; the final empty line is dropped.
  std::string_view lines = bytes.substr(0, bytes.size() - 2);
  HttpRequestHead head;
  bool first = true;
  while (!lines.empty()) {
    const size_t end = lines.find("\r\n");  // found: `lines` ends in CRLF
    const std::string_view line = lines.substr(0, end);
    lines.remove_prefix(end + 2);
    if (line.find_first_of("\r\n") != std::string_view::npos) return Invalid("bare CR or LF");
    if (line.empty()) return Invalid("bytes after the empty line that ends the head");
    absl::Status st = first ? ParseRequestLine(line, &head) : ParseField(line, &head);
    if (!st.ok()) return st;
    first = false;
  }
  if (head.version_major == 1 && head.version_minor >= 1) {
    const size_t hosts = std::count_if(head.headers.begin(), head.headers.end(), [](const auto& f) {
      return EqualsIgnoreCase(f.first, "host");
    });
    if (hosts != 1) return Invalid("an HTTP/1.1 request needs exactly one Host field");
  }
  return head;
}

// ---------------------------------------------------------------------------------------
// Serving.

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

// Bytes read and dropped after the response, before closing, so that the client sees
// the response rather than a reset (RFC 9112 9.6); bounded by the deadline too.
constexpr size_t kMaxDrainBytes = 64 * 1024;
// The pause before accepting again after an accept error (out of file descriptors):
// the pending connection stays in the backlog, and retrying at once would spin.
constexpr std::chrono::milliseconds kAcceptRetry{50};

std::string_view Reason(int code) {
  switch (code) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
  }
}

// A whole response; `head_only` (a HEAD request) leaves the body out but keeps its length.
std::string Response(int code, std::string_view content_type, std::string_view body,
                     bool head_only, std::string_view extra_fields = {}) {
  std::string out = absl::StrCat("HTTP/1.1 ", code, " ");
  out.append(Reason(code));
  out.append("\r\nContent-Type: ").append(content_type);
  out.append(absl::StrCat("\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n"));
  out.append(extra_fields).append("\r\n");
  if (!head_only) out.append(body);
  return out;
}

std::string ErrorResponse(int code, bool head_only, std::string_view extra_fields = {}) {
  return Response(code, "text/plain; charset=utf-8", std::string(Reason(code)) + "\n", head_only,
                  extra_fields);
}

}  // namespace

struct HttpEndpoint::Counters {
  std::atomic<uint64_t> accepted{0};
  std::atomic<uint64_t> evicted{0};
  std::atomic<uint64_t> timed_out{0};
  std::atomic<uint64_t> served{0};
  std::atomic<uint64_t> refused{0};
  std::atomic<uint64_t> open{0};
};

// One Start(): the io_context, its thread, the listener and the open connections. Every
// member but the port is touched only by the io thread while it runs, and by the
// destructor after joining it.
class HttpEndpoint::Running {
 public:
  Running(const std::vector<HttpResource>& resources, const HttpEndpointOptions& options,
          Counters* counters)
      : resources_(resources),
        options_(options),
        counters_(counters),
        acceptor_(io_),
        accept_retry_(io_) {}

  ~Running() {
    io_.stop();
    if (thread_.joinable()) thread_.join();
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    while (!connections_.empty()) {
      const std::shared_ptr<Connection> keep = connections_.front();
      keep->Close(Closed::kStopped);
    }
    // The handlers still queued hold the last references to their connections; the
    // io_context destroys them (members are destroyed in reverse order, io_ last).
  }

  Running(const Running&) = delete;
  Running& operator=(const Running&) = delete;

  absl::Status Listen(const std::string& host, uint16_t port) {
    PS_ASSIGN_OR_RETURN(const asio::ip::address address,
                        net::ResolveHost(host, "HTTP listen address"));
    const tcp::endpoint endpoint(address, port);
    boost::system::error_code ec;
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (!ec) port_ = acceptor_.local_endpoint(ec).port();
    if (ec) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", host, ":", port, ": ",
                                                 ec.message(), " (address in use or not local?)"));
    }
    Accept();
    thread_ = std::thread([this] { io_.run(); });
    return absl::OkStatus();
  }

  uint16_t port() const { return port_; }

 private:
  enum class Closed { kDone, kEvicted, kTimedOut, kStopped };

  class Connection : public std::enable_shared_from_this<Connection> {
   public:
    // Ordered by how willing we are to close it to make room: lower goes first.
    enum class State { kLingering = 0, kReading = 1, kWriting = 2, kClosed = 3 };

    Connection(Running* owner, tcp::socket socket)
        : owner_(owner), socket_(std::move(socket)), deadline_(owner->io_) {}

    State state() const { return state_; }

    // Arms the deadline and starts reading the request head. `self` is this connection's
    // place in the owner's list.
    void Start(std::list<std::shared_ptr<Connection>>::iterator self) {
      self_ = self;
      deadline_.expires_after(owner_->options_.deadline);
      deadline_.async_wait([this, keep = shared_from_this()](const boost::system::error_code& ec) {
        if (ec || state_ == State::kClosed) return;  // cancelled: closed already
        Close(state_ == State::kLingering ? Closed::kDone : Closed::kTimedOut);
      });
      Read();
    }

    // Closes the socket, cancels the timer and leaves the owner's list. Idempotent.
    void Close(Closed why) {
      if (state_ == State::kClosed) return;
      const bool answered = state_ == State::kLingering;
      state_ = State::kClosed;
      // Counted before the socket closes, so that a client that sees the close sees the
      // counts too.
      if (why == Closed::kEvicted) owner_->counters_->evicted.fetch_add(1);
      if (why == Closed::kTimedOut && !answered) owner_->counters_->timed_out.fetch_add(1);
      owner_->counters_->open.fetch_sub(1);
      boost::system::error_code ignored;
      deadline_.cancel();
      socket_.close(ignored);
      owner_->connections_.erase(self_);  // the caller holds a reference: no `delete this`
    }

   private:
    void Read() {
      const size_t limit = owner_->options_.max_head_bytes + 1;
      if (received_ == head_.size()) {
        head_.resize(std::min(limit, std::max<size_t>(1024, 2 * head_.size())));
      }
      socket_.async_read_some(
          asio::buffer(head_.data() + received_, head_.size() - received_),
          [this, keep = shared_from_this()](const boost::system::error_code& ec, size_t n) {
            if (state_ != State::kReading) return;
            if (ec) {
              Close(Closed::kDone);  // end of stream or error before a whole head
              return;
            }
            OnRead(n);
          });
    }

    void OnRead(size_t n) {
      const size_t before = received_;
      received_ += n;
      const std::string_view bytes(head_.data(), received_);
      const size_t end = FindHttpHeadEnd(bytes, before >= 2 ? before - 2 : 0);
      const size_t max = owner_->options_.max_head_bytes;
      if (end != std::string_view::npos && end <= max) {
        Respond(owner_->ResponseTo(ParseHttpRequestHead(bytes.substr(0, end))));
      } else if (end != std::string_view::npos || received_ > max) {
        Respond({ErrorResponse(431, false), false});
      } else {
        Read();
      }
    }

    void Respond(std::pair<std::string, bool> response) {
      state_ = State::kWriting;
      head_ = std::string();  // the head is no longer needed
      response_ = std::move(response.first);
      const bool ok = response.second;
      asio::async_write(socket_, asio::buffer(response_),
                        [this, ok, keep = shared_from_this()](const boost::system::error_code& ec,
                                                              size_t) {
                          if (state_ != State::kWriting) return;
                          if (ec) {
                            Close(Closed::kDone);
                            return;
                          }
                          (ok ? owner_->counters_->served : owner_->counters_->refused)
                              .fetch_add(1);
                          state_ = State::kLingering;
                          response_ = std::string();
                          boost::system::error_code ignored;
                          socket_.shutdown(tcp::socket::shutdown_send, ignored);
                          Drain();
                        });
    }

    // Reads and drops what the client still sends until it closes, the drain budget is
    // spent or the deadline passes.
    void Drain() {
      socket_.async_read_some(
          asio::buffer(drain_),
          [this, keep = shared_from_this()](const boost::system::error_code& ec, size_t n) {
            if (state_ != State::kLingering) return;
            drained_ += n;
            if (ec || drained_ > kMaxDrainBytes) {
              Close(Closed::kDone);
              return;
            }
            Drain();
          });
    }

    Running* const owner_;
    tcp::socket socket_;
    asio::steady_timer deadline_;
    State state_ = State::kReading;
    std::list<std::shared_ptr<Connection>>::iterator self_;
    // The request head as received so far: `received_` bytes of `head_`, which grows up
    // to max_head_bytes + 1 (one more, so that an oversized head shows).
    std::string head_;
    size_t received_ = 0;
    std::string response_;
    std::array<char, 512> drain_{};
    size_t drained_ = 0;
  };

  void Accept() {
    acceptor_.async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (ec) {
        accept_retry_.expires_after(kAcceptRetry);
        accept_retry_.async_wait([this](const boost::system::error_code& wait) {
          if (!wait) Accept();
        });
        return;
      }
      Admit(std::move(socket));
      Accept();
    });
  }

  // Makes room under the cap, then starts serving `socket`.
  void Admit(tcp::socket socket) {
    counters_->accepted.fetch_add(1);
    const size_t cap = std::max<size_t>(1, options_.max_connections);
    while (connections_.size() >= cap) {
      // The oldest of the most expendable kind (the list is oldest first).
      auto victim = connections_.begin();
      for (auto it = connections_.begin(); it != connections_.end(); ++it) {
        if ((*it)->state() < (*victim)->state()) victim = it;
      }
      const std::shared_ptr<Connection> keep = *victim;
      keep->Close(Closed::kEvicted);
    }
    auto connection = std::make_shared<Connection>(this, std::move(socket));
    connections_.push_back(connection);
    counters_->open.fetch_add(1);
    connection->Start(std::prev(connections_.end()));
  }

  // The response to a parsed (or refused) request head, and whether it is a 200.
  std::pair<std::string, bool> ResponseTo(const absl::StatusOr<HttpRequestHead>& head) {
    if (!head.ok()) return {ErrorResponse(400, false), false};
    const bool head_only = head->method == "HEAD";
    if (head->version_major != 1) return {ErrorResponse(505, head_only), false};
    const auto resource = std::find_if(resources_.begin(), resources_.end(),
                                       [&](const HttpResource& r) { return r.path == head->path; });
    if (resource == resources_.end()) return {ErrorResponse(404, head_only), false};
    if (head->method != "GET" && !head_only) {
      return {ErrorResponse(405, false, "Allow: GET, HEAD\r\n"), false};
    }
    std::string body;
    try {
      body = resource->render();
    } catch (const std::exception&) {
      return {ErrorResponse(500, head_only), false};
    }
    return {Response(200, resource->content_type, body, head_only), true};
  }

  // The HttpEndpoint's, which outlive this.
  const std::vector<HttpResource>& resources_;
  const HttpEndpointOptions& options_;
  Counters* const counters_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::steady_timer accept_retry_;
  // Open connections, oldest first.
  std::list<std::shared_ptr<Connection>> connections_;
  uint16_t port_ = 0;
  std::thread thread_;
};

HttpEndpoint::HttpEndpoint(std::vector<HttpResource> resources, HttpEndpointOptions options)
    : resources_(std::move(resources)),
      options_(std::move(options)),
      counters_(std::make_unique<Counters>()) {}

HttpEndpoint::HttpEndpoint(std::function<std::string()> render, HttpEndpointOptions options)
    : HttpEndpoint(std::vector<HttpResource>{{options.path, options.content_type, std::move(render)}},
                   options) {}

HttpEndpoint::~HttpEndpoint() { Stop(); }

absl::StatusOr<uint16_t> HttpEndpoint::Start(const std::string& host, uint16_t port) {
  absl::MutexLock lock(&mu_);
  if (running_ != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("HTTP endpoint already serving on port ", running_->port()));
  }
  auto running = std::make_unique<Running>(resources_, options_, counters_.get());
  if (absl::Status st = running->Listen(host, port); !st.ok()) return st;
  running_ = std::move(running);
  return running_->port();
}

void HttpEndpoint::Stop() {
  std::unique_ptr<Running> running;
  {
    absl::MutexLock lock(&mu_);
    running = std::move(running_);
  }
  running.reset();  // outside the lock: it waits for a render in progress
}

uint16_t HttpEndpoint::port() const {
  absl::MutexLock lock(&mu_);
  return running_ != nullptr ? running_->port() : 0;
}

HttpEndpointStats HttpEndpoint::stats() const {
  HttpEndpointStats s;
  s.accepted = counters_->accepted.load();
  s.evicted = counters_->evicted.load();
  s.timed_out = counters_->timed_out.load();
  s.served = counters_->served.load();
  s.refused = counters_->refused.load();
  s.open = counters_->open.load();
  return s;
}

}  // namespace ps::net
