// A hostile client speaking raw ps.v1 next to honest ps::Worker clients: every bad
// push gets its specific status, and the honest round still completes. The tests of
// pushes and pulls run on each data plane (testing::DataPlanes(), the hostile client a
// testing::HandClient); those of gRPC's own messages on gRPC only.
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "cluster_util.h"
#include "codecs/codec.h"
#include "core/refusal.h"
#include "hand_client.h"
#include "ps/v1/ps.grpc.pb.h"
#include "worker_lib/worker.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using std::chrono::milliseconds;

// One insecure shard (the hand-made calls below carry no credentials) for three workers,
// f = 1 (quorum 2): workers 0 and 1 are honest ps::Worker clients, worker 2 is made by
// hand.
class ProtocolFixture : public ::testing::Test {
 protected:
  void Start(core::DataPlane plane) {
    server::ServerOptions o;
    o.insecure = true;
    o.num_workers = 3;
    o.num_byzantine = 1;  // quorum 2
    o.aggregator = "mean";
    o.aggregate_only = true;
    o.round_deadline = milliseconds(500);
    o.threads = 2;
    o.data_plane = plane;
    // Each bad push on its own: the first malformed one would quarantine worker 2, whose
    // later pushes would all be refused as such (tests/harness/protocol_attacker_test.cc
    // and tests/integration/hostile_test.cc test the quarantine).
    o.quarantine = milliseconds(0);
    cluster_ = testing::StartCluster(1, o);
    ASSERT_EQ(cluster_.num_shards(), 1u);
    layout_ = std::make_unique<core::ModelLayout>(*core::ModelLayout::Create({{"w", 6, 0}}, 128, 1));
    for (uint32_t w = 0; w < 2; ++w) {
      WorkerOptions wo;
      wo.shard_addresses = cluster_.addresses();
      wo.worker_id = w;
      auto worker = Worker::Start(wo, *layout_);
      ASSERT_TRUE(worker.ok()) << worker.status();
      honest_.push_back(*std::move(worker));
    }
  }

  // The honest workers push `a` and `b` for round 0 and the round's mean is pulled.
  std::vector<float> HonestRound(float a, float b) {
    EXPECT_TRUE(honest_[0]->Push(0, 0, std::vector<float>(6, a)).ok());
    EXPECT_TRUE(honest_[1]->Push(0, 0, std::vector<float>(6, b)).ok());
    EXPECT_TRUE(honest_[0]->WaitPushes().ok());
    EXPECT_TRUE(honest_[1]->WaitPushes().ok());
    std::vector<float> agg(6);
    const auto pulled = honest_[0]->Pull(0, 1, agg, milliseconds(10000));
    EXPECT_TRUE(pulled.ok()) << pulled.status();
    return agg;
  }

  testing::Cluster cluster_;
  std::unique_ptr<core::ModelLayout> layout_;
  std::vector<std::unique_ptr<Worker>> honest_;
};

// On each data plane, worker 2 a testing::HandClient over the plane its Join names.
class ProtocolTest : public ProtocolFixture,
                     public ::testing::WithParamInterface<core::DataPlane> {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(Start(GetParam()));
    hand_ = std::make_unique<testing::HandClient>(cluster_.addresses()[0], "", 2, layout_->hash());
    ASSERT_TRUE(hand_->joined());
    ASSERT_EQ(hand_->plane(), GetParam());
  }

  // A push of `values` in fp16 for slice 0 of round 0.
  testing::HandPush Valid(const std::vector<float>& values) {
    testing::HandPush p{.codec = "fp16"};
    auto codec = codecs::MakeCodec("fp16");
    EXPECT_TRUE((*codec)->Encode(values, &p.payload).ok());
    return p;
  }

  std::unique_ptr<testing::HandClient> hand_;
};
INSTANTIATE_TEST_SUITE_P(Planes, ProtocolTest, testing::DataPlanes(),
                         [](const auto& info) { return testing::PlaneName(info.param); });

// On gRPC, worker 2 a generated stub: gRPC's own messages.
class GrpcProtocolTest : public ProtocolFixture {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(Start(core::DataPlane::kGrpc));
    stub_ = v1::WorkerService::NewStub(
        grpc::CreateChannel(cluster_.addresses()[0], grpc::InsecureChannelCredentials()));
    v1::JoinRequest join;
    join.set_worker_id(2);
    join.set_layout_hash(layout_->hash());
    v1::JoinResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->Join(&ctx, join, &resp).ok());
    session_ = resp.session();
  }

  std::unique_ptr<v1::WorkerService::Stub> stub_;
  std::string session_;
};

