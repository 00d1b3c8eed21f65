// The shard's end of the TCP data plane (server/transport/tcp, docs/data-plane.md section
// 3) against a real shard and front, with a scripted worker over a real loopback socket
// that writes and reads frames with net/data_frame's encoders: the handshake and its
// refusals, pushes and their answers by tag, a pull's slices, the header bounds, the
// proof timeout, and what a connection lost mid-pull gives back. Then a whole ps-server
// started with --data-plane tcp: its Join answer, and gRPC data refused there.
#include "server/transport/tcp/backend.h"

#include "tcp_backend_fixture.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "aggregators/aggregator.h"
#include "codecs/codec.h"
#include "core/clock.h"
#include "core/layout.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "crypto/auth_proof.h"
#include "net/data_frame.h"
#include "ps/v1/ps.grpc.pb.h"
#include "server/server.h"
#include "server/shard.h"
#include "server/shard_front.h"
#include "server/tarpit.h"

namespace ps::server::transport::tcp {
namespace {

using ::testing::HasSubstr;
using std::chrono::milliseconds;

TEST_F(TcpBackendTest, TheHandshakeAdmitsAWorkerWithTheConnectionsLimits) {
  ScriptedWorker w(backend_->port());
  ASSERT_TRUE(w.connected());
  absl::StatusOr<net::AdmitMeta> admit =
      w.Handshake(joins_[1].data_session, 1, joins_[1].data_secret);
  ASSERT_TRUE(admit.ok()) << admit.status();
  EXPECT_TRUE(w.server_proved());
  EXPECT_EQ(admit->max_body_bytes, 1u << 20);
  EXPECT_EQ(admit->max_unanswered_pushes, 1024u);
  EXPECT_EQ(admit->max_pull_slices, 2u) << "the slices this shard owns";
  EXPECT_EQ(admit->idle_timeout_ms, 60000u);
  EXPECT_EQ(backend_->stats().admitted, 1u);
}

TEST_F(TcpBackendTest, AForgedProofIsRefusedAndTheConnectionClosed) {
  ScriptedWorker w(backend_->port());
  // The right session, the wrong secret: the shard's proof does not check (the worker
  // would stop there), and the worker's proof is refused.
  absl::StatusOr<net::AdmitMeta> admit =
      w.Handshake(joins_[1].data_session, 1, std::string(32, 'x'));
  EXPECT_FALSE(w.server_proved());
  EXPECT_EQ(admit.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(admit.status().message(), HasSubstr("GOAWAY unauthenticated: wrong data connection proof"));
  EXPECT_TRUE(w.ClosedByShard());
  EXPECT_EQ(Refusals(*shard_, Refusal::kUnauthenticated), 1u);
  EXPECT_EQ(backend_->stats().admitted, 0u);
}

TEST_F(TcpBackendTest, AnUnknownOrReplacedSessionIsRefusedBeforeAnyChallenge) {
  {
    ScriptedWorker w(backend_->port());
    absl::StatusOr<net::AdmitMeta> admit =
        w.Handshake(joins_[1].data_session ^ 1, 1, joins_[1].data_secret);
    EXPECT_EQ(admit.status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_THAT(admit.status().message(), HasSubstr("GOAWAY unknown_session"));
    EXPECT_TRUE(w.ClosedByShard());
  }
  {
    // Worker 0 naming worker 1's session.
    ScriptedWorker w(backend_->port());
    absl::StatusOr<net::AdmitMeta> admit =
        w.Handshake(joins_[1].data_session, 0, joins_[1].data_secret);
    EXPECT_THAT(admit.status().message(), HasSubstr("GOAWAY unknown_session"));
  }
  // An admitted connection whose worker joins again is refused at its next frame.
  std::unique_ptr<ScriptedWorker> w = Admitted(1);
  absl::StatusOr<JoinResult> again = shard_->Join(1, hash_);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(w->Send(Push(1, hash_, 0, 0, Fp32({1, 1, 1, 1}))));
  absl::StatusOr<Frame> f = w->Read();
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->header.type, net::FrameType::kGoaway);
  EXPECT_THAT(ScriptedWorker::StatusOf(*f).message(), HasSubstr("unknown_session"));
  EXPECT_TRUE(w->ClosedByShard());
  // And the old session opens nothing; the new one does.
  ScriptedWorker old(backend_->port());
  EXPECT_THAT(old.Handshake(joins_[1].data_session, 1, joins_[1].data_secret).status().message(),
              HasSubstr("unknown_session"));
  ScriptedWorker fresh(backend_->port());
  EXPECT_TRUE(fresh.Handshake(again->data_session, 1, again->data_secret).ok());
}

TEST_F(TcpBackendTest, APushIsAnsweredByTagAndItsDuplicateRefusedWithItsKind) {
  std::unique_ptr<ScriptedWorker> w = Admitted(0);
  ASSERT_TRUE(w->Send(Push(7, hash_, 0, 0, Fp32({1, 1, 1, 1})) +
                      Push(8, hash_, 0, 0, Fp32({1, 1, 1, 1}))));
  absl::StatusOr<Frame> first = w->Read();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->header.type, net::FrameType::kAnswer);
  EXPECT_EQ(first->header.tag, 7u);
  absl::StatusOr<net::StatusMeta> ok = net::ParseStatusMeta(net::FrameType::kAnswer, first->meta);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->code, absl::StatusCode::kOk);
  EXPECT_EQ(ok->refusal_name, "");

