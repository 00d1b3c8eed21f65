#include "server/grpc_front.h"

#include <bit>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "net/grpc_status.h"
#include "server/listener.h"
#include "spdlog/spdlog.h"

namespace ps::server {
namespace {

constexpr auto kStallCheckEvery = std::chrono::milliseconds(250);

// The address of a gRPC peer string without its port ("ipv4:1.2.3.4:5" -> "1.2.3.4").
std::string SourceOf(const std::string& peer) {
  std::string_view p = peer;
  if (const size_t colon = p.find(':'); colon != std::string_view::npos) p.remove_prefix(colon + 1);
  if (const size_t last = p.rfind(':'); last != std::string_view::npos) p = p.substr(0, last);
  return std::string(p);
}

}  // namespace

class GrpcFront::Reactor final : public grpc::ServerGenericBidiReactor, public FrontCall {
 public:
  Reactor(GrpcFront* front, grpc::GenericCallbackServerContext* ctx)
      : front_(front), ctx_(ctx), connection_(ctx->peer()) {
    if (front->resets_.Begin(connection_)) {
      front->ResetsOn(connection_, absl::StrCat("holds more than ",
                                                front->resets_.limits().max_held_per_connection,
                                                " calls: it reset streams faster than the shard "
                                                "ends their calls"));
    }
    auto it = front->methods_.find(ctx->method());
    if (it == front->methods_.end()) {
      FinishOnce(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                              absl::StrCat("unknown method ", core::AsAbsl(ctx->method()))));
      return;
    }
    method_ = &it->second;
    caller_ = front->auth_->Identify(*ctx);
    if (!caller_.ok() && !method_->anonymous) {
      // The port's credential check lets no such call through; a port without one
      // (--insecure) has anonymous callers, whose Identify succeeds.
      FinishOnce(net::ToGrpc(caller_.status()));
      return;
    }
    if (caller_.ok() && !method_->anonymous && front->listener_ != nullptr) {
      front->listener_->Proven(connection_,
                               caller_->identity.has_value() ? caller_->identity->Name() : "");
    }
    if (caller_.ok() && method_->refuse_unread) {
      if (absl::Status refused = method_->refuse_unread(*caller_); !refused.ok()) {
        FinishOnce(net::ToGrpc(refused));
        return;
      }
    }
    client_ = caller_.ok() && caller_->identity.has_value() ? caller_->identity->Name()
              : method_->anonymous ? absl::StrCat("anonymous@", SourceOf(connection_))
                                   : connection_;  // --insecure: each connection its own
    if (absl::Status open = front->budget_.OpenCall(client_); !open.ok()) {
      front->refused_calls_.fetch_add(1, std::memory_order_relaxed);
      if (front->on_refused_) front->on_refused_(core::Refusal::kOverLimit, open.message());
      FinishOnce(net::ToGrpc(core::Refused(core::Refusal::kOverLimit, open.message())));
      return;
    }
    opened_ = true;
    const CallBudget::Ticket ticket =
        front->budget_.RequestRead(client_, [this](CallBudget::Ticket t) { BeginRead(t); });
    absl::MutexLock lock(&mu_);
    ticket_ = ticket;
  }

  // FrontCall
  grpc::CallbackServerContext& context() override { return *ctx_; }
  const absl::StatusOr<Caller>& caller() const override { return caller_; }
  void Reply(const grpc::Status& status, grpc::ByteBuffer response) override {
    if (finished_.exchange(true)) return;
    if (!status.ok()) {
      grpc::ServerGenericBidiReactor::Finish(status);
      return;
    }
    response_ = std::move(response);
    if (!response_.Valid()) {  // an empty message still goes out as one
      grpc::Slice empty;
      response_ = grpc::ByteBuffer(&empty, 1);
    }
    StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
  }
  void Write(const grpc::ByteBuffer* message) override { StartWrite(message); }
  void Finish(const grpc::Status& status) override { FinishOnce(status); }