TEST_P(ProtocolTest, BadPushesGetPreciseStatusesAndHonestRoundCompletes) {
  const std::vector<float> six(6, 1.0f);
  struct Case {
    const char* what;
    testing::HandPush push;
    absl::StatusCode code;
    const char* message;
    std::optional<core::Refusal> kind;
    bool forged_session = false;
  };
  std::vector<Case> cases;
  {
    auto p = Valid(six);
    p.payload.resize(p.payload.size() - 2);
    cases.push_back({"wrong size", p, absl::StatusCode::kInvalidArgument, "malformed push",
                     core::Refusal::kMalformed});
  }
  {
    auto p = Valid(six);
    p.payload[0] = 99;
    cases.push_back({"bad version byte", p, absl::StatusCode::kInvalidArgument, "malformed push",
                     core::Refusal::kMalformed});
  }
  {
    auto p = Valid(six);
    p.payload = std::string(1000, '\xff');
    cases.push_back({"garbage", p, absl::StatusCode::kInvalidArgument, "malformed push",
                     core::Refusal::kMalformed});
  }
  {
    auto p = Valid(six);
    p.payload[2] = '\x7c';  // fp16 0x7c00 = +Inf
    p.payload[1] = '\x00';
    cases.push_back({"infinity", p, absl::StatusCode::kInvalidArgument, "not finite",
                     core::Refusal::kMalformed});
  }
  {
    auto p = Valid(six);
    p.layout_hash = layout_->hash() + 1;
    cases.push_back({"wrong layout", p, absl::StatusCode::kFailedPrecondition, "layout mismatch",
                     core::Refusal::kLayoutMismatch});
  }
  {
    auto p = Valid(six);
    p.slice = 42;
    cases.push_back({"unknown slice", p, absl::StatusCode::kInvalidArgument, "unknown slice 42",
                     core::Refusal::kUnknownSlice});
  }
  {
    auto p = Valid(six);
    p.codec = "lz77";
    cases.push_back({"unknown codec", p, absl::StatusCode::kInvalidArgument, "unknown codec",
                     core::Refusal::kUnknownCodec});
  }
  cases.push_back({"forged session", Valid(six), absl::StatusCode::kUnauthenticated,
                   "unknown", core::Refusal::kUnknownSession, /*forged_session=*/true});
  {
    auto p = Valid(six);
    p.round = 3;
    cases.push_back({"future round", p, absl::StatusCode::kFailedPrecondition,
                     "before that round opened", core::Refusal::kFutureRound});
  }
  {
    // Above --max-message-bytes: gRPC refuses the message itself (no kind); the TCP port
    // refuses the PUSH from its header (over_limit) and ends the connection, which the
    // client makes again for the next push.
    auto p = Valid(six);
    p.payload = std::string(9u << 20, 'x');
    cases.push_back({"oversize", p, absl::StatusCode::kResourceExhausted, "",
                     GetParam() == core::DataPlane::kTcp
                         ? std::optional<core::Refusal>(core::Refusal::kOverLimit)
                         : std::nullopt});
  }
  for (const Case& c : cases) {
    const absl::Status s =
        c.forged_session ? hand_->PushUnderForgedSession(c.push) : hand_->Push(c.push);
    EXPECT_EQ(s.code(), c.code) << c.what << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.what;
    if (c.kind.has_value()) {
      EXPECT_EQ(core::RefusalOf(s), *c.kind) << c.what << ": " << s;
    }
  }

  // One valid push from the hostile client, then a duplicate.
  absl::Status s = hand_->Push(Valid(std::vector<float>(6, 7.0f)));
  ASSERT_TRUE(s.ok()) << s;
  s = hand_->Push(Valid(six));
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_EQ(core::RefusalOf(s), core::Refusal::kDuplicate) << s;

  // Honest workers complete the round; mean of 7, 1 and 3.
  EXPECT_FLOAT_EQ(HonestRound(1.0f, 3.0f)[0], (7.0f + 1.0f + 3.0f) / 3.0f);

  // Round 0 is closed now, with the hostile client's push: a replay of it is the
  // duplicate it is (a worker that lost the answer sends again), not late.
  s = hand_->Push(Valid(six));
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;

  server::ShardStats st = cluster_.shard(0).shard().stats();
  EXPECT_EQ(st.workers[2].refused(core::Refusal::kMalformed), 4u);
  EXPECT_EQ(st.workers[0].refused(core::Refusal::kMalformed), 0u);
}

