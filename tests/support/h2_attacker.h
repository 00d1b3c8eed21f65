// A hostile HTTP/2 client for tests and benchmarks (issue 45): it speaks the protocol
// below gRPC's client library, frame by frame, to do what an honest client never does
// (half-sent messages, floods of control frames, HPACK bombs, endless CONTINUATION
// frames), and opens bare TCP and TLS connections by the thousand.
//
// Loopback only: Target refuses any other address. Every call is bounded: each write
// and read by a timeout, each attack by a deadline, a stop predicate and counts of
// connections, frames and bytes. The attacks block their caller until one of those ends
// them; run them on a thread of their own and stop them through Control::stop.
//
// HPACK is encoded with literals only (no Huffman): literal header fields without
// indexing for requests, with incremental indexing where an attack needs the server's
// dynamic table. The server's header blocks are never decoded, only counted.
//
// Writing to a connection the server has closed must not kill the process: the first
// Connection::Open sets SIGPIPE to ignored if it was at its default.
#pragma once

#include <openssl/ssl.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ps::testing::h2 {

using std::chrono::milliseconds;

// ---- Frames (RFC 9113, section 6) ---------------------------------------------------

enum class FrameType : uint8_t {
  kData = 0,
  kHeaders = 1,
  kPriority = 2,
  kRstStream = 3,
  kSettings = 4,
  kPushPromise = 5,
  kPing = 6,
  kGoaway = 7,
  kWindowUpdate = 8,
  kContinuation = 9,
};
inline constexpr size_t kFrameTypes = 10;

// Flags.
inline constexpr uint8_t kEndStream = 0x1;   // DATA, HEADERS
inline constexpr uint8_t kAck = 0x1;         // SETTINGS, PING
inline constexpr uint8_t kEndHeaders = 0x4;  // HEADERS, CONTINUATION

// Error codes of RST_STREAM and GOAWAY (section 7).
enum class ErrorCode : uint32_t {
  kNoError = 0,
  kProtocolError = 1,
  kInternalError = 2,
  kFlowControlError = 3,
  kSettingsTimeout = 4,
  kStreamClosed = 5,
  kFrameSizeError = 6,
  kRefusedStream = 7,
  kCancel = 8,
  kCompressionError = 9,
  kConnectError = 10,
  kEnhanceYourCalm = 11,
  kInadequateSecurity = 12,
  kHttp11Required = 13,
};
// "ENHANCE_YOUR_CALM (11)"; unknown codes as "code 99".
std::string ErrorCodeName(uint32_t code);

// SETTINGS identifiers (section 6.5.2).
enum Setting : uint16_t {
  kHeaderTableSize = 1,
  kEnablePush = 2,
  kMaxConcurrentStreams = 3,
  kInitialWindowSize = 4,
  kMaxFrameSize = 5,
  kMaxHeaderListSize = 6,
};

inline constexpr std::string_view kClientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
inline constexpr size_t kFrameHeaderBytes = 9;
inline constexpr uint32_t kDefaultWindow = 65535;
inline constexpr uint32_t kDefaultMaxFrameSize = 16384;
inline constexpr uint32_t kMaxStreamId = 0x7fffffff;

// One frame on the wire: the 9-byte header and `payload` (at most 2^24 - 1 bytes).
std::string EncodeFrame(FrameType type, uint8_t flags, uint32_t stream, std::string_view payload);

// ---- HPACK (RFC 7541), literals only -------------------------------------------------

enum class Indexing {
  kWithout,      // 0000: literal header field without indexing
  kIncremental,  // 01: literal header field with incremental indexing (enters the table)
  kNever,        // 0001: literal header field never indexed
};
// The first index of the dynamic table (the static table has 61 entries): the entry
// inserted last.
inline constexpr uint32_t kFirstDynamicIndex = 62;
// An entry's size in the dynamic table: name + value + 32 (section 4.1).
inline constexpr size_t kHpackEntryOverhead = 32;

