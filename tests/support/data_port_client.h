// A raw client of a shard's TCP data port (docs/data-plane.md, section 3) for tests and
// `ps-bench hostile`: frames written with net/data_frame's encoders and read back in
// blocking POSIX calls with a timeout (the receive timeout, for sends as well), so that
// a shard that says nothing or stops reading ends a call instead of hanging it. It speaks the handshake when asked (with the right key or
// a forged one) and otherwise sends whatever bytes it is given: half headers, HELLOs of
// sessions that do not exist, headers claiming the largest body.
//
// A client may bind its own source address (another loopback address, 127.0.0.2 and
// up, as another host would be), so that a shard's per-source bounds apply to it apart
// from the honest workers on 127.0.0.1.
//
// Thread safety: one client per thread; the free functions are thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "net/data_frame.h"

struct ssl_ctx_st;
struct ssl_st;

namespace ps::testing {

// One frame as the client reads it.
struct DataFrame {
  net::FrameHeader header;
  std::string meta, body;
};

class DataPortClient {
 public:
  struct Options {
    std::string source;  // the source address to bind ("": the kernel's choice)
    std::chrono::milliseconds receive_timeout{5000};
  };
  // Connects to 127.0.0.1:`port` (connected() says whether that worked).
  explicit DataPortClient(uint16_t port) : DataPortClient(port, Options{}) {}
  DataPortClient(uint16_t port, const Options& options);
  ~DataPortClient() { Close(); }
  DataPortClient(const DataPortClient&) = delete;
  DataPortClient& operator=(const DataPortClient&) = delete;

  bool connected() const { return connected_; }
  // The TLS handshake, before anything else is sent: the shard's certificate verified
  // against `ca` (a PEM file) for 127.0.0.1, `cert` and `key` presented when given. ""
  // when it succeeded, else OpenSSL's reason. (Under TLS 1.3 a client certificate the
  // shard refuses shows at the first read, not here.) Every later call goes over TLS.
  std::string StartTls(const std::string& ca, const std::string& cert = "",
                       const std::string& key = "");
  // Whether the last handshake's CHALLENGE carried the proof of the key it was given.
  bool server_proved() const { return server_proved_; }
  void Close();

  // All of `bytes`; false when the connection refused them.
  bool Send(std::string_view bytes);
  // The next frame; UNAVAILABLE when the connection ends or nothing comes within the
  // receive timeout.
  absl::StatusOr<DataFrame> Read();
  // Whether the shard closed the connection (reads end, or it reset a connection that
  // sent more than it read), within the receive timeout.
  bool ClosedByShard();

  // The handshake under `session` (a Join's data session id) as `worker` of shard
  // `shard`, its proofs keyed by `key` (DataConnectionKey; a wrong one forges them).
  // Returns the ADMIT's meta, or what the shard answered instead as a status
  // (StatusOf).
  absl::StatusOr<net::AdmitMeta> Handshake(uint64_t session, uint32_t worker,
                                           const std::string& key, uint32_t shard = 0);

  // A GOAWAY, ANSWER or PULL_END as a status carrying its refusal's name:
  // "GOAWAY unknown_session: ...", and its kind (core::RefusalOf) when this build knows it.
  static absl::Status StatusOf(const DataFrame& f);

 private:
  bool ReadExactly(size_t n, std::string* out);

  int fd_ = -1;
  ssl_ctx_st* tls_ = nullptr;  // OpenSSL's SSL_CTX and SSL, after StartTls
  ssl_st* ssl_ = nullptr;
  bool connected_ = false;
  bool server_proved_ = false;
};

// The key of the proofs of a data connection under `session` with `secret` (a Join
// answer's) for the holder of `token` to shard `shard`: crypto::DataKey, or the secret
// itself without a token (mTLS only or --insecure).
std::string DataConnectionKey(std::string_view token, uint32_t shard, uint64_t session,
                              std::string_view secret);

// A HELLO frame under `session` as `worker`, its client nonce all 'x'.
std::string HelloFrame(uint64_t session, uint32_t worker);

}  // namespace ps::testing
