#include "tests/support/data_port_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <span>

#include "absl/strings/str_cat.h"
#include "core/auth_proof.h"
#include "core/status.h"

namespace ps::testing {

DataPortClient::DataPortClient(uint16_t port, const Options& options) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return;
  const auto ms = options.receive_timeout.count();
  const timeval timeout{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>(ms % 1000 * 1000)};
  ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
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
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool DataPortClient::Send(std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
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
                   core::DataServerProof(key, server, session, client_nonce, server_nonce);
  const std::string proof = core::DataClientProof(key, server, session, client_nonce, server_nonce);
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
  return absl::Status(m->code, absl::StrCat(core::AsAbsl(net::FrameTypeName(f.header.type)), " ",
                                            core::AsAbsl(m->refusal_name), ": ",
                                            core::AsAbsl(m->message)));
}

bool DataPortClient::ReadExactly(size_t n, std::string* out) {
  out->resize(n);
  size_t at = 0;
  while (at < n) {
    const ssize_t got = ::recv(fd_, out->data() + at, n - at, 0);
    if (got <= 0) return false;
    at += static_cast<size_t>(got);
  }
  return true;
}

std::string DataConnectionKey(std::string_view token, uint32_t shard, uint64_t session,
                              std::string_view secret) {
  if (token.empty()) return std::string(secret);
  return core::DataKey(token, core::TokenKey(token), absl::StrCat("shard-", shard), session, secret);
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
