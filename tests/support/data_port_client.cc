#include "tests/support/data_port_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <cerrno>
#include <span>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "core/refusal.h"
#include "core/status.h"
#include "crypto/auth_proof.h"

namespace ps::testing {

DataPortClient::DataPortClient(uint16_t port, const Options& options) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return;
  const auto ms = options.receive_timeout.count();
  const timeval timeout{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>(ms % 1000 * 1000)};
  ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  // A shard that stops reading (its tarpit holding a refusal) ends a send the same way.
  ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  if (!options.source.empty()) {
    sockaddr_in from{};
    from.sin_family = AF_INET;
    if (::inet_pton(AF_INET, options.source.c_str(), &from.sin_addr) != 1 ||
        ::bind(fd_, reinterpret_cast<const sockaddr*>(&from), sizeof(from)) != 0) {
      return;
    }
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  connected_ = ::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
}

void DataPortClient::Close() {
  if (ssl_ != nullptr) SSL_free(ssl_);
  if (tls_ != nullptr) SSL_CTX_free(tls_);
  ssl_ = nullptr;
  tls_ = nullptr;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string DataPortClient::StartTls(const std::string& ca, const std::string& cert,
                                     const std::string& key) {
  tls_ = SSL_CTX_new(TLS_client_method());
  SSL_CTX_set_verify(tls_, SSL_VERIFY_PEER, nullptr);
  if (SSL_CTX_load_verify_locations(tls_, ca.c_str(), nullptr) != 1 ||
      (!cert.empty() && (SSL_CTX_use_certificate_chain_file(tls_, cert.c_str()) != 1 ||
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

bool DataPortClient::Send(std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ssl_ != nullptr
                          ? SSL_write(ssl_, bytes.data(), static_cast<int>(bytes.size()))
                          : ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

absl::StatusOr<DataFrame> DataPortClient::Read() {
  std::string header;
  if (!ReadExactly(net::kFrameHeaderBytes, &header)) {
    return absl::UnavailableError("connection closed or silent");
  }
  absl::StatusOr<net::FrameHeader> h =
      net::ParseHeader(std::span<const char, net::kFrameHeaderBytes>(header.data(), 16));
  if (!h.ok()) return h.status();
  DataFrame f{.header = *h};
  if (!ReadExactly(h->meta_bytes, &f.meta) || !ReadExactly(h->body_bytes, &f.body)) {
    return absl::UnavailableError("connection closed inside a frame");
  }
  return f;
}

bool DataPortClient::ClosedByShard() {
  char c;
  if (ssl_ != nullptr) {
    // The end of the stream, with or without TLS's close_notify, or a reset.
    ERR_clear_error();
    errno = 0;
    const int n = SSL_read(ssl_, &c, 1);
    const int error = SSL_get_error(ssl_, n);
    return n <= 0 && (error == SSL_ERROR_ZERO_RETURN ||
                      (error == SSL_ERROR_SSL &&
                       ERR_GET_REASON(ERR_peek_error()) == SSL_R_UNEXPECTED_EOF_WHILE_READING) ||
                      (error == SSL_ERROR_SYSCALL && (errno == 0 || errno == ECONNRESET)));
  }
  const ssize_t n = ::recv(fd_, &c, 1, 0);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

absl::StatusOr<net::AdmitMeta> DataPortClient::Handshake(uint64_t session, uint32_t worker,
                                                         const std::string& key,
                                                         uint32_t shard) {
  net::HelloMeta hello{.data_session = session, .worker_id = worker};
  hello.client_nonce.fill('c');
  std::string out;
  if (absl::Status st = net::AppendHello(hello, &out); !st.ok()) return st;
  if (!Send(out)) return absl::UnavailableError("sending HELLO failed");
  absl::StatusOr<DataFrame> challenge = Read();
  if (!challenge.ok()) return challenge.status();
  if (challenge->header.type != net::FrameType::kChallenge) return StatusOf(*challenge);
  absl::StatusOr<net::ChallengeMeta> c = net::ParseChallengeMeta(challenge->meta);
  if (!c.ok()) return c.status();
  const std::string client_nonce(hello.client_nonce.data(), hello.client_nonce.size());
  const std::string server_nonce(c->server_nonce.data(), c->server_nonce.size());
  const std::string server = absl::StrCat("shard-", shard);
  // The shard proves it holds the session's key first (a worker stops here if not).
  server_proved_ = std::string(c->proof.data(), c->proof.size()) ==
                   crypto::DataServerProof(key, server, session, client_nonce, server_nonce);
  const std::string proof = crypto::DataClientProof(key, server, session, client_nonce, server_nonce);
  net::ProofMeta p;
  std::copy(proof.begin(), proof.end(), p.proof.begin());
  out.clear();
  if (absl::Status st = net::AppendProof(p, &out); !st.ok()) return st;
  if (!Send(out)) return absl::UnavailableError("sending PROOF failed");
  absl::StatusOr<DataFrame> admit = Read();
  if (!admit.ok()) return admit.status();
  if (admit->header.type != net::FrameType::kAdmit) return StatusOf(*admit);
  return net::ParseAdmitMeta(admit->meta);
}

absl::Status DataPortClient::StatusOf(const DataFrame& f) {
  absl::StatusOr<net::StatusMeta> m = net::ParseStatusMeta(f.header.type, f.meta);
  if (!m.ok()) return m.status();
  absl::Status s(m->code, absl::StrCat(core::AsAbsl(net::FrameTypeName(f.header.type)), " ",
                                       core::AsAbsl(m->refusal_name), ": ",
                                       core::AsAbsl(m->message)));
  // The kind, as the worker's connection rebuilds it (core::RefusalOf).
  if (!s.ok() && core::ParseRefusal(m->refusal_name).has_value()) {
    s.SetPayload(core::AsAbsl(core::kRefusalPayload), absl::Cord(core::AsAbsl(m->refusal_name)));
  }
  return s;
}

bool DataPortClient::ReadExactly(size_t n, std::string* out) {
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

std::string DataConnectionKey(std::string_view token, uint32_t shard, uint64_t session,
                              std::string_view secret) {
  return crypto::BoundDataKey(token, absl::StrCat("shard-", shard), session, secret);
}

std::string HelloFrame(uint64_t session, uint32_t worker) {
  net::HelloMeta hello{.data_session = session, .worker_id = worker};
  hello.client_nonce.fill('x');
  std::string frame;
  // A HELLO's fields have no bounds that these values could break.
  (void)net::AppendHello(hello, &frame);
  return frame;
}

}  // namespace ps::testing
