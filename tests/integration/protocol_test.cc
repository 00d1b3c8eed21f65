// A hostile client speaking raw ps.v1 next to honest ps::Worker clients: every bad
// push gets its specific status, and the honest round still completes.
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
#include "ps/v1/ps.grpc.pb.h"
#include "worker_lib/worker.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using std::chrono::milliseconds;

class ProtocolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server::ServerOptions o;
    o.insecure = true;  // raw stubs below call without credentials
    o.num_workers = 3;
    o.num_byzantine = 1;  // quorum 2
    o.aggregator = "mean";
    o.aggregate_only = true;
    o.round_deadline = milliseconds(500);
    o.threads = 2;
    // Each bad push on its own: the first malformed one would quarantine worker 2, whose
    // later pushes would all be refused as such (tests/worker_lib/protocol_attack_test.cc
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

  v1::PushRequest Valid(std::vector<float> values) {
    v1::PushRequest r;
    r.set_session(session_);
    r.set_layout_hash(layout_->hash());
    r.set_round(0);
    r.set_slice_id(0);
    r.set_codec("fp16");
    auto codec = codecs::MakeCodec("fp16");
    EXPECT_TRUE((*codec)->Encode(values, r.mutable_payload()).ok());
    return r;
  }

  grpc::Status Send(const v1::PushRequest& r) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::PushResponse resp;
    return stub_->Push(&ctx, r, &resp);
  }

  testing::Cluster cluster_;
  std::unique_ptr<core::ModelLayout> layout_;
  std::vector<std::unique_ptr<Worker>> honest_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  std::string session_;
};

TEST_F(ProtocolTest, BadPushesGetPreciseStatusesAndHonestRoundCompletes) {
  const std::vector<float> six(6, 1.0f);
  struct Case {
    const char* what;
    v1::PushRequest req;
    grpc::StatusCode code;
    const char* message;
  };
  std::vector<Case> cases;
  {
    auto r = Valid(six);
    r.mutable_payload()->resize(r.payload().size() - 2);
    cases.push_back({"wrong size", r, grpc::StatusCode::INVALID_ARGUMENT, "malformed push"});
  }
  {
    auto r = Valid(six);
    (*r.mutable_payload())[0] = 99;
    cases.push_back({"bad version byte", r, grpc::StatusCode::INVALID_ARGUMENT, "malformed push"});
  }
  {
    auto r = Valid(six);
    r.set_payload(std::string(1000, '\xff'));
    cases.push_back({"garbage", r, grpc::StatusCode::INVALID_ARGUMENT, "malformed push"});
  }
  {
    auto r = Valid(six);
    (*r.mutable_payload())[2] = '\x7c';  // fp16 0x7c00 = +Inf
    (*r.mutable_payload())[1] = '\x00';
    cases.push_back({"infinity", r, grpc::StatusCode::INVALID_ARGUMENT, "not finite"});
  }
  {
    auto r = Valid(six);
    r.set_layout_hash(r.layout_hash() + 1);
    cases.push_back({"wrong layout", r, grpc::StatusCode::FAILED_PRECONDITION, "layout mismatch"});
  }
  {
    auto r = Valid(six);
    r.set_slice_id(42);
    cases.push_back({"unknown slice", r, grpc::StatusCode::INVALID_ARGUMENT, "unknown slice 42"});
  }
  {
    auto r = Valid(six);
    r.set_codec("lz77");
    cases.push_back({"unknown codec", r, grpc::StatusCode::INVALID_ARGUMENT, "unknown codec"});
  }
  {
    auto r = Valid(six);
    r.set_session("forged-session!!");
    cases.push_back({"forged session", r, grpc::StatusCode::UNAUTHENTICATED, "unknown session"});
  }
  {
    auto r = Valid(six);
    r.set_round(3);
    cases.push_back({"future round", r, grpc::StatusCode::FAILED_PRECONDITION, "before that round opened"});
  }
  {
    auto r = Valid(six);
    r.set_payload(std::string(9u << 20, 'x'));  // above --max-message-bytes
    cases.push_back({"oversize", r, grpc::StatusCode::RESOURCE_EXHAUSTED, ""});
  }
  for (const Case& c : cases) {
    grpc::Status s = Send(c.req);
    EXPECT_EQ(s.error_code(), c.code) << c.what << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.message)) << c.what;
  }

  // One valid push from the hostile client, then a duplicate.
  ASSERT_TRUE(Send(Valid(std::vector<float>(6, 7.0f))).ok());
  grpc::Status dup = Send(Valid(six));
  EXPECT_EQ(dup.error_code(), grpc::StatusCode::ALREADY_EXISTS) << dup.error_message();

  // Honest workers complete the round; mean of 7, 1 and 3.
  ASSERT_TRUE(honest_[0]->Push(0, 0, std::vector<float>(6, 1.0f)).ok());
  ASSERT_TRUE(honest_[1]->Push(0, 0, std::vector<float>(6, 3.0f)).ok());
  ASSERT_TRUE(honest_[0]->WaitPushes().ok());
  ASSERT_TRUE(honest_[1]->WaitPushes().ok());
  std::vector<float> agg(6);
  ASSERT_TRUE(honest_[0]->Pull(0, 1, agg, milliseconds(10000)).ok());
  EXPECT_FLOAT_EQ(agg[0], (7.0f + 1.0f + 3.0f) / 3.0f);

  // Round 0 is closed now, with the hostile client's push: a replay of it is the
  // duplicate it is (a worker that lost the answer sends again), not late.
  grpc::Status again = Send(Valid(six));
  EXPECT_EQ(again.error_code(), grpc::StatusCode::ALREADY_EXISTS) << again.error_message();

  server::ShardStats st = cluster_.shard(0).shard().stats();
  EXPECT_EQ(st.malformed_by_worker[2], 4u);
  EXPECT_EQ(st.malformed_by_worker[0], 0u);
}

