// One data connection on the shard (docs/data-plane.md, section 3): its handshake,
// then its pushes, pulls and their answers, each a frame of net/data_frame.h.
//
//   With TLS (Hub::tls): once the client's first bytes come, the TLS handshake (a failed
//     one closes the connection, counted tls_handshake); under mTLS the certificate's
//     common name must then name the HELLO's worker (permission_denied otherwise);
//   HELLO (session, worker, client nonce C) -> an unknown or replaced session, or one of
//     another worker: GOAWAY unknown_session, before any HMAC;
//   CHALLENGE (N, server nonce S, the shard's proof) -> PROOF, compared with
//     crypto::SameProof; a wrong one: GOAWAY unauthenticated through the tarpit, charged
//     to its anonymous client;
//   ADMIT (the connection's limits) -> PUSH, PULL, CANCEL, GOAWAY.
//
// Every frame's header is checked from its 16 bytes (net::CheckHeader against the state
// and the limits) before more is read or allocated: a malformed one ends the connection
// with GOAWAY malformed. A PUSH's body is read into the connection's buffer and handed to
// ShardFront::Push, which decodes it as the gRPC path does; a raw fp32 body of the
// slice's size (ShardFront::RawRowNumel) is read straight into a row of the connection's,
// which the round takes as the worker's row after the same checks, giving back the row
// it held (RawRow: no copy of the values on the shard). A PUSHES carries several pushes
// of one round: each body goes to its own row (or into body_), read by reads that take
// what is here of the frame and wake once the next body is whole, and each push is taken
// as soon as its body is in. Each ANSWER goes through ShardFront::Answer (the tarpit), by tag, in any order. A
// PULL opens a ShardFront pull whose sink writes SLICE frames, each its header and meta
// followed by the published snapshot's bytes by reference (one gather write), and
// PULL_END at its end; slices of one pull queued one after another leave as one SLICES
// (the pull part: connection_pull.{h,cc}; the push reading: connection_push.cc). Reading stops while max_unanswered_pushes pushes have no written
// answer (owed, held by the tarpit, or queued for a peer that does not read).
//
// One deadline at a time: accept to ADMIT (the proof timeout, over the TLS handshake
// too), then between frames the
// idle timeout (only while no pull is open and no answer owed), and within a frame the
// read timeout.
//
// Thread safety: everything runs on the connection's thread (the socket's executor, an
// io_context run by one thread);
// Start() and Close() may be called from any thread. The backend owns each connection
// until it closes (Hub::Closed); held tarpit answers and pull callbacks keep only a
// weak_ptr. Closing frees the pulls (their watches and places)
// at once, the buffers with the last handler.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "net/data_frame.h"
#include "net/data_stream_internal.h"
#include "net/scratch_buffer.h"
#include "server/connection_table.h"
#include "server/shard_front.h"
#include "server/transport/tcp/backend.h"
#include "server/transport/tcp/pull_pace.h"

namespace ps::server::transport::tcp {

// What a connection needs of its backend.
class Hub {
 public:
  virtual ~Hub() = default;
  virtual ShardFront* front() = 0;
  virtual const Options& options() const = 0;
  // The port's TLS context; null: plaintext.
  virtual net::TlsContext* tls() = 0;
  // The handshake of connection `id` admitted it as `identity` ("worker-3").
  virtual void Admitted(ConnectionTable::Id id, const std::string& peer,
                        const std::string& identity) = 0;
  // Connection `id` sent what no honest client sends before ADMIT: penalize its source.
  virtual void Abusive(ConnectionTable::Id id) = 0;
  // A connection is closed for `reason` by its own rules (the proof timeout): counted.
  virtual void ClosedFor(CloseReason reason) = 0;
  // Connection `id` is closed (once).
  virtual void Closed(ConnectionTable::Id id) = 0;
};

class Connection final : public std::enable_shared_from_this<Connection> {
 public:
  // `socket`: accepted, its executor run by one thread. `peer`: "address:port", unique while open.
  // `proof_timeout`: from now to ADMIT.
  Connection(Hub* hub, boost::asio::ip::tcp::socket socket, ConnectionTable::Id id,
             std::string peer, core::Duration proof_timeout);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  void Start();
  // Closes the connection without a GOAWAY (the backend stops, or the table evicted it).
  void Close();