  // gRPC
  void OnReadDone(bool ok) override {
    CallBudget::Ticket ticket;
    bool cancelled;
    {
      absl::MutexLock lock(&mu_);
      state_ = State::kHandling;
      ticket = ticket_;
      cancelled = cancelled_;
    }
    front_->EndRead(ticket);
    if (!ok || cancelled) {
      FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED,
                              ok ? "cancelled" : "the call ended before its request message"));
      return;
    }
    if (method_->unary) {
      method_->unary(this, request_);
      return;
    }
    std::unique_ptr<StreamHandler> handler = method_->stream(this, request_);
    if (handler == nullptr) return;  // it ended the call
    StreamHandler* h = handler.get();
    {
      absl::MutexLock lock(&mu_);
      handler_ = std::move(handler);
    }
    h->Start();
    absl::MutexLock lock(&mu_);
    if (cancelled_ && !cancel_told_) {
      cancel_told_ = true;
      mu_.Unlock();
      h->OnCancel();
      mu_.Lock();
    }
  }

  void OnWriteDone(bool ok) override {
    StreamHandler* h;
    {
      absl::MutexLock lock(&mu_);
      h = handler_.get();
    }
    if (h != nullptr) h->OnWriteDone(ok);
  }

  void OnCancel() override {
    StreamHandler* h = nullptr;
    bool finish = false;
    bool early = false;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      early = state_ != State::kHandling;
      if (state_ == State::kWaiting && ticket_ != 0) {
        finish = front_->budget_.CancelRead(ticket_);
        if (finish) state_ = State::kHandling;
      } else if (state_ == State::kHandling && handler_ != nullptr && !cancel_told_) {
        cancel_told_ = true;
        h = handler_.get();
      }
    }
    if (finish) FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
    if (h != nullptr) h->OnCancel();
    if (early && front_->resets_.EarlyCancel(connection_)) {
      front_->ResetsOn(connection_,
                       absl::StrCat("cancelled ", front_->resets_.limits().max_early_cancels,
                                    " calls within a second before their requests arrived"));
    }
  }

  void OnDone() override {
    std::unique_ptr<StreamHandler> handler;
    State state;
    CallBudget::Ticket ticket;
    {
      absl::MutexLock lock(&mu_);
      handler = std::move(handler_);
      state = state_;
      ticket = ticket_;
    }
    if (state == State::kWaiting && ticket != 0) front_->budget_.CancelRead(ticket);
    if (state == State::kReading) front_->EndRead(ticket);
    handler.reset();  // before the call's place is given back
    if (opened_) front_->budget_.CloseCall(client_);
    front_->resets_.End(connection_);
    delete this;
  }

 private:
  enum class State { kWaiting, kReading, kHandling };

  // The budget gave this call a place to receive its body.
  // May run on another call's thread (the budget's ReadDone), so after it ends this
  // call (FinishOnce) it touches nothing of the reactor: OnDone may delete it at once.
  void BeginRead(CallBudget::Ticket ticket) {
    bool cancelled;
    {
      absl::MutexLock lock(&mu_);
      ticket_ = ticket;
      cancelled = cancelled_ || state_ != State::kWaiting;
      state_ = cancelled ? State::kHandling : State::kReading;
    }
    if (cancelled) {
      GrpcFront* const front = front_;
      front->budget_.ReadDone(ticket);
      FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
      return;
    }
    {
      absl::MutexLock lock(&front_->mu_);
      front_->reading_[ticket] = ctx_;
    }
    StartRead(&request_);
  }

  void FinishOnce(const grpc::Status& status) {
    if (!finished_.exchange(true)) grpc::ServerGenericBidiReactor::Finish(status);
  }

  GrpcFront* const front_;
  grpc::GenericCallbackServerContext* const ctx_;
  const std::string connection_;  // the peer: its address and port
  const FrontMethod* method_ = nullptr;
  absl::StatusOr<Caller> caller_ = absl::UnknownError("not identified");
  std::string client_;
  bool opened_ = false;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  std::atomic<bool> finished_{false};

  absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kWaiting;
  CallBudget::Ticket ticket_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool cancel_told_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<StreamHandler> handler_ ABSL_GUARDED_BY(mu_);
};

GrpcFront::GrpcFront(const Authenticator* auth, const CallLimits& limits,
                     const ResetLimits& resets, core::Clock* clock,
                     std::function<void(core::Refusal, absl::string_view)> on_refused)
    : auth_(auth),
      clock_(clock),
      on_refused_(std::move(on_refused)),
      budget_(limits, clock),
      resets_(resets, clock) {
  checker_ = std::thread([this] { CheckStalls(); });
}

GrpcFront::~GrpcFront() { Stop(); }

void GrpcFront::Add(std::string path, FrontMethod method) {
  methods_.insert_or_assign(std::move(path), std::move(method));
}

void GrpcFront::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (checker_.joinable()) checker_.join();
}

FrontStats GrpcFront::stats() const {
  FrontStats s;
  s.budget = budget_.stats();
  s.refused_calls = refused_calls_.load();
  s.stalled = stalled_.load();
  s.reset_connections = reset_connections_.load();
  return s;
}

grpc::ServerGenericBidiReactor* GrpcFront::CreateReactor(grpc::GenericCallbackServerContext* ctx) {
  return new Reactor(this, ctx);
}

void GrpcFront::EndRead(CallBudget::Ticket ticket) {
  {
    absl::MutexLock lock(&mu_);
    reading_.erase(ticket);
  }
  budget_.ReadDone(ticket);
}

void GrpcFront::ResetsOn(const std::string& connection, std::string_view why) {
  const uint64_t n = reset_connections_.fetch_add(1, std::memory_order_relaxed) + 1;
  // The 1st, 2nd, 4th, ... at warn, as the listener logs its closes.
  spdlog::log(std::has_single_bit(n) ? spdlog::level::warn : spdlog::level::debug,
              "closing the connection of {}: it {} (HTTP/2 rapid reset; {} so far)", connection,
              why, n);
  if (listener_ != nullptr) listener_->Abusive(connection, CloseReason::kResets);
}

void GrpcFront::CheckStalls() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::FromChrono(kStallCheckEvery));
      if (stopping_) return;
    }
    resets_.Sweep();
    for (CallBudget::Ticket ticket : budget_.Overdue(clock_->Now())) {
      std::string peer;
      {
        absl::MutexLock lock(&mu_);
        auto it = reading_.find(ticket);
        if (it == reading_.end()) continue;
        peer = it->second->peer();
        // Its OnReadDone(false) follows and gives the read's place back.
        it->second->TryCancel();
        reading_.erase(it);
      }
      stalled_.fetch_add(1, std::memory_order_relaxed);
      if (on_refused_) {
        on_refused_(core::Refusal::kStalled,
                    absl::StrCat("a request from ", peer, " did not arrive within ",
                                 std::chrono::duration_cast<std::chrono::milliseconds>(
                                     budget_.limits().read_timeout).count(),
                                 " ms of its first bytes (--request-read-timeout-ms): call "
                                 "cancelled"));
      }
    }
  }
}

}  // namespace ps::server
