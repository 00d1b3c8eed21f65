#include "server/health.h"

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "net/grpc_bytes.h"
#include "server/grpc_front.h"

namespace ps::server {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

constexpr size_t kMaxRequestBytes = 1024;

absl::StatusOr<HealthCheckRequest> ParseRequest(const grpc::ByteBuffer& raw) {
  if (raw.Length() > kMaxRequestBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a health request of ", raw.Length(),
                                                   " bytes; at most ", kMaxRequestBytes));
  }
  HealthCheckRequest req;
  if (absl::Status s = net::ParseMessage(raw, &req); !s.ok()) return s;
  return req;
}

grpc::ByteBuffer Response(HealthState::Status status) {
  HealthCheckResponse r;
  r.set_status(status);
  return net::SerializeMessage(r);
}

// One Watch stream: the status now, then each change (the newest, when several came
// while a write was in flight).
class WatchStream final : public StreamHandler {
 public:
  WatchStream(FrontCall* call, HealthState* state, std::string service)
      : call_(call), state_(state), service_(std::move(service)) {}
  ~WatchStream() override {
    if (id_ != 0) state_->Unwatch(id_);
  }

  // Registers the watcher; false (the call ended) when the state has no room.
  bool Register() {
    absl::StatusOr<uint64_t> id =
        state_->Watch(service_, [shared = shared_](HealthState::Status s) { shared->Changed(s); });
    if (!id.ok()) {
      call_->Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, std::string(id.status().message())));
      return false;
    }
    id_ = *id;
    return true;
  }

  void Start() override {
    absl::MutexLock lock(&shared_->mu);
    shared_->call = call_;
    shared_->WriteLocked();
  }
  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&shared_->mu);
    shared_->writing = false;
    if (!ok || shared_->cancelled) {
      shared_->EndLocked(grpc::Status(grpc::StatusCode::CANCELLED, "watch stream broken"));
      return;
    }
    shared_->WriteLocked();
  }
  void OnCancel() override {
    absl::MutexLock lock(&shared_->mu);
    shared_->cancelled = true;
    if (!shared_->writing) shared_->EndLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }

 private:
  // What watcher callbacks touch; they may outlive the stream by a moment.
  struct Shared {
    absl::Mutex mu;
    FrontCall* call ABSL_GUARDED_BY(mu) = nullptr;  // null until Start, and once ended
    bool writing ABSL_GUARDED_BY(mu) = false;
    bool cancelled ABSL_GUARDED_BY(mu) = false;
    std::optional<HealthState::Status> pending ABSL_GUARDED_BY(mu);
    grpc::ByteBuffer message ABSL_GUARDED_BY(mu);

    void Changed(HealthState::Status s) {
      absl::MutexLock lock(&mu);
      pending = s;
      WriteLocked();
    }
    void WriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      if (call == nullptr || writing || cancelled || !pending.has_value()) return;
      message = Response(*pending);
      pending.reset();
      writing = true;
      call->Write(&message);
    }
    void EndLocked(const grpc::Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      if (call == nullptr) return;
      call->Finish(s);
      call = nullptr;
    }
  };

  FrontCall* const call_;
  HealthState* const state_;
  const std::string service_;
  uint64_t id_ = 0;
  const std::shared_ptr<Shared> shared_ = std::make_shared<Shared>();
};

}  // namespace

void HealthState::Set(const std::string& service, bool serving) {
  std::vector<Watcher> tell;
  {
    absl::MutexLock lock(&mu_);
    auto [it, fresh] = serving_.try_emplace(service, serving);
    if (!fresh && it->second == serving) return;
    it->second = serving;
    for (const auto& [id, e] : watchers_) {
      if (e.service == service) tell.push_back(e.watcher);
    }
  }
  const Status s = serving ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
  for (const Watcher& w : tell) w(s);
}

HealthState::Status HealthState::Get(const std::string& service) const {
  absl::MutexLock lock(&mu_);
  auto it = serving_.find(service);
  if (it == serving_.end()) return HealthCheckResponse::SERVICE_UNKNOWN;
  return it->second ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
}

absl::StatusOr<uint64_t> HealthState::Watch(const std::string& service, Watcher w) {
  Status now;
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    if (watchers_.size() >= max_watches_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          max_watches_, " health watches are open on this port, the most --max-health-watches "
          "allows"));
    }
    id = next_++;
    watchers_.emplace(id, Entry{service, w});
    auto it = serving_.find(service);
    now = it == serving_.end() ? HealthCheckResponse::SERVICE_UNKNOWN
          : it->second         ? HealthCheckResponse::SERVING
                               : HealthCheckResponse::NOT_SERVING;
  }
  w(now);
  return id;
}

void HealthState::Unwatch(uint64_t id) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(id);
}

uint32_t HealthState::watches() const {
  absl::MutexLock lock(&mu_);
  return static_cast<uint32_t>(watchers_.size());
}

void AddHealthMethods(GrpcFront* front, HealthState* state, bool anonymous) {
  FrontMethod check;
  check.anonymous = anonymous;
  check.unary = [state](FrontCall* call, const grpc::ByteBuffer& raw) {
    absl::StatusOr<HealthCheckRequest> req = ParseRequest(raw);
    if (!req.ok()) {
      call->Reply(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(req.status().message())), {});
      return;
    }
    const HealthState::Status s = state->Get(req->service());
    if (s == HealthCheckResponse::SERVICE_UNKNOWN) {
      call->Reply(grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service"), {});
      return;
    }
    call->Reply(grpc::Status::OK, Response(s));
  };
  front->Add("/grpc.health.v1.Health/Check", std::move(check));
  FrontMethod watch;
  watch.anonymous = anonymous;
  watch.stream = [state](FrontCall* call,
                         const grpc::ByteBuffer& raw) -> std::unique_ptr<StreamHandler> {
    absl::StatusOr<HealthCheckRequest> req = ParseRequest(raw);
    if (!req.ok()) {
      call->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(req.status().message())));
      return nullptr;
    }
    auto stream = std::make_unique<WatchStream>(call, state, req->service());
    if (!stream->Register()) return nullptr;
    return stream;
  };
  front->Add("/grpc.health.v1.Health/Watch", std::move(watch));
}

}  // namespace ps::server