// An integer with an N-bit prefix (section 5.1); `first` holds the bits above the prefix.
void AppendHpackInteger(std::string* out, uint8_t first, int prefix_bits, uint64_t value);
// A header field with a literal (new) name and value, neither Huffman-coded.
std::string HpackLiteral(std::string_view name, std::string_view value,
                         Indexing indexing = Indexing::kWithout);
// An indexed header field: index 1..61 names the static table, 62.. the dynamic one.
std::string HpackIndexed(uint32_t index);
// A dynamic table size update (section 6.3).
std::string HpackTableSizeUpdate(uint32_t size);

// A gRPC request's header block.
struct Request {
  std::string path;  // "/ps.v1.WorkerService/Push"
  std::string authority = "127.0.0.1";
  std::string scheme = "http";
  // The whole value of the `authorization` header, "Bearer <token>" today; empty: the
  // header is left out.
  std::string authorization;
  std::vector<std::pair<std::string, std::string>> extra;  // after the standard ones
};
// :method POST, :scheme, :path, :authority, content-type application/grpc, te trailers,
// authorization (if any), then `extra`, each a literal without indexing.
std::string RequestHeaderBlock(const Request& request);

// The gRPC length prefix of a message of `length` bytes (uncompressed), and a whole
// message.
std::string GrpcPrefix(uint32_t length);
std::string GrpcMessage(std::string_view body);
// grpc.health.v1.HealthCheckRequest{service} serialized (field 1, length-delimited).
std::string HealthCheckRequestBytes(std::string_view service);

inline constexpr std::string_view kPushPath = "/ps.v1.WorkerService/Push";
inline constexpr std::string_view kHealthCheckPath = "/grpc.health.v1.Health/Check";
inline constexpr std::string_view kHealthWatchPath = "/grpc.health.v1.Health/Watch";

// ---- One connection -------------------------------------------------------------------

// Where to connect. Only loopback addresses (127.0.0.0/8, ::1) are accepted.
struct Target {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  bool tls = false;  // TLS through OpenSSL, ALPN h2, the server's certificate not checked
  // TLS only: a client certificate and its key (PEM files); empty: none.
  std::string tls_cert, tls_key;
};
absl::Status CheckLoopback(const Target& target);

// What the server sent on one connection.
struct Observed {
  uint64_t frames = 0;
  uint64_t bytes = 0;
  std::array<uint64_t, kFrameTypes> by_type{};
  uint64_t settings_acks = 0;  // ACKs of our SETTINGS
  uint64_t ping_acks = 0;
  uint64_t streams_ended = 0;  // HEADERS or DATA with END_STREAM: a call answered
  std::map<uint32_t, uint64_t> rst_codes;  // RST_STREAM error code -> count
  std::optional<uint32_t> goaway_code;     // the last GOAWAY's
  uint32_t goaway_last_stream = 0;
  std::string goaway_debug;  // its debug data (at most 256 bytes kept)
  bool closed = false;       // EOF, a reset or an error on the socket
  std::string close_reason;
};

// The server's SETTINGS as far as they matter to a client that sends.
struct PeerSettings {
  uint32_t header_table_size = 4096;
  uint32_t max_concurrent_streams = 0xffffffff;
  uint32_t initial_window_size = kDefaultWindow;
  uint32_t max_frame_size = kDefaultMaxFrameSize;
  uint32_t max_header_list_size = 0xffffffff;
  bool seen = false;  // a SETTINGS frame arrived
};

class Connection {
 public:
  struct Options {
    Target target;
    // Connecting (TCP and TLS handshake), and each blocking write and read.
    milliseconds timeout{3000};
    // Send the client preface and a SETTINGS frame of `settings`, then wait (up to
    // `timeout`) for the server's SETTINGS and ACK it. Off: a bare (TLS) connection.
    bool handshake = true;
    std::vector<std::pair<uint16_t, uint32_t>> settings = {{kEnablePush, 0}};
    // ACK the server's SETTINGS and PINGs whenever frames are read (as a client must).
    bool auto_ack = true;
    // Read what the server sends while writing (after the handshake). Off: a client
    // that never reads, whose unread answers back up at the server.
    bool read_while_writing = true;
    // A frame from the server announcing more than this closes the connection.
    uint32_t max_read_frame = 1u << 24;
    // Bytes queued for writing beyond which a write fails instead of queueing more.
    size_t max_queued = 64u << 20;
  };

