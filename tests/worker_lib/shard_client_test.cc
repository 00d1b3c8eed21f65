// ShardClient against fake shards: joining, layout registration, rejoin per epoch.
#include "worker_lib/shard_client_internal.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "tests/worker_lib/fake_transport.h"

namespace ps::internal {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

core::ModelLayout TwoShardLayout() {
  return *core::ModelLayout::Create({{"a", 10, 0}, {"b", 6, 1}}, /*slice_elems=*/4,
                                    /*num_shards=*/2);
}

RpcClock::time_point Soon() { return RpcClock::now() + milliseconds(2000); }

TEST(ShardClientTest, ConnectJoinsEveryShardAndKeepsWhatItSaid) {
  FakeCluster c(TwoShardLayout(), 2, FastOptions());
  v1::JoinResponse j0;
  j0.set_shard_id(0);
  j0.set_num_shards(2);
  j0.set_layout_registered(true);
  j0.set_version(5);
  j0.set_aggregator("krum");
  c.controls[0]->SetJoinResponse(j0);
  v1::JoinResponse j1 = j0;
  j1.set_shard_id(1);
  j1.set_version(3);
  c.controls[1]->SetJoinResponse(j1);
  ASSERT_TRUE(c.client->Connect({}, Soon()).ok());
  ASSERT_EQ(c.client->infos().size(), 2u);
  EXPECT_EQ(c.client->infos()[0].version, 5u);
  EXPECT_EQ(c.client->infos()[0].aggregator, "krum");
  EXPECT_EQ(c.client->infos()[1].shard_id, 1u);
  EXPECT_EQ(c.client->start_version(), 3u);  // the lowest
  EXPECT_EQ(c.client->session(1).token, "session-1");
  EXPECT_EQ(c.client->session(1).epoch, 1u);
  EXPECT_TRUE(c.controls[0]->registered().empty());
}

TEST(ShardClientTest, AShardWithoutLayoutGetsItAndTheInitialValuesOfItsSlices) {
  FakeCluster c(TwoShardLayout(), 2, FastOptions());
  v1::JoinResponse j;
  j.set_num_shards(2);
  j.set_layout_registered(false);
  c.controls[0]->SetJoinResponse(j);
  const core::ModelLayout& layout = c.layout;
  std::vector<uint32_t> owned;
  for (const core::SliceInfo& s : layout.slices()) {
    if (s.shard == 0) owned.push_back(s.id);
  }
  ASSERT_FALSE(owned.empty());
  c.controls[0]->SetRegisterLayout(absl::OkStatus(), owned);
  std::vector<float> a(10), b(6);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = 100.0f + static_cast<float>(i);
  const std::vector<std::span<const float>> initial = {a, b};
  ASSERT_TRUE(c.client->Connect(initial, Soon()).ok());

  const auto registered = c.controls[0]->registered();
  ASSERT_EQ(registered.size(), 1u);
  EXPECT_EQ(registered[0].session(), "session-1");
  EXPECT_EQ(registered[0].layout().tensors_size(), 2);
  EXPECT_EQ(registered[0].layout().num_shards(), 2u);
  const auto inits = c.controls[0]->inits();
  ASSERT_EQ(inits.size(), owned.size());
  for (size_t k = 0; k < inits.size(); ++k) {
    const core::SliceInfo& s = layout.slices()[owned[k]];
    EXPECT_EQ(inits[k].slice_id(), s.id);
    std::vector<float> got(s.numel);
    ASSERT_EQ(inits[k].values().size(), got.size() * sizeof(float));
    std::memcpy(got.data(), inits[k].values().data(), inits[k].values().size());
    const std::vector<float>& src = s.tensor == 0 ? a : b;
    EXPECT_EQ(got, std::vector<float>(src.begin() + s.offset, src.begin() + s.offset + s.numel));
  }
  EXPECT_TRUE(c.controls[1]->registered().empty());
}

TEST(ShardClientTest, LosingTheRegistrationRaceIsNoError) {
  FakeCluster c(TwoShardLayout(), 2, FastOptions());
  v1::JoinResponse j;
  j.set_num_shards(2);
  c.controls[0]->SetJoinResponse(j);
  c.controls[0]->SetRegisterLayout(absl::AlreadyExistsError("registered"), {0});
  EXPECT_TRUE(c.client->Connect({}, Soon()).ok());
  EXPECT_TRUE(c.controls[0]->inits().empty());
}

TEST(ShardClientTest, AShardWithoutParametersNeedsInitialValues) {
  FakeCluster c(TwoShardLayout(), 2, FastOptions());
  v1::JoinResponse j;
  j.set_num_shards(2);
  c.controls[1]->SetJoinResponse(j);
  const absl::Status st = c.client->Connect({}, Soon());
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("shard 1 (fake1:1) has no parameters yet"));
}

