// Fakes of a shard's two halves for the unit tests of the worker's parts, with no
// server behind them. FakeControl answers joins, layout registration and slice uploads
// from a script. FakeDataChannel (the data plane's channel) takes the routes joins
// hand it; its pushes either answer at once through `push_handler` or wait in `held`
// until the test answers them (to look at what is in flight); its pulls deliver the
// messages `pull_handler` returns, synchronously, then its final status. Both record
// every request, the data channel's as the ps.v1 messages the gRPC plane would send
// under its route's session. Thread-safe.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ps/v1/ps.pb.h"
#include "worker_lib/shard_client_internal.h"
#include "worker_lib/transport/channels.h"
#include "worker_lib/transport/data_channel.h"
#include "worker_lib/transport/shard_control.h"

namespace ps::internal {

class FakeControl final : public ShardControl {
 public:
  explicit FakeControl(v1::JoinResponse join) : join_(std::move(join)) {}

  // Failures the next joins return, in order, before joins succeed again.
  void FailJoins(std::vector<absl::Status> failures) {
    absl::MutexLock lock(&mu_);
    for (auto& s : failures) join_failures_.push_back(std::move(s));
  }
  void SetJoinResponse(v1::JoinResponse join) {
    absl::MutexLock lock(&mu_);
    join_ = std::move(join);
  }
  void SetRegisterLayout(absl::Status status, std::vector<uint32_t> owned) {
    absl::MutexLock lock(&mu_);
    register_status_ = std::move(status);
    owned_ = std::move(owned);
  }

  int joins() const {
    absl::MutexLock lock(&mu_);
    return joins_;
  }
  std::vector<v1::RegisterLayoutRequest> registered() const {
    absl::MutexLock lock(&mu_);
    return registered_;
  }
  std::vector<v1::InitSliceRequest> inits() const {
    absl::MutexLock lock(&mu_);
    return inits_;
  }

  absl::Status Join(const v1::JoinRequest& req, RpcClock::time_point,
                    v1::JoinResponse* resp) override {
    absl::MutexLock lock(&mu_);
    ++joins_;
    join_requests_.push_back(req);
    if (!join_failures_.empty()) {
      absl::Status s = std::move(join_failures_.front());
      join_failures_.pop_front();
      return s;
    }
    *resp = join_;
    resp->set_session(absl::StrCat("session-", joins_));
    return absl::OkStatus();
  }

  absl::Status RegisterLayout(const v1::RegisterLayoutRequest& req, RpcClock::time_point,
                              v1::RegisterLayoutResponse* resp) override {
    absl::MutexLock lock(&mu_);
    registered_.push_back(req);
    for (uint32_t id : owned_) resp->add_owned_slices(id);
    return register_status_;
  }

  absl::Status InitSlice(const v1::InitSliceRequest& req, RpcClock::time_point,
                         v1::InitSliceResponse*) override {
    absl::MutexLock lock(&mu_);
    inits_.push_back(req);
    return absl::OkStatus();
  }

  // Objects are the real shard's (ClusterTest); the fake keeps none.
  absl::Status PutObject(const v1::PutObjectRequest&, RpcClock::time_point,
                         v1::PutObjectResponse*) override {
    return absl::UnimplementedError("the fake shard keeps no objects");
  }
  absl::Status GetObject(const v1::GetObjectRequest&, RpcClock::time_point,
                         v1::GetObjectResponse*) override {
    return absl::UnimplementedError("the fake shard keeps no objects");
  }
  absl::Status Leave(const v1::LeaveRequest&, RpcClock::time_point, v1::LeaveResponse*) override {
    return absl::OkStatus();
  }
  absl::Status Adopt(const v1::AdoptRequest&, RpcClock::time_point, v1::AdoptResponse*) override {
    return absl::UnimplementedError("the fake shard adopts no values");
  }
  absl::Status AdoptSlice(const v1::AdoptSliceRequest&, RpcClock::time_point,
                          v1::AdoptSliceResponse*) override {
    return absl::UnimplementedError("the fake shard adopts no values");
  }
  // Probes take payload / `bytes_per_second` (0: no time) and end with `status`.
  void SetProbe(double bytes_per_second, absl::Status status = absl::OkStatus()) {
    absl::MutexLock lock(&mu_);
    probe_rate_ = bytes_per_second;
    probe_status_ = std::move(status);
  }
  int probes() const {
    absl::MutexLock lock(&mu_);
    return probes_;
  }
  std::vector<v1::JoinRequest> join_requests() const {
    absl::MutexLock lock(&mu_);
    return join_requests_;
  }

