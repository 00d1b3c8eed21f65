// The client's half of ps-server's mutual authentication (crypto/auth_proof.h;
// docs/protocol.md, "Authentication"), one object per channel to a shard. Every client
// of a shard uses it: the worker library, the shards toward their peers (Hello,
// ShareRound), ps-admin, the benchmarks and the tests.
//
// A client holding a token never sends it. Before its first call, ChannelAuth asks the
// listener to prove it holds the token too (a challenge with a fresh nonce); a process
// that cannot (another user's process on a shard's port while the shard is down) gets
// nothing reusable, and the call fails with UNAUTHENTICATED "the process listening on
// HOST:PORT could not prove it holds this run's secret: ...". Every call then carries a
// proof valid for that shard process only. When the shard restarted, its refusal of the
// stale proof makes the next call run the challenge again (Unary retries once itself).
//
// Without a token (mTLS certificates only, or an --insecure shard) it adds nothing.
//
// Thread-safe: calls on any thread share one challenge; Attach blocks for the challenge's
// round trip (bounded by the call's deadline) only when the shard has not proven itself
// to this object yet, or restarted.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "core/credentials.h"

namespace ps::net {

// One challenge call on `channel` for the token named `key` (crypto::TokenKey), with
// `client_nonce` (raw): the status the listener answered. An answer is UNAUTHENTICATED
// with the text crypto::ParseChallengeAnswer reads; nothing is verified here (that is
// ChannelAuth's job). For tools that play a hostile client too (tests, ps-bench hostile).
grpc::Status SendChallenge(const std::shared_ptr<grpc::ChannelInterface>& channel,
                           std::string_view key,
                           std::string_view client_nonce,
                           std::chrono::system_clock::time_point deadline, bool wait_for_ready);

class ChannelAuth {
 public:
  using Deadline = std::chrono::system_clock::time_point;

  // `channel` carries the challenge (and the calls); `target` names the shard in errors
  // ("HOST:PORT"); `shard` is the identity the listener must prove (shard-N), nullopt
  // for any shard of the run (ps-admin is not told which shard it talks to).
  ChannelAuth(std::shared_ptr<grpc::ChannelInterface> channel, core::ClientCredentials credentials,
              std::string target, std::optional<core::Identity> shard = std::nullopt);
  ChannelAuth(const ChannelAuth&) = delete;
  ChannelAuth& operator=(const ChannelAuth&) = delete;

  // Adds this client's proof to one call's metadata, running the challenge first when
  // this shard process has not proven itself yet (waiting for the shard until `deadline`
  // when `wait_for_ready`, as the call itself would). Errors: the challenge's own
  // (UNAVAILABLE, DEADLINE_EXCEEDED, the shard's UNAUTHENTICATED refusal of an unknown
  // token), UNAUTHENTICATED when the listener could not prove it holds the token,
  // FAILED_PRECONDITION when it proved it is another shard than `shard`.
  grpc::Status Attach(grpc::ClientContext* ctx, Deadline deadline, bool wait_for_ready = false);
  // Looks at a finished call's status: true when the shard refused the proof as made for
  // an earlier process of it (it restarted); the next Attach then runs the challenge
  // again. Cheap; call it with every status of a call Attach prepared.
  bool Stale(const grpc::Status& status);
  // One unary call: `call(ctx)` on a context with `deadline`, `wait_for_ready` and the
  // proof; once more after a stale proof. Returns the last status (Attach's error, if
  // the proof could not be made).
  template <typename Call>
  grpc::Status Unary(Deadline deadline, bool wait_for_ready, Call&& call) {
    for (int attempt = 0;; ++attempt) {
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline);
      ctx.set_wait_for_ready(wait_for_ready);
      grpc::Status s = Attach(&ctx, deadline, wait_for_ready);
      if (!s.ok()) return s;
      s = call(&ctx);
      if (attempt > 0 || !Stale(s)) return s;
    }
  }

  // Whether calls carry a proof (the credentials hold a token).
  bool proves() const { return !token_.empty(); }
  // The shard that proved itself last; nullopt before.
  std::optional<core::Identity> proven_shard() const;
  // Challenges answered with a valid proof so far (one per shard process seen).
  uint64_t challenges() const;

 private:
  // Runs the challenge; on success the proof header and the shard's instance.
  grpc::Status Challenge(Deadline deadline, bool wait_for_ready, std::string* header,
                         std::string* instance, core::Identity* server) const;
  grpc::Status NotProven(std::string_view why) const;

  const std::shared_ptr<grpc::ChannelInterface> channel_;
  const std::string token_;
  const std::string key_;  // crypto::TokenKey(token_)
  const std::string target_;
  const std::optional<core::Identity> shard_;

  mutable absl::Mutex mu_;
  bool challenging_ ABSL_GUARDED_BY(mu_) = false;
  std::string header_ ABSL_GUARDED_BY(mu_);    // "PS-Proof-v1 ..."; empty: challenge first
  std::string instance_ ABSL_GUARDED_BY(mu_);  // the proven process's instance id
  std::optional<core::Identity> proven_ ABSL_GUARDED_BY(mu_);
  uint64_t challenges_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ps::net
