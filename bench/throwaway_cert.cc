#include "bench/throwaway_cert.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ps::bench {
namespace {

template <typename T, void (*Free)(T*)>
struct Freer {
  void operator()(T* p) const { Free(p); }
};
using Key = std::unique_ptr<EVP_PKEY, Freer<EVP_PKEY, EVP_PKEY_free>>;
using Cert = std::unique_ptr<X509, Freer<X509, X509_free>>;
using Ext = std::unique_ptr<X509_EXTENSION, Freer<X509_EXTENSION, X509_EXTENSION_free>>;

absl::Status Fail(std::string_view what) {
  return absl::InternalError(absl::StrCat("throwaway certificate: ", std::string(what)));
}

// Writes `write(file)` to `path`, readable by the owner only.
template <typename F>
absl::Status WritePem(const std::string& path, F write) {
  FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) return Fail(absl::StrCat("cannot write ", path));
  const bool ok = write(file);
  return std::fclose(file) == 0 && ok ? absl::OkStatus() : Fail(absl::StrCat("cannot write ", path));
}

}  // namespace

ThrowawayCert::~ThrowawayCert() {
  std::error_code ignored;
  if (!dir.empty()) std::filesystem::remove_all(dir, ignored);
}

absl::StatusOr<std::shared_ptr<const ThrowawayCert>> MakeThrowawayCert() {
  Key key(EVP_EC_gen("P-256"));
  Cert cert(X509_new());
  if (key == nullptr || cert == nullptr) return Fail("no key");
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -60);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 24 * 3600);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("ps-bench"), -1, -1, 0);
  X509_set_issuer_name(cert.get(), name);
  X509_set_pubkey(cert.get(), key.get());
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, cert.get(), cert.get(), nullptr, nullptr, 0);
  for (const auto& [nid, value] : {std::pair{NID_subject_alt_name, "DNS:localhost,IP:127.0.0.1"},
                                   std::pair{NID_basic_constraints, "critical,CA:TRUE"}}) {
    Ext ext(X509V3_EXT_conf_nid(nullptr, &ctx, nid, value));
    if (ext == nullptr || X509_add_ext(cert.get(), ext.get(), -1) != 1) return Fail("extension");
  }
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) == 0) return Fail("cannot sign");

  auto out = std::make_shared<ThrowawayCert>();
  std::string dir = (std::filesystem::temp_directory_path() / "ps-bench-tls-XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) return Fail("cannot make a temporary directory");
  out->dir = dir;
  out->cert_path = dir + "/cert.pem";
  out->key_path = dir + "/key.pem";
  if (absl::Status s = WritePem(out->cert_path,
                                [&](FILE* f) { return PEM_write_X509(f, cert.get()) == 1; });
      !s.ok()) {
    return s;
  }
  if (absl::Status s = WritePem(out->key_path,
                                [&](FILE* f) {
                                  return PEM_write_PrivateKey(f, key.get(), nullptr, nullptr, 0,
                                                              nullptr, nullptr) == 1;
                                });
      !s.ok()) {
    return s;
  }
  return std::shared_ptr<const ThrowawayCert>(std::move(out));
}

}  // namespace ps::bench
