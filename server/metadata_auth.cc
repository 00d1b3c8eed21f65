#include "server/metadata_auth.h"

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpcpp/security/server_credentials.h>

#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "crypto/auth_proof.h"

namespace ps::server {
namespace {

// grpc::ServerCredentials over credentials made with gRPC's C API, which takes an
// asynchronous metadata processor (the C++ one answers synchronously, so it could not
// hold a refusal in the tarpit).
class CoreServerCredentials final : public grpc::ServerCredentials {
 public:
  // Takes `make`'s result after the base class has initialised gRPC.
  template <typename Make>
  explicit CoreServerCredentials(Make make) : creds_(make()) {}
  ~CoreServerCredentials() override { grpc_server_credentials_release(creds_); }

  grpc_server_credentials* get() const { return creds_; }

  void SetAuthMetadataProcessor(
      const std::shared_ptr<grpc::AuthMetadataProcessor>& /*processor*/) override {
    // The processor is set through the C API (ListeningCredentials) only.
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    return grpc_server_add_http2_port(server, addr.c_str(), creds_);
  }

  grpc_server_credentials* const creds_;
};

// What a refusal from the metadata is charged as: the body is not parsed, but gRPC may
// receive up to a stream's flow-control window of it (megabytes once the window has
// grown) before the client hears of the refusal.
constexpr uint64_t kUnreadBodyCharge = 1 << 20;

struct ProcessorState {
  const Authenticator* auth;
  Tarpit* tarpit;
  std::function<void(const absl::Status&)> on_refused;
};

std::string_view View(const grpc_slice& s) {
  return std::string_view(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(s)),
                          GRPC_SLICE_LENGTH(s));
}

void Process(void* state, grpc_auth_context* context, const grpc_metadata* md, size_t num_md,
             grpc_process_auth_metadata_done_cb done, void* user_data) {
  const auto* st = static_cast<const ProcessorState*>(state);
  Authenticator::Presented presented;
  std::string_view path;
  for (size_t i = 0; i < num_md; ++i) {
    const std::string_view key = View(md[i].key);
    if (key == ":path") {
      path = View(md[i].value);
    } else if (key == "authorization" && !presented.authorization.has_value()) {
      presented.authorization = View(md[i].value);
    }
  }
  std::string charge_to = kAnonymousClient;
  absl::Status refused;
  if (path == crypto::kChallengeMethod) {
    // Answered here, from the metadata alone, in the status (gRPC 1.51 drops a
    // processor's response metadata): the call never reaches a handler and its body is
    // never read. Not a refusal: neither counted nor logged nor held.
    absl::StatusOr<std::string> answer = st->auth->AnswerChallenge(presented.authorization);
    if (answer.ok()) {
      done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_UNAUTHENTICATED, answer->c_str());
      return;
    }
    refused = answer.status();
  } else {
    std::string common_name;
    if (grpc_auth_context_peer_is_authenticated(context) != 0) {
      grpc_auth_property_iterator it =
          grpc_auth_context_find_properties_by_name(context, "x509_common_name");
      const grpc_auth_property* first = grpc_auth_property_iterator_next(&it);
      if (first != nullptr && grpc_auth_property_iterator_next(&it) == nullptr) {
        common_name.assign(first->value, first->value_length);
        presented.common_name = common_name;
      }
    }
    absl::StatusOr<core::Identity> id = st->auth->Verify(presented, &charge_to);
    if (id.ok()) {
      // The handlers identify the caller again (Authenticator::Identify): the context
      // here is the connection's, shared by its calls, so nothing per call may be
      // written to it.
      done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_OK, nullptr);
      return;
    }
    refused = id.status();
  }
  refused = absl::UnauthenticatedError(
      absl::StrCat(refused.message(), " (refused from the call's metadata, its body unread)"));
  if (st->on_refused) st->on_refused(refused);
  st->tarpit->Refuse(charge_to, kUnreadBodyCharge,
                     [done, user_data, message = std::string(refused.message())]() {
                       done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_UNAUTHENTICATED,
                            message.c_str());
                     });
}

void Destroy(void* state) { delete static_cast<ProcessorState*>(state); }

}  // namespace

std::shared_ptr<grpc::ServerCredentials> ListeningCredentials(
    const Authenticator& auth, Tarpit* tarpit,
    std::function<void(const absl::Status&)> on_refused) {
  if (!auth.required()) {
    if (auth.cert_pem().empty()) return grpc::InsecureServerCredentials();
    grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    ssl.pem_key_cert_pairs.push_back({auth.key_pem(), auth.cert_pem()});
    return grpc::SslServerCredentials(ssl);
  }
  auto creds = std::make_shared<CoreServerCredentials>([&] {
    if (auth.cert_pem().empty()) return grpc_insecure_server_credentials_create();
    grpc_ssl_pem_key_cert_pair pair{auth.key_pem().c_str(), auth.cert_pem().c_str()};
    return grpc_ssl_server_credentials_create_ex(
        auth.ca_pem().empty() ? nullptr : auth.ca_pem().c_str(), &pair, 1,
        auth.ca_pem().empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                              : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY,
        nullptr);
  });
  grpc_server_credentials_set_auth_metadata_processor(
      creds->get(),
      grpc_auth_metadata_processor{Process, Destroy,
                                   new ProcessorState{&auth, tarpit, std::move(on_refused)}});
  return creds;
}

}  // namespace ps::server
