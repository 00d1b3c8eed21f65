#include "worker_lib/push_pipeline_internal.h"

#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "net/udp_frame.h"

namespace ps::internal {

absl::StatusOr<std::unique_ptr<PushPipeline>> PushPipeline::Create(const WorkerOptions& options,
                                                                   core::RetryPolicy policy,
                                                                   const core::ModelLayout& layout,
                                                                   ShardClient& client) {
  for (const auto& [name, push] : options.tensor_push) {
    bool known = false;
    for (const core::TensorSpec& t : layout.tensors()) known = known || t.name == name;
    if (!known) {
      return absl::InvalidArgumentError(
          absl::StrCat("push options for tensor '", name, "', which the layout does not have"));
    }
  }
  std::unique_ptr<PushPipeline> p(new PushPipeline(options, std::move(policy), layout, client));
  for (const core::TensorSpec& t : layout.tensors()) {
    const auto it = options.tensor_push.find(t.name);
    const PushOptions& push = it != options.tensor_push.end() ? it->second : options.push;
    auto encoder = TensorEncoder::Make(push, options.codec_seed, t.numel);
    if (!encoder.ok()) {
      return absl::Status(encoder.status().code(), absl::StrCat("push options of tensor '", t.name,
                                                                "': ", encoder.status().message()));
    }
    auto slot = std::make_unique<TensorSlot>();
    {
      absl::MutexLock lock(&slot->mu);
      slot->encoder = *std::move(encoder);
    }
    slot->udp = push.udp;
    p->slots_.push_back(std::move(slot));
    if (push.udp && p->udp_sender_ == nullptr) {
      PS_ASSIGN_OR_RETURN(p->udp_sender_, UdpSender::Start(options.udp, options.priority_order));
    }
  }
  return p;
}

PushPipeline::PushPipeline(const WorkerOptions& options, core::RetryPolicy policy,
                           const core::ModelLayout& layout, ShardClient& client)
    : options_(options), policy_(std::move(policy)), layout_(layout), client_(client) {
  for (size_t i = 0; i < client.num_shards(); ++i) {
    auto q = std::make_unique<ShardQueue>();
    absl::MutexLock lock(&q->mu);
    q->queue = std::make_unique<SendQueue<std::unique_ptr<Call>>>(options.priority_order,
                                                                  options.max_inflight_bytes);
    queues_.push_back(std::move(q));
    meters_.push_back(std::make_unique<TransferMeter>());
  }
  for (const core::TensorSpec& t : layout.tensors()) total_numel_ += t.numel;
}

PushPipeline::~PushPipeline() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    for (ShardTransport::PushCall* rpc : in_flight_) rpc->Cancel();
  }
  retry_queue_.Stop();  // runs what is queued at once; Send sees closing_
  for (auto& q : queues_) {
    std::vector<std::unique_ptr<Call>> queued;
    {
      absl::MutexLock lock(&q->mu);
      queued = q->queue->TakeAll();
    }
    absl::MutexLock lock(&mu_);
    for (auto& call : queued) FinishLocked(*call, absl::CancelledError("worker is shutting down"));
  }
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](PushPipeline* p)
           ABSL_NO_THREAD_SAFETY_ANALYSIS { return p->pending_ == 0 && p->replays_ == 0; },
      this));
}

absl::Status PushPipeline::SetCodec(size_t tensor, std::string_view spec,
                                    core::Device device) {
  if (tensor >= slots_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no tensor ", tensor, "; the layout has ", slots_.size()));
  }
  TensorSlot& slot = *slots_[tensor];
  if (slot.udp) return absl::OkStatus();
  absl::MutexLock lock(&slot.mu);
  if (slot.encoder->spec() == spec && slot.encoder->device() == device) return absl::OkStatus();
  return slot.encoder->SetCodec(spec, options_.codec_seed, device);
}

absl::Status PushPipeline::ReportLoss(uint64_t round, double loss) {
  const auto narrowed = static_cast<float>(loss);
  if (!std::isfinite(narrowed)) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss ", loss, " reported for round ", round, " is not finite as a float"));
  }
  absl::MutexLock lock(&mu_);
  loss_.emplace(round, narrowed);
  return absl::OkStatus();
}