  absl::StatusOr<Frame> second = w->Read();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->header.tag, 8u);
  absl::StatusOr<net::StatusMeta> dup =
      net::ParseStatusMeta(net::FrameType::kAnswer, second->meta);
  ASSERT_TRUE(dup.ok());
  EXPECT_EQ(dup->code, absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(dup->refusal_name, "duplicate");
  EXPECT_EQ(Refusals(*shard_, Refusal::kDuplicate), 1u);
  EXPECT_EQ(shard_->stats().pushes_accepted, 1u);
}

// A PUSHES of `pushes` (tag, slice, payload) of round 0 in fp32.
std::string Pushes(uint64_t hash, const std::vector<std::tuple<uint64_t, uint32_t, std::string>>& pushes) {
  net::PushesMeta meta{.layout_hash = hash, .round = 0, .codec = "fp32",
                       .count = static_cast<uint32_t>(pushes.size())};
  std::string bodies;
  for (size_t i = 0; i < pushes.size(); ++i) {
    const auto& [tag, slice, payload] = pushes[i];
    meta.entries[i] = {.tag = tag, .slice_id = slice,
                       .body_bytes = static_cast<uint32_t>(payload.size())};
    bodies += payload;
  }
  std::string out;
  EXPECT_TRUE(net::AppendPushes(meta, &out).ok());
  return out + bodies;
}

TEST_F(TcpBackendTest, APushesFramesPushesAreEachAnsweredByTheirTagWithTheirKinds) {
  std::unique_ptr<ScriptedWorker> w = Admitted(0);
  // Slices 0 and 1 raw (read into rows), slice 0 again (a duplicate), a slice this
  // shard does not have, and a payload of the wrong size (decoded, and refused).
  ASSERT_TRUE(w->Send(Pushes(hash_, {{11, 0, Fp32({1, 1, 1, 1})},
                                     {12, 1, Fp32({2, 2, 2, 2})},
                                     {13, 0, Fp32({1, 1, 1, 1})},
                                     {14, 99, Fp32({1, 1, 1, 1})},
                                     {15, 1, Fp32({1, 1})}})));
  std::map<uint64_t, absl::Status> answers;
  while (answers.size() < 5) {
    absl::StatusOr<Frame> f = w->Read();
    ASSERT_TRUE(f.ok()) << f.status();
    ASSERT_EQ(f->header.type, net::FrameType::kAnswer);
    answers[f->header.tag] = ScriptedWorker::StatusOf(*f);
  }
  EXPECT_TRUE(answers[11].ok()) << answers[11];
  EXPECT_TRUE(answers[12].ok()) << answers[12];
  EXPECT_EQ(core::RefusalOf(answers[13]), Refusal::kDuplicate) << answers[13];
  EXPECT_FALSE(answers[14].ok());
  EXPECT_FALSE(answers[15].ok());
  EXPECT_EQ(shard_->stats().pushes_accepted, 2u);
  // The connection goes on: worker 1's pushes close the round, whose mean has worker
  // 0's values from the PUSHES.
  std::unique_ptr<ScriptedWorker> w1 = Admitted(1);
  ASSERT_TRUE(w1->Send(Pushes(hash_, {{21, 0, Fp32({3, 3, 3, 3})}, {22, 1, Fp32({4, 4, 4, 4})}})));
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<Frame> f = w1->Read();
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_TRUE(ScriptedWorker::StatusOf(*f).ok()) << ScriptedWorker::StatusOf(*f);
  }
  ASSERT_TRUE(Eventually([&] { return shard_->Snapshot(0).version == 1 && shard_->Snapshot(1).version == 1; }));
  for (uint32_t slice : {0u, 1u}) {
    const SliceSnapshot snap = shard_->Snapshot(slice);
    ASSERT_NE(snap.values, nullptr);
    std::vector<float> got(4);
    ASSERT_EQ(snap.values->size(), 16u);
    std::memcpy(got.data(), snap.values->data(), 16);
    EXPECT_THAT(got, ::testing::Each(slice == 0 ? 2.0f : 3.0f)) << "slice " << slice;
  }
}

