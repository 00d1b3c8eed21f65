// The byte stream under a TCP data-plane connection (docs/data-plane.md, section 3,
// "TLS."): a TCP socket, or TLS over one (Boost.Asio's ssl::stream on OpenSSL). Both ends
// of the plane (server/transport/tcp, worker_lib/transport/tcp) read and write frames
// through a DataStream with Asio's composed operations (async_read, async_write) and
// never see which of the two it is; only connecting, the handshake and the peer's
// certificate differ. Internal: Asio and OpenSSL types, for this project's two planes.
//
// TLS here is TLS 1.2 or 1.3 (OpenSSL's defaults for ciphers), as the gRPC ports serve:
// - the shard's context (ServerTlsContext) serves --tls-cert/--tls-key and, with a CA
//   (--tls-ca), requires a client certificate that CA signed;
// - the worker's (ClientTlsContext) verifies the shard's certificate against
//   ClientCredentials::tls_ca, and presents tls_cert/tls_key when given; ExpectServer
//   names the server as gRPC does (tls_server_name, else the host dialled): SNI for a
//   DNS name, and the certificate must match it (a DNS name, or an IP address SAN).
//
// Thread safety: as the socket's (one read and one write in flight at a time, on the
// socket's executor), but get_executor(), which any thread may call.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <boost/asio/buffer.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/write.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/credentials.h"

namespace ps::net {

using TlsContext = boost::asio::ssl::context;

// The shard's data port context: its certificate chain and key (PEM text, the control
// port's), and when `ca_pem` is not empty, client certificates verified against it and
// required. INVALID_ARGUMENT naming what OpenSSL could not take.
absl::StatusOr<std::shared_ptr<TlsContext>> ServerTlsContext(std::string_view cert_pem,
                                                             std::string_view key_pem,
                                                             std::string_view ca_pem);
// A worker's: `c.tls()` must hold. Reads the CA bundle, and the client certificate and
// key when given (errors name the file, as the gRPC channel's credentials do).
absl::StatusOr<std::shared_ptr<TlsContext>> ClientTlsContext(const core::ClientCredentials& c);

class DataStream {
 public:
  using Socket = boost::asio::ip::tcp::socket;
  using TlsStream = boost::asio::ssl::stream<Socket>;
  using executor_type = Socket::executor_type;

  // Plaintext over `socket` until StartTls.
  explicit DataStream(Socket socket)
      : executor_(socket.get_executor()), stream_(std::in_place_index<0>, std::move(socket)) {}

  // From now on TLS under `context` (which must outlive the stream), before any byte was
  // read or written: the handshake (AsyncHandshake) comes next. Allocates OpenSSL's state
  // and Asio's record buffers (2 x 17 KiB), which a plaintext stream does not have.
  void StartTls(TlsContext& context);
  bool tls() const { return stream_.index() == 1; }

  // The client's expectation of the server's certificate (after StartTls): `name`, a DNS
  // name (also sent as SNI) or an IP address (with or without brackets).
  absl::Status ExpectServer(std::string_view name);

  template <typename Handler>
  void AsyncHandshake(boost::asio::ssl::stream_base::handshake_type type, Handler&& handler) {
    std::get<1>(stream_).async_handshake(type, std::forward<Handler>(handler));
  }
  // After a failed handshake: why the peer's certificate was refused ("certificate verify
  // failed: unable to get local issuer certificate"), or empty when it was not that.
  std::string VerifyFailure();
  // After a handshake: the common name of the peer's verified certificate, if it
  // presented one with exactly one common name.
  std::optional<std::string> PeerCommonName();

  // The TCP socket underneath (options, shutdown, close, waiting for readability).
  Socket& socket() { return tls() ? std::get<1>(stream_).next_layer() : std::get<0>(stream_); }
  // The socket's executor, kept apart from the stream: other threads post to it (a
  // connection's Close) while its own thread may be starting TLS.
  executor_type get_executor() const { return executor_; }

  // Reading (docs/data-plane.md, section 3, "Reading ahead"). A read of at most kStageBytes (a
  // frame's header, its meta, a small body) asks the socket for all it holds up to
  // kStageBytes and keeps the rest for the reads after it, so that a run of small frames
  // (a batch of ANSWERs, a compressed slice's header and meta) costs one system call,
  // not one per field. A longer read takes what is kept first and reads the rest straight
  // into its buffers.
  static constexpr size_t kStageBytes = 8 * 1024;