TEST_P(ProtocolTest, GarbageOnlyWorkerDoesNotBlockTheQuorum) {
  auto p = Valid(std::vector<float>(6, 1.0f));
  p.payload = "\x01\x02\x03";
  EXPECT_EQ(hand_->Push(p).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FLOAT_EQ(HonestRound(2.0f, 4.0f)[3], 3.0f);  // closes at the deadline
}

// The shard has one slice: a pull naming it twice names more than the shard owns, refused
// where it is read (issue 45): on gRPC the Pull call, on TCP the PULL's header (its body
// would be longer than one slice needs), which ends the connection.
TEST_P(ProtocolTest, PullOfAnotherShardsOrRepeatedSliceIsRefused) {
  absl::StatusOr<std::vector<testing::PulledSlice>> pulled =
      hand_->Pull(testing::HandPull{.slice_ids = {0, 0}});
  ASSERT_FALSE(pulled.ok());
  EXPECT_EQ(pulled.status().code(), absl::StatusCode::kInvalidArgument) << pulled.status();
  // "more than 1 slice ids" (gRPC), "count 2 is over the 1 slices a pull may name" (TCP)
  EXPECT_THAT(std::string(pulled.status().message()), HasSubstr("1 slice"));
  EXPECT_EQ(core::RefusalOf(pulled.status()), core::Refusal::kMalformed) << pulled.status();
  // The honest round goes on, and the hand client pulls it (on TCP over a new connection).
  EXPECT_FLOAT_EQ(HonestRound(2.0f, 4.0f)[0], 3.0f);
  pulled = hand_->Pull(testing::HandPull{.slice_ids = {0}, .min_version = 1});
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  ASSERT_EQ(pulled->size(), 1u);
  EXPECT_EQ((*pulled)[0].version, 1u);
}

// One shard for two workers, aggregate-only, without credentials, on gRPC's data plane:
// raw stubs call it.
server::ServerOptions RawStubShard() {
  server::ServerOptions o;
  o.data_plane = core::DataPlane::kGrpc;
  o.insecure = true;
  o.num_workers = 2;
  o.aggregator = "mean";
  o.aggregate_only = true;
  o.threads = 2;
  return o;
}

std::unique_ptr<v1::WorkerService::Stub> RawStub(const testing::Cluster& cluster) {
  return v1::WorkerService::NewStub(
      grpc::CreateChannel(cluster.addresses()[0], grpc::InsecureChannelCredentials()));
}

// A pull whose held versions do not pair up with its slices is refused as malformed and
// counted as such, like every other malformed request (before issue 46 it was a plain
// INVALID_ARGUMENT that no counter saw). Two slices, so that one held version for both
// passes the parser's bound and reaches the shard's pairing check. gRPC-only: a TCP PULL
// cannot carry them (its held flag means one version per slice id; net::AppendPull and
// ParsePullBody refuse anything else, tests/net/data_frame_test.cc).
TEST(PullRefusalTest, UnpairedHeldVersionsAreAMalformedRefusal) {
  testing::Cluster cluster = testing::StartCluster(1, RawStubShard());
  ASSERT_EQ(cluster.num_shards(), 1u);
  const core::ModelLayout layout = *core::ModelLayout::Create({{"w", 256, 0}}, 128, 1);
  WorkerOptions wo;
  wo.shard_addresses = cluster.addresses();
  wo.worker_id = 0;
  absl::StatusOr<std::unique_ptr<Worker>> worker = Worker::Start(wo, layout);
  ASSERT_TRUE(worker.ok()) << worker.status();
  auto stub = RawStub(cluster);
  v1::JoinRequest join;
  join.set_worker_id(1);
  join.set_layout_hash(layout.hash());
  v1::JoinResponse joined;
  grpc::ClientContext join_ctx;
  ASSERT_TRUE(stub->Join(&join_ctx, join, &joined).ok());

  const auto malformed = [&] {
    return cluster.shard(0).shard().stats().refusals[static_cast<size_t>(server::Refusal::kMalformed)];
  };
  const uint64_t before = malformed();
  v1::PullRequest req;
  req.set_session(joined.session());
  req.set_layout_hash(layout.hash());
  req.add_slice_ids(0);
  req.add_slice_ids(1);
  req.add_held_versions(1);
  grpc::ClientContext ctx;
  auto reader = stub->Pull(&ctx, req);
  v1::PullResponse resp;
  EXPECT_FALSE(reader->Read(&resp));
  const grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("1 held versions for 2 slices"));
  EXPECT_EQ(malformed(), before + 1);
}