TEST_F(TcpBackendTest, APushesPushIsTakenAndAnsweredAsSoonAsItsBodyIsIn) {
  std::unique_ptr<ScriptedWorker> w = Admitted(0);
  const std::string body0 = Fp32({1, 1, 1, 1}), body1 = Fp32({2, 2, 2, 2});
  const std::string frame = Pushes(hash_, {{11, 0, body0}, {12, 1, body1}});
  const size_t second = frame.size() - body1.size();  // where body 1 starts
  // Header, meta, the first body and 3 bytes of the second: the first push is answered
  // while the rest of the frame has not come.
  ASSERT_TRUE(w->Send(frame.substr(0, second + 3)));
  absl::StatusOr<Frame> first = w->Read();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->header.tag, 11u);
  EXPECT_TRUE(ScriptedWorker::StatusOf(*first).ok()) << ScriptedWorker::StatusOf(*first);
  EXPECT_EQ(shard_->stats().pushes_accepted, 1u);
  // The rest in two pieces.
  ASSERT_TRUE(w->Send(frame.substr(second + 3, 5)));
  std::this_thread::sleep_for(milliseconds(20));
  ASSERT_TRUE(w->Send(frame.substr(second + 8)));
  absl::StatusOr<Frame> next = w->Read();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->header.tag, 12u);
  EXPECT_TRUE(ScriptedWorker::StatusOf(*next).ok()) << ScriptedWorker::StatusOf(*next);
  EXPECT_EQ(shard_->stats().pushes_accepted, 2u);
}

TEST_F(TcpBackendTest, APushesWhoseLengthsDisagreeWithItsBodyEndsTheConnection) {
  std::unique_ptr<ScriptedWorker> w = Admitted(0);
  std::string frame = Pushes(hash_, {{11, 0, Fp32({1, 1, 1, 1})}, {12, 1, Fp32({2, 2, 2, 2})}});
  // B one byte longer than the lengths' sum, and that byte sent.
  frame[4] = static_cast<char>(frame[4] + 1);
  ASSERT_TRUE(w->Send(frame + "x"));
  absl::StatusOr<Frame> f = w->Read();
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->header.type, net::FrameType::kGoaway);
  const absl::Status s = ScriptedWorker::StatusOf(*f);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("malformed"));
  EXPECT_THAT(s.message(), HasSubstr("body lengths add up to"));
  EXPECT_TRUE(w->ClosedByShard());
  EXPECT_EQ(shard_->stats().pushes_accepted, 0u);
}

