#include "worker_lib/worker.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include <grpc/grpc.h>
#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/credentials_internal.h"
#include "core/shaper.h"
#include "core/status.h"
#include "core/udp_frame.h"
#include "ps/v1/ps.grpc.pb.h"
#include "worker_lib/delay_queue_internal.h"
#include "worker_lib/send_queue_internal.h"
#include "worker_lib/tensor_encoder_internal.h"
#include "worker_lib/udp_sender_internal.h"

namespace ps {
namespace {

using Clock = std::chrono::system_clock;  // gRPC deadlines are system_clock

absl::Status FromGrpc(const grpc::Status& s, std::string_view context) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(core::AsAbsl(context), ": ", s.error_message()));
}

bool Retriable(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::UNAUTHENTICATED ||
         code == grpc::StatusCode::DEADLINE_EXCEEDED;
}

// One slice push in flight; owned by whoever currently drives it (the send queue, the
// callback, the retry queue).
struct PushCall {
  uint32_t shard = 0;
  size_t tensor = 0;
  int attempt = 0;
  uint64_t epoch = 0;
  // Bytes this call holds of its shard's in-flight window, from dispatch to its end.
  uint64_t credit = 0;
  grpc::StatusCode last_code = grpc::StatusCode::OK;
  // A resend after the shard restarted (ReplayPushes): not counted in pending_, and its
  // refusal (late, duplicate) is no error of the caller's.
  bool replay = false;
  v1::PushRequest req;
  v1::PushResponse resp;
  std::unique_ptr<grpc::ClientContext> ctx;
};

struct ShardConn {
  uint32_t id = 0;
  std::string address;
  // The shaping relay this shard's channel goes through, if the link is shaped.
  std::unique_ptr<core::ShapingRelay> relay;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::WorkerService::Stub> stub;
  absl::Mutex join_mu;  // serializes (re)joins
  mutable absl::Mutex mu;
  std::string session ABSL_GUARDED_BY(mu);
  uint64_t epoch ABSL_GUARDED_BY(mu) = 0;  // bumped by every successful join
  // The UDP path as of the last join: port (0: none), session id and MAC key.
  uint16_t udp_port ABSL_GUARDED_BY(mu) = 0;
  uint64_t udp_session ABSL_GUARDED_BY(mu) = 0;
  std::shared_ptr<const core::DatagramKey> udp_key ABSL_GUARDED_BY(mu);
  boost::asio::ip::udp::endpoint udp_endpoint;  // resolved at Start()
  ShardInfo info;
  // P3 send queue of gRPC pushes to this shard (made at Start()).
  absl::Mutex send_mu;
  std::unique_ptr<internal::SendQueue<std::unique_ptr<PushCall>>> queue ABSL_GUARDED_BY(send_mu);
};

// What one pull stream delivered; shared between the stream (which deletes itself
// in OnDone) and the thread waiting for it, so neither outlives what it touches.
struct PullResult {
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  grpc::Status status ABSL_GUARDED_BY(mu);
  std::string protocol_error ABSL_GUARDED_BY(mu);
  std::vector<uint32_t> received ABSL_GUARDED_BY(mu);
  uint64_t min_version ABSL_GUARDED_BY(mu) = UINT64_MAX;
  uint64_t bytes ABSL_GUARDED_BY(mu) = 0;

  // Waits for the end of the stream and returns its status.
  grpc::Status Await() {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&done));
    if (!protocol_error.empty()) return grpc::Status(grpc::StatusCode::INTERNAL, protocol_error);
    return status;
  }
};

// Called with each slice id once its values are in place (on a gRPC thread).
using SliceArrived = std::function<void(uint32_t)>;

// Streams the requested slices of one shard and copies each into its destination.
// Owns itself: created with new, deleted at the end of OnDone (gRPC's last call).
class PullStream final : public grpc::ClientReadReactor<v1::PullResponse> {
 public:
  // `dst` and `on_slice` must stay valid until `result` reports done.
  static void Start(v1::WorkerService::Stub* stub, const core::ClientCredentials& creds,
                    v1::PullRequest req, Clock::time_point deadline,
                    const core::ModelLayout* layout, const absl::flat_hash_map<uint32_t, float*>* dst,
                    const SliceArrived* on_slice, std::shared_ptr<PullResult> result) {
    auto* stream = new PullStream(std::move(req), layout, dst, on_slice, std::move(result));
    core::AttachCredentials(creds, &stream->ctx_);
    stream->ctx_.set_deadline(deadline);
    stream->ctx_.set_wait_for_ready(true);
    stub->async()->Pull(&stream->ctx_, &stream->req_, stream);
    stream->StartRead(&stream->resp_);
    stream->StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // end of stream; OnDone follows
    const uint32_t id = resp_.slice_id();
    auto it = dst_->find(id);
    const bool wanted = it != dst_->end() &&
                        std::find(req_.slice_ids().begin(), req_.slice_ids().end(), id) !=
                            req_.slice_ids().end();
    if (!wanted || resp_.version() < req_.min_version() ||
        resp_.values().size() != size_t{layout_->slices()[id].numel} * sizeof(float)) {
      absl::MutexLock lock(&result_->mu);
      result_->protocol_error = absl::StrCat("shard sent an unexpected or malformed slice ", id,
                                             " (version ", resp_.version(), ", ",
                                             resp_.values().size(), " bytes)");
      ctx_.TryCancel();
      return;
    }
    std::memcpy(it->second, resp_.values().data(), resp_.values().size());
    {
      absl::MutexLock lock(&result_->mu);
      result_->received.push_back(id);
      result_->min_version = std::min(result_->min_version, resp_.version());
      result_->bytes += resp_.values().size();
    }
    if (*on_slice_) (*on_slice_)(id);
    StartRead(&resp_);
  }

