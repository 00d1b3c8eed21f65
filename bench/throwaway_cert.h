// A throwaway TLS identity for benchmarks (`ps-bench e2e --tls`): a self-signed P-256
// certificate for localhost and 127.0.0.1, made with OpenSSL in-process and written as
// PEM files into a new private temporary directory, which the shards serve
// (--tls-cert/--tls-key) and the workers trust (ClientCredentials::tls_ca). Not for
// anything but loopback measurements: the key lies in /tmp for the run.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace ps::bench {

// Owns its directory: removed with the files when it goes.
struct ThrowawayCert {
  ThrowawayCert() = default;
  ThrowawayCert(const ThrowawayCert&) = delete;
  ThrowawayCert& operator=(const ThrowawayCert&) = delete;
  ~ThrowawayCert();

  std::string dir;
  std::string cert_path;  // PEM certificate (also the CA to trust)
  std::string key_path;   // PEM private key
};

// INTERNAL naming what OpenSSL or the file system refused.
absl::StatusOr<std::shared_ptr<const ThrowawayCert>> MakeThrowawayCert();

}  // namespace ps::bench
