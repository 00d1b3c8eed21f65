#include "net/data_stream_internal.h"

#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include <boost/asio/buffer.hpp>
#include <boost/asio/ip/address.hpp>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace ps::net {
namespace {

namespace ssl = boost::asio::ssl;

// TLS 1.2 and 1.3 only, without renegotiation or compression (the gRPC ports' floor).
absl::Status Harden(TlsContext& context) {
  boost::system::error_code ec;
  context.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                          ssl::context::no_sslv3 | ssl::context::no_tlsv1 |
                          ssl::context::no_tlsv1_1 | ssl::context::no_compression,
                      ec);
  if (ec) return absl::InternalError(absl::StrCat("TLS options: ", ec.message()));
  SSL_CTX_set_min_proto_version(context.native_handle(), TLS1_2_VERSION);
  SSL_CTX_set_options(context.native_handle(), SSL_OP_NO_RENEGOTIATION);
  return absl::OkStatus();
}

absl::Status Failed(std::string_view what, const boost::system::error_code& ec) {
  return absl::InvalidArgumentError(
      absl::StrCat(core::AsAbsl(what), ": ", ec.message()));
}

// The certificate chain and key as one identity.
absl::Status UseIdentity(TlsContext& context, std::string_view cert_pem, std::string_view key_pem,
                         std::string_view cert_what, std::string_view key_what) {
  boost::system::error_code ec;
  context.use_certificate_chain(boost::asio::buffer(cert_pem.data(), cert_pem.size()), ec);
  if (ec) return Failed(cert_what, ec);
  context.use_private_key(boost::asio::buffer(key_pem.data(), key_pem.size()),
                          TlsContext::pem, ec);
  if (ec) return Failed(key_what, ec);
  if (SSL_CTX_check_private_key(context.native_handle()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(core::AsAbsl(key_what), " does not belong to ", core::AsAbsl(cert_what)));
  }
  return absl::OkStatus();
}

absl::Status TrustOnly(TlsContext& context, std::string_view ca_pem, std::string_view what) {
  boost::system::error_code ec;
  context.add_certificate_authority(boost::asio::buffer(ca_pem.data(), ca_pem.size()), ec);
  if (ec) return Failed(what, ec);
  return absl::OkStatus();
}

}  // namespace

size_t DataStream::TakeStaged(std::span<boost::asio::mutable_buffer> into) {
  size_t took = 0;
  for (boost::asio::mutable_buffer& b : into) {
    const size_t n = std::min(b.size(), stage_end_ - stage_begin_);
    if (n == 0) continue;
    std::memcpy(b.data(), stage_.get() + stage_begin_, n);
    stage_begin_ += n;
    b += n;
    took += n;
  }
  if (stage_begin_ == stage_end_) stage_begin_ = stage_end_ = 0;
  return took;
}

void DataStream::PrepareStage() {
  if (stage_ == nullptr) stage_ = std::make_unique_for_overwrite<char[]>(kStageBytes);
  if (stage_begin_ == 0) return;
  std::memmove(stage_.get(), stage_.get() + stage_begin_, stage_end_ - stage_begin_);
  stage_end_ -= stage_begin_;
  stage_begin_ = 0;
}

bool DataStream::ReadNow(boost::asio::mutable_buffer into) {
  if (reads_now_ >= kMaxReadsNow) return false;
  const size_t want = into.size();
  if (stage_end_ - stage_begin_ < want) {
    if (!read_ahead_ || want > kStageBytes || tls() || !socket().is_open()) return false;
    PrepareStage();
    // MSG_DONTWAIT: what is queued now, whatever the low-water mark (an error, or the
    // peer's end, is left for the asynchronous read to find).
    const ssize_t n = ::recv(socket().native_handle(), stage_.get() + stage_end_,
                             kStageBytes - stage_end_, MSG_DONTWAIT);
    if (n > 0) stage_end_ += static_cast<size_t>(n);
    if (stage_end_ - stage_begin_ < want) return false;
  }
  ReadBuffers buffers{into, boost::asio::mutable_buffer()};
  TakeStaged(buffers);
  ++reads_now_;
  return true;
}

void DataStream::SetReadLowWater(size_t bytes, size_t most) {
  const int mark = tls() || bytes < kMinReadLowWater
                       ? 1
                       : static_cast<int>(std::min({bytes, most, kMaxFrameReadLowWater}));
  if (mark == read_low_water_) return;
  Socket& s = socket();
  if (!s.is_open()) return;
  if (::setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVLOWAT, &mark, sizeof(mark)) == 0) {
    read_low_water_ = mark;
  }
}