absl::Status PushPipeline::Push(size_t tensor, uint64_t round, std::span<const float> grad) {
  if (tensor >= layout_.tensors().size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no tensor ", tensor, "; the layout has ", layout_.tensors().size()));
  }
  const core::TensorSpec& spec = layout_.tensors()[tensor];
  if (grad.size() != spec.numel) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient of '", spec.name, "' has ", grad.size(), " elements; expected ", spec.numel));
  }
  idle_.Pushing(round);
  if (slots_[tensor]->udp) return PushUdp(tensor, round, grad);
  std::vector<std::unique_ptr<Call>> calls;
  {
    TensorSlot& slot = *slots_[tensor];
    absl::MutexLock lock(&slot.mu);
    std::vector<SliceRange> ranges;
    for (uint32_t id : layout_.SlicesOfTensor(tensor)) {
      const core::SliceInfo& s = layout_.slices()[id];
      ranges.push_back({id, s.offset, s.numel, FixedCostBytes(s.shard, s.numel)});
    }
    std::vector<std::string> payloads;
    absl::Status st = slot.encoder->Encode(grad, round, options_.worker_id, ranges, &payloads);
    if (!st.ok()) {
      return absl::Status(st.code(), absl::StrCat("encoding '", spec.name, "' for round ", round,
                                                  ": ", st.message()));
    }
    for (size_t k = 0; k < ranges.size(); ++k) {
      auto call = std::make_unique<Call>();
      call->shard = layout_.slices()[ranges[k].id].shard;
      v1::PushRequest& f = call->message.fields;
      f.set_layout_hash(layout_.hash());
      f.set_round(round);
      f.set_slice_id(ranges[k].id);
      f.set_codec(std::string(slot.encoder->spec()));
      call->message.payload = std::make_shared<const std::string>(std::move(payloads[k]));
      calls.push_back(std::move(call));
    }
  }
  {
    // One lock for both: the pending count and the round's loss (ReportLoss).
    absl::MutexLock lock(&mu_);
    pending_ += calls.size();
    if (loss_.has_value() && loss_->first == round) {
      for (auto& call : calls) call->message.fields.set_loss(loss_->second);
    }
  }
  std::set<uint32_t> touched;
  for (auto& call : calls) {
    const uint32_t shard = call->shard;
    touched.insert(shard);
    const core::SliceInfo& si = layout_.slices()[call->message.fields.slice_id()];
    const uint64_t bytes = call->message.payload_size();
    ShardQueue& q = *queues_[shard];
    absl::MutexLock lock(&q.mu);
    q.queue->Push(si.priority, round, bytes, std::move(call));
  }
  for (uint32_t shard : touched) Dispatch(shard);
  return absl::OkStatus();
}

// Encodes every chunk of every slice of `tensor` on its own, signs each with its
// shard's session key and queues the datagrams (docs/transport.md, "UDP").
absl::Status PushPipeline::PushUdp(size_t tensor, uint64_t round, std::span<const float> grad) {
  const core::TensorSpec& spec = layout_.tensors()[tensor];
  const uint32_t chunk_elems = options_.udp.chunk_elems;
  std::vector<SliceRange> ranges;
  struct Chunk {
    uint32_t slice = 0;
    uint16_t index = 0;
    uint16_t count = 0;
  };
  std::vector<Chunk> chunks;
  for (uint32_t id : layout_.SlicesOfTensor(tensor)) {
    const core::SliceInfo& s = layout_.slices()[id];
    const uint32_t count = net::ChunkCount(s.numel, chunk_elems);
    if (count > UINT16_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat("slice ", id, " of '", spec.name, "' needs ", count, " UDP chunks of ",
                       chunk_elems, " values; at most 65535 (raise udp.chunk_elems)"));
    }
    for (uint32_t i = 0; i < count; ++i) {
      const net::ChunkRange r = net::ChunkRangeOf(s.numel, chunk_elems, i);
      ranges.push_back({id, s.offset + r.first, r.count});
      chunks.push_back({id, static_cast<uint16_t>(i), static_cast<uint16_t>(count)});
    }
  }
  TensorSlot& slot = *slots_[tensor];
  absl::MutexLock lock(&slot.mu);
  std::vector<std::string> payloads;
  absl::Status st = slot.encoder->Encode(grad, round, options_.worker_id, ranges, &payloads);
  if (!st.ok()) {
    return absl::Status(st.code(), absl::StrCat("encoding '", spec.name, "' for round ", round,
                                                " (UDP chunks): ", st.message()));
  }
  // Every route first, so that a shard without a key refuses the push before any of it
  // leaves.
  std::map<uint32_t, ShardClient::UdpRoute> routes;
  for (const Chunk& c : chunks) {
    const uint32_t shard = layout_.slices()[c.slice].shard;
    if (routes.contains(shard)) continue;
    ShardClient::UdpRoute route = client_.udp_route(shard);
    if (route.key == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(client_.name(shard), " gave no UDP key"));
    }
    routes.emplace(shard, std::move(route));
  }
  // Each datagram is queued as soon as it is signed: the sender starts with the first
  // while the rest are signed.
  for (size_t k = 0; k < chunks.size(); ++k) {
    const core::SliceInfo& si = layout_.slices()[chunks[k].slice];
    const ShardClient::UdpRoute& route = routes.at(si.shard);
    net::DatagramHeader h;
    h.session_id = route.session;
    h.worker_id = options_.worker_id;
    h.slice_id = chunks[k].slice;
    h.round = round;
    h.chunk_elems = chunk_elems;
    h.chunk_index = chunks[k].index;
    h.chunk_count = chunks[k].count;
    std::string datagram;
    st = net::EncodeDatagram(h, slot.encoder->spec(), payloads[k], *route.key, &datagram);
    if (!st.ok()) {
      return absl::Status(
          st.code(), absl::StrCat("UDP chunk ", h.chunk_index, " of slice ", h.slice_id, " of '",
                                  spec.name, "': ", st.message(), " (lower udp.chunk_elems)"));
    }
    udp_sender_->Enqueue(
        si.priority, round, route.endpoint, std::move(datagram),
        InjectedLoss(options_.udp, options_.worker_id, round, h.slice_id, h.chunk_index));
  }
  return absl::OkStatus();
}

