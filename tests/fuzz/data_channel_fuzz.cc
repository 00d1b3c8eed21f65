// Fuzz target for the worker's end of a TCP data connection (worker_lib/transport/tcp/
// channel.cc, docs/data-plane.md section 3): the input is what a hostile shard sends.
// The harness plays the shard on a loopback listener; a real TcpChannel, on the
// process's one IoThread, connects to it under a route whose session and secret the
// harness knows, with two pushes in flight (tags 1 and 2) and a pull open (tag 3, slices
// 5 and 6) from before it connects.
//
// Byte 0: the harness's choices; the rest: the shard's stream.
//   bits 0-1  where the stream starts, after the harness read the channel's HELLO:
//             0  at once: the stream must prove the session itself (it cannot: a
//                CHALLENGE needs the key), so the channel may send nothing after HELLO
//                and every call must fail
//             1  after the harness's right CHALLENGE and its check of the channel's
//                PROOF: the stream brings the ADMIT (its limits the fuzzer's)
//             2, 3  after the whole handshake (CHALLENGE, PROOF checked, ADMIT with a
//                largest body of 64 KiB): ANSWER, SLICE, SLICES, PULL_END, GOAWAY
//   bit 2     the pull's sink places dense values in the caller's buffer (slice 5: 16
//             bytes, slice 6: 8 bytes; another size or slice is refused, which ends the
//             pull); else it keeps no place and takes the values in Arrived
//   bit 3     short deadlines: 50 ms for the pushes and the pull, so that the channel's
//             sweep (every 100 ms) may end them while the stream is read; else 30 s
//   bit 4     the harness cancels the push call once the stream is sent
//   bit 5     with bit 3: after the stream the harness waits up to 150 ms for every call
//             to end before it half-closes, so that the sweep runs while the channel
//             waits for the rest of a frame (a slice's body being read into its place,
//             say); such inputs are slow
// After the stream the harness half-closes, reads what the channel writes, waits for
// every call to end, destroys the push call and the channel, and reads until the
// channel's socket closes.
//
// Aborts (PS_FUZZ_CHECK) when: a push's callback or the sink's Done is not reached
// exactly once within 10 s of the stream's end, or the sink is called after Done; a
// byte of the caller's buffer outside the places the sink gave changes (canaries around
// each place), or a place changes after Done; Arrived does not get the placed span
// itself (dense) or the size Place was told (no place); the channel's socket is not
// closed 10 s after the channel is destroyed, the channel still holds the sink then, or
// it connects again with nothing to send; the channel's own stream, read as the shard
// reads it (ParseHeader, CheckHeader in the shard's state, each meta's parser), is not
// HELLO, PROOF, then PUSH, PULL and CANCEL frames (pushes as given, tags 1 and 2, the
// pull as asked, tag 3, CANCEL only for it), or the channel sends anything after its
// HELLO to a port that did not prove the session; a call succeeds on a connection that
// was never admitted. ASan and UBSan (the libFuzzer build) catch the rest, and
// libFuzzer's malloc limit an allocation of gigabytes.
// Seeds: tests/fuzz/corpus/data_channel/ (DATA_CHANNEL in make_corpus.py).
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "crypto/auth_proof.h"
#include "net/data_frame.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_socket.h"
#include "worker_lib/transport/data_channel.h"
#include "worker_lib/transport/tcp/channel.h"

