// The worker's connection to one shard's TCP data port (docs/data-plane.md, section 3),
// under the channel of channel.h: its handshake, its frames both ways, its deadlines and
// its losses. Everything but the route runs on the worker's I/O thread; the channel posts
// its calls there. Asio's types stay in this internal header and the .cc files of this
// folder (the connection's parts: connection.cc, connection_pull.cc for SLICES,
// connection_deadline.cc for the sweep).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/thread_pool.h"
#include "net/data_frame.h"
#include "net/data_stream_internal.h"
#include "net/scratch_buffer.h"
#include "worker_lib/transport/data_channel.h"
#include "worker_lib/transport/tcp/channel.h"

namespace ps::internal::tcp_plane {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

class IoThread {
 public:
  IoThread()
      : guard_(asio::make_work_guard(io_)), thread_([this] {
          core::NameThisThread("ps-worker-tcp");
          io_.run();
        }) {}
  // Never from the thread itself: the channels hold it, and their connections (which
  // the thread's handlers keep alive) only borrow its io_context.
  ~IoThread() {
    guard_.reset();
    io_.stop();
    thread_.join();
  }
  asio::io_context& io() { return io_; }

 private:
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> guard_;
  std::thread thread_;
};

// until the last has run (the PushCall itself may be gone by then).
struct PushBatch {
  std::function<void(size_t, absl::Status)> done;
  std::vector<uint64_t> tags;  // per push; 0 once answered
};

// A frame waiting to be written: its header and meta, and its body by reference. A push
// keeps its fields instead of a head: Flush frames it, as a PUSH or with the pushes
// queued after it as one PUSHES.
struct OutFrame {
  std::string head;
  std::shared_ptr<const std::string> body;
  // A borrowed push's bytes after `body`, and their guard, kept until the write that
  // carries them completed or failed (OutgoingPush).
  std::span<const char> borrowed;
  std::shared_ptr<const void> borrowed_guard;
  struct Push {
    uint64_t layout_hash = 0;
    uint64_t round = 0;
    std::string codec;
    net::PushesEntry entry;  // its tag, slice, body length, loss and learning rate
  };
  std::optional<Push> push;
};

// The connection to one shard's data port, on the I/O thread only (but the route).
class Connection final : public std::enable_shared_from_this<Connection> {
 public:
  // `tls`: null for plaintext.
  Connection(asio::io_context& io, TcpChannelOptions options, std::shared_ptr<net::TlsContext> tls)
      : io_(io),
        options_(std::move(options)),
        tls_(std::move(tls)),
        server_(absl::StrCat("shard-", options_.shard)) {}

  // ---- any thread ----
  struct Route {
    DataRoute data;
    std::optional<tcp::endpoint> endpoint;  // none: no TCP data plane on this shard
    std::string server_name;  // TLS: the name the shard's certificate must carry
    absl::Status why_none;
  };
  void SetRoute(Route route);
  uint64_t epoch() const;
  std::string Name() const { return ShardName(options_.shard, options_.address); }
  // Connections opened where the shard named a least retransmission timeout that this
  // worker's kernel could not set (WorkerStats::tcp_rto_min_unset).
  uint64_t rto_min_unset() const { return rto_min_unset_.load(std::memory_order_relaxed); }

  // ---- the I/O thread ----
  void StartPushes(std::shared_ptr<PushBatch> batch, std::vector<OutFrame> frames,
                   std::vector<absl::Status> refused, RpcClock::time_point deadline);
  void CancelPushes(const std::shared_ptr<PushBatch>& batch);
  void StartPull(uint64_t tag, OutFrame frame, std::shared_ptr<PullSink> sink,
                 RpcClock::time_point deadline);
  uint64_t NextTag() { return next_tag_.fetch_add(1) + 1; }

  // The channel is going away (nothing is in flight then): closes the socket.
  void Close() { Lost(absl::CancelledError("data channel closed")); }

 private:
  struct PendingPush {
    std::shared_ptr<PushBatch> batch;
    size_t index = 0;
    RpcClock::time_point deadline;
  };
  struct PendingPull {
    std::shared_ptr<PullSink> sink;
    RpcClock::time_point deadline;
  };
  enum class State { kIdle, kConnecting, kReady };
  Route route() const;

  // Connects when idle, writes when ready; keeps the deadline sweep running while
  // anything waits.
  void Go();
  void Connect();
  // TLS over the connected socket, expecting `server_name`, then SendHello.
  void StartTls(uint64_t gen, const std::string& server_name);
  void SendHello(uint64_t gen);

  // Writes a handshake frame, then reads the shard's next one in `next`.
  void Handshake(uint64_t gen, std::string bytes, std::string_view doing,
                 net::ConnectionState next);

  // Reads one frame's header and meta, then Handle.
  void ReadFrame(uint64_t gen, net::ConnectionState state);
  // Reads exactly `into`, then calls `then()` (at once when the bytes are here already:
  // net::DataStream::ReadNow); a failed read loses the connection, `doing` saying what
  // was read. `doing` must outlive the read (a literal).
  template <typename Then>
  void ReadInto(uint64_t gen, boost::asio::mutable_buffer into, Then then,
                std::string_view doing = "reading");
  void Handle(uint64_t gen, net::ConnectionState state);
  void OnChallenge(uint64_t gen);
  void OnAdmit(uint64_t gen);
  void OnAnswer(uint64_t gen);
  void OnSlice(uint64_t gen);
  // A SLICES (connection_pull.cc): every slice's place asked for first (the caller's
  // buffer, or the scratch body), then reads that take all of the frame that is here and
  // wake once the next body is whole; each slice arrives as soon as its body is in. A pull
  // that ends mid-frame has the places left pointed at scratch before the next read.
  void OnSlices(uint64_t gen);
  void OnSlicesRead(uint64_t gen);
  // The places left of the SLICES being read that are the caller's, pointed at scratch:
  // its pull ended, so its buffer is no longer this connection's to write.
  void DropSlicePlaces();
  // Slice `h` of pull `tag` arrived in `bytes` (its place, or scratch): told to its sink
  // when the pull is still open; a refusal ends the pull.
  void Arrived(uint64_t tag, const net::PullHeader& h, std::span<char> bytes);
  void OnPullEnd(uint64_t gen);

