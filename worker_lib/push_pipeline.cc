#include "worker_lib/push_pipeline_internal.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "net/udp_frame.h"

namespace ps::internal {

std::shared_ptr<const void> BorrowCount::Guard(const std::shared_ptr<BorrowCount>& count) {
  {
    absl::MutexLock lock(&count->mu_);
    ++count->live_;
  }
  return std::shared_ptr<const void>(count.get(), [count](const void*) {
    absl::MutexLock lock(&count->mu_);
    --count->live_;
  });
}

void BorrowCount::AwaitNone() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](BorrowCount* c) ABSL_NO_THREAD_SAFETY_ANALYSIS { return c->live_ == 0; }, this));
}

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
    slot->path = push.push_path();
    for (uint32_t shard = 0; shard < client.num_shards(); ++shard) {
      const DataChannel* channel = client.channel(shard, slot->path);
      if (channel == nullptr) {
        return absl::InternalError(absl::StrCat("tensor '", t.name, "' is pushed over the ",
                                                PushPathName(slot->path), " but ",
                                                client.name(shard), " has no channel for it"));
      }
      slot->chunked = slot->chunked || channel->chunked();
    }
    slot->borrow = push.borrow;
    p->slots_.push_back(std::move(slot));
  }
  return p;
}

PushPipeline::PushPipeline(const WorkerOptions& options, core::RetryPolicy policy,
                           const core::ModelLayout& layout, ShardClient& client)
    : options_(options),
      policy_(std::move(policy)),
      layout_(layout),
      client_(client),
      restores_(std::make_unique<std::atomic<int>[]>(client.num_shards())) {
  for (size_t i = 0; i < client.num_shards(); ++i) {
    restores_[i].store(0);
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
    for (DataChannel::PushCall* rpc : in_flight_) rpc->Cancel();
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
  if (slot.chunked) return absl::OkStatus();
  absl::MutexLock lock(&slot.mu);
  if (slot.encoder->spec() == spec && slot.encoder->device() == device) return absl::OkStatus();
  return slot.encoder->SetCodec(spec, options_.codec_seed, device);
}

absl::Status PushPipeline::SetLearningRate(size_t tensor, double lr) {
  if (tensor >= slots_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no tensor ", tensor, "; the layout has ", slots_.size()));
  }
  const auto narrowed = static_cast<float>(lr);
  if (!(std::isfinite(narrowed) && narrowed >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "learning rate ", lr, " for '", layout_.tensors()[tensor].name,
        "' is not a finite number >= 0 as a float"));
  }
  TensorSlot& slot = *slots_[tensor];
  absl::MutexLock lock(&slot.mu);
  slot.lr = narrowed;
  return absl::OkStatus();
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
  // Each slice goes whole, answered, or in chunks where its shard's channel carries
  // chunks; each chunk is encoded on its own (docs/transport.md, "UDP").
  std::vector<std::unique_ptr<Call>> calls, chunks;
  {
    TensorSlot& slot = *slots_[tensor];
    absl::MutexLock lock(&slot.mu);
    std::vector<SliceRange> ranges;
    std::vector<std::unique_ptr<Call>> pieces;
    const std::string codec(slot.encoder->spec());
    const bool start_round = round == client_.start_version();
    const bool may_be_held = start_round && !slot.pushed_start_round;
    slot.pushed_start_round |= start_round;
    auto piece = [&](const core::SliceInfo& s, DataChannel* channel, uint32_t index,
                     uint32_t count) {
      auto call = std::make_unique<Call>();
      call->shard = s.shard;
      call->channel = channel;
      call->may_be_held = may_be_held;
      OutgoingPush& m = call->message;
      m.layout_hash = layout_.hash();
      m.round = round;
      m.slice_id = s.id;
      m.priority = s.priority;
      m.codec = codec;
      m.lr = slot.lr;
      m.chunk_index = static_cast<uint16_t>(index);
      m.chunk_count = static_cast<uint16_t>(count);
      pieces.push_back(std::move(call));
    };
    for (uint32_t id : layout_.SlicesOfTensor(tensor)) {
      const core::SliceInfo& s = layout_.slices()[id];
      DataChannel* channel = client_.channel(s.shard, slot.path);
      if (!channel->chunked()) {
        ranges.push_back({id, s.offset, s.numel, FixedCostBytes(s.shard, s.numel)});
        piece(s, channel, 0, 1);
        continue;
      }
      const uint32_t chunk_elems = channel->chunk_elems(
          codec.size(), [&slot](size_t n) { return slot.encoder->MaxEncodedBytes(n); });
      const uint32_t count = net::ChunkCount(s.numel, chunk_elems);
      if (count > UINT16_MAX) {
        return absl::InvalidArgumentError(absl::StrCat(
            "slice ", id, " of '", spec.name, "' needs ", count, " ", PushPathName(slot.path),
            " chunks of ", chunk_elems, " values; at most 65535 (raise udp.chunk_elems)"));
      }
      for (uint32_t i = 0; i < count; ++i) {
        const net::ChunkRange r = net::ChunkRangeOf(s.numel, chunk_elems, i);
        ranges.push_back({id, s.offset + r.first, r.count});
        piece(s, channel, i, count);
        pieces.back()->message.chunk_elems = chunk_elems;
      }
    }
    // Last rounds' strings, already as long as their payloads (Slot::payloads).
    std::vector<std::string> payloads;
    // Borrowed: the slices' values go from `grad` as they are, after one shared head and
    // under one guard.
    std::string head;
    std::vector<std::span<const char>> borrowed;
    const bool borrowing = slot.borrow && slot.encoder->CanBorrow();
    if (!borrowing) slot.payloads->Take(ranges.size(), &payloads);
    absl::Status st = borrowing
                          ? slot.encoder->Borrow(grad, ranges, &head, &borrowed)
                          : slot.encoder->Encode(grad, round, options_.worker_id, ranges, &payloads);
    if (!st.ok()) {
      return absl::Status(
          st.code(), absl::StrCat("encoding '", spec.name, "' for round ", round,
                                  slot.chunked ? absl::StrCat(" (", PushPathName(slot.path),
                                                              " chunks)")
                                               : "",
                                  ": ", st.message()));
    }
    std::shared_ptr<const void> guard;
    std::shared_ptr<const std::string> shared_head;
    if (borrowing) {
      guard = BorrowCount::Guard(borrows_);
      shared_head = std::make_shared<const std::string>(std::move(head));
    }
    for (size_t k = 0; k < pieces.size(); ++k) {
      OutgoingPush& m = pieces[k]->message;
      if (borrowing) {
        m.payload = shared_head;
        m.borrowed = borrowed[k];
        m.borrowed_guard = guard;
      } else {
        m.payload = slot.payloads->Lend(std::move(payloads[k]));
      }
      (pieces[k]->channel->chunked() ? chunks : calls).push_back(std::move(pieces[k]));
    }
  }
  if (!chunks.empty()) {
    PS_RETURN_IF_ERROR(WithContext(SendUnanswered(chunks), absl::StrCat("'", spec.name, "'")));
  }
  if (calls.empty()) return absl::OkStatus();
  {
    // One lock for both: the pending count and the round's loss (ReportLoss).
    absl::MutexLock lock(&mu_);
    pending_ += calls.size();
    if (loss_.has_value() && loss_->first == round) {
      for (auto& call : calls) call->message.loss = loss_->second;
    }
  }
  std::set<uint32_t> touched;
  for (auto& call : calls) {
    const uint32_t shard = call->shard;
    touched.insert(shard);
    const int32_t priority = call->message.priority;
    const uint64_t bytes = call->message.payload_size();
    ShardQueue& q = *queues_[shard];
    absl::MutexLock lock(&q.mu);
    q.queue->Push(priority, round, bytes, std::move(call));
  }
  for (uint32_t shard : touched) Dispatch(shard);
  return absl::OkStatus();
}