TEST_F(TcpBackendTest, APullReceivesThePublishedSliceAndEnds) {
  std::unique_ptr<ScriptedWorker> w = Admitted(0);
  // The pull first: its watch waits for version 1, which the round's close publishes.
  std::string pull;
  const std::vector<uint32_t> ids = {0};
  ASSERT_TRUE(net::AppendPull(3, net::PullMeta{.layout_hash = hash_, .min_version = 1, .count = 1},
                              ids, {}, &pull)
                  .ok());
  ASSERT_TRUE(w->Send(pull));
  ASSERT_TRUE(Eventually([&] { return shard_->WatcherCount() == 1; }));
  ASSERT_TRUE(w->Send(Push(1, hash_, 0, 0, Fp32({1, 1, 1, 1}))));
  const std::string payload = Fp32({3, 3, 3, 3});
  const std::string_view piece = payload;
  ASSERT_TRUE(front_->Push(DataPeer{.worker = 1, .client = "worker-1"},
                           PushHead{.layout_hash = hash_, .round = 0, .slice_id = 0, .codec = "fp32"},
                           std::span<const std::string_view>(&piece, 1))
                  .ok());
  bool answered = false, sliced = false, ended = false;
  while (!ended) {
    absl::StatusOr<Frame> f = w->Read();
    ASSERT_TRUE(f.ok()) << f.status();
    switch (f->header.type) {
      case net::FrameType::kAnswer:
        EXPECT_EQ(f->header.tag, 1u);
        answered = true;
        break;
      case net::FrameType::kSlice: {
        EXPECT_EQ(f->header.tag, 3u);
        absl::StatusOr<net::PullHeader> m = net::ParseSliceMeta(f->header.flags, f->meta);
        ASSERT_TRUE(m.ok()) << m.status();
        EXPECT_EQ(m->slice_id, 0u);
        EXPECT_EQ(m->version, 1u);
        EXPECT_EQ(m->codec, "");
        const SliceSnapshot snap = shard_->Snapshot(0);
        ASSERT_NE(snap.values, nullptr);
        EXPECT_EQ(f->body, *snap.values) << "the published bytes, as they are";
        std::vector<float> got(4);
        ASSERT_EQ(f->body.size(), 16u);
        std::memcpy(got.data(), f->body.data(), 16);
        EXPECT_THAT(got, ::testing::Each(2.0f)) << "the mean of 1 and 3";
        sliced = true;
        break;
      }
      case net::FrameType::kPullEnd:
        EXPECT_EQ(f->header.tag, 3u);
        EXPECT_TRUE(ScriptedWorker::StatusOf(*f).ok()) << ScriptedWorker::StatusOf(*f);
        ended = true;
        break;
      default:
        FAIL() << net::FrameTypeName(f->header.type);
    }
  }
  EXPECT_TRUE(answered);
  EXPECT_TRUE(sliced);
  EXPECT_EQ(shard_->WatcherCount(), 0u);
}

TEST_F(TcpBackendTest, APullsSlicesReadyTogetherLeaveAsOneSlicesFrame) {
  // Both slices published at version 1 before the pull: its scheduler writes both at once
  // (PullPace's least is 2), and they leave as one SLICES, the bodies the snapshots'.
  for (uint32_t worker : {0u, 1u}) {
    for (uint32_t slice : {0u, 1u}) {
      const std::string payload = Fp32({float(worker + 1), 1, 1, float(slice)});
      const std::string_view piece = payload;
      ASSERT_TRUE(front_->Push(DataPeer{.worker = worker, .client = absl::StrCat("worker-", worker)},
                               PushHead{.layout_hash = hash_, .round = 0, .slice_id = slice,
                                        .codec = "fp32"},
                               std::span<const std::string_view>(&piece, 1))
                      .ok());
    }
  }
  ASSERT_TRUE(Eventually([&] { return shard_->Snapshot(1).version == 1; }));
  std::unique_ptr<ScriptedWorker> w = Admitted(0);
  std::string pull;
  const std::vector<uint32_t> ids = {0, 1};
  ASSERT_TRUE(net::AppendPull(3, net::PullMeta{.layout_hash = hash_, .min_version = 1, .count = 2},
                              ids, {}, &pull)
                  .ok());
  ASSERT_TRUE(w->Send(pull));
  absl::StatusOr<Frame> f = w->Read();
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->header.type, net::FrameType::kSlices) << net::FrameTypeName(f->header.type);
  EXPECT_EQ(f->header.tag, 3u);
  absl::StatusOr<net::SlicesMeta> m = net::ParseSlicesMeta(f->header, f->meta);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->codec, "");
  ASSERT_EQ(m->count, 2u);
  std::string bodies;
  for (uint32_t i = 0; i < 2; ++i) {
    EXPECT_EQ(m->entries[i].slice_id, i);
    EXPECT_EQ(m->entries[i].version, 1u);
    EXPECT_EQ(m->entries[i].body_bytes, 16u);
    const SliceSnapshot snap = shard_->Snapshot(i);
    ASSERT_NE(snap.values, nullptr);
    bodies += *snap.values;
  }
  EXPECT_EQ(f->body, bodies) << "the published bytes, back to back";
  std::vector<float> got(8);
  ASSERT_EQ(f->body.size(), 32u);
  std::memcpy(got.data(), f->body.data(), 32);
  EXPECT_EQ(got, (std::vector<float>{1.5f, 1, 1, 0, 1.5f, 1, 1, 1})) << "the means";
  f = w->Read();
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->header.type, net::FrameType::kPullEnd);
  EXPECT_TRUE(ScriptedWorker::StatusOf(*f).ok()) << ScriptedWorker::StatusOf(*f);
}

