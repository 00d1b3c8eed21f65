#include "server/transport/tcp/connection.h"

#include <algorithm>
#include <span>
#include <utility>
#include <vector>

#include <boost/asio/buffer.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include "absl/strings/str_cat.h"
#include "core/client_text.h"
#include "core/refusal.h"
#include "core/status.h"
#include "server/transport/tcp/connection_pull.h"
#include "spdlog/spdlog.h"

namespace ps::server::transport::tcp {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

// Frames gathered into one write at most (IOV_MAX is 1024; two buffers per frame).
constexpr size_t kMaxFramesPerWrite = 64;
// ANSWERs held for a write with the next ones at most (OnPushBody, OnPushesRead): only
// while the frames after them are here already (WaitToRead writes them before any wait),
// so a run of small pushes read at once, or a PUSHES's pushes, are answered in one write,
// and no answer waits on the network.
constexpr uint32_t kMaxHeldAnswers = net::kMaxPushesPerFrame;
// How long a GOAWAY may take to leave before the connection closes without it.
constexpr auto kGoawayLinger = std::chrono::seconds(1);

// A status as ANSWER, PULL_END and GOAWAY carry it (docs/data-plane.md, "Refusals on the
// wire"): code, the refusal's stable name, and the message, cut to the frame's bound
// and made printable if it is not UTF-8 (the shard's own messages quote client text
// through core::ClientText already, so this is rare).
net::StatusMeta WireStatus(const absl::Status& status, std::string* message_storage) {
  net::StatusMeta meta;
  meta.code = status.code();
  if (std::optional<Refusal> kind = core::RefusalOf(status); kind.has_value()) {
    meta.refusal_name = core::RefusalName(*kind);
  }
  const std::string_view message(status.message().data(), status.message().size());
  if (message.size() <= net::kMaxStatusMessageBytes && core::IsUtf8(message)) {
    meta.message = message;
  } else {
    // ClientText adds "... (N bytes)" to what it keeps: leave room for it.
    *message_storage = core::ClientText(message, net::kMaxStatusMessageBytes - 32);
    meta.message = *message_storage;
  }
  return meta;
}

// ANSWER, PULL_END or GOAWAY carrying `status`.
std::string StatusFrame(net::FrameType type, uint64_t tag, const absl::Status& status) {
  std::string storage, out;
  const net::StatusMeta meta = WireStatus(status, &storage);
  absl::Status written = type == net::FrameType::kAnswer    ? net::AppendAnswer(tag, meta, &out)
                         : type == net::FrameType::kPullEnd ? net::AppendPullEnd(tag, meta, &out)
                                                            : net::AppendGoaway(meta, &out);
  // WireStatus keeps every field within its bound, so this cannot fail; if it did, the
  // peer still learns the code.
  if (!written.ok()) {
    out.clear();
    const net::StatusMeta bare{.code = status.code()};
    (void)(type == net::FrameType::kAnswer    ? net::AppendAnswer(tag, bare, &out)
           : type == net::FrameType::kPullEnd ? net::AppendPullEnd(tag, bare, &out)
                                              : net::AppendGoaway(bare, &out));
  }
  return out;
}

}  // namespace

Connection::Connection(Hub* hub, tcp::socket socket, ConnectionTable::Id id, std::string peer,
                       core::Duration proof_timeout)
    : hub_(hub),
      front_(hub->front()),
      socket_(std::move(socket)),
      timer_(socket_.get_executor()),
      id_(id),
      peer_name_(std::move(peer)),
      proof_timeout_(proof_timeout) {
  // Before ADMIT only HELLO and PROOF are allowed, neither with a body.
  limits_.max_body_bytes = 0;
  limits_.max_pull_slices = 0;
}

Connection::~Connection() = default;

void Connection::Start() {
  asio::post(socket_.get_executor(), [self = shared_from_this()] {
    boost::system::error_code ec;
    self->socket_.socket().set_option(tcp::no_delay(true), ec);
    self->Arm(Deadline::kProof, self->proof_timeout_);
    if (self->hub_->tls() != nullptr) return self->StartTls();
    self->ReadHeader();
  });
}

void Connection::Close() {
  asio::post(socket_.get_executor(), [self = shared_from_this()] { self->Shutdown(); });
}

// ---- reading ----

void Connection::ReadHeader() {
  reading_ = false;
  if (closed_ || going_away_) return;
  // Owed answers first: a worker past its window waits here, where the tarpit's held
  // answers keep it (Answered resumes reading).
  if (unanswered_ >= hub_->options().max_unanswered_pushes) {
    WriteMore();  // the answers held: this waits for them to be written
    Arm(Deadline::kNone, {});
    return;
  }
  reading_ = true;
  if (state_ == net::ConnectionState::kShardAdmitted) Arm(Deadline::kIdle, hub_->options().idle_timeout);
  ReadInto(asio::buffer(header_bytes_), &Connection::OnHeader);
}

