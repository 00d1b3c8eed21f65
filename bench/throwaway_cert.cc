#include "bench/throwaway_cert.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
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

absl::Status Fail(const std::string& what) {
  return absl::InternalError(absl::StrCat("throwaway certificates: ", what));
}

// A certificate for `key` named `cn`, signed by `issuer` (itself when null) with
// `issuer_key`; a CA when `ca`.
absl::StatusOr<Cert> Issue(const std::string& cn, EVP_PKEY* key, X509* issuer,
                           EVP_PKEY* issuer_key, bool ca, long serial) {
  Cert cert(X509_new());
  if (cert == nullptr) return Fail("no certificate");
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), serial);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -60);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 24 * 3600);
  X509_NAME_add_entry_by_txt(X509_get_subject_name(cert.get()), "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509* signer = issuer != nullptr ? issuer : cert.get();
  X509_set_issuer_name(cert.get(), X509_get_subject_name(signer));
  X509_set_pubkey(cert.get(), key);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, signer, cert.get(), nullptr, nullptr, 0);
  const std::pair<int, const char*> exts[] = {
      {NID_basic_constraints, ca ? "critical,CA:TRUE" : "CA:FALSE"},
      {NID_subject_alt_name, "DNS:localhost,IP:127.0.0.1"}};
  for (const auto& [nid, value] : exts) {
    Ext ext(X509V3_EXT_conf_nid(nullptr, &ctx, nid, value));
    if (ext == nullptr || X509_add_ext(cert.get(), ext.get(), -1) != 1) return Fail("extension");
  }
  if (X509_sign(cert.get(), issuer_key, EVP_sha256()) == 0) return Fail("cannot sign " + cn);
  return cert;
}

// Writes `write(file)` to `path` (in the private directory).
template <typename F>
absl::Status WritePem(const std::string& path, F write) {
  FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) return Fail("cannot write " + path);
  const bool ok = write(file);
  return std::fclose(file) == 0 && ok ? absl::OkStatus() : Fail("cannot write " + path);
}

absl::Status WriteIdentity(const ThrowawayCerts& out, const std::string& name, X509* cert,
                           EVP_PKEY* key) {
  absl::Status s = WritePem(out.Path(name + ".pem"),
                            [&](FILE* f) { return PEM_write_X509(f, cert) == 1; });
  if (!s.ok() || key == nullptr) return s;
  return WritePem(out.Path(name + ".key"), [&](FILE* f) {
    return PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr) == 1;
  });
}

}  // namespace

ThrowawayCerts::~ThrowawayCerts() {
  std::error_code ignored;
  if (!dir.empty()) std::filesystem::remove_all(dir, ignored);
}

absl::StatusOr<std::shared_ptr<const ThrowawayCerts>> MakeThrowawayCerts(uint32_t shards,
                                                                          uint32_t workers) {
  auto out = std::make_shared<ThrowawayCerts>();
  std::string dir = (std::filesystem::temp_directory_path() / "ps-bench-tls-XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) return Fail("cannot make a temporary directory");
  out->dir = dir;
  Key ca_key(EVP_EC_gen("P-256"));
  if (ca_key == nullptr) return Fail("no key");
  absl::StatusOr<Cert> ca = Issue("ps-bench CA", ca_key.get(), nullptr, ca_key.get(), true, 1);
  if (!ca.ok()) return ca.status();
  if (absl::Status s = WriteIdentity(*out, "ca", ca->get(), nullptr); !s.ok()) return s;
  long serial = 2;
  for (const auto& [kind, count] : {std::pair{"shard", shards}, std::pair{"worker", workers}}) {
    for (uint32_t i = 0; i < count; ++i) {
      const std::string name = absl::StrCat(kind, "-", i);
      Key key(EVP_EC_gen("P-256"));
      if (key == nullptr) return Fail("no key");
      absl::StatusOr<Cert> cert = Issue(name, key.get(), ca->get(), ca_key.get(), false, serial++);
      if (!cert.ok()) return cert.status();
      if (absl::Status s = WriteIdentity(*out, name, cert->get(), key.get()); !s.ok()) return s;
    }
  }
  return std::shared_ptr<const ThrowawayCerts>(std::move(out));
}

}  // namespace ps::bench