// The 16 bytes of a PUSH header claiming the largest body a 32-bit length can name.
std::string LargestClaim() {
  std::string header;
  EXPECT_TRUE(net::EncodeHeader(net::FrameHeader{.type = net::FrameType::kPush,
                                                 .meta_bytes = 25,
                                                 .body_bytes = 0xFFFFFFFF,
                                                 .tag = 1},
                                &header)
                  .ok());
  return header;
}

TEST_F(TcpBackendTest, AHeaderClaimingTheLargestBodyIsRefusedAfterItsSixteenBytes) {
  std::unique_ptr<ScriptedWorker> w = Admitted(0);
  const std::string header = LargestClaim();
  ASSERT_EQ(header.size(), 16u);
  ASSERT_TRUE(w->Send(header));  // and nothing more: no meta, no body
  absl::StatusOr<Frame> f = w->Read();
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->header.type, net::FrameType::kGoaway);
  const absl::Status s = ScriptedWorker::StatusOf(*f);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("over_limit"));
  EXPECT_THAT(s.message(), HasSubstr("over the limit of 1048576"));
  EXPECT_TRUE(w->ClosedByShard());
}

TEST_F(TcpBackendTest, AFrameOtherThanTheHandshakeBeforeAdmitEndsTheConnection) {
  ScriptedWorker w(backend_->port());
  // A PUSH's header alone: the shard refuses it from its 16 bytes.
  ASSERT_TRUE(w.Send(Push(1, hash_, 0, 0, Fp32({1, 1, 1, 1})).substr(0, net::kFrameHeaderBytes)));
  absl::StatusOr<Frame> f = w.Read();
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->header.type, net::FrameType::kGoaway);
  EXPECT_THAT(ScriptedWorker::StatusOf(*f).message(), HasSubstr("not allowed while the shard awaits HELLO"));
  EXPECT_TRUE(w.ClosedByShard());
  EXPECT_EQ(shard_->stats().pushes_accepted, 0u);
}

// After its GOAWAY the connection closes when the worker closes its end, not at the
// GOAWAY's deadline (one second): it reads and drops what the worker still sends to see
// that end. Found by the data_connection fuzz target, where every refused input held its
// connection (and the table's entry) for the whole second.
TEST_F(TcpBackendTest, AConnectionThatSentItsGoawayClosesWhenTheWorkerCloses) {
  for (const bool admitted : {false, true}) {
    SCOPED_TRACE(admitted ? "admitted" : "before HELLO");
    std::unique_ptr<ScriptedWorker> w =
        admitted ? Admitted(0) : std::make_unique<ScriptedWorker>(backend_->port());
    ASSERT_TRUE(Eventually([&] { return backend_->stats().open == 1; }));
    // No frame's header, and bytes after it that the shard never parses.
    ASSERT_TRUE(w->Send(std::string(16, 'A') + std::string(100, 'B')));
    absl::StatusOr<Frame> f = w->Read();
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(f->header.type, net::FrameType::kGoaway);
    EXPECT_THAT(ScriptedWorker::StatusOf(*f).message(), HasSubstr("malformed"));
    EXPECT_TRUE(w->ClosedByShard());
    const auto closed = std::chrono::steady_clock::now();
    w->Close();
    ASSERT_TRUE(Eventually([&] { return backend_->stats().open == 0; }));
    EXPECT_LT(std::chrono::steady_clock::now() - closed, milliseconds(700))
        << "closed at the GOAWAY's deadline, not at the worker's end";
  }
}