  absl::Status Probe(const v1::ProbeRequest& req, RpcClock::time_point,
                     v1::ProbeResponse* resp) override {
    double rate = 0;
    absl::Status status;
    {
      absl::MutexLock lock(&mu_);
      ++probes_;
      rate = probe_rate_;
      status = probe_status_;
    }
    if (rate > 0) {
      std::this_thread::sleep_for(std::chrono::duration<double>(
          static_cast<double>(req.payload().size()) / rate));
    }
    resp->set_received_bytes(req.payload().size());
    return status;
  }

 private:
  mutable absl::Mutex mu_;
  v1::JoinResponse join_ ABSL_GUARDED_BY(mu_);
  std::deque<absl::Status> join_failures_ ABSL_GUARDED_BY(mu_);
  int joins_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status register_status_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> owned_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::RegisterLayoutRequest> registered_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::InitSliceRequest> inits_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::JoinRequest> join_requests_ ABSL_GUARDED_BY(mu_);
  double probe_rate_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status probe_status_ ABSL_GUARDED_BY(mu_);
  int probes_ ABSL_GUARDED_BY(mu_) = 0;
};

class FakeDataChannel final : public DataChannel {
 public:
  struct PullScript {
    std::vector<v1::PullResponse> messages;
    absl::Status status;  // how the stream ends after the messages
  };
  // Decides a push's answer; unset: pushes wait in held().
  using PushHandler = std::function<absl::Status(const v1::PushRequest&)>;
  using PullHandler = std::function<PullScript(const v1::PullRequest&)>;

  ~FakeDataChannel() override {
    std::vector<std::thread> threads;
    {
      absl::MutexLock lock(&mu_);
      threads.swap(threads_);
    }
    for (std::thread& t : threads) t.join();
  }

  void SetPushHandler(PushHandler handler) {
    absl::MutexLock lock(&mu_);
    push_handler_ = std::move(handler);
  }
  void SetPullHandler(PullHandler handler) {
    absl::MutexLock lock(&mu_);
    pull_handler_ = std::move(handler);
  }
  // Keeps the guards of borrowed pushes started from now on, as a transport whose write
  // still reads the bytes after the answer does, until ReleaseGuards.
  void KeepGuards() {
    absl::MutexLock lock(&mu_);
    keep_guards_ = true;
  }
  // Drops the guards kept; how many there were.
  size_t ReleaseGuards() {
    std::vector<std::shared_ptr<const void>> guards;
    {
      absl::MutexLock lock(&mu_);
      guards.swap(guards_);
    }
    return guards.size();
  }

  // Makes this a channel that carries chunks of `elems` values (as the UDP path's),
  // whose pushes are unanswered: set a push handler, so that each is answered before
  // Start returns. Before the pipeline is made, which reads it once.
  void CarryChunks(uint32_t elems) {
    absl::MutexLock lock(&mu_);
    chunk_elems_ = elems;
  }
  bool chunked() const override {
    absl::MutexLock lock(&mu_);
    return chunk_elems_ > 0;
  }
  uint32_t chunk_elems(size_t /*codec_bytes*/,
                       absl::FunctionRef<size_t(size_t)> /*max_encoded_bytes*/) const override {
    absl::MutexLock lock(&mu_);
    return chunk_elems_;
  }

  // What SetRoute returns from now on (the route is taken either way).
  void RefuseRoutes(absl::Status status) {
    absl::MutexLock lock(&mu_);
    route_status_ = std::move(status);
  }

  // The routes set, in order.
  std::vector<DataRoute> routes() const {
    absl::MutexLock lock(&mu_);
    return routes_;
  }
  // Every push started, in order (retries and replays included).
  std::vector<v1::PushRequest> pushes() const {
    absl::MutexLock lock(&mu_);
    return pushes_;
  }
  std::vector<v1::PullRequest> pulls() const {
    absl::MutexLock lock(&mu_);
    return pulls_;
  }