  static absl::StatusOr<std::unique_ptr<Connection>> Open(Options options);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Queues `bytes` and writes them, reading (and acknowledging) what the server sends
  // meanwhile. Fails when the connection closed or nothing moved for `timeout`; bytes
  // still queued are written by the next call.
  absl::Status Write(std::string_view bytes);
  absl::Status WriteFrame(FrameType type, uint8_t flags, uint32_t stream, std::string_view payload);
  absl::Status Settings(const std::vector<std::pair<uint16_t, uint32_t>>& settings);
  absl::Status Ping(uint64_t data, bool ack = false);
  absl::Status RstStream(uint32_t stream, ErrorCode code);
  absl::Status WindowUpdate(uint32_t stream, uint32_t increment);
  absl::Status Goaway(uint32_t last_stream, ErrorCode code, std::string_view debug = "");
  // HEADERS carrying `block` whole, or split into HEADERS and CONTINUATION frames of the
  // server's maximum frame size. `end_headers` false leaves the block open.
  absl::Status Headers(uint32_t stream, std::string_view block, bool end_stream,
                       bool end_headers = true);
  absl::Status Continuation(uint32_t stream, std::string_view block, bool end_headers);

  // DATA within the server's flow-control windows (connection and stream): sends what
  // they allow now, in frames of the server's maximum size, and returns how many bytes
  // of `bytes` went out. END_STREAM goes with the last byte if `end_stream`.
  absl::StatusOr<size_t> DataNow(uint32_t stream, std::string_view bytes, bool end_stream);
  // The same, waiting (bounded by `wait`) for WINDOW_UPDATEs until all is sent.
  absl::StatusOr<size_t> Data(uint32_t stream, std::string_view bytes, bool end_stream,
                              milliseconds wait);

  // Reads and handles what the server sent for up to `wait` (0: what has arrived).
  // Fails once the connection is closed.
  absl::Status Poll(milliseconds wait);

  // The next client stream id (1, 3, 5, ...); 0 once the ids are spent.
  uint32_t NextStream();
  const Observed& observed() const { return observed_; }
  const PeerSettings& peer() const { return peer_; }
  // The server's send windows as this client sees them.
  int64_t connection_window() const { return connection_window_; }
  int64_t stream_window(uint32_t stream) const;
  // Whether the server reset `stream` (known for streams given DATA only).
  bool stream_reset(uint32_t stream) const;
  // Stream state is kept only for streams given DATA; forget one that is done.
  void ForgetStream(uint32_t stream) { streams_.erase(stream); }
  bool open() const { return !observed_.closed; }
  uint64_t bytes_written() const { return bytes_written_; }
  // Frames this connection encoded (WriteFrame and the helpers; not raw Write bytes).
  uint64_t frames_written() const { return frames_written_; }
  size_t queued() const { return out_.size() - out_at_; }

 private:
  explicit Connection(Options options) : options_(std::move(options)) {}
  absl::Status Connect();
  absl::Status TlsHandshake();
  absl::Status ClientHandshake();
  // One read of what is there; false when nothing was.
  absl::StatusOr<bool> ReadSome();
  absl::StatusOr<size_t> WriteSome();
  absl::Status Flush(milliseconds timeout);
  void HandleFrames();
  void Handle(FrameType type, uint8_t flags, uint32_t stream, std::string_view payload);
  void Close(std::string reason);
  // Waits for the socket (and TLS) to be readable, or writable if `want_write`.
  bool WaitIo(bool want_write, milliseconds wait);