void Connection::OnHeader() {
  if (closed_ || going_away_) return Drain();
  absl::StatusOr<net::FrameHeader> header =
      net::ParseHeader(std::span<const char, net::kFrameHeaderBytes>(header_bytes_));
  if (header.ok() && header->type == net::FrameType::kPull) {
    // Owned slices once a layout is registered: the bound shrinks then.
    limits_.max_pull_slices = front_->shard()->MaxPullSlices();
  }
  absl::Status checked =
      header.ok() ? net::CheckHeader(*header, state_, limits_) : header.status();
  if (!checked.ok()) {
    // Before ADMIT an honest client sends one HELLO and one PROOF, nothing else.
    if (state_ != net::ConnectionState::kShardAdmitted) hub_->Abusive(id_);
    // A body over --max-message-bytes is over_limit (RESOURCE_EXHAUSTED), as gRPC refuses
    // a message over it; anything else the header says is malformed.
    const Refusal kind = checked.code() == absl::StatusCode::kResourceExhausted
                             ? Refusal::kOverLimit
                             : Refusal::kMalformed;
    return EndFor(kind, checked.message(), net::kFrameHeaderBytes);
  }
  header_ = *header;
  if (state_ == net::ConnectionState::kShardAdmitted) Arm(Deadline::kRead, hub_->options().read_timeout);
  if (header_.meta_bytes == 0) return OnMeta();
  ReadInto(asio::buffer(meta_.data(), header_.meta_bytes), &Connection::OnMeta);
}

void Connection::OnMeta() {
  if (closed_ || going_away_) return Drain();
  const std::string_view meta(meta_.data(), header_.meta_bytes);
  const auto malformed = [this](const absl::Status& s) {
    EndFor(Refusal::kMalformed, s.message(), net::kFrameHeaderBytes + header_.meta_bytes);
  };
  switch (header_.type) {
    case net::FrameType::kHello:
      return Hello(meta);
    case net::FrameType::kProof:
      return Proof(meta);
    case net::FrameType::kPush: {
      absl::StatusOr<net::PushMeta> push = net::ParsePushMeta(header_.flags, meta);
      if (!push.ok()) return malformed(push.status());
      push_ = *push;  // its codec borrows meta_, which stays until the next frame
      return ReadPushBody();
    }
    case net::FrameType::kPushes: {
      absl::StatusOr<net::PushesMeta> pushes = net::ParsePushesMeta(header_, meta);
      if (!pushes.ok()) return malformed(pushes.status());
      pushes_ = *pushes;  // as push_
      return ReadPushesBody();
    }
    case net::FrameType::kPull: {
      absl::StatusOr<net::PullMeta> pull = net::ParsePullMeta(header_.flags, meta);
      if (!pull.ok()) return malformed(pull.status());
      if (absl::Status s = net::CheckPullBody(header_, *pull, limits_); !s.ok()) {
        return malformed(s);
      }
      pull_ = *pull;
      return ReadBody(&Connection::OnPullBody);
    }
    case net::FrameType::kCancel:
      Cancel(header_.tag);
      return ReadHeader();
    case net::FrameType::kGoaway:
      // The worker leaves; what it says is for its own log.
      return Shutdown();
    default:
      // CheckHeader let through only what the state allows.
      return malformed(absl::InvalidArgumentError(
          absl::StrCat("data frame ", core::AsAbsl(net::FrameTypeName(header_.type)),
                       ": unexpected")));
  }
}

void Connection::ReadBody(void (Connection::*then)()) {
  // The header passed CheckHeader: the body is within the limits this buffer may reach.
  const std::span<char> body = body_.Take(header_.body_bytes);
  if (body.empty()) return (this->*then)();
  ReadInto(asio::buffer(body.data(), body.size()), then);
}

void Connection::ReadInto(asio::mutable_buffer into, void (Connection::*then)()) {
  // Bytes already here (read ahead, or queued in the socket) are handled at once (ReadNow
  // bounds how many in a row).
  if (socket_.ReadNow(into)) return (this->*then)();
  WaitToRead();
  socket_.AsyncReadExactly(
      into, [self = shared_from_this(), then](const boost::system::error_code& ec, size_t) {
        self->read_in_flight_ = false;
        if (ec) return self->Shutdown();
        ((*self).*then)();
      });
}

void Connection::WaitToRead() {
  read_in_flight_ = true;
  // The answers held go before the wait: they wait only while frames already here are
  // read, never on the worker, whose window may be full of the pushes they answer.
  WriteMore();
}