  void OnDone(const grpc::Status& s) override {
    std::shared_ptr<PullResult> result = std::move(result_);
    delete this;
    absl::MutexLock lock(&result->mu);
    result->status = s;
    result->done = true;
  }

 private:
  PullStream(v1::PullRequest req, const core::ModelLayout* layout,
             const absl::flat_hash_map<uint32_t, float*>* dst, const SliceArrived* on_slice,
             std::shared_ptr<PullResult> result)
      : req_(std::move(req)), layout_(layout), dst_(dst), on_slice_(on_slice), result_(std::move(result)) {}

  grpc::ClientContext ctx_;
  v1::PullRequest req_;
  v1::PullResponse resp_;
  const core::ModelLayout* layout_;
  const absl::flat_hash_map<uint32_t, float*>* dst_;
  const SliceArrived* on_slice_;
  std::shared_ptr<PullResult> result_;
};

// A pull running on its own thread, counting per tensor the slices still to come.
class PullTicketImpl final : public PullTicket {
 public:
  using PullFn = std::function<absl::StatusOr<uint64_t>(const SliceArrived&)>;

  PullTicketImpl(const core::ModelLayout& layout, absl::flat_hash_map<uint32_t, float*> dst)
      : layout_(layout), dst_(std::move(dst)), arrived_(layout.slices().size(), 0) {
    for (size_t t = 0; t < layout.tensors().size(); ++t) {
      remaining_.push_back(layout.SlicesOfTensor(t).size());
    }
    on_slice_ = [this](uint32_t id) {
      absl::MutexLock lock(&mu_);
      if (arrived_[id]) return;
      arrived_[id] = 1;
      --remaining_[layout_.slices()[id].tensor];
    };
  }

  ~PullTicketImpl() override { Join(); }

  const absl::flat_hash_map<uint32_t, float*>& dst() const { return dst_; }

  void Run(PullFn pull) {
    thread_ = std::thread([this, pull = std::move(pull)] {
      absl::StatusOr<uint64_t> r = pull(on_slice_);
      absl::MutexLock lock(&mu_);
      result_ = std::move(r);
      done_ = true;
    });
  }

  absl::Status WaitTensor(size_t tensor) override {
    if (tensor >= remaining_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("no tensor ", tensor, "; the layout has ",
                                                     remaining_.size()));
    }
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return remaining_[tensor] == 0 || done_; };
    mu_.Await(absl::Condition(&ready));
    if (remaining_[tensor] == 0) return absl::OkStatus();
    if (!result_.ok()) return result_.status();
    return absl::InternalError(absl::StrCat("pull ended without tensor '",
                                            layout_.tensors()[tensor].name, "'"));
  }

  bool TensorReady(size_t tensor) const override {
    absl::MutexLock lock(&mu_);
    return tensor < remaining_.size() && remaining_[tensor] == 0;
  }

  absl::StatusOr<uint64_t> Wait() override {
    Join();
    absl::MutexLock lock(&mu_);
    return result_;
  }

 private:
  void Join() {
    absl::MutexLock lock(&join_mu_);
    if (thread_.joinable()) thread_.join();
  }

  const core::ModelLayout& layout_;
  const absl::flat_hash_map<uint32_t, float*> dst_;
  SliceArrived on_slice_;
  absl::Mutex join_mu_;
  std::thread thread_ ABSL_GUARDED_BY(join_mu_);
  mutable absl::Mutex mu_;
  std::vector<uint8_t> arrived_ ABSL_GUARDED_BY(mu_);
  std::vector<size_t> remaining_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::StatusOr<uint64_t> result_ ABSL_GUARDED_BY(mu_) = absl::UnknownError("pull still running");
};

class WorkerImpl final : public Worker {
 public:
  WorkerImpl(WorkerOptions options, core::ModelLayout layout)
      : options_(std::move(options)), layout_(std::move(layout)) {}