TEST_F(TcpBackendTest, ASilentConnectionIsClosedAfterTheProofTimeout) {
  ScriptedWorker w(backend_->port());
  ASSERT_TRUE(w.connected());
  ASSERT_TRUE(Eventually([&] { return backend_->stats().open == 1; }));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(w.ClosedByShard());
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(200));
  EXPECT_TRUE(Eventually([&] { return backend_->stats().open == 0; }));
}

TEST_F(TcpBackendTest, ALostConnectionGivesBackItsPullsWatchesAndPlaces) {
  std::unique_ptr<ScriptedWorker> w = Admitted(0);
  // Two pulls, the worker's every place, waiting for a version that never comes.
  for (uint64_t tag : {1, 2}) {
    std::string pull;
    const std::vector<uint32_t> ids = {0, 1};
    ASSERT_TRUE(net::AppendPull(tag, net::PullMeta{.layout_hash = hash_, .min_version = 9, .count = 2},
                                ids, {}, &pull)
                    .ok());
    ASSERT_TRUE(w->Send(pull));
  }
  ASSERT_TRUE(Eventually([&] { return shard_->WatcherCount() == 4; }));
  const DataPeer peer{.worker = 0, .client = "worker-0"};
  const PullAsk ask{.layout_hash = hash_, .min_version = 9, .slice_ids = {0}};
  EXPECT_EQ(core::RefusalOf(front_->OpenPull(peer, ask).status()), Refusal::kOverLimit);

  w->Close();  // mid-pull
  EXPECT_TRUE(Eventually([&] { return shard_->WatcherCount() == 0; }));
  EXPECT_TRUE(Eventually([&] { return backend_->stats().open == 0; }));
  std::vector<std::unique_ptr<PullHandle>> places;
  for (uint32_t i = 0; i < shard_->options().max_pulls_per_worker; ++i) {
    absl::StatusOr<std::unique_ptr<PullHandle>> p = front_->OpenPull(peer, ask);
    ASSERT_TRUE(p.ok()) << i << ": " << p.status();
    places.push_back(*std::move(p));
  }
}

// Reading stops while max_unanswered_pushes pushes have no written answer. Here 2, with
// a tarpit holding every refusal past the first for 300 ms: the first answer goes out at
// once, the second and third are held, and the fourth push is read only once a held
// answer went out.
TEST_F(TcpBackendTest, ReadingStopsWhilePushesWaitForTheirAnswers) {
  Tarpit tarpit(TarpitOptions{.rate = 1, .burst = 1, .hold = milliseconds(300)},
                core::Clock::Real());
  ShardFront front(shard_.get(), nullptr, &tarpit);
  Options o = options_;
  o.max_unanswered_pushes = 2;
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      Backend::Start(o, &front, core::Clock::Real());  // before front and tarpit go
  ASSERT_TRUE(backend.ok()) << backend.status();
  ScriptedWorker w((*backend)->port());
  ASSERT_TRUE(w.Handshake(joins_[0].data_session, 0, joins_[0].data_secret).ok());
  // Slice 9 is not in the layout: each push is refused unknown_slice, and charged.
  const std::string payload = Fp32({1, 1, 1, 1});
  ASSERT_TRUE(w.Send(Push(1, hash_, 0, 9, payload) + Push(2, hash_, 0, 9, payload) +
                     Push(3, hash_, 0, 9, payload) + Push(4, hash_, 0, 9, payload)));
  ASSERT_TRUE(Eventually([&] { return Refusals(*shard_, Refusal::kUnknownSlice) == 3; }));
  std::this_thread::sleep_for(milliseconds(150));
  EXPECT_EQ(Refusals(*shard_, Refusal::kUnknownSlice), 3u) << "the fourth push is not read yet";
  for (uint64_t tag : {1, 2, 3, 4}) {
    absl::StatusOr<Frame> f = w.Read();
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(f->header.type, net::FrameType::kAnswer);
    EXPECT_EQ(f->header.tag, tag);
    EXPECT_THAT(ScriptedWorker::StatusOf(*f).message(), HasSubstr("unknown_slice"));
  }
  EXPECT_EQ(Refusals(*shard_, Refusal::kUnknownSlice), 4u);
  // The server's order (ServerImpl::Shutdown): the tarpit first, so that no answer it
  // holds still runs, and drops its connection, once the backend is gone.
  tarpit.Stop();
  (*backend)->Stop();
}