 private:
  class Pull;
  // One frame to write: header and meta (`head`), then `body` by reference. A pull's
  // slice keeps its fields instead of a head: WriteMore frames it, as a SLICE or with the
  // slices of its pull queued after it as one SLICES.
  struct Outgoing {
    struct Slice {
      uint64_t pull = 0;  // its tag: the pull is told WriteDone once the slice is written
      net::SlicesEntry entry;
      std::string codec;
    };
    std::string head;
    std::shared_ptr<const std::string> body;
    std::optional<Slice> slice;
    bool answer = false;         // a push's ANSWER: the push is answered once it is written
    bool last = false;           // a GOAWAY: the connection closes once it is written
  };
  enum class Deadline { kNone, kProof, kIdle, kRead, kGoaway };

  // TLS: waits for the client's first bytes, then runs the handshake, then ReadHeader.
  void StartTls();
  // Under mTLS, whether the certificate names `worker` (the control plane's identity).
  absl::Status CertifiedAs(uint32_t worker) const;

  // Reading, one frame at a time.
  void ReadHeader();
  void OnHeader();
  void OnMeta();
  // Reads the frame's body into body_, then calls `then`.
  void ReadBody(void (Connection::*then)());
  // Reads a PUSH's body: raw fp32 values into raw_ (ShardFront::RawRowNumel), else into
  // body_; then OnPushBody.
  void ReadPushBody();
  PushHead Head() const;  // the PUSH being read
  // Reads exactly `into` from the socket, then calls `then` (at once when the bytes are
  // here already: net::DataStream::ReadNow); a failed read closes.
  void ReadInto(boost::asio::mutable_buffer into, void (Connection::*then)());
  // Before an asynchronous read of the socket: the held answers are written.
  void WaitToRead();
  // Going away: reads and drops what the peer still sends, until its end of the stream,
  // which closes the connection once the GOAWAY is written (Written closes it at once
  // when the end came first).
  void Drain();
  void OnPushBody();
  // PUSHES: each push's body is read into a row of its own (raw fp32 of its slice's size)
  // or into body_, by reads that take all of the frame that is here (one wake-up and one
  // system call for several bodies when they came together) and wake once the next body
  // is whole; each push is taken as OnPushBody takes one as soon as its body is in.
  void ReadPushesBody();
  void OnPushesRead();
  void TakePushOfPushes(uint32_t i);
  PushHead PushesHead(size_t i) const;  // push i of the PUSHES being read
  void OnPullBody();
  // The handshake.
  void Hello(std::string_view meta);
  void Proof(std::string_view meta);
  // The session this connection was admitted under is still the worker's (a re-join
  // replaces it): else the unknown_session refusal.
  absl::Status Current() const;
  void Cancel(uint64_t tag);

  // Writing.
  void Queue(Outgoing frame);
  void WriteMore();
  // The write in flight completed (`ec`): its frames are done with.
  void Written(const boost::system::error_code& ec);
  void Answered(uint64_t tag, const absl::Status& status);
  // Slices of one pull, in the order its scheduler wrote them.
  void QueueSlices(std::vector<Outgoing> slices);
  // From out_[at], a slice, and the slices of its pull after it (up to out_[end]) that
  // can share its frame: their header and meta in *head (a SLICE for one, else a
  // SLICES), and their count (0: out_[at] is no slice).
  absl::StatusOr<size_t> SlicesHead(size_t at, size_t end, std::string* head) const;
  void PullEnded(uint64_t tag, const absl::Status& status);
  // GOAWAY with `status`, then closed; reading stops now.
  void GoAway(const absl::Status& status);
  // A frame the peer should not have sent ends the connection, refused as `kind` after
  // `request_bytes` of it were read. An admitted worker is charged for it as for a
  // refused push: over its budget the tarpit holds the GOAWAY (reading stops meanwhile),
  // so a member that reconnects to send such frames again and again gets no more of them
  // refused per second than it would over gRPC. Before ADMIT: GOAWAY at once (the hub
  // penalizes abusive sources).
  void EndFor(Refusal kind, absl::string_view message, size_t request_bytes);
  // A refusal answered through the front (the tarpit may hold it), as `frame` (ANSWER,
  // PULL_END or GOAWAY) once sent.
  void AnswerLater(std::string_view client, const absl::Status& status, size_t request_bytes,
                   net::FrameType frame, uint64_t tag);