// A worker and a shard must agree on the data plane (docs/data-plane.md): a gRPC shard
// refuses a Join asking for TCP with the data_plane refusal, naming both planes and both
// fixes, and takes one asking for gRPC, for any plane, or for none (older clients).
TEST(DataPlaneJoinTest, AGrpcShardRefusesAJoinForTcpAndTakesTheOthers) {
  testing::Cluster cluster = testing::StartCluster(1, RawStubShard());
  ASSERT_EQ(cluster.num_shards(), 1u);
  const core::ModelLayout layout = *core::ModelLayout::Create({{"w", 256, 0}}, 128, 1);
  auto stub = RawStub(cluster);
  const auto join = [&](v1::DataPlane plane, v1::JoinResponse* resp) {
    v1::JoinRequest req;
    req.set_worker_id(1);
    req.set_layout_hash(layout.hash());
    req.set_data_plane(plane);
    grpc::ClientContext ctx;
    return stub->Join(&ctx, req, resp);
  };
  const auto refused = [&] {
    return cluster.shard(0).shard().stats().refusals[static_cast<size_t>(server::Refusal::kDataPlane)];
  };
  v1::JoinResponse resp;
  const grpc::Status tcp = join(v1::DATA_PLANE_TCP, &resp);
  EXPECT_EQ(tcp.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(tcp.error_message(),
              HasSubstr("worker 1 asks for the tcp data plane but shard 0 moves tensors over grpc "
                        "(--data-plane grpc); set WorkerOptions::data_plane to grpc or leave it "
                        "unset, or start every shard with --data-plane tcp"));
  EXPECT_EQ(refused(), 1u);
  for (v1::DataPlane plane : {v1::DATA_PLANE_UNSPECIFIED, v1::DATA_PLANE_GRPC, v1::DATA_PLANE_ANY}) {
    resp.Clear();
    const grpc::Status s = join(plane, &resp);
    ASSERT_TRUE(s.ok()) << v1::DataPlane_Name(plane) << ": " << s.error_message();
    EXPECT_EQ(resp.data_plane(), v1::DATA_PLANE_GRPC);
    EXPECT_EQ(resp.data_port(), 0u);
    EXPECT_TRUE(resp.data_secret().empty()) << "a gRPC shard hands out no TCP secret";
  }
  EXPECT_EQ(refused(), 1u);
}

// Worker `id` of a RawStubShard cluster asking for `plane` at Join (nullopt: any).
absl::StatusOr<std::unique_ptr<Worker>> StartPlaneWorker(const testing::Cluster& cluster,
                                                         uint32_t id,
                                                         std::optional<core::DataPlane> plane) {
  WorkerOptions o;
  o.shard_addresses = cluster.addresses();
  o.worker_id = id;
  o.data_plane = plane;
  o.connect_timeout = std::chrono::milliseconds(20000);
  return Worker::Start(std::move(o), *core::ModelLayout::Create({{"w", 8, 0}}, 8, 1));
}

// Against a shard on `shard_plane`: a worker asking for the other plane does not start and
// says why and how to fix it; one asking for the shard's plane and one left unset (whatever
// the shards run) start, report the shard's plane (ShardInfo::data_plane) and train over it.
void ExpectWorkersFollowTheShardsPlane(core::DataPlane shard_plane) {
  server::ServerOptions o = RawStubShard();
  o.data_plane = shard_plane;
  testing::Cluster cluster = testing::StartCluster(1, o);
  ASSERT_EQ(cluster.num_shards(), 1u);
  const core::DataPlane other =
      shard_plane == core::DataPlane::kTcp ? core::DataPlane::kGrpc : core::DataPlane::kTcp;
  absl::StatusOr<std::unique_ptr<Worker>> refused = StartPlaneWorker(cluster, 0, other);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(core::RefusalOf(refused.status()), core::Refusal::kDataPlane) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr(absl::StrCat("set WorkerOptions::data_plane to ",
                                     testing::PlaneName(shard_plane),
                                     " or leave it unset, or start every shard with "
                                     "--data-plane ",
                                     testing::PlaneName(other))));

  std::vector<std::unique_ptr<Worker>> workers;
  for (auto [id, plane] : {std::pair<uint32_t, std::optional<core::DataPlane>>{0, std::nullopt},
                           {1, shard_plane}}) {
    absl::StatusOr<std::unique_ptr<Worker>> w = StartPlaneWorker(cluster, id, plane);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_EQ((*w)->shards().size(), 1u);
    EXPECT_EQ((*w)->shards()[0].data_plane, shard_plane) << "worker " << id;
    workers.push_back(*std::move(w));
  }
  for (uint32_t id = 0; id < 2; ++id) {
    ASSERT_TRUE(workers[id]->Push(0, 0, std::vector<float>(8, 1.0f + id)).ok());
  }
  std::vector<float> mean(8);
  ASSERT_TRUE(workers[0]->Pull(0, 1, mean, milliseconds(10000)).ok());
  EXPECT_FLOAT_EQ(mean[0], 1.5f);
}