// A frame that ends an admitted connection is charged to the worker like a refused push:
// over its budget the GOAWAY is held for the tarpit's hold, and nothing more is read
// meanwhile (a member that reconnects to send such frames again gets them refused no
// faster than pushes). Before the budget is spent, the same GOAWAY goes out at once.
TEST_F(TcpBackendTest, AConnectionEndingRefusalOverTheBudgetIsHeldByTheTarpit) {
  Tarpit tarpit(TarpitOptions{.rate = 1, .burst = 1, .hold = milliseconds(400)},
                core::Clock::Real());
  ShardFront front(shard_.get(), nullptr, &tarpit);
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      Backend::Start(options_, &front, core::Clock::Real());
  ASSERT_TRUE(backend.ok()) << backend.status();
  const std::string claim = LargestClaim();
  // Within the budget (the first refusal): at once.
  const auto refused_after = [&]() -> std::optional<milliseconds> {
    ScriptedWorker w((*backend)->port());
    EXPECT_TRUE(w.Handshake(joins_[0].data_session, 0, joins_[0].data_secret).ok());
    const auto start = std::chrono::steady_clock::now();
    EXPECT_TRUE(w.Send(claim));
    absl::StatusOr<Frame> f = w.Read();
    if (!f.ok()) {
      ADD_FAILURE() << f.status();
      return std::nullopt;
    }
    EXPECT_EQ(f->header.type, net::FrameType::kGoaway);
    const absl::Status s = ScriptedWorker::StatusOf(*f);
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_THAT(s.message(), HasSubstr("over_limit"));
    EXPECT_TRUE(w.ClosedByShard());
    return std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - start);
  };
  const std::optional<milliseconds> first = refused_after();
  ASSERT_TRUE(first.has_value());
  EXPECT_LT(*first, milliseconds(300));
  // Over it: held.
  const std::optional<milliseconds> second = refused_after();
  ASSERT_TRUE(second.has_value());
  EXPECT_GE(*second, milliseconds(350));
  EXPECT_EQ(tarpit.stats().held_total, 1u);
  EXPECT_EQ(Refusals(*shard_, Refusal::kOverLimit), 2u);
  tarpit.Stop();
  (*backend)->Stop();
}

TEST_F(TcpBackendTest, StopClosesEveryConnectionAndFreesItsPulls) {
  std::unique_ptr<ScriptedWorker> w = Admitted(0);
  std::string pull;
  const std::vector<uint32_t> ids = {0, 1};
  ASSERT_TRUE(net::AppendPull(1, net::PullMeta{.layout_hash = hash_, .min_version = 9, .count = 2},
                              ids, {}, &pull)
                  .ok());
  ASSERT_TRUE(w->Send(pull));
  ASSERT_TRUE(Eventually([&] { return shard_->WatcherCount() == 2; }));
  backend_->Stop();
  EXPECT_EQ(shard_->WatcherCount(), 0u);
  EXPECT_EQ(backend_->stats().open, 0u);
  EXPECT_TRUE(w->ClosedByShard());
}