namespace {

using ps::fuzz::DataFrame;
using ps::fuzz::ReadDataFrame;
using ps::fuzz::Socket;
using ps::fuzz::SteadyClock;
using ps::net::ConnectionState;
using ps::net::FrameType;
namespace plane = ps::internal::tcp_plane;
using ps::internal::DataChannel;
using ps::internal::DataRoute;
using ps::internal::OutgoingPush;
using ps::internal::PullAsk;
using ps::internal::PullSink;
using ps::internal::RpcClock;

constexpr uint64_t kSession = 77;
constexpr uint32_t kWorker = 3;
constexpr uint32_t kMaxBody = 1 << 16;
constexpr auto kBound = std::chrono::seconds(10);
const std::string kSecret(32, 's');
const std::string kToken = "the worker's token";

constexpr uint8_t kStartMask = 3;
constexpr uint8_t kDense = 1 << 2;
constexpr uint8_t kShortDeadlines = 1 << 3;
constexpr uint8_t kCancelPushes = 1 << 4;
constexpr uint8_t kLinger = 1 << 5;

// The pulled slices and their sizes in the caller's buffer.
constexpr uint32_t kSliceA = 5, kSliceB = 6;
constexpr size_t kBytesA = 16, kBytesB = 8;
constexpr size_t kCanary = 64;
constexpr char kCanaryByte = static_cast<char>(0xA5);

// The caller's buffer: a canary, slice 5's place, a canary, slice 6's place, a canary,
// in one allocation of exactly that size (ASan catches what goes past its ends).
class Destination {
 public:
  static constexpr size_t kSize = kCanary + kBytesA + kCanary + kBytesB + kCanary;
  Destination() : bytes_(new char[kSize]) {
    std::memset(bytes_.get(), kCanaryByte, kSize);
    std::memset(place(kSliceA).data(), 0, kBytesA);
    std::memset(place(kSliceB).data(), 0, kBytesB);
  }
  std::span<char> place(uint32_t slice) {
    return slice == kSliceA ? std::span<char>(bytes_.get() + kCanary, kBytesA)
                            : std::span<char>(bytes_.get() + 2 * kCanary + kBytesA, kBytesB);
  }
  std::string Places() {
    return std::string(place(kSliceA).data(), kBytesA) +
           std::string(place(kSliceB).data(), kBytesB);
  }
  bool CanariesIntact() const {
    const char* p = bytes_.get();
    for (size_t at : {size_t{0}, kCanary + kBytesA, 2 * kCanary + kBytesA + kBytesB}) {
      for (size_t i = 0; i < kCanary; ++i) {
        if (p[at + i] != kCanaryByte) return false;
      }
    }
    return true;
  }

 private:
  std::unique_ptr<char[]> bytes_;
};

size_t SizeOf(uint32_t slice) { return slice == kSliceA ? kBytesA : kBytesB; }

// The caller's end of the pull; runs on the I/O thread, read by the harness after Done.
class Sink final : public PullSink {
 public:
  Sink(Destination* destination, bool dense) : destination_(destination), dense_(dense) {}

  absl::StatusOr<std::span<char>> Place(const ps::net::PullHeader& h, size_t bytes) override {
    absl::MutexLock lock(&mu_);
    after_done_ += done_ > 0 ? 1 : 0;
    if (h.slice_id != kSliceA && h.slice_id != kSliceB) {
      return absl::InvalidArgumentError("a slice the pull did not ask for");
    }
    if (!dense_) {
      asked_.push_back({h.slice_id, {}, bytes});
      return std::span<char>();
    }
    if (bytes != SizeOf(h.slice_id)) return absl::InvalidArgumentError("a slice of another size");
    asked_.push_back({h.slice_id, destination_->place(h.slice_id), bytes});
    return asked_.back().placed;
  }

  absl::Status Arrived(const ps::net::PullHeader& h, ps::net::Pieces bytes) override {
    absl::MutexLock lock(&mu_);
    after_done_ += done_ > 0 ? 1 : 0;
    size_t total = 0;
    for (std::string_view piece : bytes) total += piece.size();
    // Slices arrive in the order they were placed (a SLICES asks for every place first).
    if (asked_.empty() || asked_.front().slice_id != h.slice_id) {
      ++misplaced_;
      return absl::OkStatus();
    }
    const Asked asked = asked_.front();
    asked_.pop_front();
    if (dense_) {
      misplaced_ += bytes.size() == 1 && bytes[0].data() == asked.placed.data() &&
                            bytes[0].size() == asked.placed.size() && !asked.placed.empty()
                        ? 0
                        : 1;
    } else {
      misplaced_ += total == asked.told ? 0 : 1;
      if (total != SizeOf(h.slice_id)) {
        return absl::InvalidArgumentError("a change, not dense values");
      }
    }
    return absl::OkStatus();
  }

  void Done(absl::Status status) override {
    absl::MutexLock lock(&mu_);
    if (done_++ == 0) {
      status_ = std::move(status);
      at_done_ = destination_->Places();
    }
  }

