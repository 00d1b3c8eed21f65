// Throwaway TLS identities for benchmarks (`ps-bench e2e --tls`): a private P-256 CA and,
// signed by it, a certificate per shard (common name shard-N) and per worker (worker-N),
// each for localhost and 127.0.0.1, made with OpenSSL in-process and written as PEM
// files into a new private temporary directory (removed with the object). The layout of
// deploy/tls/make-certs.sh: ca.pem, shard-N.pem/.key, worker-N.pem/.key, so that the
// shards run mutual TLS as deployed. Not for anything but loopback measurements: the
// keys lie in /tmp for the run.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace ps::bench {

struct ThrowawayCerts {
  ThrowawayCerts() = default;
  ThrowawayCerts(const ThrowawayCerts&) = delete;
  ThrowawayCerts& operator=(const ThrowawayCerts&) = delete;
  ~ThrowawayCerts();

  std::string dir;  // DIR/ca.pem, DIR/shard-N.pem, DIR/shard-N.key, DIR/worker-N.{pem,key}
  std::string Path(const std::string& name) const { return dir + "/" + name; }
};

// INTERNAL naming what OpenSSL or the file system refused.
absl::StatusOr<std::shared_ptr<const ThrowawayCerts>> MakeThrowawayCerts(uint32_t shards,
                                                                          uint32_t workers);

}  // namespace ps::bench