// The worker library asks for WorkerOptions::data_plane at Join: against a gRPC shard a
// worker set to TCP does not start, naming the fix; set to gRPC or left unset it starts
// and trains over gRPC.
TEST(DataPlaneJoinTest, AWorkerOnAnotherPlaneIsRefusedAtStartNamingTheFix) {
  ExpectWorkersFollowTheShardsPlane(core::DataPlane::kGrpc);
}

// The same against a TCP shard: a worker set to gRPC is refused, the others train over
// TCP and say so (ShardInfo::data_plane, which the Python binding reports).
TEST(DataPlaneJoinTest, WorkersOnATcpShardReportItsPlane) {
  ExpectWorkersFollowTheShardsPlane(core::DataPlane::kTcp);
}

// Push and Pull are read in place on the shard (net/wire.h): bodies that are not their
// message are refused as malformed, with the reason, and the honest round goes on.
// gRPC-only: protobuf bodies; the TCP plane's frames have their parser's tests
// (tests/net/data_frame_test.cc) and fuzz targets (data_frame, data_connection).
TEST_F(GrpcProtocolTest, BodiesThatDoNotParseAreRefusedAsMalformed) {
  grpc::GenericStub generic(
      grpc::CreateChannel(cluster_.addresses()[0], grpc::InsecureChannelCredentials()));
  const std::string garbage("\x0b\xff\xff", 3);  // a group tag, then a truncated varint
  grpc::Slice slice(garbage.data(), garbage.size());
  const grpc::ByteBuffer body(&slice, 1);
  for (const char* method : {"/ps.v1.WorkerService/Push", "/ps.v1.WorkerService/Pull"}) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::ByteBuffer resp;
    absl::Notification done;
    grpc::Status status;
    generic.UnaryCall(&ctx, method, grpc::StubOptions(), &body, &resp, [&](grpc::Status s) {
      status = std::move(s);
      done.Notify();
    });
    done.WaitForNotification();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_THAT(status.error_message(), HasSubstr("malformed")) << method;
    EXPECT_THAT(status.error_message(), HasSubstr(std::string(method).ends_with("Push")
                                                      ? "PushRequest"
                                                      : "PullRequest"))
        << method;
  }
  ASSERT_TRUE(honest_[0]->Push(0, 0, std::vector<float>(6, 2.0f)).ok());
  ASSERT_TRUE(honest_[1]->Push(0, 0, std::vector<float>(6, 4.0f)).ok());
  ASSERT_TRUE(honest_[0]->WaitPushes().ok());
  std::vector<float> agg(6);
  ASSERT_TRUE(honest_[0]->Pull(0, 1, agg, milliseconds(10000)).ok());
  EXPECT_FLOAT_EQ(agg[0], 3.0f);
}