  // Ends pull `tag` with `status`, telling the shard when it is still sending.
  void EndPull(uint64_t tag, const absl::Status& status, bool cancel);

  // Writes what is queued, up to kMaxFramesPerWrite frames in one gather write; pushes
  // queued one after another under the same layout, round, codec and fields go as one
  // PUSHES (TakePushes).
  void Flush();
  // From queue_'s front, a push and the pushes after it that can share its frame: moved
  // to `out`, their header and meta in *head (a PUSH for one, else a PUSHES); their count
  // (0: the front is no push).
  absl::StatusOr<size_t> TakePushes(std::vector<OutFrame>& out, std::string* head);
  void LostOn(const boost::system::error_code& ec, std::string_view doing);
  // Drops the queued frames of the pushes `tags` names (answered late or cancelled: not
  // sent any more, and what a frame holds, a borrowed push's guard, goes now).
  void DropQueuedPushes(std::span<const uint64_t> tags);

  // Closes the connection and fails everything in flight with `status`; the next call
  // connects again.
  void Lost(const absl::Status& status);
  void FailAll(const absl::Status& status);

  // Every 100 ms while something waits: what passed its deadline fails.
  void ScheduleSweep();
  // The pull whose slices are being read into its places passed its deadline: the
  // connection is closed and the pull fails (DEADLINE_EXCEEDED), what else waited as a
  // lost connection. Whether it was so.
  bool ReadingPastItsDeadline(RpcClock::time_point now);
  // A push passed its deadline while the write under way still carries its bytes: a
  // frame cannot be taken back mid-write, so the connection is closed (the write ends,
  // and with it every read of the push's bytes: a borrowed push's caller gets its
  // buffer back) and the push fails (DEADLINE_EXCEEDED), what else waited as a lost
  // connection. Whether it was so.
  bool WritingPastItsDeadline(RpcClock::time_point now);
  // A frame begun and no byte of it for kFrameStallPeriod while a call waiting on the
  // connection is late: the connection is closed (what waits fails as a lost connection,
  // and is retried on a new one). Whether it was so.
  bool Stalled(RpcClock::time_point now);

  asio::io_context& io_;
  const TcpChannelOptions options_;
  const std::shared_ptr<net::TlsContext> tls_;  // null: plaintext
  const std::string server_;  // "shard-N", as the proofs name it
  std::atomic<uint64_t> next_tag_{0};
  std::atomic<uint64_t> rto_min_unset_{0};

  mutable absl::Mutex mu_;
  Route route_ ABSL_GUARDED_BY(mu_);

  // The I/O thread's.
  State state_ = State::kIdle;
  uint64_t generation_ = 0;  // bumped by every connect and every loss
  // The socket, or TLS over it. Each operation's handler holds the stream it runs on:
  // a loss closes it and a new connection replaces it at once, but TLS's operations
  // still touch theirs when they end (aborted).
  std::shared_ptr<net::DataStream> socket_;
  std::unique_ptr<asio::steady_timer> connect_timer_;
  std::unique_ptr<asio::steady_timer> sweep_timer_;
  bool sweeping_ = false;
  DataRoute admitted_route_;  // the route the connection was opened under
  std::string client_nonce_;
  net::FrameLimits limits_;
  std::array<char, net::kFrameHeaderBytes> header_bytes_{};
  bool frame_open_ = false;  // a frame's header is read, and not yet all of the frame
  uint64_t reads_ = 0;       // reads completed (Stalled's measure of progress)
  // What Stalled last saw (reads, bytes waiting in the socket), and since when.
  std::optional<std::pair<uint64_t, size_t>> stall_progress_;
  std::chrono::steady_clock::time_point stall_since_;
  net::FrameHeader header_;
  std::string meta_;
  net::PullHeader slice_;
  net::ScratchBuffer body_;  // a slice with no place of its own
  // The pull whose slice, or the SLICES's slices, are being read into its places: the
  // sweep does not end it under the read, but closes the connection once it is late.
  uint64_t reading_tag_ = 0;
  // The SLICES being read: its meta (the codec borrows meta_), each body's end in B,
  // whether its place is the caller's, its place, and what is left of each place to fill
  // (one buffer per slice), filled in order from `slices_into_first_`.
  net::SlicesMeta slices_;
  std::array<size_t, net::kMaxSlicesPerFrame> slices_end_{};
  std::array<bool, net::kMaxSlicesPerFrame> slices_placed_{};
  std::array<std::span<char>, net::kMaxSlicesPerFrame> slices_place_{};
  std::vector<asio::mutable_buffer> slices_into_;
  size_t slices_into_first_ = 0;
  size_t slices_read_ = 0;    // bytes of B read
  uint32_t slices_next_ = 0;  // the first slice not yet arrived
  net::ScratchBuffer dropped_;  // where places of a pull that ended are read instead
  std::deque<OutFrame> queue_;
  bool writing_ = false;
  std::vector<uint64_t> writing_tags_;  // the pushes the write under way carries
  absl::flat_hash_map<uint64_t, PendingPush> pushes_;
  absl::flat_hash_map<uint64_t, PendingPull> pulls_;
};

}  // namespace ps::internal::tcp_plane