absl::Status PushPipeline::Wait() {
  absl::Status udp = udp_sender_ != nullptr ? udp_sender_->WaitIdle() : absl::OkStatus();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](PushPipeline* p) ABSL_NO_THREAD_SAFETY_ANALYSIS { return p->pending_ == 0; }, this));
  absl::Status st = std::move(first_error_);
  first_error_ = absl::OkStatus();
  return st.ok() ? udp : st;
}

void PushPipeline::OnRejoined(uint32_t shard, const v1::JoinResponse& join) {
  if (join.layout_registered()) {
    Replay(shard, join.version());
    return;
  }
  // A shard that restarted without its state cannot continue this run.
  absl::MutexLock lock(&mu_);
  if (first_error_.ok()) {
    first_error_ = absl::FailedPreconditionError(
        absl::StrCat(client_.name(shard), " restarted and lost the layout and parameters"));
  }
}

// A shard restored from a checkpoint forgot the pushes it accepted after that
// checkpoint. The rounds it still has open (from `version`, its lowest published
// version, on) wait for them, and this worker, which had them acknowledged, may
// already be pulling the next version: resend its last accepted push of every slice
// of that shard whose round is still open there. A resend the shard already has (or
// whose round it closed meanwhile) is refused as duplicate or late and ignored.
void PushPipeline::Replay(uint32_t shard, uint64_t version) {
  std::vector<std::unique_ptr<Call>> calls;
  {
    absl::MutexLock lock(&replay_mu_);
    for (const auto& [slice, message] : last_accepted_) {
      if (layout_.slices()[slice].shard != shard || message.fields.round() < version) continue;
      auto call = std::make_unique<Call>();
      call->shard = shard;
      call->replay = true;
      call->message = message;  // the payload is shared, not copied
      calls.push_back(std::move(call));
    }
  }
  pushes_replayed_.fetch_add(calls.size());
  {
    absl::MutexLock lock(&mu_);
    replays_ += calls.size();
  }
  for (auto& call : calls) Send(std::move(call));
}

void PushPipeline::Dispatch(uint32_t shard) {
  std::vector<std::pair<uint64_t, std::unique_ptr<Call>>> go;
  {
    ShardQueue& q = *queues_[shard];
    absl::MutexLock lock(&q.mu);
    go = q.queue->TakeSendable();
  }
  for (auto& [bytes, call] : go) {
    call->credit = bytes;
    Send(std::move(call));
  }
}

void PushPipeline::ReleaseCredit(const Call& call) {
  if (call.credit == 0) return;
  {
    ShardQueue& q = *queues_[call.shard];
    absl::MutexLock lock(&q.mu);
    q.queue->Release(call.credit);
  }
  Dispatch(call.shard);
}

void PushPipeline::Send(std::unique_ptr<Call> call) {
  const ShardClient::Session session = client_.session(call->shard);
  call->message.fields.set_session(session.token);
  call->epoch = session.epoch;
  call->rpc = client_.transport(call->shard).NewPush(RpcClock::now() + options_.rpc_timeout);
  {
    absl::MutexLock lock(&mu_);
    if (closing_) {
      FinishLocked(*call, absl::CancelledError("worker is shutting down"));
      return;
    }
    in_flight_.insert(call->rpc.get());
  }
  meters_[call->shard]->Started();
  Call* raw = call.release();
  raw->rpc->Start(&raw->message,
                  [this, raw](absl::Status s) { OnDone(std::unique_ptr<Call>(raw), s); });
}

