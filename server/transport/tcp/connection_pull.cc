// The pull part of a shard's data connection (connection.h, connection_pull.h): a PULL
// opens a ShardFront pull whose sink queues each slice with its fields; WriteMore frames
// them (SlicesHead), the slices of one pull queued one after another as one SLICES.
#include "server/transport/tcp/connection_pull.h"

#include <algorithm>
#include <string>
#include <utility>

#include <boost/asio/post.hpp>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "spdlog/spdlog.h"

namespace ps::server::transport::tcp {

namespace asio = boost::asio;

void Connection::Pull::Write(PullItem item) {
  std::shared_ptr<Connection> c = connection_.lock();
  if (c == nullptr) return;
  const net::PullHeader& h = item.header;
  if (const absl::Status s = net::CheckPayload(net::FrameType::kSlice, h.codec, item.body->size());
      !s.ok()) {
    // A pull codec spec over 255 bytes, or a body over 4 GiB: neither is configurable
    // past the options' checks, and no frame carries it. The pull ends as a failed write
    // would end it.
    spdlog::error("shard {}: cannot frame a slice: {}", c->front_->shard()->shard_id(),
                  std::string(s.message()));
    asio::post(c->socket_.get_executor(), [c, tag = tag_] {
      if (auto it = c->pulls_.find(tag); it != c->pulls_.end()) it->second->handle().WriteDone(false);
    });
    return;
  }
  const net::SlicesEntry entry{h, static_cast<uint32_t>(item.body->size())};
  Outgoing frame{.body = std::move(item.body),
                 .slice = Outgoing::Slice{.pull = tag_, .entry = entry, .codec = std::string(h.codec)}};
  {
    absl::MutexLock lock(&batch_->mu);
    batch_->frames.push_back(std::move(frame));
    if (std::exchange(batch_->posted, true)) return;  // the posted handler takes it
  }
  asio::post(c->socket_.get_executor(), [c, batch = batch_] {
    std::vector<Outgoing> frames;
    {
      absl::MutexLock lock(&batch->mu);
      frames.swap(batch->frames);
      batch->posted = false;
    }
    c->QueueSlices(std::move(frames));
  });
}

void Connection::Pull::Finish(const absl::Status& status) {
  if (std::shared_ptr<Connection> c = connection_.lock()) {
    asio::post(c->socket_.get_executor(),
               [c, tag = tag_, status] { c->PullEnded(tag, status); });
  }
}

void Connection::OnPullBody() {
  if (closed_ || going_away_) return Drain();
  const uint64_t tag = header_.tag;
  const size_t request_bytes = net::kFrameHeaderBytes + header_.meta_bytes + header_.body_bytes;
  absl::StatusOr<net::PullBody> body = net::ParsePullBody(pull_, body_.view());
  if (!body.ok()) return EndFor(Refusal::kMalformed, body.status().message(), request_bytes);
  if (pulls_.contains(tag)) {
    return EndFor(Refusal::kMalformed,
                  absl::StrCat("PULL with tag ", tag, ", which an open pull has"), request_bytes);
  }
  absl::Status s = Current();
  if (!s.ok()) return GoAway(s);
  s = front_->AdmitCaller(caller_);
  if (s.ok()) {
    absl::StatusOr<std::unique_ptr<PullHandle>> handle =
        front_->OpenPull(peer_, PullAsk{.layout_hash = pull_.layout_hash,
                                        .min_version = pull_.min_version,
                                        .held_epoch = pull_.held_epoch,
                                        .slice_ids = std::move(body->slice_ids),
                                        .held_versions = std::move(body->held_versions)});
    if (handle.ok()) {
      auto pull = std::make_unique<Pull>(weak_from_this(), tag, pull_pace_.WritesInFlight());
      Pull* raw = pull.get();
      pulls_.emplace(tag, std::move(pull));
      raw->Open(*std::move(handle));  // Write and Finish post: nothing runs in here
      return ReadHeader();
    }
    s = handle.status();
  }
  AnswerLater(peer_.client, s, request_bytes, net::FrameType::kPullEnd, tag);
  ReadHeader();
}

void Connection::Cancel(uint64_t tag) {
  // A pull that ended already (its PULL_END crossed the CANCEL) is no error.
  if (auto it = pulls_.find(tag); it != pulls_.end()) it->second->handle().Cancel();
}

void Connection::QueueSlices(std::vector<Outgoing> slices) {
  // Nothing follows a GOAWAY.
  if (closed_ || goaway_queued_) return;
  for (Outgoing& slice : slices) out_.push_back(std::move(slice));
  WriteMore();
}

absl::StatusOr<size_t> Connection::SlicesHead(size_t at, size_t end, std::string* head) const {
  const Outgoing& first = out_[at];
  if (!first.slice.has_value()) return 0;
  const Outgoing::Slice& one = *first.slice;
  net::SlicesMeta meta{.codec = one.codec};
  // Within what the worker reads (the ADMIT's largest body, which it caps at
  // net::kMaxSlicesBodyBytes or more).
  const uint64_t limit = std::min<uint64_t>(limits_.max_body_bytes, net::kMaxSlicesBodyBytes);
  uint64_t body_bytes = 0;
  size_t n = 0;
  for (; at + n < end && n < net::kMaxSlicesPerFrame; ++n) {
    const Outgoing& f = out_[at + n];
    if (n > 0 && (!f.slice.has_value() || f.slice->pull != one.pull || f.slice->codec != one.codec ||
                  body_bytes + f.slice->entry.body_bytes > limit)) {
      break;
    }
    body_bytes += f.slice->entry.body_bytes;
    meta.entries[n] = f.slice->entry;
  }
  meta.count = static_cast<uint32_t>(n);
  // Write checked the codec and each body (net::CheckPayload), and the merged bodies are
  // within 16 MiB: neither encoder refuses these fields.
  PS_RETURN_IF_ERROR(
      n == 1 ? net::AppendSlice(one.pull, net::PullHeader{one.entry, one.codec}, one.entry.body_bytes, head)
             : net::AppendSlices(one.pull, meta, head));
  return n;
}

}  // namespace ps::server::transport::tcp