  // The deadline is now `kind`, `after` from now (kNone: none).
  void Arm(Deadline kind, core::Duration after);
  // Waits on the timer until deadline_at_.
  void Wait();
  void OnTimer(uint64_t seq, const boost::system::error_code& ec);
  void OnDeadline(Deadline kind);
  void Shutdown();

  Hub* const hub_;
  ShardFront* const front_;
  net::DataStream socket_;  // the socket, or TLS over it
  boost::asio::steady_timer timer_;
  const ConnectionTable::Id id_;
  const std::string peer_name_;  // "address:port"
  const core::Duration proof_timeout_;

  net::ConnectionState state_ = net::ConnectionState::kShardAwaitsHello;
  net::FrameLimits limits_;
  bool closed_ = false;
  bool going_away_ = false;  // GOAWAY queued or a refusal of the handshake pending
  bool goaway_queued_ = false;
  bool reading_ = false;     // a read is in flight or a frame is being handled
  bool read_in_flight_ = false;  // an async read of the socket is pending
  bool goaway_written_ = false;
  bool peer_ended_ = false;  // the peer's end of the stream was read while going away
  Deadline deadline_ = Deadline::kNone;
  std::chrono::steady_clock::time_point deadline_at_;
  bool timer_waiting_ = false;  // a wait of the current timer_seq_ is pending
  uint64_t timer_seq_ = 0;

  // The frame being read: header, meta (fixed: no meta is longer), the parsed PUSH or
  // PULL meta, the body.
  std::array<char, net::kFrameHeaderBytes> header_bytes_{};
  net::FrameHeader header_;
  std::array<char, net::kMaxMetaBytes> meta_{};
  net::PushMeta push_;
  net::PullMeta pull_;
  net::ScratchBuffer body_;
  // A raw fp32 push's row, and whether the PUSH being read went there; after a push the
  // row the round gave back for the next one (or null).
  RawRow raw_;
  bool raw_push_ = false;
  // A PUSHES: its meta (the codec borrows meta_), and per push whether its body went into
  // its row in raws_ or into body_, back to back. The rows are kept for the next frame's
  // pushes, but only those of this frame's raw pushes: within one body's bound
  // (--max-message-bytes), as raw_ is.
  net::PushesMeta pushes_;
  std::vector<RawRow> raws_;
  std::array<bool, net::kMaxPushesPerFrame> raw_entry_{};
  std::array<size_t, net::kMaxPushesPerFrame> pushes_end_{};  // each body's end in B
  std::array<size_t, net::kMaxPushesPerFrame> pushes_at_{};   // a coded body's place in body_
  std::vector<boost::asio::mutable_buffer> pushes_into_;  // the bodies' places, filled in order
  size_t pushes_into_first_ = 0;  // the first place not yet full
  size_t pushes_read_ = 0;        // bytes of B read
  uint32_t pushes_next_ = 0;      // the first push not yet taken
  size_t pushes_request_bytes_ = 0;  // the header's and meta's, charged to the first push

  // The handshake's state, then the admitted peer.
  std::optional<std::string> certificate_name_;  // the client certificate's common name
  std::shared_ptr<const DataSession> session_;
  uint64_t session_id_ = 0;
  std::string expected_proof_;
  DataPeer peer_;
  Caller caller_;

  uint32_t unanswered_ = 0;
  bool holding_answers_ = false;  // OnPushBody's answer may wait for the next ones
  uint32_t held_answers_ = 0;     // ANSWERs queued since the last write started
  absl::flat_hash_map<uint64_t, std::unique_ptr<Pull>> pulls_;
  std::deque<Outgoing> out_;
  size_t writing_ = 0;  // frames of out_'s front in the write in flight
  std::deque<std::string> slice_heads_;  // the write in flight's SLICE and SLICES heads
  std::chrono::steady_clock::time_point write_started_;  // of the write in flight
  PullPace pull_pace_;  // how many slices a pull hands over at once
};

}  // namespace ps::server::transport::tcp
