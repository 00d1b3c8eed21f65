#include "core/credentials_internal.h"
#include "core/status.h"

namespace ps::core {

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientCredentials& c) {
  PS_RETURN_IF_ERROR(c.Validate());
  if (!c.tls()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  PS_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadSmallFile(c.tls_ca, "CA bundle"));
  if (!c.tls_cert.empty()) {
    PS_ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadSmallFile(c.tls_cert, "client certificate"));
    PS_ASSIGN_OR_RETURN(ssl.pem_private_key, ReadSmallFile(c.tls_key, "client key"));
  }
  return grpc::SslCredentials(ssl);
}

void ApplyChannelArguments(const ClientCredentials& c, grpc::ChannelArguments* args) {
  if (c.tls() && !c.tls_server_name.empty()) args->SetSslTargetNameOverride(c.tls_server_name);
}

void AttachCredentials(const ClientCredentials& c, grpc::ClientContext* ctx) {
  if (!c.token.empty()) ctx->AddMetadata("authorization", "Bearer " + c.token);
}

}  // namespace ps::core