void PushPipeline::OnDone(std::unique_ptr<Call> call, const absl::Status& s) {
  {
    absl::MutexLock lock(&mu_);
    in_flight_.erase(call->rpc.get());
  }
  // The finished RPC goes now, on this (gRPC's) thread, before the push is finished:
  // its ClientContext holds a reference to the channel, and once pending_ drops the
  // worker may be destroyed; were this the channel's last reference, the channel (and
  // gRPC's callback threads with it) would be torn down from one of those threads while
  // the process may already be exiting (a rare abort at exit in the torch tests).
  call->rpc.reset();
  // A retry answered "duplicate" means an earlier attempt got through.
  const bool accepted = s.ok() || (call->attempt > 0 && absl::IsAlreadyExists(s) &&
                                   call->last_code != absl::StatusCode::kUnauthenticated);
  meters_[call->shard]->Finished(accepted ? call->message.payload_size() : 0);
  if (accepted) {
    slices_pushed_.fetch_add(1);
    push_bytes_.fetch_add(call->message.payload_size());
    if (!call->replay) {
      // Kept for Replay: the newest accepted push of each slice. (Before the push is
      // finished: once pending_ drops, the pipeline may be destroyed.)
      absl::MutexLock lock(&replay_mu_);
      ShardTransport::PushMessage& kept = last_accepted_[call->message.fields.slice_id()];
      if (kept.payload == nullptr || kept.fields.round() <= call->message.fields.round()) {
        kept = call->message;
      }
    }
    ReleaseCredit(*call);
    absl::MutexLock lock(&mu_);
    FinishLocked(*call, absl::OkStatus());
    return;
  }
  bool closing;
  {
    absl::MutexLock lock(&mu_);
    closing = closing_;
  }
  if (!closing && policy_.ShouldRetry(s, call->attempt)) {
    retries_.fetch_add(1);
    const auto delay = policy_.Backoff(call->attempt);
    ++call->attempt;
    call->last_code = s.code();
    retry_queue_.After(delay, [this, call = std::shared_ptr<Call>(std::move(call))]() mutable {
      if (call->last_code == absl::StatusCode::kUnauthenticated) {
        client_.Rejoin(call->shard, call->epoch);
      }
      Send(std::make_unique<Call>(std::move(*call)));
    });
    return;
  }
  if (!call->replay) slices_refused_.fetch_add(1);
  ReleaseCredit(*call);
  const core::SliceInfo& si = layout_.slices()[call->message.fields.slice_id()];
  absl::Status st = WithContext(
      s, absl::StrCat(
             "push of tensor '", layout_.tensors()[si.tensor].name, "' slice ", si.id, " round ",
             call->message.fields.round(), " to ", client_.name(call->shard),
             call->attempt > 0 ? absl::StrCat(" (after ", call->attempt + 1, " attempts)") : ""));
  MarkPushFailure(&st, PushFailure{.tensor = layout_.tensors()[si.tensor].name,
                                   .slice = si.id,
                                   .round = call->message.fields.round(),
                                   .shard = call->shard});
  absl::MutexLock lock(&mu_);
  FinishLocked(*call, st);
}

void PushPipeline::FinishLocked(const Call& call, absl::Status st) {
  if (call.replay) {  // not the caller's push: neither pending nor its error
    --replays_;
    return;
  }
  if (!st.ok() && first_error_.ok()) first_error_ = std::move(st);
  if (--pending_ == 0) idle_.Drained();
}

std::string PushPipeline::device_note(size_t tensor) const {
  if (tensor >= slots_.size()) return "";
  TensorSlot& slot = *slots_[tensor];
  absl::MutexLock lock(&slot.mu);
  return std::string(slot.encoder->device_note());
}

double PushPipeline::FixedCostBytes(uint32_t shard, uint64_t numel) const {
  // Objective::kBytes: CAT's payload-bit model, the spec's overhead alone.
  if (options_.objective == Objective::kBytes) return -1;
  const LinkCost c = meters_[shard]->Estimate();
  if (!c.valid || c.seconds_per_byte <= 0) return -1;
  // Without a slope or latency samples alpha is 0 for want of data, not measured.
  const bool alpha_measured = c.from_slope || c.alpha_seconds > 0;
  const std::optional<double> idle = idle_.Seconds();
  if (!alpha_measured && !idle.has_value()) return -1;
  double seconds = alpha_measured ? c.alpha_seconds : 0;
  if (idle.has_value() && total_numel_ > 0) {
    seconds += *idle * static_cast<double>(numel) / static_cast<double>(total_numel_);
  }
  return seconds / c.seconds_per_byte;
}

void PushPipeline::FillStats(WorkerStats& stats) const {
  stats.push_links.clear();
  for (const auto& meter : meters_) stats.push_links.push_back(meter->Estimate().stats());
  stats.slices_pushed = slices_pushed_.load();
  stats.slices_refused = slices_refused_.load();
  stats.push_bytes = push_bytes_.load();
  stats.pushes_replayed = pushes_replayed_.load();
  if (udp_sender_ != nullptr) {
    stats.udp_datagrams_sent = udp_sender_->datagrams_sent();
    stats.udp_datagrams_dropped = udp_sender_->datagrams_dropped();
    stats.udp_bytes = udp_sender_->bytes_sent();
  }
}

}  // namespace ps::internal