absl::StatusOr<std::shared_ptr<TlsContext>> ServerTlsContext(std::string_view cert_pem,
                                                             std::string_view key_pem,
                                                             std::string_view ca_pem) {
  auto context = std::make_shared<TlsContext>(TlsContext::tls_server);
  PS_RETURN_IF_ERROR(Harden(*context));
  PS_RETURN_IF_ERROR(UseIdentity(*context, cert_pem, key_pem, "data plane TLS: --tls-cert",
                                 "data plane TLS: --tls-key"));
  if (!ca_pem.empty()) {
    PS_RETURN_IF_ERROR(TrustOnly(*context, ca_pem, "data plane TLS: --tls-ca"));
    boost::system::error_code ec;
    context->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert, ec);
    if (ec) return Failed("data plane TLS: client verification", ec);
  }
  // Workers open a connection per shard and keep it: no session tickets to resume.
  SSL_CTX_set_num_tickets(context->native_handle(), 0);
  return context;
}

absl::StatusOr<std::shared_ptr<TlsContext>> ClientTlsContext(const core::ClientCredentials& c) {
  PS_RETURN_IF_ERROR(c.Validate());
  if (!c.tls()) return absl::InvalidArgumentError("data plane TLS without a CA bundle");
  auto context = std::make_shared<TlsContext>(TlsContext::tls_client);
  PS_RETURN_IF_ERROR(Harden(*context));
  PS_ASSIGN_OR_RETURN(const std::string ca, core::ReadSmallFile(c.tls_ca, "CA bundle"));
  PS_RETURN_IF_ERROR(TrustOnly(*context, ca, absl::StrCat("CA bundle ", c.tls_ca)));
  boost::system::error_code ec;
  context->set_verify_mode(ssl::verify_peer, ec);
  if (ec) return Failed("data plane TLS: server verification", ec);
  if (!c.tls_cert.empty()) {
    PS_ASSIGN_OR_RETURN(const std::string cert,
                        core::ReadSmallFile(c.tls_cert, "client certificate"));
    PS_ASSIGN_OR_RETURN(const std::string key, core::ReadSmallFile(c.tls_key, "client key"));
    PS_RETURN_IF_ERROR(UseIdentity(*context, cert, key,
                                   absl::StrCat("client certificate ", c.tls_cert),
                                   absl::StrCat("client key ", c.tls_key)));
  }
  return context;
}

void DataStream::StartTls(TlsContext& context) {
  if (tls()) return;
  Socket socket = std::move(std::get<0>(stream_));
  stream_.emplace<1>(std::move(socket), context);
}

absl::Status DataStream::ExpectServer(std::string_view name) {
  if (!tls()) return absl::FailedPreconditionError("a plaintext stream has no server to expect");
  if (name.size() >= 2 && name.front() == '[' && name.back() == ']') {
    name = name.substr(1, name.size() - 2);
  }
  const std::string host(name);
  SSL* ssl = std::get<1>(stream_).native_handle();
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  boost::system::error_code not_ip;
  boost::asio::ip::make_address(host, not_ip);
  bool ok;
  if (!not_ip) {
    ok = X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str()) == 1;
  } else {
    X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    ok = X509_VERIFY_PARAM_set1_host(param, host.data(), host.size()) == 1 &&
         SSL_set_tlsext_host_name(ssl, host.c_str()) == 1;
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("data plane TLS: cannot expect the server name '", host, "'"));
  }
  return absl::OkStatus();
}

std::string DataStream::VerifyFailure() {
  if (!tls()) return "";
  const long result = SSL_get_verify_result(std::get<1>(stream_).native_handle());
  if (result == X509_V_OK) return "";
  return absl::StrCat("certificate verify failed: ", X509_verify_cert_error_string(result));
}

std::optional<std::string> DataStream::PeerCommonName() {
  if (!tls()) return std::nullopt;
  SSL* ssl = std::get<1>(stream_).native_handle();
  if (SSL_get_verify_result(ssl) != X509_V_OK) return std::nullopt;
  X509* cert = SSL_get1_peer_certificate(ssl);
  if (cert == nullptr) return std::nullopt;
  std::optional<std::string> cn;
  const X509_NAME* subject = X509_get_subject_name(cert);
  const int at = X509_NAME_get_index_by_NID(subject, NID_commonName, -1);
  if (at >= 0 && X509_NAME_get_index_by_NID(subject, NID_commonName, at) < 0) {
    unsigned char* utf8 = nullptr;
    const int n =
        ASN1_STRING_to_UTF8(&utf8, X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, at)));
    if (n >= 0) cn.emplace(reinterpret_cast<const char*>(utf8), static_cast<size_t>(n));
    OPENSSL_free(utf8);
  }
  X509_free(cert);
  return cn;
}

}  // namespace ps::net