  // From now on reads go through the read-ahead buffer (allocated at the first such read);
  // until then every read is exact, so that a peer not yet admitted costs no buffer.
  void ReadAhead() { read_ahead_ = true; }

  // Fills `into` now, without waiting, when that can be done: from what was read ahead,
  // topped up on plaintext by one non-blocking read when `into` is at most kStageBytes
  // (after ReadAhead). False, with nothing taken, otherwise (the caller then reads with
  // AsyncReadExactly; an error or the peer's end is for that read to report), and after
  // kMaxReadsNow in a row without an AsyncReadExactly between: a caller that handles
  // what ReadNow gives at once then goes through its executor, so the other connections
  // of its thread are served and its stack stays shallow.
  static constexpr uint32_t kMaxReadsNow = 64;
  bool ReadNow(boost::asio::mutable_buffer into);

  // Reads all of `into` (one or two buffers), then calls `handler(ec, bytes)` as Asio's
  // asynchronous operations do (never from within this call). What was read ahead comes
  // first. Then a rest of at most kStageBytes is read through the read-ahead buffer; a
  // longer rest straight into `into` as asio::async_read would, with two differences
  // that matter for a frame's body: each read asks for all that is left (Asio's own
  // conditions stop at 64 KiB), and on plaintext the kernel wakes the read only once what
  // is left (at most kMaxReadLowWater) is queued (SO_RCVLOWAT), so that one wake-up and
  // one read move a 256 KiB slice instead of one for each burst of segments. Below
  // kMinReadLowWater left, the mark is the usual 1 byte. Every read of a plaintext stream
  // goes through here or sets the mark itself (SetReadLowWater(1)): a mark above what the
  // peer sends would never wake the read. Under TLS (whole records) the mark stays 1.
  static constexpr size_t kMinReadLowWater = 16 * 1024;
  static constexpr size_t kMaxReadLowWater = 256 * 1024;
  using ReadBuffers = std::array<boost::asio::mutable_buffer, 2>;
  template <typename Handler>
  void AsyncReadExactly(boost::asio::mutable_buffer into, Handler&& handler) {
    AsyncReadExactly(ReadBuffers{into, boost::asio::mutable_buffer()},
                     std::forward<Handler>(handler));
  }
  template <typename Handler>
  void AsyncReadExactly(ReadBuffers into, Handler&& handler) {
    ReadExactly(std::move(into), std::forward<Handler>(handler));
  }
  // Any number of buffers (a scatter read of several bodies), as above.
  using ReadList = std::vector<boost::asio::mutable_buffer>;
  template <typename Handler>
  void AsyncReadExactly(ReadList into, Handler&& handler) {
    ReadExactly(std::move(into), std::forward<Handler>(handler));
  }
  // What was read ahead, copied into `into`'s front (advancing it); the bytes taken. For a
  // caller that reads the rest with async_read_some itself, in parts it handles as each
  // fills (setting the mark with SetReadLowWater, as AsyncReadExactly does).
  size_t TakeReadAhead(std::span<boost::asio::mutable_buffer> into) {
    reads_now_ = 0;
    return TakeStaged(into);
  }

  // Writes all of `buffers` (a gather list of any length), then calls `handler(ec, bytes)`:
  // asio::async_write, but each write offers all that is left, where Asio's own conditions
  // stop at 64 KiB, so a batch of slices goes in as few system calls as the socket's
  // buffer takes.
  template <typename Buffers, typename Handler>
  void AsyncWriteAll(const Buffers& buffers, Handler&& handler) {
    boost::asio::async_write(*this, buffers, Unwritten{boost::asio::buffer_size(buffers)},
                             std::forward<Handler>(handler));
  }
  // SO_RCVLOWAT of `bytes` clamped as above, at most `most` (nothing when it is that
  // already); a failed setsockopt is ignored, as the reads work either way. A read that
  // takes several bodies of one frame (a SLICES) may wait for up to kMaxFrameReadLowWater
  // of it: one wake-up for the frame rather than one per body (the kernel caps the mark
  // at half its largest receive buffer, and grows the buffer to hold it).
  static constexpr size_t kMaxFrameReadLowWater = 2 * 1024 * 1024;
  void SetReadLowWater(size_t bytes, size_t most = kMaxReadLowWater);