// The shard writes pull messages itself (a header, then the snapshot's bytes): a client
// on the generated classes reads them as the PullResponse they are. gRPC-only: the TCP
// plane's SLICE frames are read by the pull tests above and below (testing::HandClient).
TEST_F(GrpcProtocolTest, GeneratedClientsReadThePullMessagesTheShardWrites) {
  ASSERT_TRUE(honest_[0]->Push(0, 0, std::vector<float>{1, 2, 3, 4, 5, 6}).ok());
  ASSERT_TRUE(honest_[1]->Push(0, 0, std::vector<float>{3, 4, 5, 6, 7, 8}).ok());
  ASSERT_TRUE(honest_[0]->WaitPushes().ok());
  ASSERT_TRUE(honest_[1]->WaitPushes().ok());
  v1::PullRequest req;
  req.set_session(session_);
  req.set_layout_hash(layout_->hash());
  req.add_slice_ids(0);
  req.set_min_version(1);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto reader = stub_->Pull(&ctx, req);
  v1::PullResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.slice_id(), 0u);
  EXPECT_EQ(resp.version(), 1u);
  ASSERT_EQ(resp.values().size(), 6 * sizeof(float));
  float values[6];
  std::memcpy(values, resp.values().data(), sizeof(values));
  for (int i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(values[i], 2.0f + i) << i;
  EXPECT_FALSE(reader->Read(&resp));
  EXPECT_TRUE(reader->Finish().ok());
}

// A push of 64 ones in `codec` for `slice` of `round`.
testing::HandPush Ones(uint64_t round, uint32_t slice, const std::string& codec) {
  testing::HandPush p{.codec = codec, .slice = slice, .round = round};
  auto c = codecs::MakeCodec(codec);
  EXPECT_TRUE((*c)->Encode(std::vector<float>(64, 1.0f), &p.payload).ok());
  return p;
}

// The pulls' order and marks, on each data plane (worker 1 a testing::HandClient).
class PullQueuedTest : public ::testing::TestWithParam<core::DataPlane> {
 protected:
  static server::ServerOptions Shard() {
    server::ServerOptions o;
    o.insecure = true;
    o.num_workers = 2;
    o.aggregator = "mean";
    o.aggregate_only = true;
    o.data_plane = GetParam();
    return o;
  }
};
INSTANTIATE_TEST_SUITE_P(Planes, PullQueuedTest, testing::DataPlanes(),
                         [](const auto& info) { return testing::PlaneName(info.param); });

// A slice's queued mark (PullResponse.queued, the SLICE frame's flag 0x04): set on a
// message the shard wrote right after the one before it (it was ready while that one was
// being written), clear on the first message of a stream and on one whose version came
// while the stream was idle. The worker times its downlink over the queued ones only
// (docs/adaptive.md, "The cost model").
TEST_P(PullQueuedTest, OnlyMessagesThatWaitedForTheLinkAreMarkedQueued) {
  server::ServerOptions o = Shard();
  o.round_deadline = milliseconds(30000);
  testing::Cluster cluster = testing::StartCluster(1, o);
  ASSERT_EQ(cluster.num_shards(), 1u);
  auto layout = core::ModelLayout::Create({{"w", 4 * 64, 0}}, 64, 1);
  ASSERT_TRUE(layout.ok());
  ASSERT_EQ(layout->slices().size(), 4u);
  WorkerOptions wo;
  wo.shard_addresses = cluster.addresses();
  wo.worker_id = 0;
  auto honest = Worker::Start(wo, *layout);
  ASSERT_TRUE(honest.ok()) << honest.status();
  testing::HandClient hand(cluster.addresses()[0], "", 1, layout->hash());
  ASSERT_TRUE(hand.joined());
  ASSERT_EQ(hand.plane(), GetParam());
  const std::vector<float> grad(4 * 64, 2.0f);

  // Round 0 complete before the pull: every slice is ready at once.
  ASSERT_TRUE((*honest)->Push(0, 0, grad).ok());
  ASSERT_TRUE((*honest)->WaitPushes().ok());
  for (uint32_t id = 0; id < 4; ++id) ASSERT_TRUE(hand.Push(Ones(0, id, "fp16")).ok()) << id;
  // Aggregation runs after the last push is answered: one pull waits for every slice,
  // so that the next finds them all ready.
  const testing::HandPull all{.slice_ids = {0, 1, 2, 3}, .min_version = 1};
  ASSERT_TRUE(hand.Pull(all).ok());
  {
    absl::StatusOr<std::vector<testing::PulledSlice>> pulled = hand.Pull(all);
    ASSERT_TRUE(pulled.ok()) << pulled.status();
    std::vector<bool> queued;
    for (const testing::PulledSlice& slice : *pulled) queued.push_back(slice.queued);
    // The stream starts writing once it has every slice's watch, so the three behind
    // the first were ready while it was written, however late its write completes.
    EXPECT_EQ(queued, (std::vector<bool>{false, true, true, true}));
  }

  // Round 1: the stream is open before either slice is ready, and each comes while it
  // is idle.
  ASSERT_TRUE((*honest)->Push(0, 1, grad).ok());
  ASSERT_TRUE((*honest)->WaitPushes().ok());
  std::unique_ptr<testing::HandClient::PullStream> stream =
      hand.OpenPull(testing::HandPull{.slice_ids = {0, 1}, .min_version = 2});
  ASSERT_TRUE(hand.Push(Ones(1, 0, "fp16")).ok());
  absl::StatusOr<std::optional<testing::PulledSlice>> next = stream->Next();
  ASSERT_TRUE(next.ok() && next->has_value()) << next.status();
  EXPECT_EQ((*next)->slice_id, 0u);
  EXPECT_FALSE((*next)->queued);
  // Long enough for the shard to see the first write done before the next slice is
  // ready (were it not, the slice would rightly be marked queued).
  std::this_thread::sleep_for(milliseconds(200));
  ASSERT_TRUE(hand.Push(Ones(1, 1, "fp16")).ok());
  next = stream->Next();
  ASSERT_TRUE(next.ok() && next->has_value()) << next.status();
  EXPECT_EQ((*next)->slice_id, 1u);
  EXPECT_FALSE((*next)->queued);
  next = stream->Next();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_FALSE(next->has_value()) << "the pull ends after its two slices";
}