TEST(ShardClientTest, AShardOfAnotherClusterSizeIsRefused) {
  FakeCluster c(TwoShardLayout(), 2, FastOptions());
  v1::JoinResponse j;
  j.set_num_shards(3);
  j.set_layout_registered(true);
  c.controls[0]->SetJoinResponse(j);
  const absl::Status st = c.client->Connect({}, Soon());
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("belongs to a cluster of 3 shards"));
}

TEST(ShardClientTest, JoinRetriesAnUnreachableShardWithBackoff) {
  FakeCluster c(TwoShardLayout(), 2, FastOptions());
  c.controls[0]->FailJoins({absl::UnavailableError("down"), absl::DeadlineExceededError("slow"),
                         absl::UnavailableError("down")});
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(c.client->Connect({}, Soon()).ok());
  // Waits of 1, 2 and 4 ms between the attempts.
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(7));
  EXPECT_EQ(c.controls[0]->joins(), 4);
  EXPECT_EQ(c.client->retries(), 3u);
  EXPECT_EQ(c.client->session(0).epoch, 1u);
}

TEST(ShardClientTest, JoinGivesUpAtOnceOnAFinalRefusal) {
  for (absl::Status refusal :
       {absl::PermissionDeniedError("not you"), absl::UnauthenticatedError("no token")}) {
    FakeCluster c(TwoShardLayout(), 2, FastOptions());
    c.controls[0]->FailJoins({refusal});
    const absl::Status st = c.client->Connect({}, Soon());
    EXPECT_EQ(st.code(), refusal.code());
    EXPECT_THAT(st.message(), HasSubstr("joining shard 0 (fake0:1) as worker 0: "));
    EXPECT_THAT(st.message(), HasSubstr(refusal.message()));
    EXPECT_EQ(c.controls[0]->joins(), 1);
    EXPECT_EQ(c.controls[1]->joins(), 0);
  }
}

TEST(ShardClientTest, JoinGivesUpAtTheDeadline) {
  FakeCluster c(TwoShardLayout(), 2, FastOptions());
  c.controls[0]->FailJoins(std::vector<absl::Status>(1000, absl::UnavailableError("down")));
  const auto start = std::chrono::steady_clock::now();
  const absl::Status st = c.client->Connect({}, RpcClock::now() + milliseconds(30));
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(500));
  EXPECT_GT(c.controls[0]->joins(), 1);
}