  // Slice ids of the pushes waiting for an answer (no push handler), oldest first.
  std::vector<uint32_t> held() const {
    absl::MutexLock lock(&mu_);
    std::vector<uint32_t> out;
    for (const Held& h : held_) out.push_back(h.req.slice_id());
    return out;
  }
  // Waits up to 5 s until `n` pushes are held; false on timeout.
  bool AwaitHeld(size_t n) const {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return held_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(5));
  }
  // Answers the oldest held push with `status` (on this thread); false if none.
  bool AnswerOldest(absl::Status status) {
    std::function<void(absl::Status)> done;
    {
      absl::MutexLock lock(&mu_);
      if (held_.empty()) return false;
      done = std::move(held_.front().done);
      held_.pop_front();
    }
    done(std::move(status));
    return true;
  }

  absl::Status SetRoute(const DataRoute& route) override {
    absl::MutexLock lock(&mu_);
    routes_.push_back(route);
    return route_status_;
  }

  std::unique_ptr<PushCall> NewPush(std::vector<const OutgoingPush*> pushes,
                                    RpcClock::time_point) override {
    absl::MutexLock lock(&mu_);
    return std::make_unique<FakePush>(this, Route(), std::move(pushes));
  }

  uint64_t Pull(PullAsk ask, RpcClock::time_point, std::shared_ptr<PullSink> sink) override {
    v1::PullRequest req;
    PullHandler handler;
    uint64_t epoch;
    {
      absl::MutexLock lock(&mu_);
      const DataRoute route = Route();
      req.set_session(route.session);
      epoch = route.epoch;
      req.set_layout_hash(ask.layout_hash);
      req.set_min_version(ask.min_version);
      for (uint32_t id : ask.slice_ids) req.add_slice_ids(id);
      req.set_held_epoch(ask.held_epoch);
      for (uint64_t v : ask.held_versions) req.add_held_versions(v);
      pulls_.push_back(req);
      handler = pull_handler_;
    }
    PullScript script = handler ? handler(req) : PullScript{{}, absl::UnavailableError("no pulls")};
    for (const v1::PullResponse& m : script.messages) {
      // The bytes a shard would send, handed over in three pieces as gRPC might.
      const std::string bytes = m.SerializeAsString();
      const size_t a = bytes.size() / 3, b = 2 * bytes.size() / 3;
      const std::string_view all(bytes);
      const std::string_view pieces[] = {all.substr(0, a), all.substr(a, b - a), all.substr(b)};
      absl::StatusOr<net::PullFrame> frame = net::ParsePullResponse(pieces);
      const absl::Status delivered = frame.ok() ? DeliverPullFrame(*frame, *sink) : frame.status();
      if (!delivered.ok()) {
        sink->Done(delivered);
        return epoch;
      }
    }
    sink->Done(script.status);
    return epoch;
  }

 private:
  struct Held {
    v1::PushRequest req;
    std::function<void(absl::Status)> done;
    const void* call = nullptr;
  };

  class FakePush final : public PushCall {
   public:
    FakePush(FakeDataChannel* t, DataRoute route, std::vector<const OutgoingPush*> pushes)
        : t_(t), route_(std::move(route)), pushes_(std::move(pushes)) {}
    uint64_t epoch() const override { return route_.epoch; }
    void Start(std::function<void(size_t, absl::Status)> done) override {
      // The requests as the shard would parse them, made first: an answer may destroy
      // this call.
      std::vector<v1::PushRequest> reqs;
      for (const OutgoingPush* p : pushes_) {
        v1::PushRequest& req = reqs.emplace_back();
        req.set_session(route_.session);
        req.set_layout_hash(p->layout_hash);
        req.set_round(p->round);
        req.set_slice_id(p->slice_id);
        req.set_codec(p->codec);
        if (p->loss.has_value()) req.set_loss(*p->loss);
        req.set_payload(p->Bytes());
        if (p->borrowed_guard != nullptr) t_->Keep(p->borrowed_guard);
      }
      FakeDataChannel* const t = t_;
      const void* const key = this;
      for (size_t i = 0; i < reqs.size(); ++i) {
        t->StartPush(key, reqs[i], [done, i](absl::Status s) { done(i, std::move(s)); });
      }
    }
    void Cancel() override { t_->CancelPush(this); }

