// The TLS part of a shard's data connection (connection.h): the handshake before the
// first frame, and under mTLS the certificate's identity against the HELLO's session.
#include <boost/asio/ssl/stream_base.hpp>

#include "absl/strings/str_cat.h"
#include "core/credentials.h"
#include "core/refusal.h"
#include "server/transport/tcp/connection.h"
#include "spdlog/spdlog.h"

namespace ps::server::transport::tcp {

namespace asio = boost::asio;
using asio::ip::tcp;

void Connection::StartTls() {
  // A connection that says nothing holds no TLS state: it is made when the first bytes
  // come. The proof deadline, armed at accept, bounds the wait and the handshake.
  socket_.socket().async_wait(
      tcp::socket::wait_read, [self = shared_from_this()](const boost::system::error_code& ec) {
        if (self->closed_) return;
        if (ec) return self->Shutdown();
        self->socket_.StartTls(*self->hub_->tls());
        self->socket_.AsyncHandshake(
            asio::ssl::stream_base::server, [self](const boost::system::error_code& e) {
              if (self->closed_) return;  // the proof deadline, or the backend stopping
              if (e) {
                // No TLS at all (a plaintext HELLO), no certificate or one the CA did not
                // sign: closed without a word, as the gRPC ports do.
                spdlog::debug("shard {}: data connection from {}: TLS handshake failed: {}",
                              self->front_->shard()->shard_id(), self->peer_name_,
                              e.message());
                self->hub_->ClosedFor(CloseReason::kTlsHandshake);
                return self->Shutdown();
              }
              self->certificate_name_ = self->socket_.PeerCommonName();
              self->ReadHeader();
            });
      });
}

absl::Status Connection::CertifiedAs(uint32_t worker) const {
  if (hub_->options().tls_ca_pem.empty()) return absl::OkStatus();
  // The handshake required a certificate the CA signed; its common name is the identity,
  // as for the control plane's calls (Authenticator::Verify).
  const core::Identity session_of{core::Identity::Kind::kWorker, worker};
  if (!certificate_name_.has_value()) {
    return front_->shard()->Refuse(Refusal::kUnauthenticated,
                                   "data connection: the client certificate has no single "
                                   "common name");
  }
  absl::StatusOr<core::Identity> named = core::ParseIdentity(*certificate_name_);
  if (!named.ok()) {
    return front_->shard()->Refuse(
        Refusal::kUnauthenticated,
        absl::StrCat("data connection: client certificate: ", named.status().message()));
  }
  if (!(*named == session_of)) {
    return front_->shard()->Refuse(
        Refusal::kPermissionDenied,
        absl::StrCat("data connection: the client certificate says ", named->Name(),
                     " but the data session is ", session_of.Name(),
                     "'s: a worker connects under its own session"));
  }
  return absl::OkStatus();
}

}  // namespace ps::server::transport::tcp