void Connection::Drain() {
  if (closed_ || read_in_flight_ || peer_ended_) return;
  // Nothing is parsed after a GOAWAY: meta_ serves as the scratch buffer.
  read_in_flight_ = true;
  socket_.SetReadLowWater(1);  // whatever comes
  socket_.async_read_some(asio::buffer(meta_),
                          [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                            self->read_in_flight_ = false;
                            if (!ec) return self->Drain();
                            // The peer's end (or a reset): closed once the GOAWAY is out.
                            self->peer_ended_ = true;
                            if (self->goaway_written_) self->Shutdown();
                          });
}

// ---- writing ----

void Connection::Queue(Outgoing frame) {
  // Nothing follows a GOAWAY.
  if (closed_ || goaway_queued_) return;
  goaway_queued_ = frame.last;
  out_.push_back(std::move(frame));
  WriteMore();
}

void Connection::WriteMore() {
  if (closed_ || writing_ != 0 || out_.empty()) return;
  // References into out_'s elements stay valid while more are pushed at its back
  // (std::deque), and none is popped before the write completes.
  std::vector<asio::const_buffer> buffers;
  const size_t n = std::min(out_.size(), kMaxFramesPerWrite);
  buffers.reserve(2 * n);
  slice_heads_.clear();
  for (size_t i = 0; i < n;) {
    std::string head;
    absl::StatusOr<size_t> slices = SlicesHead(i, n, &head);
    if (!slices.ok()) {
      spdlog::error("shard {}: cannot frame slices it queued: {}", front_->shard()->shard_id(),
                    std::string(slices.status().message()));
      return Shutdown();
    }
    size_t frames = *slices;
    if (frames > 0) {
      buffers.emplace_back(asio::buffer(slice_heads_.emplace_back(std::move(head))));
    } else {
      frames = 1;
      buffers.emplace_back(asio::buffer(out_[i].head));
    }
    for (const size_t end = i + frames; i < end; ++i) {
      if (out_[i].body != nullptr && !out_[i].body->empty()) buffers.emplace_back(asio::buffer(*out_[i].body));
    }
  }
  writing_ = n;
  write_started_ = std::chrono::steady_clock::now();
  held_answers_ = 0;
  socket_.AsyncWriteAll(buffers,
                        [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                          self->Written(ec);
                        });
}

void Connection::Written(const boost::system::error_code& ec) {
  const size_t written = std::exchange(writing_, 0);
  if (ec || closed_) return Shutdown();
  std::vector<uint64_t> slices;  // pulls whose slice went out
  uint32_t answers = 0;
  bool last = false;
  for (size_t i = 0; i < written; ++i) {
    const Outgoing& frame = out_.front();
    if (frame.slice.has_value()) slices.push_back(frame.slice->pull);
    answers += frame.answer ? 1 : 0;
    last = last || frame.last;
    out_.pop_front();  // drops its snapshot reference
  }
  if (!slices.empty()) {
    pull_pace_.Wrote(slices.size(), std::chrono::duration<double>(
                                        std::chrono::steady_clock::now() - write_started_)
                                        .count());
  }
  if (last) {
    // The peer reads the GOAWAY and then the end of the stream; the socket closes when
    // it closes its end or at the GOAWAY's deadline (closing at once, with its unread
    // bytes still here, would reset the connection, and a reset may discard the GOAWAY).
    // Until then what it sends is read and dropped (Drain), which is how its end is seen.
    boost::system::error_code e;
    socket_.socket().shutdown(tcp::socket::shutdown_send, e);
    goaway_written_ = true;
    if (peer_ended_) return Shutdown();
    return Drain();
  }
  // A push counts until its answer is written, not queued: a peer that stops reading
  // stops this connection's reading at the bound, and the answers queued for it with it.
  const uint32_t bound = hub_->options().max_unanswered_pushes;
  const bool paused = !reading_ && unanswered_ >= bound;
  unanswered_ -= answers;
  for (uint64_t tag : slices) {
    if (auto it = pulls_.find(tag); it != pulls_.end()) it->second->handle().WriteDone(true);
  }
  WriteMore();
  if (paused && unanswered_ < bound) ReadHeader();
}

void Connection::Answered(uint64_t tag, const absl::Status& status) {
  // Counted off once written (Written).
  Outgoing answer{.head = StatusFrame(net::FrameType::kAnswer, tag, status), .answer = true};
  if (holding_answers_ && held_answers_ + 1 < kMaxHeldAnswers && !closed_ && !goaway_queued_) {
    out_.push_back(std::move(answer));  // written by the next WriteMore
    ++held_answers_;
    return;
  }
  Queue(std::move(answer));
}

void Connection::PullEnded(uint64_t tag, const absl::Status& status) {
  auto it = pulls_.find(tag);
  if (it == pulls_.end()) return;  // closed meanwhile
  pulls_.erase(it);  // the handle's watches and place go back now
  Queue(Outgoing{.head = StatusFrame(net::FrameType::kPullEnd, tag, status)});
}

