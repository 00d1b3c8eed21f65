#include "net/grpc_credentials.h"
#include "core/status.h"

namespace ps::net {

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const core::ClientCredentials& c) {
  PS_RETURN_IF_ERROR(c.Validate());
  if (!c.tls()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  PS_ASSIGN_OR_RETURN(ssl.pem_root_certs, core::ReadSmallFile(c.tls_ca, "CA bundle"));
  if (!c.tls_cert.empty()) {
    PS_ASSIGN_OR_RETURN(ssl.pem_cert_chain, core::ReadSmallFile(c.tls_cert, "client certificate"));
    PS_ASSIGN_OR_RETURN(ssl.pem_private_key, core::ReadSmallFile(c.tls_key, "client key"));
  }
  return grpc::SslCredentials(ssl);
}

void ApplyChannelArguments(const core::ClientCredentials& c, grpc::ChannelArguments* args) {
  if (c.tls() && !c.tls_server_name.empty()) args->SetSslTargetNameOverride(c.tls_server_name);
}

}  // namespace ps::net
