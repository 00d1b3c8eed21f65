// The fixture of the shard's TCP data plane tests (tcp_backend_test.cc, tcp_tls_test.cc):
// a real shard, front and tcp::Backend on a loopback port, and a scripted worker that
// writes and reads frames with net/data_frame's encoders over a blocking socket, in
// plaintext or TLS.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "aggregators/aggregator.h"
#include "codecs/codec.h"
#include "core/auth_proof.h"
#include "core/clock.h"
#include "core/layout.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "net/data_frame.h"
#include "server/shard.h"
#include "server/shard_front.h"
#include "server/transport/tcp/backend.h"

namespace ps::server::transport::tcp {

// One frame as the worker reads it.
struct Frame {
  net::FrameHeader header;
  std::string meta, body;
};

// A worker's end of a data connection, in blocking POSIX calls with a receive timeout,
// so that a shard that says nothing fails the test instead of hanging it; over TLS
// (OpenSSL's blocking calls on the same socket) after StartTls.
class ScriptedWorker {
 public:
  explicit ScriptedWorker(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    const timeval timeout{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~ScriptedWorker() { Close(); }

  bool connected() const { return connected_; }
  // Whether the last handshake's CHALLENGE carried the proof of the key it was given.
  bool server_proved() const { return server_proved_; }
  void Close() {
    if (ssl_ != nullptr) SSL_free(ssl_);
    if (tls_ != nullptr) SSL_CTX_free(tls_);
    ssl_ = nullptr;
    tls_ = nullptr;
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  // The TLS handshake, before anything else is sent: the shard's certificate verified
  // against `ca` (a PEM file), `cert` and `key` presented when given. "" when it
  // succeeded, else OpenSSL's reason. (Under TLS 1.3 a client certificate the shard
  // refuses shows at the first read, not here.)
  std::string StartTls(const std::string& ca, const std::string& cert = "",
                       const std::string& key = "") {
    tls_ = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_verify(tls_, SSL_VERIFY_PEER, nullptr);
    if (SSL_CTX_load_verify_locations(tls_, ca.c_str(), nullptr) != 1 ||
        (!cert.empty() &&
         (SSL_CTX_use_certificate_chain_file(tls_, cert.c_str()) != 1 ||
          SSL_CTX_use_PrivateKey_file(tls_, key.c_str(), SSL_FILETYPE_PEM) != 1))) {
      return "cannot load the test certificates";
    }
    ssl_ = SSL_new(tls_);
    SSL_set_fd(ssl_, fd_);
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl_), "127.0.0.1");
    if (SSL_connect(ssl_) == 1) return "";
    char reason[256];
    ERR_error_string_n(ERR_get_error(), reason, sizeof(reason));
    return reason;
  }

  bool Send(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ssl_ != nullptr
                            ? SSL_write(ssl_, bytes.data(), static_cast<int>(bytes.size()))
                            : ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // The next frame; an error when the connection ends or nothing comes for 5 s.
  absl::StatusOr<Frame> Read() {
    std::string header;
    if (!ReadExactly(net::kFrameHeaderBytes, &header)) {
      return absl::UnavailableError("connection closed or silent");
    }
    absl::StatusOr<net::FrameHeader> h =
        net::ParseHeader(std::span<const char, net::kFrameHeaderBytes>(header.data(), 16));
    if (!h.ok()) return h.status();
    Frame f{.header = *h};
    if (!ReadExactly(h->meta_bytes, &f.meta) || !ReadExactly(h->body_bytes, &f.body)) {
      return absl::UnavailableError("connection closed inside a frame");
    }
    return f;
  }

  // Whether the shard closed the connection (reads end, or it reset a connection that
  // sent more than it read), within the receive timeout.
  bool ClosedByShard() {
    char c;
    if (ssl_ != nullptr) {
      // The end of the stream, with or without TLS's close_notify, or a reset.
      ERR_clear_error();
      errno = 0;
      const int n = SSL_read(ssl_, &c, 1);
      const int error = SSL_get_error(ssl_, n);
      return n <= 0 && (error == SSL_ERROR_ZERO_RETURN ||
                        (error == SSL_ERROR_SSL && ERR_GET_REASON(ERR_peek_error()) ==
                                                       SSL_R_UNEXPECTED_EOF_WHILE_READING) ||
                        (error == SSL_ERROR_SYSCALL && (errno == 0 || errno == ECONNRESET)));
    }
    const ssize_t n = ::recv(fd_, &c, 1, 0);
    return n == 0 || (n < 0 && errno == ECONNRESET);
  }

  // The handshake under `session` (the Join's data session id and secret) as `worker`.
  // Returns the ADMIT's meta, or what the shard answered instead.
  absl::StatusOr<net::AdmitMeta> Handshake(uint64_t session, uint32_t worker,
                                           const std::string& secret) {
    net::HelloMeta hello{.data_session = session, .worker_id = worker};
    hello.client_nonce.fill('c');
    std::string out;
    EXPECT_TRUE(net::AppendHello(hello, &out).ok());
    if (!Send(out)) return absl::UnavailableError("send failed");
    absl::StatusOr<Frame> challenge = Read();
    if (!challenge.ok()) return challenge.status();
    if (challenge->header.type != net::FrameType::kChallenge) return StatusOf(*challenge);
    absl::StatusOr<net::ChallengeMeta> c = net::ParseChallengeMeta(challenge->meta);
    if (!c.ok()) return c.status();
    const std::string client_nonce(hello.client_nonce.data(), hello.client_nonce.size());
    const std::string server_nonce(c->server_nonce.data(), c->server_nonce.size());
    // Without tokens (--insecure) the key is the secret itself.
    const std::string server = "shard-0";
    // The shard proves it holds the session's key first (a worker stops here if not).
    server_proved_ = std::string(c->proof.data(), c->proof.size()) ==
                     core::DataServerProof(secret, server, session, client_nonce, server_nonce);
    const std::string proof =
        core::DataClientProof(secret, server, session, client_nonce, server_nonce);
    net::ProofMeta p;
    std::copy(proof.begin(), proof.end(), p.proof.begin());
    out.clear();
    EXPECT_TRUE(net::AppendProof(p, &out).ok());
    if (!Send(out)) return absl::UnavailableError("send failed");
    absl::StatusOr<Frame> admit = Read();
    if (!admit.ok()) return admit.status();
    if (admit->header.type != net::FrameType::kAdmit) return StatusOf(*admit);
    return net::ParseAdmitMeta(admit->meta);
  }

  // A GOAWAY, ANSWER or PULL_END as a status carrying its refusal's name.
  static absl::Status StatusOf(const Frame& f) {
    absl::StatusOr<net::StatusMeta> m = net::ParseStatusMeta(f.header.type, f.meta);
    if (!m.ok()) return m.status();
    return absl::Status(m->code, absl::StrCat(core::AsAbsl(net::FrameTypeName(f.header.type)), " ",
                                              core::AsAbsl(m->refusal_name), ": ",
                                              core::AsAbsl(m->message)));
  }

 private:
  bool ReadExactly(size_t n, std::string* out) {
    out->resize(n);
    size_t at = 0;
    while (at < n) {
      const ssize_t got = ssl_ != nullptr
                              ? SSL_read(ssl_, out->data() + at, static_cast<int>(n - at))
                              : ::recv(fd_, out->data() + at, n - at, 0);
      if (got <= 0) return false;
      at += static_cast<size_t>(got);
    }
    return true;
  }

  int fd_ = -1;
  SSL_CTX* tls_ = nullptr;
  SSL* ssl_ = nullptr;
  bool connected_ = false;
  bool server_proved_ = false;
};

inline std::string Fp32(std::vector<float> values) {
  std::string payload;
  EXPECT_TRUE((*codecs::MakeCodec("fp32"))->Encode(values, &payload).ok());
  return payload;
}

inline uint64_t Refusals(const Shard& shard, Refusal r) {
  return shard.stats().refusals[static_cast<size_t>(r)];
}

// Waits up to 5 s for `done`.
template <typename F>
bool Eventually(F done) {
  for (int i = 0; i < 500; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

class TcpBackendTest : public ::testing::Test {
 protected:
  // Two workers; tensor "w" of 8 values in two slices of 4 (ids 0 and 1); at most two
  // pulls per worker; aggregate-only, so the slices are ready at zero.
  void SetUp() override {
    ServerOptions o;
    o.num_workers = 2;
    o.aggregator = "mean";
    o.aggregate_only = true;
    o.round_deadline = std::chrono::seconds(30);
    o.max_pulls_per_worker = 2;
    o.data_plane = core::DataPlane::kTcp;
    aggregators::AggregatorOptions a;
    a.num_workers = 2;
    shard_ = std::make_unique<Shard>(o, 0, *aggregators::MakeAggregator("mean", a),
                                     core::Clock::Real(), &pool_);
    auto layout = core::ModelLayout::Create({{"w", 8, 0}}, 4, 1);
    ASSERT_TRUE(layout.ok()) << layout.status();
    hash_ = layout->hash();
    for (uint32_t w = 0; w < 2; ++w) {
      absl::StatusOr<JoinResult> joined = shard_->Join(w, hash_);
      ASSERT_TRUE(joined.ok()) << joined.status();
      joins_.push_back(*joined);
    }
    ASSERT_TRUE(shard_->RegisterLayout(0, *layout).ok());
    front_ = std::make_unique<ShardFront>(shard_.get(), nullptr, nullptr);
    options_.max_body_bytes = 1 << 20;
    options_.limits.proof_timeout = std::chrono::milliseconds(300);
    Configure(&options_);
    absl::StatusOr<std::unique_ptr<Backend>> backend =
        Backend::Start(options_, front_.get(), nullptr, core::Clock::Real());
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = *std::move(backend);
  }

  // What a derived fixture changes in the backend's options before it starts.
  virtual void Configure(Options*) {}

  void TearDown() override {
    // The backend before the front, as in the server.
    if (backend_ != nullptr) backend_->Stop();
  }

  std::unique_ptr<ScriptedWorker> Admitted(uint32_t worker) {
    auto w = std::make_unique<ScriptedWorker>(backend_->port());
    EXPECT_TRUE(w->connected());
    absl::StatusOr<net::AdmitMeta> admit =
        w->Handshake(joins_[worker].data_session, worker, joins_[worker].data_secret);
    EXPECT_TRUE(admit.ok()) << admit.status();
    EXPECT_TRUE(w->server_proved());
    return w;
  }

  static std::string Push(uint64_t tag, uint64_t hash, uint64_t round, uint32_t slice,
                          const std::string& payload) {
    std::string out;
    EXPECT_TRUE(net::AppendPush(tag,
                                net::PushMeta{.layout_hash = hash, .round = round,
                                              .slice_id = slice, .codec = "fp32"},
                                payload.size(), &out)
                    .ok());
    return out + payload;
  }

  core::ThreadPool pool_{2};
  std::unique_ptr<Shard> shard_;
  std::unique_ptr<ShardFront> front_;
  Options options_;
  std::unique_ptr<Backend> backend_;
  uint64_t hash_ = 0;
  std::vector<JoinResult> joins_;
};

}  // namespace ps::server::transport::tcp
