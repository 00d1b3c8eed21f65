// GrpcFront: every call to a shard's gRPC port, through one generic callback service
// (docs/connections.md). gRPC hands a generic call over as soon as its headers arrived
// and passed the credential check (server/metadata_auth.h), before reading any of its
// body. The front then:
// - finds the method (unknown: UNIMPLEMENTED) and the caller (Authenticator::Identify);
//   a call with an identity proves its connection (server/listener.h);
// - opens the call in the port's CallBudget: a client with max_calls_per_client calls
//   open is refused (RESOURCE_EXHAUSTED, over_limit);
// - reads the request body once the budget gives the call a place (CallBudget: a body
//   being received costs up to --max-message-bytes, so their number is bounded per
//   client and in all), and ends the call (CANCELLED, counted as `stalled`) when the body
//   has not arrived read_timeout after reading started;
// - reports each call's start, end and early cancel to its ResetWatch
//   (server/reset_watch.h), and closes a connection that resets streams abusively
//   (HTTP/2 rapid reset) through the listener;
// - hands the body to the method's handler: a unary handler answers once through
//   FrontCall::Reply; a server-streaming handler returns a StreamHandler that writes
//   through FrontCall::Write and ends with FrontCall::Finish.
// The wire is that of ordinary unary and server-streaming methods: clients are
// unchanged. Why not gRPC's generated services: for those gRPC reads a unary call's whole
// message before any application code runs, opening the stream's window to it, so a
// client could keep any number of half-sent messages in the shard's memory.
//
// Thread safety: handlers run on gRPC's callback threads; Reply, Write and Finish may be
// called from any thread. Lifetimes: the front outlives the gRPC server it serves.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "core/clock.h"
#include "core/refusal.h"
#include "server/auth_internal.h"
#include "server/call_budget.h"
#include "server/port_stats.h"
#include "server/reset_watch.h"

namespace ps::server {

class Listener;

// One call as a handler sees it.
class FrontCall {
 public:
  virtual ~FrontCall() = default;
  virtual grpc::CallbackServerContext& context() = 0;
  // Who is calling, as checked at the call's start: an error only on a port that lets
  // calls without credentials in (health).
  virtual const absl::StatusOr<Caller>& caller() const = 0;
  // Unary calls: ends the call, with `response` when `status` is OK. Exactly once.
  virtual void Reply(const grpc::Status& status, grpc::ByteBuffer response) = 0;
  // Streaming calls: writes one message (the next only after OnWriteDone), and ends the
  // call (once; not while a write is in flight).
  virtual void Write(const grpc::ByteBuffer* message) = 0;
  virtual void Finish(const grpc::Status& status) = 0;
};

// A server-streaming call's own state, owned by the front; destroyed when the call is
// done (no callback after that).
class StreamHandler {
 public:
  virtual ~StreamHandler() = default;
  // Called once the front holds the handler: writing may start here, not before.
  virtual void Start() = 0;
  virtual void OnWriteDone(bool ok) = 0;
  virtual void OnCancel() = 0;
};

struct FrontMethod {
  // Calls without a valid identity may use it (health); otherwise the port's
  // credential check has refused them before the front.
  bool anonymous = false;
  // Exactly one is set. A unary handler answers through call->Reply; a streaming one
  // returns its state, or null after ending the call itself.
  std::function<void(FrontCall* call, const grpc::ByteBuffer& request)> unary;
  std::function<std::unique_ptr<StreamHandler>(FrontCall* call, const grpc::ByteBuffer& request)>
      stream;
  // Optional: decides from the caller alone, before the body is read or counted in the
  // budget, whether the port serves the method at all in its configuration (the data
  // methods at a shard whose data plane is not gRPC). A refusal ends the call with it,
  // at once: a configuration mismatch, not abuse, so not through the tarpit.
  std::function<absl::Status(const Caller& caller)> refuse_unread;
};

class GrpcFront final : public grpc::CallbackGenericService {
 public:
  // `auth`: who calls (borrowed). `on_refused`: sees every refusal the front makes itself
  // (to count and log it; may be null).
  GrpcFront(const Authenticator* auth, const CallLimits& limits, const ResetLimits& resets,
            core::Clock* clock, std::function<void(core::Refusal, absl::string_view)> on_refused);
  ~GrpcFront() override;

  // Before serving. `path`: "/package.Service/Method".
  void Add(std::string path, FrontMethod method);
  // The listener whose connections calls prove; null: none. Before serving.
  void set_listener(Listener* listener) { listener_ = listener; }
  // Ends the stall checks; before the front is destroyed, after the server shut down.
  void Stop();

  FrontStats stats() const;

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override;

 private:
  class Reactor;
  friend class Reactor;

  void CheckStalls();
  // ResetWatch named `connection` (`why`): counted, logged and closed by the listener.
  void ResetsOn(const std::string& connection, std::string_view why);
  // A body arrived (or its call ended while it was being received).
  void EndRead(CallBudget::Ticket ticket);

  const Authenticator* const auth_;
  core::Clock* const clock_;
  const std::function<void(core::Refusal, absl::string_view)> on_refused_;
  Listener* listener_ = nullptr;
  CallBudget budget_;
  ResetWatch resets_;  // HTTP/2 rapid reset
  absl::flat_hash_map<std::string, FrontMethod> methods_;

  // Calls whose body is being received, by read ticket: the stall check cancels them.
  mutable absl::Mutex mu_;
  absl::flat_hash_map<CallBudget::Ticket, grpc::ServerContextBase*> reading_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread checker_;
  std::atomic<uint64_t> refused_calls_{0};
  std::atomic<uint64_t> stalled_{0};
  std::atomic<uint64_t> reset_connections_{0};
};

}  // namespace ps::server