absl::Status PushPipeline::SendUnanswered(const std::vector<std::unique_ptr<Call>>& chunks) {
  // One call per channel with all of its chunks, in their order, wherever the slices of
  // different shards interleave: the UDP channel sends one end per call.
  std::vector<DataChannel*> channels;
  for (const auto& c : chunks) {
    if (std::find(channels.begin(), channels.end(), c->channel) == channels.end()) {
      channels.push_back(c->channel);
    }
  }
  for (DataChannel* channel : channels) {
    std::vector<const OutgoingPush*> run;
    for (const auto& c : chunks) {
      if (c->channel == channel) run.push_back(&c->message);
    }
    const std::unique_ptr<DataChannel::PushCall> call =
        channel->NewPush(std::move(run), RpcClock::now() + options_.rpc_timeout);
    absl::Status first;
    // A channel that carries chunks runs every `done` before Start returns.
    call->Start([&first](size_t, absl::Status s) { first.Update(s); });
    if (!first.ok()) return first;
  }
  return absl::OkStatus();
}

absl::Status PushPipeline::Wait() {
  // Every path's unanswered sends first, as they were queued before the answered ones.
  absl::Status sent;
  for (uint32_t shard = 0; shard < client_.num_shards(); ++shard) {
    for (PushPath path : kAllPushPaths) {
      if (DataChannel* channel = client_.channel(shard, path)) sent.Update(channel->WaitSent());
    }
  }
  absl::Status st;
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](PushPipeline* p) ABSL_NO_THREAD_SAFETY_ANALYSIS { return p->pending_ == 0; }, this));
    st = std::move(first_error_);
    first_error_ = absl::OkStatus();
  }
  // Every push is answered; a transport may still hold a borrowed push's bytes (a push
  // answered by its deadline while its write goes on), and the caller may change them
  // once this returns.
  borrows_->AwaitNone();
  return st.ok() ? sent : st;
}