  // Asio's AsyncReadStream and AsyncWriteStream, for async_read and async_write.
  template <typename Buffers, typename Handler>
  void async_read_some(const Buffers& buffers, Handler&& handler) {
    if (TlsStream* s = std::get_if<1>(&stream_)) {
      s->async_read_some(buffers, std::forward<Handler>(handler));
    } else {
      std::get<0>(stream_).async_read_some(buffers, std::forward<Handler>(handler));
    }
  }
  template <typename Buffers, typename Handler>
  void async_write_some(const Buffers& buffers, Handler&& handler) {
    if (TlsStream* s = std::get_if<1>(&stream_)) {
      s->async_write_some(buffers, std::forward<Handler>(handler));
    } else {
      std::get<0>(stream_).async_write_some(buffers, std::forward<Handler>(handler));
    }
  }

 private:
  template <typename Buffers, typename Handler>
  void ReadExactly(Buffers into, Handler&& handler) {
    reads_now_ = 0;
    const size_t total = boost::asio::buffer_size(into);
    const size_t took = TakeStaged(into);
    const size_t left = total - took;
    if (left == 0) {
      boost::asio::post(executor_, [h = std::forward<Handler>(handler), total]() mutable {
        h(boost::system::error_code(), total);
      });
    } else if (left <= kStageBytes && read_ahead_) {
      Fill(StagedRead<Buffers, std::decay_t<Handler>>{this, std::move(into), total,
                                                      std::forward<Handler>(handler)});
    } else {
      boost::asio::async_read(*this, into, Remaining{this, left},
                              [h = std::forward<Handler>(handler), took](
                                  const boost::system::error_code& ec, size_t n) mutable {
                                h(ec, took + n);
                              });
    }
  }

  // AsyncReadExactly's read of a short rest: into the read-ahead buffer, then taken.
  template <typename Buffers, typename Handler>
  struct StagedRead {
    DataStream* stream;
    Buffers into;  // what is left to fill
    size_t total;
    Handler handler;
    void operator()(const boost::system::error_code& ec, size_t n) {
      stream->stage_end_ += n;
      stream->TakeStaged(into);
      const size_t left = boost::asio::buffer_size(into);
      if (ec || left == 0) return handler(ec, total - left);
      stream->Fill(std::move(*this));
    }
  };
  template <typename Buffers, typename Handler>
  void Fill(StagedRead<Buffers, Handler>&& op) {
    PrepareStage();
    SetReadLowWater(1);
    async_read_some(boost::asio::buffer(stage_.get() + stage_end_, kStageBytes - stage_end_),
                    std::move(op));
  }
  // Copies what was read ahead into `into`'s front, advancing it; the bytes taken.
  size_t TakeStaged(std::span<boost::asio::mutable_buffer> into);
  // The read-ahead buffer allocated, its bytes moved to its front.
  void PrepareStage();

  // AsyncReadExactly's completion condition: the bytes left, with the mark set to them.
  struct Remaining {
    DataStream* stream;
    size_t total;
    size_t operator()(const boost::system::error_code& ec, size_t done) const {
      if (ec || done >= total) return 0;
      stream->SetReadLowWater(total - done);
      return total - done;
    }
  };

  // AsyncWriteAll's completion condition: the bytes left.
  struct Unwritten {
    size_t total;
    size_t operator()(const boost::system::error_code& ec, size_t done) const {
      return ec || done >= total ? 0 : total - done;
    }
  };

  const executor_type executor_;
  std::variant<Socket, TlsStream> stream_;
  int read_low_water_ = 1;  // the socket's SO_RCVLOWAT as last set
  // What was read ahead: stage_[stage_begin_, stage_end_) (allocated at the first read
  // through it).
  bool read_ahead_ = false;
  uint32_t reads_now_ = 0;  // ReadNow's successes since the last AsyncReadExactly
  std::unique_ptr<char[]> stage_;
  size_t stage_begin_ = 0;
  size_t stage_end_ = 0;
};

}  // namespace ps::net