// Slices ready when a pull starts go out most urgent first (--schedule=priority, the
// default), whatever the order the request lists them in.
TEST_P(PullQueuedTest, SlicesReadyAtTheStartGoOutMostUrgentFirst) {
  testing::Cluster cluster = testing::StartCluster(1, Shard());
  ASSERT_EQ(cluster.num_shards(), 1u);
  // fc (priority 2) is slices 0-1, conv (priority 0, the most urgent) slices 2-3.
  auto layout = core::ModelLayout::Create({{"fc", 2 * 64, 2}, {"conv", 2 * 64, 0}}, 64, 1);
  ASSERT_TRUE(layout.ok());
  ASSERT_EQ(layout->slices().size(), 4u);
  // Worker 0 registers the layout and pushes through the library; worker 1 is the hand
  // client whose pull is watched.
  WorkerOptions wo;
  wo.shard_addresses = cluster.addresses();
  wo.worker_id = 0;
  auto honest = Worker::Start(wo, *layout);
  ASSERT_TRUE(honest.ok()) << honest.status();
  ASSERT_TRUE((*honest)->Push(0, 0, std::vector<float>(2 * 64, 1.0f)).ok());
  ASSERT_TRUE((*honest)->Push(1, 0, std::vector<float>(2 * 64, 1.0f)).ok());
  ASSERT_TRUE((*honest)->WaitPushes().ok());
  testing::HandClient hand(cluster.addresses()[0], "", 1, layout->hash());
  ASSERT_TRUE(hand.joined());
  ASSERT_EQ(hand.plane(), GetParam());
  for (uint32_t id = 0; id < 4; ++id) ASSERT_TRUE(hand.Push(Ones(0, id, "fp32")).ok()) << id;
  // The first pull waits for the aggregations (they run after the pushes are answered);
  // the second finds every slice ready.
  const testing::HandPull all{.slice_ids = {0, 1, 2, 3}, .min_version = 1};
  std::vector<uint32_t> order;
  for (int pull = 0; pull < 2; ++pull) {
    absl::StatusOr<std::vector<testing::PulledSlice>> pulled = hand.Pull(all);
    ASSERT_TRUE(pulled.ok()) << pulled.status();
    order.clear();
    for (const testing::PulledSlice& slice : *pulled) order.push_back(slice.slice_id);
  }
  EXPECT_EQ(order, (std::vector<uint32_t>{2, 3, 0, 1}));
}

}  // namespace
}  // namespace ps