  struct Stream {
    int64_t window = kDefaultWindow;
    bool reset = false;  // RST_STREAM from the server
    bool ended = false;  // END_STREAM from the server
  };
  Stream& StreamState(uint32_t stream);

  Options options_;
  int fd_ = -1;
  SSL_CTX* ssl_ctx_ = nullptr;
  SSL* ssl_ = nullptr;
  bool tls_wants_write_ = false;  // the last TLS read or write wants the socket writable
  std::string in_;
  size_t in_at_ = 0;
  std::string out_;
  size_t out_at_ = 0;
  uint64_t bytes_written_ = 0;
  uint64_t frames_written_ = 0;
  uint32_t next_stream_ = 1;
  int64_t connection_window_ = kDefaultWindow;
  std::map<uint32_t, Stream> streams_;
  PeerSettings peer_;
  Observed observed_;
};

// ---- Attacks ---------------------------------------------------------------------------

// When an attack ends: `stop` returning true (polled between steps), `duration` after it
// began, or its own counts.
struct Control {
  std::function<bool()> stop;
  milliseconds duration{5000};
};

// What an attack did and what the server answered, over all its connections.
struct Report {
  uint64_t connections = 0;          // opened (TCP, and TLS where asked)
  uint64_t connect_failures = 0;     // connects or handshakes that failed or timed out
  uint64_t connections_closed = 0;   // by the server (EOF, reset, error) while in use
  uint64_t streams = 0;              // streams opened
  uint64_t frames = 0;               // frames sent (all kinds, DATA included)
  uint64_t bytes = 0;                // bytes sent
  uint64_t data_bytes = 0;           // DATA payload bytes the windows let through
  uint64_t answered = 0;             // streams the server ended (END_STREAM)
  uint64_t ping_acks = 0, settings_acks = 0;
  std::map<uint32_t, uint64_t> rst_codes;     // RST_STREAM code -> count
  std::map<uint32_t, uint64_t> goaway_codes;  // GOAWAY code -> count
  std::vector<std::string> notes;             // the first distinct failures and events
  double seconds = 0;

  void Note(std::string note);
  // Adds a connection's observations (call once per connection).
  void Absorb(const Observed& observed);
  // Adds another attack's figures (several attacks run one after another), its notes
  // prefixed by `label`.
  void Add(const Report& other, std::string_view label = "");
  // One line: "connections 40, streams 1600, frames 2000, ..., RST ENHANCE_YOUR_CALM (11) x3".
  std::string Summary() const;
};

// Raises this process's RLIMIT_NOFILE soft limit to its hard limit; returns the new
// soft limit.
uint64_t RaiseOpenFileLimit();

// (a) Streams of requests to `request.path` whose gRPC length prefix announces
// `message_bytes` and whose bodies stop one byte short, then held open (SETTINGS and
// PINGs answered) until the control ends the attack. Bytes go out as the server's
// windows allow; a stream the server resets is not replaced.
struct HalfSentOptions {
  Target target;
  Request request{.path = std::string(kPushPath)};
  uint32_t connections = 1;
  uint32_t streams_per_connection = 40;
  uint32_t message_bytes = (8u << 20) - 1024;
  Control control;
};
Report HalfSentRequests(const HalfSentOptions& options);

// (b) TCP connections that never send a byte, up to `count` established, held until the
// control ends the attack. Raises RLIMIT_NOFILE first. Connects go out in batches of
// `batch`; a batch whose connects do not complete within `connect_timeout` is closed.
struct BareConnectionOptions {
  Target target;
  uint32_t count = 1000;
  uint32_t batch = 256;
  milliseconds connect_timeout{500};
  Control control;
};
Report BareConnections(const BareConnectionOptions& options);

