// What `ps-bench hostile`'s hostile clients are made of (docs/bench.md, "Hostile
// clients"): the cluster they attack, the identity they act as (worker 3, an
// authenticated Byzantine worker), the proofs they send with the tokens they hold or
// forge, their own connections and raw calls, and the tally of what they sent and got.
// The attacks themselves are in hostile_attacks.h.
#pragma once

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "core/layout.h"
#include "ps/v1/ps.grpc.pb.h"
#if PS_HAVE_DATA_PORT_CLIENT
#include "bench/hostile_data_phases.h"
#endif

namespace ps::bench {

// The cluster every attack runs against (the server's flags are in hostile_bench.cc).
inline constexpr uint32_t kWorkers = 4;     // n
inline constexpr uint32_t kHonest = 3;      // workers 0..2
inline constexpr uint32_t kAttackerId = 3;  // the Byzantine worker's rank
inline constexpr uint32_t kMaxPullsPerWorker = 16;
inline constexpr uint32_t kSliceElems = 8192;
inline constexpr std::chrono::milliseconds kCallDeadline{2000};
inline constexpr int kStatusCodes = 17;  // grpc::StatusCode 0..16

// The model the honest workers train: two tensors in slices of kSliceElems.
core::ModelLayout HonestLayout();

// "UNAUTHENTICATED" for grpc::StatusCode (and absl::StatusCode) 16.
std::string CodeName(int code);

// ---- Calls ---------------------------------------------------------------------------

// The proofs (crypto/auth_proof.h) the attacker sends with the tokens it holds or forges,
// for the shard of the current attack: it asks that shard for a challenge and makes the
// call proof from the answer without checking the shard's proof, as a client that wants
// to act as someone else would. For worker 3's own token that is what ps::Worker sends;
// a forged token's proof is refused. Thread-safe.
class AttackerProofs {
 public:
  static AttackerProofs& Get();
  // A new shard process at `address`: forgets the proofs made for the last one.
  void Reset(const std::string& address);
  // The authorization header for `token` ("" when it could not be made).
  std::string Header(std::string_view token);

 private:
  absl::Mutex mu_;
  std::shared_ptr<grpc::Channel> channel_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string, std::less<>> headers_ ABSL_GUARDED_BY(mu_);
};

// Sets the deadline and, unless `token` is empty, the proof of `token` of one call.
void Prepare(grpc::ClientContext& ctx, std::string_view token,
             std::chrono::milliseconds deadline = kCallDeadline);

// A channel with a TCP connection of its own: gRPC shares one connection between the
// channels of a process that have the same arguments, so without this the attacker's
// streams would share flow control with the honest workers' and each other's.
std::shared_ptr<grpc::Channel> OwnChannel(const std::string& address);

// One unary call with a request given as raw bytes (to send what the protobuf
// serializer would not, such as invalid UTF-8 in a string field).
grpc::Status CallRaw(grpc::GenericStub& stub, const std::string& method, const std::string& bytes,
                     std::string_view token);

// `message` serialized, with the bytes of every occurrence of kUtf8Marker (the value of
// a string field) replaced by 0xff, which is never valid UTF-8. The lengths stay right.
inline constexpr std::string_view kUtf8Marker = "PS-BENCH-INVALID-UTF8-MARKER";
std::string WithInvalidUtf8(const google::protobuf::Message& message);

// Random bytes of random length in [1, max_bytes], starting with the codecs' format
// version so that decoders look past the first byte.
std::string Garbage(std::mt19937_64& rng, size_t max_bytes);

// Codec specs MakeCodec accepts, each never returned before by this source (three
// families with a bucket size and a level count that count up). Thread-safe.
class SpecSource {
 public:
  std::string Next();

 private:
  std::atomic<uint64_t> next_{0};
};

// What one attack sent and got. Thread-safe.
class Tally {
 public:
  void Count(const grpc::Status& s);
  // Requests that are not calls (connections opened, streams, frames).
  void CountOther(uint64_t n = 1);
  // A request the server should have refused but did not.
  void Accepted(std::string what);
  // Kept once, the first 8 distinct notes.
  void Note(std::string note);
  void StartPhase() { phase_requests_.store(0); }

  uint64_t requests() const { return requests_.load(); }
  uint64_t phase_requests() const { return phase_requests_.load(); }
  uint64_t accepted() const { return accepted_.load(); }
  uint64_t code(int c) const { return codes_[size_t(c)].load(); }
  std::vector<std::string> notes() const;

 private:
  std::atomic<uint64_t> requests_{0}, phase_requests_{0}, accepted_{0};
  std::array<std::atomic<uint64_t>, kStatusCodes> codes_{};
  mutable absl::Mutex mu_;
  std::vector<std::string> notes_ ABSL_GUARDED_BY(mu_);
};

// ---- The attacker's identity ------------------------------------------------------------

// Worker 3's token and its current session on the shard. A Join replaces the worker's
// session, so attacks that join keep it current here for the cover and the others.
// Thread-safe.
class Attacker {
 public:
  Attacker(std::string address, uint16_t port, std::string token, uint64_t layout_hash)
      : address_(std::move(address)),
        port_(port),
        token_(std::move(token)),
        layout_hash_(layout_hash) {}

  const std::string& address() const { return address_; }
  uint16_t port() const { return port_; }
  const std::string& token() const { return token_; }
  uint64_t layout_hash() const { return layout_hash_; }
  std::string session() const;

  // Joins as worker 3 with its token; the session becomes current.
  grpc::Status Join(v1::WorkerService::Stub& stub);
#if PS_HAVE_DATA_PORT_CLIENT
  // The data port with worker 3's data session from the newest join.
  DataPortTarget data_target() const;
#endif
  // The UDP path's port, session id and datagram key (the secret bound to the token)
  // from the newest join (port 0: none).
  uint16_t udp_port() const;
  uint64_t udp_session() const;
  std::string udp_key() const;

 private:
  const std::string address_;
  const uint16_t port_;
  const std::string token_;
  const uint64_t layout_hash_;
  mutable absl::Mutex mu_;
  std::string session_ ABSL_GUARDED_BY(mu_);
  uint16_t udp_port_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t udp_session_ ABSL_GUARDED_BY(mu_) = 0;
  std::string udp_key_ ABSL_GUARDED_BY(mu_);
  uint16_t data_port_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t data_session_ ABSL_GUARDED_BY(mu_) = 0;
  std::string data_secret_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::bench