  int done() const {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  void Check(bool admitted_possible) const {
    absl::MutexLock lock(&mu_);
    PS_FUZZ_CHECK(done_ == 1, "the pull's sink was not told Done exactly once");
    PS_FUZZ_CHECK(after_done_ == 0, "the sink was called after Done");
    PS_FUZZ_CHECK(misplaced_ == 0,
                  "Arrived did not get the placed span (dense) or the size Place was told");
    PS_FUZZ_CHECK(destination_->Places() == at_done_, "a place changed after Done");
    PS_FUZZ_CHECK(admitted_possible || !status_.ok(), "a pull succeeded without an admission");
  }

 private:
  Destination* const destination_;
  const bool dense_;
  mutable absl::Mutex mu_;
  int done_ = 0;
  int after_done_ = 0;
  int misplaced_ = 0;
  // The places given and not yet arrived, in order: the slice, its place (dense), the
  // size Place was told.
  struct Asked {
    uint32_t slice_id = 0;
    std::span<char> placed;
    size_t told = 0;
  };
  std::deque<Asked> asked_;
  absl::Status status_;
  std::string at_done_;
};

// The push callbacks' outcomes, by index.
class Answers {
 public:
  std::function<void(size_t, absl::Status)> Callback() {
    return [this](size_t i, absl::Status s) {
      absl::MutexLock lock(&mu_);
      PS_FUZZ_CHECK(i < count_.size(), "a push callback for an index never pushed");
      ++count_[i];
      if (!s.ok()) ++failed_;
    };
  }
  bool AllDone() const {
    absl::MutexLock lock(&mu_);
    return count_[0] > 0 && count_[1] > 0;
  }
  void Check(bool admitted_possible) const {
    absl::MutexLock lock(&mu_);
    PS_FUZZ_CHECK(count_[0] == 1 && count_[1] == 1, "a push's callback did not run exactly once");
    PS_FUZZ_CHECK(admitted_possible || failed_ == 2, "a push succeeded without an admission");
  }

