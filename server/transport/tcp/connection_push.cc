// The push part of a shard's data connection (connection.h): a PUSH's body read into a
// raw row or the connection's buffer and handed to ShardFront::Push; a PUSHES's bodies
// each into its own place, every push taken as soon as its body is in; each answered by
// its tag through the tarpit.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include <boost/asio/buffer.hpp>

#include "server/transport/tcp/connection.h"

namespace ps::server::transport::tcp {

namespace asio = boost::asio;

namespace {

// What the front takes of a push's meta (its codec a view, as the meta's).
PushHead HeadOf(const net::PushMeta& m) {
  return PushHead{.layout_hash = m.layout_hash,
                  .round = m.round,
                  .slice_id = m.slice_id,
                  .codec = m.codec,
                  .loss = m.loss,
                  .lr = m.lr};
}

}  // namespace

void Connection::ReadPushBody() {
  raw_push_ = false;
  const uint32_t numel = front_->RawRowNumel(Head(), header_.body_bytes);
  if (numel == 0) return ReadBody(&Connection::OnPushBody);
  // Raw fp32 values, read straight into a row that becomes the worker's in the round (the
  // row it replaces comes back for the next push): no copy on the shard.
  raw_push_ = true;
  if (raw_.values == nullptr || raw_.numel != numel) {
    raw_.values = std::make_unique_for_overwrite<float[]>(numel);
    raw_.numel = numel;
  }
  const std::array<asio::mutable_buffer, 2> into{
      asio::buffer(&raw_.version, 1), asio::buffer(raw_.values.get(), size_t{numel} * sizeof(float))};
  WaitToRead();
  socket_.AsyncReadExactly(
      into, [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
        self->read_in_flight_ = false;
        if (ec) return self->Shutdown();
        self->OnPushBody();
      });
}

void Connection::ReadPushesBody() {
  const uint32_t n = pushes_.count;
  raws_.resize(n);  // the rows of pushes past this frame's count go
  size_t coded = 0;  // bytes of the pushes not read into rows
  size_t end = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t bytes = pushes_.entries[i].body_bytes;
    const uint32_t numel = front_->RawRowNumel(PushesHead(i), bytes);
    raw_entry_[i] = numel != 0;
    end += bytes;
    pushes_end_[i] = end;
    if (numel == 0) {
      pushes_at_[i] = coded;
      coded += bytes;
      raws_[i] = RawRow{};  // the rows kept are this frame's, within its body's bound
    } else if (raws_[i].values == nullptr || raws_[i].numel != numel) {
      raws_[i].values = std::make_unique_for_overwrite<float[]>(numel);
      raws_[i].numel = numel;
    }
  }
  // The header passed CheckHeader: B, and so `coded`, is within the body limit.
  const std::span<char> coded_bodies = body_.Take(coded);
  pushes_into_.clear();
  for (uint32_t i = 0; i < n; ++i) {
    if (raw_entry_[i]) {
      // A raw row's body is its format byte and its values (RawRowNumel: 1 + 4 numel).
      pushes_into_.push_back(asio::buffer(&raws_[i].version, 1));
      pushes_into_.push_back(
          asio::buffer(raws_[i].values.get(), size_t{raws_[i].numel} * sizeof(float)));
    } else {
      pushes_into_.push_back(
          asio::buffer(coded_bodies.data() + pushes_at_[i], pushes_.entries[i].body_bytes));
    }
  }
  pushes_into_first_ = 0;
  pushes_read_ = socket_.TakeReadAhead(pushes_into_);
  pushes_next_ = 0;
  pushes_request_bytes_ = net::kFrameHeaderBytes + header_.meta_bytes;
  OnPushesRead();
}

void Connection::OnPushesRead() {
  if (closed_ || going_away_) return Drain();
  // Every push whose body is in, taken now; their answers wait for the next write.
  if (pushes_next_ < pushes_.count && pushes_read_ >= pushes_end_[pushes_next_]) {
    if (pushes_next_ == 0) {
      absl::Status current = Current();
      if (!current.ok()) return GoAway(current);
    }
    holding_answers_ = true;
    while (pushes_next_ < pushes_.count && pushes_read_ >= pushes_end_[pushes_next_]) {
      TakePushOfPushes(pushes_next_++);
    }
    holding_answers_ = false;
  }
  if (pushes_next_ == pushes_.count) return ReadHeader();
  // The rest: the read wakes once the next body is whole (up to the mark's bound) and
  // takes all of the frame that is here.
  while (pushes_into_[pushes_into_first_].size() == 0) ++pushes_into_first_;
  WaitToRead();  // the answers held go first
  socket_.SetReadLowWater(pushes_end_[pushes_next_] - pushes_read_);
  socket_.async_read_some(
      std::span<asio::mutable_buffer>(pushes_into_).subspan(pushes_into_first_),
      [self = shared_from_this()](const boost::system::error_code& ec, size_t n) {
        self->read_in_flight_ = false;
        if (ec) return self->Shutdown();
        self->pushes_read_ += n;
        for (size_t i = self->pushes_into_first_; n > 0; ++i) {
          const size_t took = std::min(n, self->pushes_into_[i].size());
          self->pushes_into_[i] += took;
          n -= took;
        }
        self->OnPushesRead();
      });
}

void Connection::TakePushOfPushes(uint32_t i) {
  const net::PushesEntry& e = pushes_.entries[i];
  const std::string_view payload =
      raw_entry_[i] ? std::string_view()
                    : body_.view().substr(pushes_at_[i], e.body_bytes);
  absl::Status s = front_->AdmitCaller(caller_);
  if (s.ok()) {
    s = front_->Push(peer_, PushesHead(i),
                     raw_entry_[i] ? PushPayload(&raws_[i])
                                   : PushPayload(std::span<const std::string_view>(&payload, 1)));
  }
  ++unanswered_;
  AnswerLater(peer_.client, s, pushes_request_bytes_ + e.body_bytes, net::FrameType::kAnswer,
              e.tag);
  pushes_request_bytes_ = 0;
}

PushHead Connection::PushesHead(size_t i) const { return HeadOf(pushes_.push(i)); }

PushHead Connection::Head() const { return HeadOf(push_); }

void Connection::OnPushBody() {
  if (closed_ || going_away_) return Drain();
  const uint64_t tag = header_.tag;
  const size_t request_bytes = net::kFrameHeaderBytes + header_.meta_bytes + header_.body_bytes;
  absl::Status s = Current();
  if (!s.ok()) return GoAway(s);
  s = front_->AdmitCaller(caller_);
  if (s.ok()) {
    const std::string_view payload = body_.view();
    s = front_->Push(peer_, Head(),
                     raw_push_ ? PushPayload(&raw_)
                               : PushPayload(std::span<const std::string_view>(&payload, 1)));
  }
  ++unanswered_;
  // Its answer waits, with those of the pushes before it, while the frames after it are
  // here already (up to kMaxHeldAnswers; WaitToRead): one write and one wake-up of the
  // worker for a run of pushes instead of one each.
  holding_answers_ = true;
  AnswerLater(peer_.client, s, request_bytes, net::FrameType::kAnswer, tag);
  holding_answers_ = false;
  ReadHeader();
}

}  // namespace ps::server::transport::tcp