TEST(ShardClientTest, RejoinsOncePerLostSession) {
  FakeCluster c(TwoShardLayout(), 2, FastOptions());
  std::atomic<int> told{0};
  std::atomic<uint32_t> told_shard{99};
  c.on_rejoin = [&](uint32_t shard, const v1::JoinResponse& join) {
    EXPECT_TRUE(join.layout_registered());
    told_shard = shard;
    ++told;
  };
  ASSERT_TRUE(c.client->Connect({}, Soon()).ok());
  ASSERT_EQ(c.client->session(1).epoch, 1u);

  c.client->Rejoin(1, /*failed_epoch=*/1);
  EXPECT_EQ(c.controls[1]->joins(), 2);
  EXPECT_EQ(c.client->session(1).epoch, 2u);
  EXPECT_EQ(c.client->session(1).token, "session-2");
  EXPECT_EQ(told.load(), 1);
  EXPECT_EQ(told_shard.load(), 1u);
  c.client->Rejoin(1, /*failed_epoch=*/1);  // already re-joined
  EXPECT_EQ(c.controls[1]->joins(), 2);

  // Many calls notice the same lost session at once: one join.
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) threads.emplace_back([&] { c.client->Rejoin(1, 2); });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(c.controls[1]->joins(), 3);
  EXPECT_EQ(told.load(), 2);
  EXPECT_EQ(c.controls[0]->joins(), 1);  // the other shard untouched
}

TEST(ShardClientTest, EveryJoinHandsItsRouteToTheDataChannels) {
  FakeCluster c(TwoShardLayout(), 2, FastOptions());
  v1::JoinResponse j;
  j.set_num_shards(2);
  j.set_layout_registered(true);
  j.set_udp_port(4000);
  j.set_udp_session(12);
  j.set_udp_key("k");
  c.controls[1]->SetJoinResponse(j);
  ASSERT_TRUE(c.client->Connect({}, Soon()).ok());
  auto routes = c.channels[1]->routes();
  ASSERT_EQ(routes.size(), 1u);
  EXPECT_EQ(routes[0].session, "session-1");
  EXPECT_EQ(routes[0].epoch, 1u);
  EXPECT_EQ(routes[0].udp_port, 4000u);
  EXPECT_EQ(routes[0].udp_session, 12u);
  EXPECT_EQ(routes[0].udp_key, "k");
  c.client->Rejoin(1, 1);
  routes = c.channels[1]->routes();
  ASSERT_EQ(routes.size(), 2u);
  EXPECT_EQ(routes[1].session, "session-2");
  EXPECT_EQ(routes[1].epoch, c.client->session(1).epoch);
  EXPECT_EQ(c.channels[0]->routes().size(), 1u);
}

TEST(ShardClientTest, ARouteAChannelCannotTakeFailsConnectButNotARejoin) {
  FakeCluster c(TwoShardLayout(), 2, FastOptions());
  c.channels[0]->RefuseRoutes(absl::FailedPreconditionError("no UDP path"));
  const absl::Status st = c.client->Connect({}, Soon());
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("no UDP path"));

  FakeCluster d(TwoShardLayout(), 2, FastOptions());
  int told = 0;
  d.on_rejoin = [&](uint32_t, const v1::JoinResponse&) { ++told; };
  ASSERT_TRUE(d.client->Connect({}, Soon()).ok());
  d.channels[0]->RefuseRoutes(absl::FailedPreconditionError("no UDP path"));
  d.client->Rejoin(0, 1);
  // The shard joined: a new session, which the channel holds too; its calls report
  // what is wrong with the route.
  EXPECT_EQ(d.client->session(0).epoch, 2u);
  EXPECT_EQ(d.channels[0]->routes().back().epoch, 2u);
  EXPECT_EQ(told, 1);
}

TEST(ShardClientTest, AFailedRejoinTellsNobody) {
  FakeCluster c(TwoShardLayout(), 2, FastOptions());
  int told = 0;
  c.on_rejoin = [&](uint32_t, const v1::JoinResponse&) { ++told; };
  ASSERT_TRUE(c.client->Connect({}, Soon()).ok());
  c.controls[0]->FailJoins({absl::PermissionDeniedError("no")});
  c.client->Rejoin(0, 1);
  EXPECT_EQ(told, 0);
  EXPECT_EQ(c.client->session(0).epoch, 1u);
}

}  // namespace
}  // namespace ps::internal