void PushPipeline::OnRejoined(uint32_t shard, const v1::JoinResponse& join) {
  restores_[shard].store(join.no_checkpoints() ? 2 : 1);
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
    for (const auto& [slice, accepted] : last_accepted_) {
      if (layout_.slices()[slice].shard != shard || accepted.message.round < version) continue;
      auto call = std::make_unique<Call>();
      call->shard = shard;
      call->channel = accepted.channel;
      call->replay = true;
      call->message = accepted.message;  // the payload is shared, not copied
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

bool PushPipeline::Restores(uint32_t shard) const {
  const int said = restores_[shard].load();
  if (said != 0) return said == 1;
  const std::vector<ShardInfo>& infos = client_.infos();
  return shard >= infos.size() || infos[shard].restores_from_checkpoints;
}

void PushPipeline::KeepForReplay(const Call& call) {
  OutgoingPush message = call.message;
  if (!message.borrowed.empty()) {
    // The caller may change the borrowed bytes once WaitPushes returns: the replay
    // copy, where a restored shard may need it, is taken now (outside the lock).
    if (!Restores(call.shard)) {
      absl::MutexLock lock(&replay_mu_);
      last_accepted_.erase(message.slice_id);
      return;
    }
    message.payload = std::make_shared<const std::string>(message.Bytes());
    message.borrowed = {};
    message.borrowed_guard = nullptr;
  }
  absl::MutexLock lock(&replay_mu_);
  Accepted& kept = last_accepted_[message.slice_id];
  if (kept.message.payload == nullptr || kept.message.round <= message.round) {
    kept = Accepted{call.channel, std::move(message)};
  }
}

uint64_t PushPipeline::Window(uint32_t shard) const {
  // A sanity bound on a wild estimate: the window bounds how long an urgent slice may
  // wait, and 64 MiB is 50 ms even at 10 Gbit/s.
  constexpr uint64_t kMaxWindow = uint64_t{64} << 20;
  const uint64_t measured =
      options_.inflight_seconds > 0 ? meters_[shard]->Estimate().BytesIn(options_.inflight_seconds) : 0;
  return std::max(options_.max_inflight_bytes, std::min(measured, kMaxWindow));
}

void PushPipeline::Dispatch(uint32_t shard) {
  const uint64_t window = Window(shard);
  std::vector<std::pair<uint64_t, std::unique_ptr<Call>>> go;
  {
    ShardQueue& q = *queues_[shard];
    absl::MutexLock lock(&q.mu);
    q.queue->set_window(window);
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
  call->rpc = call->channel->NewPush({&call->message}, RpcClock::now() + options_.rpc_timeout);
  call->epoch = call->rpc->epoch();
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
  raw->rpc->Start([this, raw](size_t, absl::Status s) { OnDone(std::unique_ptr<Call>(raw), s); });
}

void PushPipeline::OnDone(std::unique_ptr<Call> call, const absl::Status& s) {
  {
    absl::MutexLock lock(&mu_);
    in_flight_.erase(call->rpc.get());
  }
  // The finished call goes now, on this (gRPC's) thread, before the push is finished:
  // its ClientContext holds a reference to the channel, and once pending_ drops the
  // worker may be destroyed; were this the channel's last reference, the channel (and
  // gRPC's callback threads with it) would be torn down from one of those threads while
  // the process may already be exiting (a rare abort at exit in the torch tests).
  call->rpc.reset();
  // "Duplicate" means an earlier copy of this push got through: for a retry, an earlier
  // attempt; for this process's first push of the round it started at, the process of
  // this worker id it replaces (restarted mid-round: ps-launch --max-restarts), whose copy
  // counts. Any other duplicate is the caller's error.
  const bool earlier_copy = absl::IsAlreadyExists(s) &&
                            call->last_code != absl::StatusCode::kUnauthenticated &&
                            (call->attempt > 0 || call->may_be_held);
  const bool accepted = s.ok() || earlier_copy;
  meters_[call->shard]->Finished(accepted ? call->message.payload_size() : 0);
  if (accepted) {
    slices_pushed_.fetch_add(1);
    if (!call->message.borrowed.empty()) slices_borrowed_.fetch_add(1);
    if (earlier_copy && call->attempt == 0) slices_held_from_before_.fetch_add(1);
    push_bytes_.fetch_add(call->message.payload_size());
    // Before the push is finished: once pending_ drops, the pipeline may be destroyed.
    if (!call->replay) KeepForReplay(*call);
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
    call->rejoin = CallsForRejoin(s);
    retry_queue_.After(delay, [this, call = std::shared_ptr<Call>(std::move(call))]() mutable {
      if (call->rejoin) {
        client_.Rejoin(call->shard, call->epoch);
      }
      Send(std::make_unique<Call>(std::move(*call)));
    });
    return;
  }
  if (!call->replay) slices_refused_.fetch_add(1);
  ReleaseCredit(*call);
  const core::SliceInfo& si = layout_.slices()[call->message.slice_id];
  absl::Status st = WithContext(
      s, absl::StrCat(
             "push of tensor '", layout_.tensors()[si.tensor].name, "' slice ", si.id, " round ",
             call->message.round, " to ", client_.name(call->shard),
             call->attempt > 0 ? absl::StrCat(" (after ", call->attempt + 1, " attempts)") : ""));
  MarkPushFailure(&st, PushFailure{.tensor = layout_.tensors()[si.tensor].name,
                                   .slice = si.id,
                                   .round = call->message.round,
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
  stats.slices_borrowed = slices_borrowed_.load();
  stats.slices_held_from_before = slices_held_from_before_.load();
  stats.slices_refused = slices_refused_.load();
  stats.push_bytes = push_bytes_.load();
  stats.pushes_replayed = pushes_replayed_.load();
  for (uint32_t shard = 0; shard < client_.num_shards(); ++shard) {
    for (PushPath path : kAllPushPaths) {
      if (const DataChannel* channel = client_.channel(shard, path)) channel->FillStats(stats);
    }
  }
}

}  // namespace ps::internal