 private:
  mutable absl::Mutex mu_;
  std::array<int, 2> count_{};
  int failed_ = 0;
};

// What the channel wrote after its PROOF, read as the shard reads it: PUSH, PUSHES, PULL
// and CANCEL only, the pushes and the pull as the harness made them.
void CheckWorkerStream(std::string_view out, const std::vector<const OutgoingPush*>& pushes) {
  const ps::net::FrameLimits limits{.max_body_bytes = kMaxBody, .max_pull_slices = 16};
  while (out.size() >= ps::net::kFrameHeaderBytes) {
    auto h = ps::net::ParseHeader(
        std::span<const char, ps::net::kFrameHeaderBytes>(out.data(), ps::net::kFrameHeaderBytes));
    PS_FUZZ_CHECK(h.ok(), "the channel wrote a header the shard refuses");
    PS_FUZZ_CHECK(ps::net::CheckHeader(*h, ConnectionState::kShardAdmitted, limits).ok(),
                  "the channel wrote a frame an admitted shard refuses");
    const size_t size = ps::net::kFrameHeaderBytes + h->meta_bytes + h->body_bytes;
    if (out.size() < size) break;  // the connection was closed mid-write
    const std::string_view meta = out.substr(ps::net::kFrameHeaderBytes, h->meta_bytes);
    const std::string_view body =
        out.substr(ps::net::kFrameHeaderBytes + h->meta_bytes, h->body_bytes);
    switch (h->type) {
      case FrameType::kPush: {
        auto m = ps::net::ParsePushMeta(h->flags, meta);
        PS_FUZZ_CHECK(m.ok(), "a PUSH the shard refuses");
        PS_FUZZ_CHECK(h->tag == 1 || h->tag == 2, "a PUSH under another tag");
        const OutgoingPush& p = *pushes[h->tag - 1];
        PS_FUZZ_CHECK(m->slice_id == p.slice_id && m->round == p.round &&
                          m->layout_hash == p.layout_hash && m->codec == p.codec &&
                          body == *p.payload,
                      "a PUSH that is not the push given");
        break;
      }
      case FrameType::kPushes: {
        auto m = ps::net::ParsePushesMeta(*h, meta);
        PS_FUZZ_CHECK(m.ok(), "a PUSHES the shard refuses");
        size_t at = 0;
        for (uint32_t i = 0; i < m->count; ++i) {
          const ps::net::PushesEntry& e = m->entries[i];
          PS_FUZZ_CHECK(e.tag == 1 || e.tag == 2, "a push of a PUSHES under another tag");
          const OutgoingPush& p = *pushes[e.tag - 1];
          PS_FUZZ_CHECK(e.slice_id == p.slice_id && m->round == p.round &&
                            m->layout_hash == p.layout_hash && m->codec == p.codec &&
                            body.substr(at, e.body_bytes) == *p.payload,
                        "a push of a PUSHES that is not the push given");
          at += e.body_bytes;
        }
        break;
      }
      case FrameType::kPull: {
        auto m = ps::net::ParsePullMeta(h->flags, meta);
        PS_FUZZ_CHECK(m.ok() && ps::net::CheckPullBody(*h, *m, limits).ok(),
                      "a PULL the shard refuses");
        auto b = ps::net::ParsePullBody(*m, body);
        const std::vector<uint32_t> asked = {kSliceA, kSliceB};
        PS_FUZZ_CHECK(b.ok() && h->tag == 3 && b->slice_ids == asked,
                      "a PULL that is not the pull asked");
        break;
      }
      case FrameType::kCancel:
        PS_FUZZ_CHECK(h->tag == 3, "a CANCEL of something other than the pull");
        break;
      default:
        PS_FUZZ_CHECK(false, "the channel wrote a frame other than PUSH, PUSHES, PULL or CANCEL");
    }
    out.remove_prefix(size);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // One I/O thread for the process, as a worker has one for all its shards.
  static std::shared_ptr<plane::IoThread>* io =
      new std::shared_ptr<plane::IoThread>(plane::StartIoThread());
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const std::string_view stream(reinterpret_cast<const char*>(data) + 1, size - 1);
  const int start = mode & kStartMask;

  uint16_t port = 0;
  Socket listener = Socket::Listen(&port);
  if (!listener.ok()) std::fprintf(stderr, "listen: %s\n", std::strerror(errno));
  PS_FUZZ_CHECK(listener.ok(), "cannot listen on loopback");
  absl::StatusOr<std::unique_ptr<DataChannel>> made = plane::MakeTcpChannel(
      *io, plane::TcpChannelOptions{.worker_id = kWorker,
                                    .shard = 0,
                                    .address = "127.0.0.1:1",
                                    .credentials = {.token = kToken},
                                    .connect_timeout = std::chrono::milliseconds(5000)});
  PS_FUZZ_CHECK(made.ok(), "the channel was not made");
  std::unique_ptr<DataChannel> channel = *std::move(made);
  PS_FUZZ_CHECK(
      channel
          ->SetRoute(DataRoute{
              .epoch = 4, .data_port = port, .data_session = kSession, .data_secret = kSecret})
          .ok(),
      "the route was refused");

  const auto deadline =
      RpcClock::now() + ((mode & kShortDeadlines) != 0 ? std::chrono::milliseconds(50)
                                                       : std::chrono::milliseconds(30000));
  OutgoingPush a, b;
  for (OutgoingPush* p : {&a, &b}) {
    p->layout_hash = 9;
    p->round = 2;
    p->codec = "fp32";
  }
  a.slice_id = kSliceA;
  b.slice_id = kSliceB;
  a.payload = std::make_shared<const std::string>("\x01 sixteen bytes!");
  b.payload = std::make_shared<const std::string>("\x01 eight!");
  const std::vector<const OutgoingPush*> pushes = {&a, &b};
  Answers answers;
  std::unique_ptr<DataChannel::PushCall> call = channel->NewPush(pushes, deadline);
  call->Start(answers.Callback());
  Destination destination;
  auto sink = std::make_shared<Sink>(&destination, (mode & kDense) != 0);
  channel->Pull(PullAsk{.layout_hash = 9, .min_version = 1, .slice_ids = {kSliceA, kSliceB}},
                deadline, sink);

  Socket sock = listener.Accept(SteadyClock::now() + kBound);
  PS_FUZZ_CHECK(sock.ok(), "the channel did not connect");
  std::string in;  // what the channel wrote
  DataFrame f;
  PS_FUZZ_CHECK(ReadDataFrame(sock, &in, &f, SteadyClock::now() + kBound) &&
                    f.header.type == FrameType::kHello,
                "the channel's first frame is not a HELLO");
  auto hello = ps::net::ParseHelloMeta(f.meta);
  PS_FUZZ_CHECK(hello.ok() && hello->data_session == kSession && hello->worker_id == kWorker,
                "a HELLO that is not the route's");

  std::string out;  // what the harness sends: its handshake frames, then the stream
  bool proved = false;
  if (start >= 1) {
    const std::string client_nonce(hello->client_nonce.begin(), hello->client_nonce.end());
    const std::string server_nonce(ps::crypto::kNonceBytes, 'n');
    const std::string key =
        ps::crypto::DataKey(kToken, ps::crypto::TokenKey(kToken), "shard-0", kSession, kSecret);
    ps::net::ChallengeMeta c;
    std::memcpy(c.server_nonce.data(), server_nonce.data(), c.server_nonce.size());
    const std::string proof =
        ps::crypto::DataServerProof(key, "shard-0", kSession, client_nonce, server_nonce);
    std::memcpy(c.proof.data(), proof.data(), c.proof.size());
    std::string challenge;
    PS_FUZZ_CHECK(ps::net::AppendChallenge(c, &challenge).ok(), "CHALLENGE");
    PS_FUZZ_CHECK(sock.Send(challenge, SteadyClock::now() + kBound, &in), "sending the CHALLENGE");
    PS_FUZZ_CHECK(ReadDataFrame(sock, &in, &f, SteadyClock::now() + kBound) &&
                      f.header.type == FrameType::kProof,
                  "no PROOF after the right CHALLENGE");
    auto p = ps::net::ParseProofMeta(f.meta);
    PS_FUZZ_CHECK(
        p.ok() && ps::crypto::SameProof(ps::crypto::DataClientProof(key, "shard-0", kSession,
                                                                client_nonce, server_nonce),
                                      std::string_view(p->proof.data(), p->proof.size())),
        "the channel's PROOF is wrong");
    proved = true;
    if (start >= 2) {
      const ps::net::AdmitMeta admit{.max_body_bytes = kMaxBody,
                                     .max_unanswered_pushes = 64,
                                     .max_pull_slices = 16,
                                     .idle_timeout_ms = 60000};
      PS_FUZZ_CHECK(ps::net::AppendAdmit(admit, &out).ok(), "ADMIT");
    }
  }
  PS_FUZZ_CHECK(proved || in.empty(),
                "the channel wrote after HELLO before the port proved itself");
  out.append(stream);
  (void)sock.Send(out, SteadyClock::now() + kBound, &in);  // false: the channel closed first
  if ((mode & kCancelPushes) != 0) call->Cancel();
  const auto all_done = [&] { return answers.AllDone() && sink->done() > 0; };
  bool ended = false;  // the channel's end of the stream (it closed the connection)
  if ((mode & (kShortDeadlines | kLinger)) == (kShortDeadlines | kLinger)) {
    const auto linger_until = SteadyClock::now() + std::chrono::milliseconds(150);
    while (!ended && !all_done() && SteadyClock::now() < linger_until) {
      ended = sock.ReadToEnd(&in, SteadyClock::now() + std::chrono::milliseconds(2));
    }
  }
  sock.ShutdownWrite();

  // Every call ends; what the channel writes meanwhile is read.
  const auto ended_by = SteadyClock::now() + kBound;
  while (!all_done() && SteadyClock::now() < ended_by) {
    if (!ended) {
      ended = sock.ReadToEnd(&in, SteadyClock::now() + std::chrono::milliseconds(2));
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  answers.Check(proved);
  sink->Check(proved);
  call.reset();
  channel.reset();
  PS_FUZZ_CHECK(ended || sock.ReadToEnd(&in, SteadyClock::now() + kBound),
                "the channel's socket was not closed within 10 s of the channel's end");
  PS_FUZZ_CHECK(!listener.Accept(SteadyClock::now()).ok(),
                "the channel connected again with nothing to send");
  // The channel lets go of the sink with its Done (the handler that ran it may still be
  // finishing).
  const auto released_by = SteadyClock::now() + kBound;
  while (sink.use_count() > 1 && SteadyClock::now() < released_by) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  PS_FUZZ_CHECK(sink.use_count() == 1, "the channel kept the pull's sink after its end");
  PS_FUZZ_CHECK(destination.CanariesIntact(), "the channel wrote outside the places it was given");

  if (!proved) {
    PS_FUZZ_CHECK(in.empty(), "the channel wrote after HELLO to a port that did not prove itself");
  } else {
    CheckWorkerStream(in, pushes);
  }
  return 0;
}