TEST_F(ProtocolTest, GarbageOnlyWorkerDoesNotBlockTheQuorum) {
  auto r = Valid(std::vector<float>(6, 1.0f));
  r.set_payload("\x01\x02\x03");
  EXPECT_EQ(Send(r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(honest_[0]->Push(0, 0, std::vector<float>(6, 2.0f)).ok());
  ASSERT_TRUE(honest_[1]->Push(0, 0, std::vector<float>(6, 4.0f)).ok());
  ASSERT_TRUE(honest_[0]->WaitPushes().ok());
  ASSERT_TRUE(honest_[1]->WaitPushes().ok());
  std::vector<float> agg(6);
  ASSERT_TRUE(honest_[1]->Pull(0, 1, agg, milliseconds(10000)).ok());  // closes at the deadline
  EXPECT_FLOAT_EQ(agg[3], 3.0f);
}

TEST_F(ProtocolTest, PullOfAnotherShardsOrRepeatedSliceIsRefused) {
  v1::PullRequest req;
  req.set_session(session_);
  req.set_layout_hash(layout_->hash());
  req.add_slice_ids(0);
  req.add_slice_ids(0);
  grpc::ClientContext ctx;
  auto reader = stub_->Pull(&ctx, req);
  v1::PullResponse resp;
  EXPECT_FALSE(reader->Read(&resp));
  grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // The shard has one slice: the second id is refused where it is read (issue 45).
  EXPECT_THAT(s.error_message(), HasSubstr("more than 1 slice ids"));
}

// One shard for two workers, aggregate-only, without credentials: raw stubs call it.
server::ServerOptions RawStubShard() {
  server::ServerOptions o;
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
// passes the parser's bound and reaches the shard's pairing check.
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
TEST_F(ProtocolTest, BodiesThatDoNotParseAreRefusedAsMalformed) {
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
// on the generated classes reads them as the PullResponse they are.
TEST_F(ProtocolTest, GeneratedClientsReadThePullMessagesTheShardWrites) {
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

// Joins as `worker` over a raw stub; the session, or "" (with a test failure).
std::string RawJoin(v1::WorkerService::Stub& stub, uint32_t worker, uint64_t hash) {
  v1::JoinRequest join;
  join.set_worker_id(worker);
  join.set_layout_hash(hash);
  v1::JoinResponse joined;
  grpc::ClientContext ctx;
  const grpc::Status s = stub.Join(&ctx, join, &joined);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return joined.session();
}

// One raw Push of 64 ones in `codec` for `slice` of `round` in the session `session`.
grpc::Status RawPush(v1::WorkerService::Stub& stub, const std::string& session, uint64_t hash,
                     uint64_t round, uint32_t slice, const std::string& codec) {
  v1::PushRequest r;
  r.set_session(session);
  r.set_layout_hash(hash);
  r.set_round(round);
  r.set_slice_id(slice);
  r.set_codec(codec);
  auto c = codecs::MakeCodec(codec);
  EXPECT_TRUE((*c)->Encode(std::vector<float>(64, 1.0f), r.mutable_payload()).ok());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::PushResponse resp;
  return stub.Push(&ctx, r, &resp);
}

// PullResponse.queued: set on a message the shard wrote right after the one before it
// (it was ready while that one was being written), clear on the first message of a
// stream and on one whose version came while the stream was idle. The worker times its
// downlink over the queued ones only (docs/adaptive.md, "The cost model").
TEST(PullQueuedTest, OnlyMessagesThatWaitedForTheLinkAreMarkedQueued) {
  server::ServerOptions o;
  o.insecure = true;
  o.num_workers = 2;
  o.aggregator = "mean";
  o.aggregate_only = true;
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
  auto stub = v1::WorkerService::NewStub(
      grpc::CreateChannel(cluster.addresses()[0], grpc::InsecureChannelCredentials()));
  const std::string session = RawJoin(*stub, 1, layout->hash());
  ASSERT_FALSE(session.empty());
  auto push = [&](uint64_t round, uint32_t slice) {
    return RawPush(*stub, session, layout->hash(), round, slice, "fp16");
  };
  auto open_pull = [&](grpc::ClientContext& ctx, uint64_t min_version,
                       std::vector<uint32_t> slices) {
    v1::PullRequest req;
    req.set_session(session);
    req.set_layout_hash(layout->hash());
    req.set_min_version(min_version);
    for (uint32_t id : slices) req.add_slice_ids(id);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return stub->Pull(&ctx, req);
  };
  const std::vector<float> grad(4 * 64, 2.0f);

  // Round 0 complete before the pull: every slice is ready at once.
  ASSERT_TRUE((*honest)->Push(0, 0, grad).ok());
  ASSERT_TRUE((*honest)->WaitPushes().ok());
  for (uint32_t id = 0; id < 4; ++id) ASSERT_TRUE(push(0, id).ok()) << id;
  // Aggregation runs after the last push is answered: one pull waits for every slice,
  // so that the next finds them all ready.
  {
    grpc::ClientContext ctx;
    auto reader = open_pull(ctx, 1, {0, 1, 2, 3});
    v1::PullResponse resp;
    while (reader->Read(&resp)) {
    }
    ASSERT_TRUE(reader->Finish().ok());
  }
  {
    grpc::ClientContext ctx;
    auto reader = open_pull(ctx, 1, {0, 1, 2, 3});
    std::vector<bool> queued;
    v1::PullResponse resp;
    while (reader->Read(&resp)) queued.push_back(resp.queued());
    ASSERT_TRUE(reader->Finish().ok());
    // The stream starts writing once it has every slice's watch, so the three behind
    // the first were ready while it was written, however late its write completes.
    EXPECT_EQ(queued, (std::vector<bool>{false, true, true, true}));
  }

  // Round 1: the stream is open before either slice is ready, and each comes while it
  // is idle.
  ASSERT_TRUE((*honest)->Push(0, 1, grad).ok());
  ASSERT_TRUE((*honest)->WaitPushes().ok());
  grpc::ClientContext ctx;
  auto reader = open_pull(ctx, 2, {0, 1});
  ASSERT_TRUE(push(1, 0).ok());
  v1::PullResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.slice_id(), 0u);
  EXPECT_FALSE(resp.queued());
  // Long enough for the shard to see the first write done before the next slice is
  // ready (were it not, the slice would rightly be marked queued).
  std::this_thread::sleep_for(milliseconds(200));
  ASSERT_TRUE(push(1, 1).ok());
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.slice_id(), 1u);
  EXPECT_FALSE(resp.queued());
  EXPECT_FALSE(reader->Read(&resp));
  EXPECT_TRUE(reader->Finish().ok());
}

// Slices ready when a pull starts go out most urgent first (--schedule=priority, the
// default), whatever the order the request lists them in.
TEST(PullQueuedTest, SlicesReadyAtTheStartGoOutMostUrgentFirst) {
  server::ServerOptions o;
  o.insecure = true;
  o.num_workers = 2;
  o.aggregator = "mean";
  o.aggregate_only = true;
  testing::Cluster cluster = testing::StartCluster(1, o);
  // fc (priority 2) is slices 0-1, conv (priority 0, the most urgent) slices 2-3.
  auto layout = core::ModelLayout::Create({{"fc", 2 * 64, 2}, {"conv", 2 * 64, 0}}, 64, 1);
  ASSERT_TRUE(layout.ok());
  ASSERT_EQ(layout->slices().size(), 4u);
  // Worker 0 registers the layout and pushes through the library; worker 1 is the raw
  // client whose pull is watched.
  WorkerOptions wo;
  wo.shard_addresses = cluster.addresses();
  wo.worker_id = 0;
  auto honest = Worker::Start(wo, *layout);
  ASSERT_TRUE(honest.ok()) << honest.status();
  ASSERT_TRUE((*honest)->Push(0, 0, std::vector<float>(2 * 64, 1.0f)).ok());
  ASSERT_TRUE((*honest)->Push(1, 0, std::vector<float>(2 * 64, 1.0f)).ok());
  ASSERT_TRUE((*honest)->WaitPushes().ok());
  auto stub = v1::WorkerService::NewStub(
      grpc::CreateChannel(cluster.addresses()[0], grpc::InsecureChannelCredentials()));
  const std::string session = RawJoin(*stub, 1, layout->hash());
  ASSERT_FALSE(session.empty());
  for (uint32_t id = 0; id < 4; ++id) {
    ASSERT_TRUE(RawPush(*stub, session, layout->hash(), 0, id, "fp32").ok()) << id;
  }
  v1::PullRequest req;
  req.set_session(session);
  req.set_layout_hash(layout->hash());
  req.set_min_version(1);
  for (uint32_t id : {0, 1, 2, 3}) req.add_slice_ids(id);
  // The first pull waits for the aggregations (they run after the pushes are answered);
  // the second finds every slice ready.
  std::vector<uint32_t> order;
  for (int pull = 0; pull < 2; ++pull) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    auto reader = stub->Pull(&ctx, req);
    order.clear();
    v1::PullResponse resp;
    while (reader->Read(&resp)) order.push_back(resp.slice_id());
    ASSERT_TRUE(reader->Finish().ok());
  }
  EXPECT_EQ(order, (std::vector<uint32_t>{2, 3, 0, 1}));
}

}  // namespace
}  // namespace ps