   private:
    FakeDataChannel* t_;
    const DataRoute route_;
    const std::vector<const OutgoingPush*> pushes_;
  };

  DataRoute Route() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return routes_.empty() ? DataRoute{} : routes_.back();
  }

  void Keep(std::shared_ptr<const void> guard) {
    absl::MutexLock lock(&mu_);
    if (keep_guards_) guards_.push_back(std::move(guard));
  }

  void StartPush(const void* call, const v1::PushRequest& req,
                 std::function<void(absl::Status)> done) {
    PushHandler handler;
    {
      absl::MutexLock lock(&mu_);
      pushes_.push_back(req);
      handler = push_handler_;
      if (!handler) {
        held_.push_back(Held{req, std::move(done), call});
        return;
      }
    }
    done(handler(req));
  }

  // As gRPC: a cancelled call ends soon, on another thread, never inside Cancel().
  void CancelPush(const void* call) {
    absl::MutexLock lock(&mu_);
    for (auto it = held_.begin(); it != held_.end(); ++it) {
      if (it->call != call) continue;
      threads_.emplace_back(
          [done = std::move(it->done)] { done(absl::CancelledError("cancelled")); });
      held_.erase(it);
      return;
    }
  }

  mutable absl::Mutex mu_;
  std::vector<DataRoute> routes_ ABSL_GUARDED_BY(mu_);
  absl::Status route_status_ ABSL_GUARDED_BY(mu_);
  PushHandler push_handler_ ABSL_GUARDED_BY(mu_);
  PullHandler pull_handler_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::PushRequest> pushes_ ABSL_GUARDED_BY(mu_);
  bool keep_guards_ ABSL_GUARDED_BY(mu_) = false;
  uint32_t chunk_elems_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::shared_ptr<const void>> guards_ ABSL_GUARDED_BY(mu_);
  std::deque<Held> held_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::PullRequest> pulls_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

// Options that keep the tests fast: backoff of 1 ms doubling to 4 ms, 3 attempts.
inline WorkerOptions FastOptions() {
  WorkerOptions o;
  o.initial_backoff = std::chrono::milliseconds(1);
  o.max_backoff = std::chrono::milliseconds(4);
  o.rpc_timeout = std::chrono::milliseconds(1000);
  o.max_attempts = 3;
  return o;
}

// A layout, ShardClient and fakes for `num_shards` shards, each with a data-plane
// channel (Connect not called yet).
struct FakeCluster {
  FakeCluster(core::ModelLayout l, uint32_t num_shards, const WorkerOptions& options)
      : layout(std::move(l)) {
    std::vector<ShardLink> links;
    std::vector<std::string> addresses;
    for (uint32_t i = 0; i < num_shards; ++i) {
      v1::JoinResponse join;
      join.set_shard_id(i);
      join.set_num_shards(num_shards);
      join.set_num_workers(2);
      join.set_layout_registered(true);
      ShardLink link;
      auto control = std::make_unique<FakeControl>(join);
      auto channel = std::make_unique<FakeDataChannel>();
      controls.push_back(control.get());
      channels.push_back(channel.get());
      link.control = std::move(control);
      link.channels[static_cast<size_t>(PushPath::kDataPlane)] = std::move(channel);
      links.push_back(std::move(link));
      addresses.push_back(absl::StrCat("fake", i, ":1"));
    }
    ShardClient::Options o;
    o.worker_id = options.worker_id;
    o.rpc_timeout = options.rpc_timeout;
    o.join_policy = JoinRetryPolicy(options);
    client = std::make_unique<ShardClient>(o, layout, addresses, std::move(links),
                                           [this](uint32_t shard, const v1::JoinResponse& join) {
                                             if (on_rejoin) on_rejoin(shard, join);
                                           });
  }

  core::ModelLayout layout;
  // Owned by `client`.
  std::vector<FakeControl*> controls;
  std::vector<FakeDataChannel*> channels;
  std::function<void(uint32_t, const v1::JoinResponse&)> on_rejoin;
  std::unique_ptr<ShardClient> client;
};

}  // namespace ps::internal