  ~WorkerImpl() override {
    {
      absl::MutexLock lock(&mu_);
      closing_ = true;
      for (grpc::ClientContext* ctx : in_flight_) ctx->TryCancel();
    }
    retries_.Stop();  // runs what is queued at once; SendPush sees closing_
    for (auto& c : shards_) {
      std::vector<std::unique_ptr<PushCall>> queued;
      {
        absl::MutexLock lock(&c->send_mu);
        if (c->queue != nullptr) queued = c->queue->TakeAll();
      }
      absl::MutexLock lock(&mu_);
      for (auto& call : queued) FinishPushLocked(*call, absl::CancelledError("worker is shutting down"));
    }
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](WorkerImpl* w) ABSL_NO_THREAD_SAFETY_ANALYSIS { return w->pending_ == 0 && w->replays_ == 0; },
        this));
  }

  absl::Status Init(std::span<const std::span<const float>> initial) {
    if (options_.shard_addresses.size() != layout_.num_shards()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the layout is cut for ", layout_.num_shards(), " shards but ",
          options_.shard_addresses.size(), " shard addresses were given"));
    }
    if (!initial.empty()) {
      if (initial.size() != layout_.tensors().size()) {
        return absl::InvalidArgumentError(absl::StrCat("initial values for ", initial.size(),
                                                       " tensors; the layout has ",
                                                       layout_.tensors().size()));
      }
      for (size_t t = 0; t < initial.size(); ++t) {
        if (initial[t].size() != layout_.tensors()[t].numel) {
          return absl::InvalidArgumentError(absl::StrCat(
              "initial value of tensor '", layout_.tensors()[t].name, "' has ", initial[t].size(),
              " elements; the layout says ", layout_.tensors()[t].numel));
        }
      }
    }
    for (const auto& [name, push] : options_.tensor_push) {
      bool known = false;
      for (const core::TensorSpec& t : layout_.tensors()) known = known || t.name == name;
      if (!known) {
        return absl::InvalidArgumentError(
            absl::StrCat("push options for tensor '", name, "', which the layout does not have"));
      }
    }
    for (const core::TensorSpec& t : layout_.tensors()) {
      const auto it = options_.tensor_push.find(t.name);
      const PushOptions& push = it != options_.tensor_push.end() ? it->second : options_.push;
      auto encoder = internal::TensorEncoder::Make(push, options_.codec_seed, t.numel);
      if (!encoder.ok()) {
        return absl::Status(encoder.status().code(),
                            absl::StrCat("push options of tensor '", t.name, "': ",
                                         encoder.status().message()));
      }
      encoders_.push_back(std::make_unique<TensorSlot>());
      encoders_.back()->encoder = *std::move(encoder);
      encoders_.back()->udp = push.udp;
      if (push.udp && udp_sender_ == nullptr) {
        PS_ASSIGN_OR_RETURN(udp_sender_, internal::UdpSender::Start(options_.udp, options_.priority_order));
      }
    }
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    args.SetMaxSendMessageSize(64 << 20);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, static_cast<int>(options_.initial_backoff.count()));
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, static_cast<int>(options_.initial_backoff.count()));
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(options_.max_backoff.count()));
    if (options_.receive_window_bytes > 0) {
      args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
      args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, static_cast<int>(options_.receive_window_bytes));
    }
    core::ApplyChannelArguments(options_.credentials, &args);
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds_or =
        core::MakeChannelCredentials(options_.credentials);
    if (!creds_or.ok()) {
      return absl::Status(creds_or.status().code(),
                          absl::StrCat("worker credentials: ", creds_or.status().message()));
    }
    const std::shared_ptr<grpc::ChannelCredentials> channel_creds = *std::move(creds_or);
    shards_.reserve(options_.shard_addresses.size());
    for (uint32_t i = 0; i < options_.shard_addresses.size(); ++i) {
      auto c = std::make_unique<ShardConn>();
      c->id = i;
      c->address = options_.shard_addresses[i];
      std::string target = c->address;
      if (options_.shaping.enabled()) {
        auto relay = core::ShapingRelay::Start(c->address, options_.shaping);
        if (!relay.ok()) {
          return absl::Status(relay.status().code(), absl::StrCat("shaping the link to ", ShardName(*c),
                                                                  ": ", relay.status().message()));
        }
        c->relay = *std::move(relay);
        target = c->relay->address();
      }
      c->channel = grpc::CreateCustomChannel(target, channel_creds, args);
      {
        absl::MutexLock lock(&c->send_mu);
        c->queue = std::make_unique<internal::SendQueue<std::unique_ptr<PushCall>>>(
            options_.priority_order, options_.max_inflight_bytes);
      }
      c->stub = v1::WorkerService::NewStub(c->channel);
      shards_.push_back(std::move(c));
    }
    const auto deadline = Clock::now() + options_.connect_timeout;
    uint64_t start = UINT64_MAX;
    for (auto& c : shards_) {
      PS_ASSIGN_OR_RETURN(v1::JoinResponse join, JoinShard(*c, deadline));
      if (join.num_shards() != layout_.num_shards()) {
        return absl::FailedPreconditionError(absl::StrCat(
            ShardName(*c), " belongs to a cluster of ", join.num_shards(),
            " shards; this worker's layout is cut for ", layout_.num_shards()));
      }
      if (!join.layout_registered()) PS_RETURN_IF_ERROR(RegisterOn(*c, join, initial));
      c->info.shard_id = join.shard_id();
      c->info.num_workers = join.num_workers();
      c->info.aggregator = join.aggregator();
      c->info.aggregate_only = join.aggregate_only();
      c->info.version = join.version();
      if (udp_sender_ != nullptr) {
        if (join.udp_port() == 0) {
          return absl::FailedPreconditionError(absl::StrCat(
              "tensors are pushed over UDP but ", ShardName(*c),
              " runs without the UDP path (start it with --udp-port)"));
        }
        PS_ASSIGN_OR_RETURN(c->udp_endpoint,
                            internal::ResolveUdp(c->address, static_cast<uint16_t>(join.udp_port())));
      }
      infos_.push_back(c->info);
      start = std::min(start, join.version());
    }
    start_version_ = start;
    return absl::OkStatus();
  }

  const core::ModelLayout& layout() const override { return layout_; }
  const std::vector<ShardInfo>& shards() const override { return infos_; }
  uint64_t start_version() const override { return start_version_; }

  absl::Status Push(size_t tensor, uint64_t round, std::span<const float> grad) override {
    if (tensor >= layout_.tensors().size()) {
      return absl::InvalidArgumentError(absl::StrCat("no tensor ", tensor, "; the layout has ",
                                                     layout_.tensors().size()));
    }
    const core::TensorSpec& spec = layout_.tensors()[tensor];
    if (grad.size() != spec.numel) {
      return absl::InvalidArgumentError(absl::StrCat("gradient of '", spec.name, "' has ",
                                                     grad.size(), " elements; expected ", spec.numel));
    }
    if (encoders_[tensor]->udp) return PushUdp(tensor, round, grad);
    std::vector<std::unique_ptr<PushCall>> calls;
    {
      TensorSlot& slot = *encoders_[tensor];
      absl::MutexLock lock(&slot.mu);
      std::vector<internal::SliceRange> ranges;
      for (uint32_t id : layout_.SlicesOfTensor(tensor)) {
        const core::SliceInfo& s = layout_.slices()[id];
        ranges.push_back({id, s.offset, s.numel});
      }
      std::vector<std::string> payloads;
      absl::Status st = slot.encoder->Encode(grad, round, options_.worker_id, ranges, &payloads);
      if (!st.ok()) {
        return absl::Status(st.code(), absl::StrCat("encoding '", spec.name, "' for round ",
                                                    round, ": ", st.message()));
      }
      for (size_t k = 0; k < ranges.size(); ++k) {
        auto call = std::make_unique<PushCall>();
        call->shard = layout_.slices()[ranges[k].id].shard;
        call->tensor = tensor;
        call->req.set_layout_hash(layout_.hash());
        call->req.set_round(round);
        call->req.set_slice_id(ranges[k].id);
        call->req.set_codec(std::string(slot.encoder->spec()));
        *call->req.mutable_payload() = std::move(payloads[k]);
        calls.push_back(std::move(call));
      }
    }
    {
      absl::MutexLock lock(&mu_);
      pending_ += calls.size();
    }
    std::set<uint32_t> touched;
    for (auto& call : calls) {
      ShardConn& c = *shards_[call->shard];
      touched.insert(c.id);
      const core::SliceInfo& si = layout_.slices()[call->req.slice_id()];
      const uint64_t bytes = call->req.payload().size();
      absl::MutexLock lock(&c.send_mu);
      c.queue->Push(si.priority, round, bytes, std::move(call));
    }
    for (uint32_t shard : touched) Dispatch(*shards_[shard]);
    return absl::OkStatus();
  }

  absl::Status WaitPushes() override {
    absl::Status udp = udp_sender_ != nullptr ? udp_sender_->WaitIdle() : absl::OkStatus();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](WorkerImpl* w) ABSL_NO_THREAD_SAFETY_ANALYSIS { return w->pending_ == 0; }, this));
    absl::Status st = std::move(first_error_);
    first_error_ = absl::OkStatus();
    return st.ok() ? udp : st;
  }

  absl::StatusOr<uint64_t> Pull(size_t tensor, uint64_t min_version, std::span<float> out,
                                std::chrono::milliseconds timeout) override {
    if (tensor >= layout_.tensors().size()) {
      return absl::InvalidArgumentError(absl::StrCat("no tensor ", tensor, "; the layout has ",
                                                     layout_.tensors().size()));
    }
    absl::flat_hash_map<uint32_t, float*> dst;
    PS_RETURN_IF_ERROR(AddDestinations(tensor, out, dst));
    return PullSlices(dst, min_version, timeout);
  }

  absl::StatusOr<uint64_t> PullAll(uint64_t min_version, std::span<const std::span<float>> outs,
                                   std::chrono::milliseconds timeout) override {
    absl::flat_hash_map<uint32_t, float*> dst;
    PS_RETURN_IF_ERROR(AllDestinations(outs, dst));
    return PullSlices(dst, min_version, timeout);
  }

  absl::StatusOr<std::unique_ptr<PullTicket>> StartPullAll(uint64_t min_version,
                                                           std::span<const std::span<float>> outs,
                                                           std::chrono::milliseconds timeout) override;

  std::string device_note(size_t tensor) const override {
    if (tensor >= encoders_.size()) return "";
    TensorSlot& slot = *encoders_[tensor];
    absl::MutexLock lock(&slot.mu);
    return std::string(slot.encoder->device_note());
  }

  WorkerStats stats() const override {
    WorkerStats s;
    s.slices_pushed = slices_pushed_.load();
    s.slices_refused = slices_refused_.load();
    s.push_bytes = push_bytes_.load();
    s.slices_pulled = slices_pulled_.load();
    s.pull_bytes = pull_bytes_.load();
    s.retries = retries_count_.load();
    s.pushes_replayed = pushes_replayed_.load();
    if (udp_sender_ != nullptr) {
      s.udp_datagrams_sent = udp_sender_->datagrams_sent();
      s.udp_datagrams_dropped = udp_sender_->datagrams_dropped();
      s.udp_bytes = udp_sender_->bytes_sent();
    }
    return s;
  }

 private:
  struct TensorSlot {
    absl::Mutex mu;
    std::unique_ptr<internal::TensorEncoder> encoder ABSL_GUARDED_BY(mu);
    bool udp = false;  // pushed as datagrams (PushOptions::udp)
  };

  // Encodes every chunk of every slice of `tensor` on its own, signs each with its
  // shard's session key and queues the datagrams (docs/transport.md, "UDP").
  absl::Status PushUdp(size_t tensor, uint64_t round, std::span<const float> grad) {
    const core::TensorSpec& spec = layout_.tensors()[tensor];
    const uint32_t chunk_elems = options_.udp.chunk_elems;
    std::vector<internal::SliceRange> ranges;
    struct Chunk {
      uint32_t slice = 0;
      uint16_t index = 0;
      uint16_t count = 0;
    };
    std::vector<Chunk> chunks;
    for (uint32_t id : layout_.SlicesOfTensor(tensor)) {
      const core::SliceInfo& s = layout_.slices()[id];
      const uint32_t count = core::ChunkCount(s.numel, chunk_elems);
      if (count > UINT16_MAX) {
        return absl::InvalidArgumentError(absl::StrCat(
            "slice ", id, " of '", spec.name, "' needs ", count, " UDP chunks of ", chunk_elems,
            " values; at most 65535 (raise udp.chunk_elems)"));
      }
      for (uint32_t i = 0; i < count; ++i) {
        const core::ChunkRange r = core::ChunkRangeOf(s.numel, chunk_elems, i);
        ranges.push_back({id, s.offset + r.first, r.count});
        chunks.push_back({id, static_cast<uint16_t>(i), static_cast<uint16_t>(count)});
      }
    }
    TensorSlot& slot = *encoders_[tensor];
    absl::MutexLock lock(&slot.mu);
    std::vector<std::string> payloads;
    absl::Status st = slot.encoder->Encode(grad, round, options_.worker_id, ranges, &payloads);
    if (!st.ok()) {
      return absl::Status(st.code(), absl::StrCat("encoding '", spec.name, "' for round ", round,
                                                  " (UDP chunks): ", st.message()));
    }
    std::vector<std::tuple<int32_t, boost::asio::ip::udp::endpoint, std::string, bool>> out;
    for (size_t k = 0; k < chunks.size(); ++k) {
      const core::SliceInfo& si = layout_.slices()[chunks[k].slice];
      ShardConn& c = *shards_[si.shard];
      core::DatagramHeader h;
      std::shared_ptr<const core::DatagramKey> key;
      {
        absl::MutexLock conn_lock(&c.mu);
        h.session_id = c.udp_session;
        key = c.udp_key;
      }
      h.worker_id = options_.worker_id;
      h.slice_id = chunks[k].slice;
      h.round = round;
      h.chunk_elems = chunk_elems;
      h.chunk_index = chunks[k].index;
      h.chunk_count = chunks[k].count;
      std::string datagram;
      if (key == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(ShardName(c), " gave no UDP key"));
      }
      st = core::EncodeDatagram(h, slot.encoder->spec(), payloads[k], *key, &datagram);
      if (!st.ok()) {
        return absl::Status(st.code(), absl::StrCat("UDP chunk ", h.chunk_index, " of slice ", h.slice_id,
                                                    " of '", spec.name, "': ", st.message(),
                                                    " (lower udp.chunk_elems)"));
      }
      out.emplace_back(si.priority, c.udp_endpoint, std::move(datagram),
                       internal::InjectedLoss(options_.udp, options_.worker_id, round, h.slice_id,
                                              h.chunk_index));
    }
    for (auto& [priority, to, datagram, lost] : out) {
      udp_sender_->Enqueue(priority, round, to, std::move(datagram), lost);
    }
    return absl::OkStatus();
  }

  absl::Status AllDestinations(std::span<const std::span<float>> outs,
                                absl::flat_hash_map<uint32_t, float*>& dst) const {
    if (outs.size() != layout_.tensors().size()) {
      return absl::InvalidArgumentError(absl::StrCat("pulling every tensor needs ",
                                                     layout_.tensors().size(), " buffers, got ",
                                                     outs.size()));
    }
    for (size_t t = 0; t < outs.size(); ++t) PS_RETURN_IF_ERROR(AddDestinations(t, outs[t], dst));
    return absl::OkStatus();
  }

  // Maps every slice of `tensor` to its place in `out`, after checking out's size.
  absl::Status AddDestinations(size_t tensor, std::span<float> out,
                               absl::flat_hash_map<uint32_t, float*>& dst) const {
    const core::TensorSpec& spec = layout_.tensors()[tensor];
    if (out.size() != spec.numel) {
      return absl::InvalidArgumentError(absl::StrCat("buffer for '", spec.name, "' has ",
                                                     out.size(), " elements; expected ", spec.numel));
    }
    for (uint32_t id : layout_.SlicesOfTensor(tensor)) dst[id] = out.data() + layout_.slices()[id].offset;
    return absl::OkStatus();
  }

  std::string ShardName(const ShardConn& c) const {
    return absl::StrCat("shard ", c.id, " (", c.address, ")");
  }

  std::chrono::milliseconds Backoff(int attempt) const {
    auto d = options_.initial_backoff * (1 << std::min(attempt, 16));
    return std::min<std::chrono::milliseconds>(d, options_.max_backoff);
  }

  // Joins (again) until `deadline`, retrying while the shard is unreachable.
  absl::StatusOr<v1::JoinResponse> JoinShard(ShardConn& c, Clock::time_point deadline) {
    absl::MutexLock join_lock(&c.join_mu);
    for (int attempt = 0;; ++attempt) {
      grpc::ClientContext ctx;
      core::AttachCredentials(options_.credentials, &ctx);
      ctx.set_deadline(std::min(deadline, Clock::now() + options_.rpc_timeout));
      ctx.set_wait_for_ready(true);
      v1::JoinRequest req;
      req.set_worker_id(options_.worker_id);
      req.set_layout_hash(layout_.hash());
      v1::JoinResponse resp;
      grpc::Status s = c.stub->Join(&ctx, req, &resp);
      if (s.ok()) {
        std::shared_ptr<const core::DatagramKey> udp_key;
        if (resp.udp_port() != 0) {
          auto key = core::DatagramKey::FromBytes(resp.udp_key());
          if (!key.ok()) {
            return absl::InternalError(absl::StrCat(ShardName(c), " handed out a bad UDP key: ",
                                                    key.status().message()));
          }
          udp_key = std::make_shared<const core::DatagramKey>(*std::move(key));
        }
        absl::MutexLock lock(&c.mu);
        c.session = resp.session();
        c.udp_port = static_cast<uint16_t>(resp.udp_port());
        c.udp_session = resp.udp_session();
        c.udp_key = std::move(udp_key);
        ++c.epoch;
        return resp;
      }
      const bool transient = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                             s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
      if (!transient || Clock::now() + Backoff(attempt) >= deadline) {
        return FromGrpc(s, absl::StrCat("joining ", ShardName(c), " as worker ", options_.worker_id));
      }
      retries_count_.fetch_add(1);
      std::this_thread::sleep_for(Backoff(attempt));
    }
  }

  // Re-joins after the shard forgot our session, unless another call already did.
  void Rejoin(ShardConn& c, uint64_t failed_epoch) {
    {
      absl::MutexLock lock(&c.mu);
      if (c.epoch != failed_epoch) return;
    }
    auto r = JoinShard(c, Clock::now() + options_.rpc_timeout);
    if (!r.ok()) return;  // the retried call reports what goes wrong
    if (!r->layout_registered()) {
      // A shard that restarted without its state cannot continue this run.
      absl::MutexLock lock(&mu_);
      if (first_error_.ok()) {
        first_error_ = absl::FailedPreconditionError(
            absl::StrCat(ShardName(c), " restarted and lost the layout and parameters"));
      }
      return;
    }
    ReplayPushes(c, r->version());
  }

  // A shard restored from a checkpoint forgot the pushes it accepted after that
  // checkpoint. The rounds it still has open (from `version`, its lowest published
  // version, on) wait for them, and this worker, which had them acknowledged, may
  // already be pulling the next version: resend its last accepted push of every slice
  // of that shard whose round is still open there. A resend the shard already has (or
  // whose round it closed meanwhile) is refused as duplicate or late and ignored.
  void ReplayPushes(ShardConn& c, uint64_t version) {
    std::vector<std::unique_ptr<PushCall>> calls;
    {
      absl::MutexLock lock(&replay_mu_);
      for (const auto& [slice, req] : last_accepted_) {
        if (layout_.slices()[slice].shard != c.id || req.round() < version) continue;
        auto call = std::make_unique<PushCall>();
        call->shard = c.id;
        call->tensor = layout_.slices()[slice].tensor;
        call->replay = true;
        call->req = req;
        calls.push_back(std::move(call));
      }
    }
    pushes_replayed_.fetch_add(calls.size());
    {
      absl::MutexLock lock(&mu_);
      replays_ += calls.size();
    }
    for (auto& call : calls) SendPush(std::move(call));
  }

  absl::Status RegisterOn(ShardConn& c, const v1::JoinResponse& join,
                          std::span<const std::span<const float>> initial) {
    grpc::ClientContext ctx;
    core::AttachCredentials(options_.credentials, &ctx);
    ctx.set_deadline(Clock::now() + options_.rpc_timeout);
    v1::RegisterLayoutRequest req;
    {
      absl::MutexLock lock(&c.mu);
      req.set_session(c.session);
    }
    v1::Layout* l = req.mutable_layout();
    l->set_slice_elems(layout_.slice_elems());
    l->set_num_shards(layout_.num_shards());
    for (const core::TensorSpec& t : layout_.tensors()) {
      v1::TensorSpec* ts = l->add_tensors();
      ts->set_name(t.name);
      ts->set_numel(t.numel);
      ts->set_priority(t.priority);
    }
    v1::RegisterLayoutResponse resp;
    grpc::Status s = c.stub->RegisterLayout(&ctx, req, &resp);
    if (s.error_code() == grpc::StatusCode::ALREADY_EXISTS) return absl::OkStatus();  // lost the race
    if (!s.ok()) return FromGrpc(s, absl::StrCat("registering the layout on ", ShardName(c)));
    if (join.aggregate_only()) return absl::OkStatus();
    if (initial.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          ShardName(c), " has no parameters yet and this worker brought no initial values"));
    }
    for (uint32_t id : resp.owned_slices()) {
      if (id >= layout_.slices().size()) {
        return absl::InternalError(absl::StrCat(ShardName(c), " claims unknown slice ", id));
      }
      const core::SliceInfo& si = layout_.slices()[id];
      grpc::ClientContext ictx;
      core::AttachCredentials(options_.credentials, &ictx);
      ictx.set_deadline(Clock::now() + options_.rpc_timeout);
      v1::InitSliceRequest ireq;
      ireq.set_session(req.session());
      ireq.set_layout_hash(layout_.hash());
      ireq.set_slice_id(id);
      ireq.set_values(reinterpret_cast<const char*>(initial[si.tensor].data() + si.offset),
                      size_t{si.numel} * sizeof(float));
      v1::InitSliceResponse iresp;
      grpc::Status is = c.stub->InitSlice(&ictx, ireq, &iresp);
      if (!is.ok() && is.error_code() != grpc::StatusCode::ALREADY_EXISTS) {
        return FromGrpc(is, absl::StrCat("uploading the initial value of slice ", id, " to ", ShardName(c)));
      }
    }
    return absl::OkStatus();
  }

  // Sends queued pushes to `c`, most urgent first, while the in-flight window allows.
  void Dispatch(ShardConn& c) {
    std::vector<std::pair<uint64_t, std::unique_ptr<PushCall>>> go;
    {
      absl::MutexLock lock(&c.send_mu);
      go = c.queue->TakeSendable();
    }
    for (auto& [bytes, call] : go) {
      call->credit = bytes;
      SendPush(std::move(call));
    }
  }

  // A push is over (accepted, refused or failed): its bytes leave the window, which
  // lets queued pushes go.
  void ReleaseCredit(const PushCall& call) {
    if (call.credit == 0) return;
    ShardConn& c = *shards_[call.shard];
    {
      absl::MutexLock lock(&c.send_mu);
      c.queue->Release(call.credit);
    }
    Dispatch(c);
  }

  void SendPush(std::unique_ptr<PushCall> call) {
    ShardConn& c = *shards_[call->shard];
    {
      absl::MutexLock lock(&c.mu);
      call->req.set_session(c.session);
      call->epoch = c.epoch;
    }
    call->ctx = std::make_unique<grpc::ClientContext>();
    core::AttachCredentials(options_.credentials, call->ctx.get());
    call->ctx->set_deadline(Clock::now() + options_.rpc_timeout);
    call->ctx->set_wait_for_ready(true);
    {
      absl::MutexLock lock(&mu_);
      if (closing_) {
        FinishPushLocked(*call, absl::CancelledError("worker is shutting down"));
        return;
      }
      in_flight_.insert(call->ctx.get());
    }
    PushCall* raw = call.release();
    c.stub->async()->Push(raw->ctx.get(), &raw->req, &raw->resp, [this, raw](grpc::Status s) {
      OnPushDone(std::unique_ptr<PushCall>(raw), s);
    });
  }

  void OnPushDone(std::unique_ptr<PushCall> call, const grpc::Status& s) {
    {
      absl::MutexLock lock(&mu_);
      in_flight_.erase(call->ctx.get());
    }
    // A retry answered "duplicate" means an earlier attempt got through.
    const bool accepted =
        s.ok() || (call->attempt > 0 && s.error_code() == grpc::StatusCode::ALREADY_EXISTS &&
                   call->last_code != grpc::StatusCode::UNAUTHENTICATED);
    if (accepted) {
      slices_pushed_.fetch_add(1);
      push_bytes_.fetch_add(call->req.payload().size());
      if (!call->replay) {
        // Kept for ReplayPushes: the newest accepted push of each slice. (Before the
        // push is finished: once pending_ drops, the worker may be destroyed.)
        absl::MutexLock lock(&replay_mu_);
        v1::PushRequest& kept = last_accepted_[call->req.slice_id()];
        if (kept.payload().empty() || kept.round() <= call->req.round()) kept = std::move(call->req);
      }
      ReleaseCredit(*call);
      absl::MutexLock lock(&mu_);
      FinishPushLocked(*call, absl::OkStatus());
      return;
    }
    bool closing;
    {
      absl::MutexLock lock(&mu_);
      closing = closing_;
    }
    if (!closing && Retriable(s.error_code()) && call->attempt + 1 < options_.max_attempts) {
      retries_count_.fetch_add(1);
      const auto delay = Backoff(call->attempt);
      ++call->attempt;
      call->last_code = s.error_code();
      retries_.After(delay, [this, call = std::shared_ptr<PushCall>(std::move(call))]() mutable {
        if (call->last_code == grpc::StatusCode::UNAUTHENTICATED) Rejoin(*shards_[call->shard], call->epoch);
        SendPush(std::make_unique<PushCall>(std::move(*call)));
      });
      return;
    }
    if (!call->replay) slices_refused_.fetch_add(1);
    ReleaseCredit(*call);
    const core::SliceInfo& si = layout_.slices()[call->req.slice_id()];
    absl::Status st = FromGrpc(
        s, absl::StrCat("push of tensor '", layout_.tensors()[si.tensor].name, "' slice ",
                        si.id, " round ", call->req.round(), " to ", ShardName(*shards_[call->shard]),
                        call->attempt > 0 ? absl::StrCat(" (after ", call->attempt + 1, " attempts)") : ""));
    absl::MutexLock lock(&mu_);
    FinishPushLocked(*call, st);
  }

  void FinishPushLocked(const PushCall& call, absl::Status st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (call.replay) {  // not the caller's push: neither pending nor its error
      --replays_;
      return;
    }
    if (!st.ok() && first_error_.ok()) first_error_ = std::move(st);
    --pending_;
  }

  absl::StatusOr<uint64_t> PullSlices(const absl::flat_hash_map<uint32_t, float*>& dst,
                                      uint64_t min_version, std::chrono::milliseconds timeout,
                                      const SliceArrived& on_slice = {}) {
    const auto deadline = Clock::now() + timeout;
    std::set<uint32_t> missing;
    for (const auto& [id, ptr] : dst) missing.insert(id);
    uint64_t version = UINT64_MAX;
    for (int attempt = 0;; ++attempt) {
      std::map<uint32_t, v1::PullRequest> requests;
      for (uint32_t id : missing) {
        const core::SliceInfo& si = layout_.slices()[id];
        v1::PullRequest& r = requests[si.shard];
        r.add_slice_ids(id);
      }
      std::vector<std::pair<uint32_t, std::shared_ptr<PullResult>>> streams;
      std::map<uint32_t, uint64_t> epochs;
      for (auto& [shard, req] : requests) {
        ShardConn& c = *shards_[shard];
        {
          absl::MutexLock lock(&c.mu);
          req.set_session(c.session);
          epochs[shard] = c.epoch;
        }
        req.set_layout_hash(layout_.hash());
        req.set_min_version(min_version);
        auto result = std::make_shared<PullResult>();
        PullStream::Start(c.stub.get(), options_.credentials, req, deadline, &layout_, &dst, &on_slice, result);
        streams.emplace_back(shard, std::move(result));
      }
      grpc::Status worst;
      uint32_t worst_shard = 0;
      bool retriable = true;
      for (auto& [shard, result] : streams) {
        grpc::Status s = result->Await();
        absl::MutexLock lock(&result->mu);
        for (uint32_t id : result->received) missing.erase(id);
        if (!result->received.empty()) version = std::min(version, result->min_version);
        slices_pulled_.fetch_add(result->received.size());
        pull_bytes_.fetch_add(result->bytes);
        if (!s.ok() && (worst.ok() || !Retriable(s.error_code()))) {
          worst = s;
          worst_shard = shard;
          retriable = retriable && Retriable(s.error_code());
        }
      }
      if (missing.empty()) return version;
      const std::string context = absl::StrCat(
          "pull of ", dst.size(), " slices at version >= ", min_version, " from ",
          ShardName(*shards_[worst_shard]), " (", missing.size(), " missing)");
      if (worst.ok()) return absl::InternalError(absl::StrCat(context, ": stream ended early"));
      if (!retriable || attempt + 1 >= options_.max_attempts ||
          Clock::now() + Backoff(attempt) >= deadline) {
        return FromGrpc(worst, context);
      }
      retries_count_.fetch_add(1);
      if (worst.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
        Rejoin(*shards_[worst_shard], epochs[worst_shard]);
      }
      std::this_thread::sleep_for(Backoff(attempt));
    }
  }

  const WorkerOptions options_;
  const core::ModelLayout layout_;
  std::vector<std::unique_ptr<ShardConn>> shards_;
  std::vector<ShardInfo> infos_;
  std::vector<std::unique_ptr<TensorSlot>> encoders_;
  uint64_t start_version_ = 0;
  internal::DelayQueue retries_;
  std::unique_ptr<internal::UdpSender> udp_sender_;  // when some tensor goes over UDP

  absl::Mutex mu_;
  size_t pending_ ABSL_GUARDED_BY(mu_) = 0;
  size_t replays_ ABSL_GUARDED_BY(mu_) = 0;  // replayed pushes not finished (the destructor waits)
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  std::set<grpc::ClientContext*> in_flight_ ABSL_GUARDED_BY(mu_);

  std::atomic<uint64_t> slices_pushed_{0}, slices_refused_{0}, push_bytes_{0};
  std::atomic<uint64_t> slices_pulled_{0}, pull_bytes_{0}, retries_count_{0};
  std::atomic<uint64_t> pushes_replayed_{0};

  absl::Mutex replay_mu_;
  // Per slice id, the newest push a shard accepted (ReplayPushes).
  absl::flat_hash_map<uint32_t, v1::PushRequest> last_accepted_ ABSL_GUARDED_BY(replay_mu_);
};

