// HttpEndpoint: a minimal HTTP/1.1 server for one read-only text resource (a shard's or
// a trainer's Prometheus metrics, docs/metrics.md), built so that idle, slow or half-sent
// connections cannot block it: one Boost.Asio thread, every socket operation
// asynchronous, a deadline per connection, a cap on the request head and on the number
// of open connections (a new connection evicts the oldest when the cap is reached), and
// `Connection: close` after every response.
//
// ParseHttpRequestHead and FindHttpHeadEnd are the parser of the untrusted request
// bytes, pure functions (fuzz target tests/fuzz/http_request_fuzz.cc).
//
// Ownership: the endpoint owns its thread, sockets and timers; the render callback is
// copied in and called on the endpoint's thread, so whatever it captures must outlive
// Stop() (or the destructor).
// Thread safety: Start(), Stop(), port() and stats() may be called from any thread,
// concurrently; Stop() must not be called from inside the render callback.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace ps::net {

// ---------------------------------------------------------------------------------------
// Request parsing (pure).

// The request line and header fields of one HTTP/1.x request, as sent.
struct HttpRequestHead {
  // The method token, case-sensitive ("GET").
  std::string method;
  // The path of the request target, starting with '/', without the query ("/metrics").
  // An absolute-form target ("http://host:port/metrics") gives its path ("/" if none).
  std::string path;
  // The query after '?', without the '?'; empty when absent.
  std::string query;
  // HTTP-version "HTTP/<major>.<minor>" (single digits).
  int version_major = 1;
  int version_minor = 1;
  // Header fields in order: the name as sent, the value without surrounding blanks.
  std::vector<std::pair<std::string, std::string>> headers;

  // The value of the first field named `name` (case-insensitive), or nullptr.
  const std::string* FindHeader(std::string_view name) const;
};

// Where the request head in `bytes` ends: the offset just past the empty line that
// closes it (the first "\n\n" or "\n\r\n"), or std::string_view::npos when `bytes`
// holds no complete head yet. Searching starts at `from` (pass the previous length
// minus 2 to scan only what is new); the result does not depend on it as long as no
// head end lies before `from`.
size_t FindHttpHeadEnd(std::string_view bytes, size_t from = 0);

// Parses one complete request head: `bytes` up to and including the empty line that
// ends it (what FindHttpHeadEnd delimits; anything after that empty line is refused).
// Lines end in CRLF; one empty line before the request line is skipped (RFC 9112 2.2).
// INVALID_ARGUMENT, with a message that quotes no input bytes, for anything else: a
// bad method token, a target that is not origin-form or absolute-form http(s), a
// version other than HTTP/D.D, a bare CR or LF, control characters, obs-fold, a field
// without a name or colon, an HTTP/1.1 request without exactly one Host field.
absl::StatusOr<HttpRequestHead> ParseHttpRequestHead(std::string_view bytes);

// ---------------------------------------------------------------------------------------
// The server.

struct HttpEndpointOptions {
  // With the one-resource constructor: the path answered with the rendered body; any
  // other path gets 404.
  std::string path = "/metrics";
  // The Content-Type of that body (the Prometheus text exposition format by default).
  std::string content_type = "text/plain; version=0.0.4; charset=utf-8";
  // Time a connection has, from its accept, to send its whole request head and take the
  // whole response; it is closed when it runs out.
  std::chrono::milliseconds deadline{5000};
  // The largest request head (request line, fields, empty line); a longer one gets 431.
  size_t max_head_bytes = 8192;
  // Connections open at once at most (0 counts as 1); accepting one more first closes
  // the oldest (preferring one whose response is already written, then one still
  // sending its request, over one whose response is being written).
  size_t max_connections = 64;
};

// What the endpoint did since it was constructed (over every Start and Stop).
struct HttpEndpointStats {
  uint64_t accepted = 0;   // connections accepted
  uint64_t evicted = 0;    // closed to make room for a newer connection
  uint64_t timed_out = 0;  // closed at the deadline before their response was written
  uint64_t served = 0;     // 200 responses written (GET or HEAD of the path)
  uint64_t refused = 0;    // error responses written (400, 404, 405, 431, 505)
  uint64_t open = 0;       // connections open now
};

// One path the endpoint answers: `render` makes the body of a 200 response; called on
// the endpoint's thread, once per GET or HEAD of the path (while it runs, no other
// connection is served: keep it short). An exception it throws is answered with 500.
struct HttpResource {
  std::string path;
  std::string content_type;
  std::function<std::string()> render;
};

class HttpEndpoint {
 public:
  // Serves `resources` (any other path gets 404).
  explicit HttpEndpoint(std::vector<HttpResource> resources, HttpEndpointOptions options = {});
  // Serves one resource, `render` at options.path with options.content_type.
  explicit HttpEndpoint(std::function<std::string()> render, HttpEndpointOptions options = {});
  // Stops first.
  ~HttpEndpoint();
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  // Listens on `host` (an IP address or a name; "localhost" is 127.0.0.1) and `port`
  // (0: a free one) and serves until Stop(); returns the bound port. UNAVAILABLE when
  // the address cannot be resolved or bound; FAILED_PRECONDITION when already serving.
  absl::StatusOr<uint16_t> Start(const std::string& host, uint16_t port);
  // Closes the listener and every connection and joins the thread; returns once a
  // render in progress, if any, has finished. Idempotent; Start() may follow.
  void Stop();
  // The bound port, 0 when not serving.
  uint16_t port() const;
  HttpEndpointStats stats() const;

 private:
  class Running;
  struct Counters;

  const std::vector<HttpResource> resources_;
  const HttpEndpointOptions options_;
  const std::unique_ptr<Counters> counters_;
  mutable absl::Mutex mu_;
  std::unique_ptr<Running> running_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::net