// (c) TLS handshakes begun and abandoned, one connection after another.
enum class TlsFloodMode {
  kGarbage,      // 512 bytes that are no TLS record, then close
  kClientHello,  // a ClientHello, then close without waiting for the answer
  kNoCertificate,  // a whole handshake without a client certificate, then close
};
struct TlsFloodOptions {
  Target target;  // tls is implied
  TlsFloodMode mode = TlsFloodMode::kNoCertificate;
  uint32_t max_connections = 2000;
  double per_second = 0;  // pace; 0: as fast as they go
  Control control;
};
Report TlsHandshakeFlood(const TlsFloodOptions& options);

// (d) Control-frame floods, `frames_per_write` frames per write, on one connection after
// another (a new one when the server closes the last) up to `max_connections`.
enum class FloodKind {
  kSettings,      // SETTINGS frames (each must be ACKed)
  kPing,          // PINGs (each must be ACKed)
  kRapidReset,    // HEADERS of a request, then RST_STREAM(CANCEL) at once, on new streams
  kWindowUpdate,  // WINDOW_UPDATE of 1 on the connection
};
struct FloodOptions {
  Target target;
  FloodKind kind = FloodKind::kPing;
  Request request{.path = std::string(kPushPath)};  // kRapidReset's requests
  uint32_t max_connections = 16;
  uint64_t max_frames = 1000000;
  uint32_t frames_per_write = 64;
  double frames_per_second = 0;  // pace; 0: as fast as they go
  // Read (and so let the server's ACKs through) between writes; off: never read, so
  // the server's answers back up.
  bool read_replies = true;
  Control control;
};
Report Flood(const FloodOptions& options);

// (e) HPACK bombs, one request after another on new streams (and new connections when
// the server closes one), up to `max_streams` and `max_bytes` sent.
enum class HpackKind {
  // `headers` literal headers of `header_bytes` each in one block, over HEADERS and
  // CONTINUATION frames.
  kManyLargeHeaders,
  // Each connection's first block enters one header of about `header_bytes` into the
  // dynamic table; every block then references it `references` times (1 byte each).
  kIndexedReferences,
  // One header whose value is `header_bytes` long.
  kOversizedHeader,
};
struct HpackOptions {
  Target target;
  HpackKind kind = HpackKind::kIndexedReferences;
  Request request{.path = std::string(kPushPath)};
  uint32_t header_bytes = 4000;
  uint32_t headers = 100;
  uint32_t references = 16000;
  uint32_t max_streams = 10000;
  uint32_t max_connections = 64;
  uint64_t max_bytes = 256u << 20;
  Control control;
};
Report HpackBomb(const HpackOptions& options);

// (e) A request's HEADERS without END_HEADERS, followed by CONTINUATION frames that
// never end the block: literal headers of up to `frame_bytes` each, or empty frames.
// Up to `max_bytes` per connection, on up to `max_connections` connections.
struct ContinuationOptions {
  Target target;
  Request request{.path = std::string(kPushPath)};
  uint32_t frame_bytes = 16384;
  bool empty_frames = false;
  uint64_t max_bytes = 64u << 20;
  uint32_t max_connections = 4;
  Control control;
};
Report ContinuationFlood(const ContinuationOptions& options);

// (f) grpc.health.v1.Health/Watch streams (without credentials unless the request has
// them), each request sent whole with END_STREAM, never read beyond what the windows
// let the server send, held until the control ends the attack.
struct HealthWatchOptions {
  Target target;
  std::string authorization;  // empty: none
  std::string service;        // the watched service name
  uint32_t connections = 4;
  uint32_t streams_per_connection = 1000;
  Control control;
};
Report HealthWatches(const HealthWatchOptions& options);

// (f) grpc.health.v1.Health/Check calls with a `body_bytes` service name, `concurrent`
// in flight on as many connections, each sent within the server's windows; a new one
// starts when one is answered or reset, up to `max_calls`.
struct HealthCheckBodyOptions {
  Target target;
  std::string authorization;
  uint32_t body_bytes = 8000000;
  uint32_t concurrent = 4;
  uint64_t max_calls = 1000;
  Control control;
};
Report HealthCheckBodies(const HealthCheckBodyOptions& options);

}  // namespace ps::testing::h2
