#include "worker_lib/transport/tcp/connection_internal.h"

#include <netinet/in.h>
#include <netinet/tcp.h>

#include <algorithm>
#include <utility>

#include "core/refusal.h"
#include "core/status.h"
#include "crypto/auth_proof.h"
#include "net/address.h"
#include "net/tcp_options.h"

namespace ps::internal::tcp_plane {
namespace {

constexpr size_t kMaxFramesPerWrite = 64;
// The largest body this worker reads, whatever the shard's ADMIT says: the gRPC
// channel's receive limit. A slice with no place of its own is read into a buffer of its
// header's size, allocated before its bytes come.
constexpr uint64_t kMaxBodyBytes = 64u << 20;
static_assert(kMaxBodyBytes >= net::kMaxSlicesBodyBytes, "a merged SLICES is read");

// A status from the wire: the refusal rebuilt from its name when this worker knows it.
absl::Status FromWire(const net::StatusMeta& m) {
  if (m.code == absl::StatusCode::kOk) return absl::OkStatus();
  if (!m.refusal_name.empty()) {
    if (std::optional<core::Refusal> kind = core::ParseRefusal(m.refusal_name)) {
      return core::Refused(*kind, core::AsAbsl(m.message));
    }
  }
  return absl::Status(m.code, core::AsAbsl(m.message));
}

// The bytes that follow a frame's head: its body's, then the borrowed ones.
void AddBodies(const OutFrame& f, std::vector<asio::const_buffer>& buffers) {
  if (f.body != nullptr && !f.body->empty()) buffers.emplace_back(f.body->data(), f.body->size());
  if (!f.borrowed.empty()) buffers.emplace_back(f.borrowed.data(), f.borrowed.size());
}

}  // namespace

void Connection::SetRoute(Route route) {
  absl::MutexLock lock(&mu_);
  route_ = std::move(route);
}

uint64_t Connection::epoch() const {
  absl::MutexLock lock(&mu_);
  return route_.data.epoch;
}

void Connection::StartPushes(std::shared_ptr<PushBatch> batch, std::vector<OutFrame> frames,
                             std::vector<absl::Status> refused, RpcClock::time_point deadline) {
  for (size_t i = 0; i < frames.size(); ++i) {
    if (!refused[i].ok()) {
      batch->tags[i] = 0;
      batch->done(i, refused[i]);
      continue;
    }
    const uint64_t tag = batch->tags[i];
    pushes_[tag] = PendingPush{batch, i, deadline};
    queue_.push_back(std::move(frames[i]));
  }
  Go();
}

void Connection::CancelPushes(const std::shared_ptr<PushBatch>& batch) {
  DropQueuedPushes(batch->tags);
  for (size_t i = 0; i < batch->tags.size(); ++i) {
    auto it = pushes_.find(batch->tags[i]);
    if (it == pushes_.end()) continue;
    pushes_.erase(it);
    batch->done(i, absl::CancelledError("push cancelled"));
  }
}

void Connection::StartPull(uint64_t tag, OutFrame frame, std::shared_ptr<PullSink> sink,
                           RpcClock::time_point deadline) {
  pulls_[tag] = PendingPull{std::move(sink), deadline};
  queue_.push_back(std::move(frame));
  Go();
}

Connection::Route Connection::route() const {
  absl::MutexLock lock(&mu_);
  return route_;
}

void Connection::Go() {
  if (!sweeping_ && (!pushes_.empty() || !pulls_.empty())) {
    sweeping_ = true;
    ScheduleSweep();
  }
  if (state_ == State::kIdle) {
    Connect();
  } else if (state_ == State::kReady) {
    Flush();
  }
}

void Connection::Connect() {
  const Route r = route();
  if (!r.endpoint.has_value()) {
    FailAll(r.why_none.ok() ? absl::FailedPreconditionError(absl::StrCat(
                                  Name(), " named no TCP data endpoint in its Join answer"))
                            : r.why_none);
    return;
  }
  state_ = State::kConnecting;
  const uint64_t gen = ++generation_;
  socket_ = std::make_shared<net::DataStream>(tcp::socket(io_));
  admitted_route_ = r.data;
  auto self = shared_from_this();
  connect_timer_ = std::make_unique<asio::steady_timer>(io_, options_.connect_timeout);
  connect_timer_->async_wait([self, gen](const boost::system::error_code& ec) {
    if (ec || gen != self->generation_ || self->state_ != State::kConnecting) return;
    self->Lost(DataEndpointUnreachable(absl::StrCat(
        "no admission from ", self->Name(), "'s data port within ",
        self->options_.connect_timeout.count(), " ms")));
  });
  // The shard's least retransmission timeout for this end's segments (pushes) too, set
  // before the handshake, whose round trip starts the estimate. A kernel without the
  // option keeps its own: the pushes still arrive, only slower under loss, and the
  // worker's stats count the connection. (A socket that fails to open fails the connect
  // below with the same error.)
  boost::system::error_code opened;
  socket_->socket().open(r.endpoint->protocol(), opened);
  if (!opened &&
      !net::SetTcpRtoMin(socket_->socket().native_handle(), r.data.tcp_rto_min).ok()) {
    rto_min_unset_.fetch_add(1, std::memory_order_relaxed);
  }
  socket_->socket().async_connect(*r.endpoint, [self, gen, name = r.server_name, stream = socket_](
                                                    const boost::system::error_code& ec) {
    if (gen != self->generation_) return;
    if (ec) {
      self->Lost(DataEndpointUnreachable(absl::StrCat(
          "cannot connect to ", self->Name(), "'s data port: ", ec.message())));
      return;
    }
    boost::system::error_code ignored;
    self->socket_->socket().set_option(tcp::no_delay(true), ignored);
    if (self->tls_ != nullptr) return self->StartTls(gen, name);
    self->SendHello(gen);
  });
}

void Connection::StartTls(uint64_t gen, const std::string& server_name) {
  socket_->StartTls(*tls_);
  if (absl::Status st = socket_->ExpectServer(server_name); !st.ok()) return Lost(st);
  auto self = shared_from_this();
  socket_->AsyncHandshake(
      asio::ssl::stream_base::client,
      [self, gen, server_name, stream = socket_](const boost::system::error_code& ec) {
        if (gen != self->generation_) return;
        if (!ec) return self->SendHello(gen);
        // The shard's certificate refused: what a port that cannot prove the session
        // gets (nothing more is said to it); else the connection failed under TLS.
        const std::string refused = self->socket_->VerifyFailure();
        if (!refused.empty()) {
          return self->Lost(absl::UnauthenticatedError(absl::StrCat(
              self->Name(), "'s data port: TLS ", refused, " (the CA bundle ",
              self->options_.credentials.tls_ca, ", the name '", server_name, "')")));
        }
        self->Lost(absl::UnavailableError(absl::StrCat("TLS handshake with ", self->Name(),
                                                       "'s data port failed: ", ec.message())));
      });
}

void Connection::SendHello(uint64_t gen) {
  absl::StatusOr<std::string> nonce = crypto::NewNonce();
  if (!nonce.ok()) return Lost(nonce.status());
  net::HelloMeta hello{.data_session = admitted_route_.data_session,
                       .worker_id = options_.worker_id};
  std::copy(nonce->begin(), nonce->end(), hello.client_nonce.begin());
  client_nonce_ = *nonce;
  std::string frame;
  if (absl::Status st = net::AppendHello(hello, &frame); !st.ok()) return Lost(st);
  Handshake(gen, std::move(frame), "sending its HELLO",
            net::ConnectionState::kWorkerAwaitsChallenge);
}

void Connection::Handshake(uint64_t gen, std::string bytes, std::string_view doing,
                           net::ConnectionState next) {
  auto frame = std::make_shared<const std::string>(std::move(bytes));
  auto self = shared_from_this();
  asio::async_write(*socket_, asio::buffer(*frame),
                    [self, gen, frame, doing, next, stream = socket_](
                        const boost::system::error_code& ec, size_t) {
                      if (gen != self->generation_) return;
                      if (ec) return self->LostOn(ec, doing);
                      self->ReadFrame(gen, next);
                    });
}

void Connection::ReadFrame(uint64_t gen, net::ConnectionState state) {
  frame_open_ = false;
  ReadInto(gen, asio::buffer(header_bytes_), [this, gen, state] {
    absl::StatusOr<net::FrameHeader> h = net::ParseHeader(header_bytes_);
    absl::Status ok = h.ok() ? net::CheckHeader(*h, state, limits_) : h.status();
    if (!ok.ok()) {
      return Lost(absl::InternalError(
          absl::StrCat(Name(), " sent a frame this worker cannot read: ", ok.message())));
    }
    header_ = *h;
    frame_open_ = true;
    meta_.resize(h->meta_bytes);
    ReadInto(gen, asio::buffer(meta_), [this, gen, state] { Handle(gen, state); });
  });
}

template <typename Then>
void Connection::ReadInto(uint64_t gen, asio::mutable_buffer into, Then then,
                          std::string_view doing) {
  // A frame's handling may have lost the connection (a callback closing the channel):
  // then nothing more is read for it, least of all from a new connection's socket.
  if (gen != generation_) return;
  // Bytes already here (read ahead, or queued in the socket) are handled at once (ReadNow
  // bounds how many in a row).
  if (socket_->ReadNow(into)) return then();
  socket_->AsyncReadExactly(into, [self = shared_from_this(), gen, then = std::move(then),
                                   doing, stream = socket_](const boost::system::error_code& ec,
                                                            size_t) {
    if (gen != self->generation_) return;
    if (ec) return self->LostOn(ec, doing);
    ++self->reads_;
    then();
  });
}

void Connection::Handle(uint64_t gen, net::ConnectionState state) {
  const net::FrameHeader& h = header_;
  if (h.type == net::FrameType::kGoaway) {
    absl::StatusOr<net::StatusMeta> m = net::ParseStatusMeta(h.type, meta_);
    if (!m.ok()) return Lost(m.status());
    // A GOAWAY ends the connection, never a call: one that names no error (code 0, from
    // any port, proven or not) fails what waits as a lost connection does, not as OK.
    if (m->code == absl::StatusCode::kOk) {
      return Lost(absl::UnavailableError(
          absl::StrCat(Name(), " closed the data connection (GOAWAY naming no error)")));
    }
    return Lost(WithContext(FromWire(*m), Name()));
  }
  switch (state) {
    case net::ConnectionState::kWorkerAwaitsChallenge:
      return OnChallenge(gen);
    case net::ConnectionState::kWorkerAwaitsAdmit:
      return OnAdmit(gen);
    default:
      break;
  }
  switch (h.type) {
    case net::FrameType::kAnswer:
      return OnAnswer(gen);
    case net::FrameType::kSlice:
      return OnSlice(gen);
    case net::FrameType::kSlices:
      return OnSlices(gen);
    case net::FrameType::kPullEnd:
      return OnPullEnd(gen);
    default:
      // CheckHeader admits nothing else in this state.
      return Lost(absl::InternalError(absl::StrCat(Name(), " sent an unexpected ",
                                                   core::AsAbsl(net::FrameTypeName(h.type)))));
  }
}

void Connection::OnChallenge(uint64_t gen) {
  absl::StatusOr<net::ChallengeMeta> c = net::ParseChallengeMeta(meta_);
  if (!c.ok()) return Lost(c.status());
  const std::string server_nonce(c->server_nonce.begin(), c->server_nonce.end());
  const std::string& secret = admitted_route_.data_secret;
  const std::string key = crypto::BoundDataKey(options_.credentials.token, server_,
                                                admitted_route_.data_session, secret);
  const std::string expected = crypto::DataServerProof(
      key, server_, admitted_route_.data_session, client_nonce_, server_nonce);
  if (c->shard_index != options_.shard ||
      !crypto::SameProof(expected, std::string_view(c->proof.data(), c->proof.size()))) {
    // Nothing more is said to a port that cannot prove it holds the session.
    return Lost(absl::UnauthenticatedError(absl::StrCat(
        Name(), "'s data port did not prove that it is shard ", options_.shard,
        " holding this worker's data session (another process on the port?)")));
  }
  net::ProofMeta proof;
  const std::string mine = crypto::DataClientProof(key, server_, admitted_route_.data_session,
                                                 client_nonce_, server_nonce);
  std::copy(mine.begin(), mine.end(), proof.proof.begin());
  std::string frame;
  if (absl::Status st = net::AppendProof(proof, &frame); !st.ok()) return Lost(st);
  Handshake(gen, std::move(frame), "sending its PROOF", net::ConnectionState::kWorkerAwaitsAdmit);
}

void Connection::OnAdmit(uint64_t gen) {
  absl::StatusOr<net::AdmitMeta> a = net::ParseAdmitMeta(meta_);
  if (!a.ok()) return Lost(a.status());
  limits_.max_body_bytes = std::min<uint64_t>(a->max_body_bytes, kMaxBodyBytes);
  state_ = State::kReady;
  socket_->ReadAhead();  // answers and slices come in runs
  connect_timer_.reset();
  Flush();
  ReadFrame(gen, net::ConnectionState::kWorkerAdmitted);
}

void Connection::OnAnswer(uint64_t gen) {
  absl::StatusOr<net::StatusMeta> m = net::ParseStatusMeta(header_.type, meta_);
  if (!m.ok()) return Lost(m.status());
  auto it = pushes_.find(header_.tag);
  if (it != pushes_.end()) {  // else cancelled or timed out already
    PendingPush p = std::move(it->second);
    pushes_.erase(it);
    p.batch->tags[p.index] = 0;
    p.batch->done(p.index, FromWire(*m));
  }
  ReadFrame(gen, net::ConnectionState::kWorkerAdmitted);
}

void Connection::OnSlice(uint64_t gen) {
  absl::StatusOr<net::PullHeader> m = net::ParseSliceMeta(header_.flags, meta_);
  if (!m.ok()) return Lost(m.status());
  slice_ = *m;  // its codec a view into meta_, kept until Arrived
  const size_t bytes = header_.body_bytes;
  std::span<char> place;
  auto it = pulls_.find(header_.tag);
  if (it != pulls_.end()) {
    absl::StatusOr<std::span<char>> placed = it->second.sink->Place(slice_, bytes);
    if (placed.ok() && !placed->empty() && placed->size() != bytes) {
      placed = absl::InternalError(absl::StrCat("a place of ", placed->size(),
                                                " bytes for a slice of ", bytes));
    }
    if (!placed.ok()) {
      EndPull(header_.tag, placed.status(), /*cancel=*/true);
    } else {
      place = *placed;
    }
  }
  // A slice of a pull that ended (or whose sink keeps no place) is read into the
  // scratch body and, without a pull, dropped. While the body is read into the sink's
  // place, the pull is not ended from outside: its buffer is the caller's until Done
  // (past its deadline, the sweep closes the connection first).
  reading_tag_ = place.empty() ? 0 : header_.tag;
  if (place.empty()) {
    place = body_.Take(bytes);
  }
  ReadInto(
      gen, asio::buffer(place.data(), place.size()),
      [this, gen, place] {
        reading_tag_ = 0;
        Arrived(header_.tag, slice_, place);
        ReadFrame(gen, net::ConnectionState::kWorkerAdmitted);
      },
      "reading a slice");
}

void Connection::Arrived(uint64_t tag, const net::PullHeader& h, std::span<char> bytes) {
  auto it = pulls_.find(tag);
  if (it == pulls_.end()) return;
  const std::string_view piece(bytes.data(), bytes.size());
  absl::Status st = it->second.sink->Arrived(h, net::Pieces(&piece, 1));
  if (!st.ok()) EndPull(tag, st, /*cancel=*/true);
}

void Connection::OnPullEnd(uint64_t gen) {
  absl::StatusOr<net::StatusMeta> m = net::ParseStatusMeta(header_.type, meta_);
  if (!m.ok()) return Lost(m.status());
  EndPull(header_.tag, FromWire(*m), /*cancel=*/false);
  ReadFrame(gen, net::ConnectionState::kWorkerAdmitted);
}

void Connection::EndPull(uint64_t tag, const absl::Status& status, bool cancel) {
  auto it = pulls_.find(tag);
  if (it == pulls_.end()) return;
  std::shared_ptr<PullSink> sink = std::move(it->second.sink);
  pulls_.erase(it);
  if (cancel && state_ == State::kReady) {
    OutFrame f;
    if (net::AppendCancel(tag, &f.head).ok()) {
      queue_.push_back(std::move(f));
      Flush();
    }
  }
  sink->Done(status);
}

void Connection::Flush() {
  if (writing_ || queue_.empty() || state_ != State::kReady) return;
  // Each frame of the batch: a queued frame as it is, or a PUSHES (its head made here,
  // its pushes' bodies after it).
  auto batch = std::make_shared<std::vector<OutFrame>>();
  std::vector<asio::const_buffer> buffers;
  size_t frames = 0;
  while (!queue_.empty() && frames < kMaxFramesPerWrite) {
    ++frames;
    std::string head;
    const size_t first = batch->size();
    absl::StatusOr<size_t> pushes = TakePushes(*batch, &head);
    if (!pushes.ok()) return Lost(pushes.status());
    if (*pushes > 0) {
      auto merged = std::make_shared<const std::string>(std::move(head));
      buffers.emplace_back(merged->data(), merged->size());
      for (size_t i = first; i < batch->size(); ++i) {
        AddBodies((*batch)[i], buffers);
      }
      batch->push_back(OutFrame{.body = std::move(merged)});  // keeps the head alive
      continue;
    }
    batch->push_back(std::move(queue_.front()));
    queue_.pop_front();
    const OutFrame& f = batch->back();
    buffers.emplace_back(f.head.data(), f.head.size());
    AddBodies(f, buffers);
  }
  writing_ = true;
  writing_tags_.clear();
  for (const OutFrame& f : *batch) {
    if (f.push.has_value()) writing_tags_.push_back(f.push->entry.tag);
  }
  const uint64_t gen = generation_;
  auto self = shared_from_this();
  socket_->AsyncWriteAll(
      buffers, [self, gen, batch, stream = socket_](const boost::system::error_code& ec, size_t) {
        if (gen != self->generation_) return;
        self->writing_ = false;
        self->writing_tags_.clear();
        if (ec) return self->LostOn(ec, "writing");
        self->Flush();
      });
}

absl::StatusOr<size_t> Connection::TakePushes(std::vector<OutFrame>& out, std::string* head) {
  if (!queue_.front().push.has_value()) return 0;
  const OutFrame::Push& first = *queue_.front().push;
  const auto joins = [&first](const OutFrame::Push& p) {
    return p.layout_hash == first.layout_hash && p.round == first.round && p.codec == first.codec &&
           p.entry.loss.has_value() == first.entry.loss.has_value() &&
           p.entry.lr.has_value() == first.entry.lr.has_value();
  };
  net::PushesMeta meta{.layout_hash = first.layout_hash, .round = first.round, .codec = first.codec};
  uint64_t body_bytes = 0;
  size_t n = 0;
  for (; n < queue_.size() && n < net::kMaxPushesPerFrame; ++n) {
    const OutFrame& f = queue_[n];
    if (n > 0 && (!f.push.has_value() || !joins(*f.push) ||
                  body_bytes + f.push->entry.body_bytes > limits_.max_body_bytes)) {
      break;
    }
    body_bytes += f.push->entry.body_bytes;
    meta.entries[n] = f.push->entry;
  }
  meta.count = static_cast<uint32_t>(n);
  // Start checked each push's codec and body (net::CheckPayload), and the merged bodies
  // are within the ADMIT's largest: neither encoder refuses these fields.
  const net::PushesEntry& one = first.entry;
  PS_RETURN_IF_ERROR(n == 1 ? net::AppendPush(one.tag,
                                              net::PushMeta{.layout_hash = first.layout_hash,
                                                            .round = first.round,
                                                            .slice_id = one.slice_id,
                                                            .loss = one.loss,
                                                            .codec = first.codec,
                                                            .lr = one.lr},
                                              one.body_bytes, head)
                            : net::AppendPushes(meta, head));
  for (size_t i = 0; i < n; ++i) {
    out.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  return n;
}

void Connection::DropQueuedPushes(std::span<const uint64_t> tags) {
  if (tags.empty()) return;
  std::erase_if(queue_, [tags](const OutFrame& f) {
    return f.push.has_value() &&
           std::find(tags.begin(), tags.end(), f.push->entry.tag) != tags.end();
  });
}

void Connection::LostOn(const boost::system::error_code& ec, std::string_view doing) {
  Lost(absl::UnavailableError(
      absl::StrCat("the data connection to ", Name(), " was lost ", core::AsAbsl(doing), ": ",
                   ec.message())));
}

void Connection::Lost(const absl::Status& status) {
  // Closing the socket ends its reads on this thread: no byte lands in a sink's place
  // after the Done below.
  ++generation_;  // every handler of the old connection returns at once
  reading_tag_ = 0;
  frame_open_ = false;
  if (socket_ != nullptr) {
    boost::system::error_code ignored;
    socket_->socket().close(ignored);
  }
  connect_timer_.reset();
  state_ = State::kIdle;
  writing_ = false;
  writing_tags_.clear();
  limits_ = {};
  queue_.clear();
  FailAll(status);
}

void Connection::FailAll(const absl::Status& status) {
  auto pushes = std::move(pushes_);
  auto pulls = std::move(pulls_);
  pushes_.clear();
  pulls_.clear();
  queue_.clear();
  for (auto& [tag, p] : pushes) {
    p.batch->tags[p.index] = 0;
    p.batch->done(p.index, status);
  }
  for (auto& [tag, p] : pulls) p.sink->Done(status);
}

}  // namespace ps::internal::tcp_plane