void Connection::GoAway(const absl::Status& status) {
  if (closed_) return;
  going_away_ = true;
  Queue(Outgoing{.head = StatusFrame(net::FrameType::kGoaway, 0, status), .last = true});
  // A peer that does not read does not hold the connection for its GOAWAY.
  Arm(Deadline::kGoaway, kGoawayLinger);
}

void Connection::EndFor(Refusal kind, absl::string_view message, size_t request_bytes) {
  const absl::Status refused = front_->shard()->Refuse(kind, message);
  if (state_ != net::ConnectionState::kShardAdmitted) return GoAway(refused);
  going_away_ = true;
  AnswerLater(peer_.client, refused, request_bytes, net::FrameType::kGoaway, 0);
}

void Connection::AnswerLater(std::string_view client, const absl::Status& status,
                             size_t request_bytes, net::FrameType frame, uint64_t tag) {
  // The tarpit may run `send` on its own thread, after this connection is gone.
  front_->Answer(client, status, request_bytes,
                 [weak = weak_from_this(), status, frame, tag]() {
                   std::shared_ptr<Connection> c = weak.lock();
                   if (c == nullptr) return;
                   asio::dispatch(c->socket_.get_executor(), [c, status, frame, tag] {
                     switch (frame) {
                       case net::FrameType::kAnswer:
                         return c->Answered(tag, status);
                       case net::FrameType::kPullEnd:
                         return c->Queue(
                             Outgoing{.head = StatusFrame(net::FrameType::kPullEnd, tag, status)});
                       default:
                         return c->GoAway(status);
                     }
                   });
                 });
}

// ---- deadlines and the end ----

void Connection::Arm(Deadline kind, core::Duration after) {
  deadline_ = kind;
  if (kind == Deadline::kNone || closed_) return;
  deadline_at_ = std::chrono::steady_clock::now() + after;
  // The timer is set again only when its wait would end too late. Every frame moves
  // the idle and read deadlines further out, which costs no timer operation (and no
  // system call): the wait that ends early finds the deadline ahead and waits again.
  if (timer_waiting_ && timer_.expiry() <= deadline_at_) return;
  Wait();
}

void Connection::Wait() {
  timer_waiting_ = true;
  timer_.expires_at(deadline_at_);  // a pending wait ends with operation_aborted
  timer_.async_wait([self = shared_from_this(), seq = ++timer_seq_](
                        const boost::system::error_code& ec) { self->OnTimer(seq, ec); });
}

void Connection::OnTimer(uint64_t seq, const boost::system::error_code& ec) {
  if (seq != timer_seq_) return;  // replaced by a sooner wait, or closed
  timer_waiting_ = false;
  if (ec || closed_ || deadline_ == Deadline::kNone) return;
  if (std::chrono::steady_clock::now() < deadline_at_) return Wait();
  OnDeadline(deadline_);
}

void Connection::OnDeadline(Deadline kind) {
  const Options& o = hub_->options();
  switch (kind) {
    case Deadline::kProof:
      spdlog::debug("shard {}: data connection from {} closed: no proof within {} ms",
                    front_->shard()->shard_id(), peer_name_,
                    std::chrono::duration_cast<std::chrono::milliseconds>(proof_timeout_).count());
      hub_->ClosedFor(CloseReason::kProofTimeout);
      return Shutdown();
    case Deadline::kIdle:
      if (!pulls_.empty() || unanswered_ > 0) return Arm(Deadline::kIdle, o.idle_timeout);
      return GoAway(absl::UnavailableError(absl::StrCat(
          "data connection idle for ", std::chrono::duration_cast<std::chrono::milliseconds>(o.idle_timeout).count(),
          " ms: closed; connect again when there is data to move")));
    case Deadline::kRead:
      return GoAway(front_->shard()->Refuse(
          Refusal::kStalled,
          absl::StrCat("data frame ", core::AsAbsl(net::FrameTypeName(header_.type)),
                       " not received within ",
                       std::chrono::duration_cast<std::chrono::milliseconds>(o.read_timeout).count(),
                       " ms of its header (--request-read-timeout-ms)")));
    case Deadline::kGoaway:
    case Deadline::kNone:
      return Shutdown();
  }
}

void Connection::Shutdown() {
  if (closed_) return;
  closed_ = true;
  ++timer_seq_;
  timer_.cancel();
  boost::system::error_code ec;
  socket_.socket().shutdown(tcp::socket::shutdown_both, ec);
  socket_.socket().close(ec);
  // Every pull's watches and place go back now; a write in flight still references
  // out_, which goes with the last handler.
  pulls_.clear();
  hub_->Closed(id_);
}

}  // namespace ps::server::transport::tcp