absl::StatusOr<std::unique_ptr<PullTicket>> WorkerImpl::StartPullAll(
    uint64_t min_version, std::span<const std::span<float>> outs, std::chrono::milliseconds timeout) {
  absl::flat_hash_map<uint32_t, float*> dst;
  PS_RETURN_IF_ERROR(AllDestinations(outs, dst));
  auto ticket = std::make_unique<PullTicketImpl>(layout_, std::move(dst));
  PullTicketImpl* raw = ticket.get();
  raw->Run([this, raw, min_version, timeout](const SliceArrived& on_slice) {
    return PullSlices(raw->dst(), min_version, timeout, on_slice);
  });
  return ticket;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Worker>> Worker::Start(WorkerOptions options, core::ModelLayout layout,
                                                      std::span<const std::span<const float>> initial) {
  // Keep gRPC initialised for the life of the process: when the last channel goes
  // away gRPC otherwise shuts its callback machinery down, which races with its own
  // threads at exit (seen as rare aborts in grpc_cq_internal_unref; grpc#32584).
  static const bool grpc_pinned = (grpc_init(), true);
  (void)grpc_pinned;
  auto w = std::make_unique<WorkerImpl>(std::move(options), std::move(layout));
  PS_RETURN_IF_ERROR(w->Init(initial));
  return w;
}

}  // namespace ps