// A whole ps-server on the TCP plane: the Join answer names the data port and session,
// a Join for gRPC (or from a client that names no plane) is refused with the data_plane
// refusal, as are gRPC Push and Pull, and the Join's session opens a data connection.
TEST(TcpServerTest, AServerOnTheTcpPlaneAnswersJoinsWithItAndRefusesGrpcData) {
  ServerOptions o;
  o.insecure = true;
  o.port = 0;
  o.num_workers = 2;
  o.aggregator = "mean";
  o.aggregate_only = true;
  o.threads = 2;
  o.data_plane = core::DataPlane::kTcp;
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  const core::ModelLayout layout = *core::ModelLayout::Create({{"w", 8, 0}}, 4, 1);
  auto stub = v1::WorkerService::NewStub(::grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", (*server)->port()), ::grpc::InsecureChannelCredentials()));
  const auto join = [&](v1::DataPlane plane, v1::JoinResponse* resp) {
    v1::JoinRequest req;
    req.set_worker_id(1);
    req.set_layout_hash(layout.hash());
    req.set_data_plane(plane);
    ::grpc::ClientContext ctx;
    return stub->Join(&ctx, req, resp);
  };
  v1::JoinResponse resp;
  const ::grpc::Status old = join(v1::DATA_PLANE_UNSPECIFIED, &resp);
  EXPECT_EQ(old.error_code(), ::grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(old.error_message(),
              HasSubstr("worker 1 asks for the grpc data plane but shard 0 moves tensors over tcp "
                        "(--data-plane tcp); set WorkerOptions::data_plane to tcp or leave it "
                        "unset, or start every shard with --data-plane grpc"));
  for (v1::DataPlane plane : {v1::DATA_PLANE_TCP, v1::DATA_PLANE_ANY}) {
    resp.Clear();
    const ::grpc::Status s = join(plane, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.data_plane(), v1::DATA_PLANE_TCP);
    EXPECT_NE(resp.data_port(), 0u);
    EXPECT_NE(resp.data_port(), (*server)->port()) << "a port of its own";
    EXPECT_EQ(resp.data_secret().size(), 32u);
  }

  // gRPC data at a TCP shard, refused from the method's name.
  v1::PushRequest push;
  push.set_session(resp.session());
  push.set_layout_hash(layout.hash());
  push.set_codec("fp32");
  ::grpc::ClientContext push_ctx;
  v1::PushResponse pushed;
  const ::grpc::Status p = stub->Push(&push_ctx, push, &pushed);
  EXPECT_EQ(p.error_code(), ::grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(p.error_message(), HasSubstr("calls Push on the grpc data plane but shard 0"));
  v1::PullRequest pull;
  pull.set_session(resp.session());
  ::grpc::ClientContext pull_ctx;
  auto reader = stub->Pull(&pull_ctx, pull);
  v1::PullResponse slice;
  EXPECT_FALSE(reader->Read(&slice));
  const ::grpc::Status q = reader->Finish();
  EXPECT_EQ(q.error_code(), ::grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(q.error_message(), HasSubstr("calls Pull on the grpc data plane"));
  EXPECT_EQ((*server)->shard().stats().refusals[static_cast<size_t>(Refusal::kDataPlane)], 3u);

  // The Join's data session opens a connection to the data port.
  ScriptedWorker w(static_cast<uint16_t>(resp.data_port()));
  absl::StatusOr<net::AdmitMeta> admit = w.Handshake(resp.data_session(), 1, resp.data_secret());
  EXPECT_TRUE(admit.ok()) << admit.status();
  (*server)->Shutdown();
  EXPECT_TRUE(w.ClosedByShard());
}

// The idle deadline of admitted connections, short.
class TcpBackendIdleTest : public TcpBackendTest {
  void Configure(Options* o) override { o->idle_timeout = milliseconds(400); }
};

TEST_F(TcpBackendIdleTest, AnIdleConnectionIsClosedAndEveryFrameMovesItsDeadline) {
  std::unique_ptr<ScriptedWorker> busy = Admitted(0);
  std::unique_ptr<ScriptedWorker> idle = Admitted(1);
  ASSERT_TRUE(Eventually([&] { return backend_->stats().open == 2; }));
  std::string cancel;  // a frame that asks nothing back (no call has this tag)
  ASSERT_TRUE(net::AppendCancel(99, &cancel).ok());
  // A frame every 100 ms for 1.5 s, several idle timeouts: the busy connection stays
  // open, the idle one closes, not before its timeout.
  for (int i = 0; i < 15; ++i) {
    std::this_thread::sleep_for(milliseconds(100));
    if (i == 1) {
      EXPECT_EQ(backend_->stats().open, 2u) << "closed before its idle timeout";
    }
    ASSERT_TRUE(busy->Send(cancel)) << i;
  }
  EXPECT_EQ(backend_->stats().open, 1u) << "the idle connection stays, or the busy one went";
  // Each is told why (GOAWAY, UNAVAILABLE) before the shard closes it.
  const auto told_and_closed = [](ScriptedWorker& w) {
    absl::StatusOr<testing::DataFrame> goaway = w.Read();
    ASSERT_TRUE(goaway.ok()) << goaway.status();
    EXPECT_EQ(goaway->header.type, net::FrameType::kGoaway);
    EXPECT_TRUE(w.ClosedByShard());
  };
  told_and_closed(*idle);
  // Once it stops sending, the busy one goes too.
  EXPECT_TRUE(Eventually([&] { return backend_->stats().open == 0; }));
  told_and_closed(*busy);
}

}  // namespace
}  // namespace ps::server::transport::tcp
