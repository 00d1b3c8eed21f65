// Protocol attacks against a real shard on loopback: each gets its own refusal while
// two honest workers complete their rounds, and only the attacker is counted malformed;
// with quarantines on, its garbage takes it out of the rounds.
#include "harness/protocol_attacker.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_util.h"
#include "worker_lib/worker.h"

namespace ps::harness {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

// One shard of 3 workers (f = 1, so quorum 2; mean, aggregate-only) on loopback: honest
// workers 0 and 1 with a one-slice layout of 6 values, and a ProtocolAttacker as worker 2.
// `authenticated`: the shard authenticates (the default) and each joins with its token;
// otherwise it runs --insecure.
struct Attacked {
  void Start(milliseconds round_deadline, milliseconds quarantine, bool authenticated = false) {
    server::ServerOptions o;
    o.data_plane = core::DataPlane::kGrpc;  // the attacker speaks ps.v1 on the control port
    o.insecure = !authenticated;
    o.num_workers = 3;
    o.num_byzantine = 1;
    o.aggregator = "mean";
    o.aggregate_only = true;
    o.round_deadline = round_deadline;
    o.quarantine = quarantine;
    cluster = testing::StartCluster(1, o);
    ASSERT_EQ(cluster.num_shards(), 1u);
    for (uint32_t w = 0; w < 2; ++w) {
      auto worker = Worker::Start(testing::ClientOptions(cluster, w), layout);
      ASSERT_TRUE(worker.ok()) << worker.status();
      honest.push_back(*std::move(worker));
    }
    core::ClientCredentials creds;
    if (authenticated) creds.token = testing::WorkerToken(cluster, 2);
    auto joined = ProtocolAttacker::Join(cluster.addresses()[0], 2, layout, milliseconds(10000), creds);
    ASSERT_TRUE(joined.ok()) << joined.status();
    attacker = *std::move(joined);
  }

  const core::ModelLayout layout = *core::ModelLayout::Create({{"w", 6, 0}}, 128, 1);
  testing::Cluster cluster;
  std::vector<std::unique_ptr<Worker>> honest;
  std::unique_ptr<ProtocolAttacker> attacker;
};

TEST(ProtocolAttackTest, EveryAttackIsRefusedAndTheHonestRoundsComplete) {
  // Each attack on its own: the garbage push would quarantine the attacker (next test).
  Attacked t;
  ASSERT_NO_FATAL_FAILURE(t.Start(/*round_deadline=*/milliseconds(2000),
                                  /*quarantine=*/milliseconds(0)));
  testing::Cluster& cluster = t.cluster;
  std::vector<std::unique_ptr<Worker>>& honest = t.honest;
  ProtocolAttacker& a = *t.attacker;

  EXPECT_EQ(a.Send(ProtocolAttack::kDuplicate, 0, 0).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a.Send(ProtocolAttack::kGarbage, 0, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Send(ProtocolAttack::kOversize, 0, 0).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a.Send(ProtocolAttack::kFutureRound, 0, 0).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(a.PushValid(0, 0, std::vector<float>(6, 7.0f)).ok());
  const absl::Status dup = a.Send(ProtocolAttack::kDuplicate, 0, 0);
  EXPECT_EQ(dup.code(), absl::StatusCode::kAlreadyExists) << dup;
  const absl::Status forged = a.Send(ProtocolAttack::kImpersonate, 0, 0);
  EXPECT_EQ(forged.code(), absl::StatusCode::kUnauthenticated) << forged;
  EXPECT_THAT(std::string(forged.message()), HasSubstr("unknown session"));

  // The honest workers close round 0: mean of 7, 1 and 3.
  ASSERT_TRUE(honest[0]->Push(0, 0, std::vector<float>(6, 1.0f)).ok());
  ASSERT_TRUE(honest[1]->Push(0, 0, std::vector<float>(6, 3.0f)).ok());
  ASSERT_TRUE(honest[0]->WaitPushes().ok());
  ASSERT_TRUE(honest[1]->WaitPushes().ok());
  std::vector<float> agg(6);
  ASSERT_TRUE(honest[0]->Pull(0, 1, agg, milliseconds(10000)).ok());
  EXPECT_FLOAT_EQ(agg[0], 11.0f / 3.0f);

  // Round 0 closed with the attacker's push: resending it, or pushing it as an old
  // round, is the duplicate of what that round took (as the resend of a push whose answer
  // was lost is), and changes nothing.
  EXPECT_EQ(a.Send(ProtocolAttack::kReplay, 0, 0).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(a.Send(ProtocolAttack::kOldRound, 1, 0).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(cluster.shard(0).shard().stats().workers[2].refused(core::Refusal::kMalformed), 1u);  // the garbage
  EXPECT_EQ(cluster.shard(0).shard().stats().workers[0].refused(core::Refusal::kMalformed), 0u);
}

TEST(ProtocolAttackTest, GarbageQuarantinesTheAttackerAndRoundsGoOnWithoutIt) {
  // A deadline far beyond the pull's timeout below: the rounds must close without
  // waiting for the attacker.
  Attacked t;
  ASSERT_NO_FATAL_FAILURE(t.Start(/*round_deadline=*/milliseconds(60000),
                                  /*quarantine=*/milliseconds(60000)));
  testing::Cluster& cluster = t.cluster;
  std::vector<std::unique_ptr<Worker>>& honest = t.honest;
  ProtocolAttacker& a = *t.attacker;
  EXPECT_EQ(a.Send(ProtocolAttack::kGarbage, 0, 0).code(), absl::StatusCode::kInvalidArgument);
  const absl::Status valid = a.PushValid(0, 0, std::vector<float>(6, 7.0f));
  EXPECT_EQ(valid.code(), absl::StatusCode::kFailedPrecondition) << valid;
  EXPECT_THAT(std::string(valid.message()), HasSubstr("quarantined"));

  for (uint64_t round = 0; round < 3; ++round) {
    ASSERT_TRUE(honest[0]->Push(0, round, std::vector<float>(6, 1.0f)).ok());
    ASSERT_TRUE(honest[1]->Push(0, round, std::vector<float>(6, 3.0f)).ok());
    ASSERT_TRUE(honest[0]->WaitPushes().ok());
    ASSERT_TRUE(honest[1]->WaitPushes().ok());
    std::vector<float> agg(6);
    ASSERT_TRUE(honest[0]->Pull(0, round + 1, agg, milliseconds(10000)).ok()) << round;
    EXPECT_FLOAT_EQ(agg[0], 2.0f) << "the mean of the honest pushes alone";
  }
  const server::ShardStats st = cluster.shard(0).shard().stats();
  EXPECT_EQ(st.quarantines, 1u);
  EXPECT_EQ(st.rounds_closed_at_deadline, 0u);
  EXPECT_EQ(st.workers[0].refused(core::Refusal::kMalformed) + st.workers[1].refused(core::Refusal::kMalformed), 0u);
}

// The attacker carries a worker's credentials: against a shard that authenticates (the
// default) it joins with worker 2's token, proven as ps::Worker proves it, and its
// attacks reach the checks behind authentication; without a token it is turned away.
TEST(ProtocolAttackTest, JoinsAnAuthenticatedShardWithAWorkersTokenOnly) {
  Attacked t;
  ASSERT_NO_FATAL_FAILURE(t.Start(/*round_deadline=*/milliseconds(2000),
                                  /*quarantine=*/milliseconds(0), /*authenticated=*/true));
  const std::string address = t.cluster.addresses()[0];
  auto anonymous = ProtocolAttacker::Join(address, 2, t.layout, milliseconds(10000));
  ASSERT_FALSE(anonymous.ok());
  EXPECT_EQ(anonymous.status().code(), absl::StatusCode::kUnauthenticated) << anonymous.status();

  ProtocolAttacker& a = *t.attacker;  // joined with worker 2's token
  EXPECT_EQ(a.Send(ProtocolAttack::kFutureRound, 0, 0).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(a.PushValid(0, 0, std::vector<float>(6, 7.0f)).ok());
  EXPECT_EQ(a.Send(ProtocolAttack::kDuplicate, 0, 0).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(a.Send(ProtocolAttack::kImpersonate, 0, 0).code(), absl::StatusCode::kUnauthenticated);

  core::ClientCredentials forged;
  forged.token = std::string(32, 'f');
  auto impostor = ProtocolAttacker::Join(address, 2, t.layout, milliseconds(10000), forged);
  ASSERT_FALSE(impostor.ok());
  EXPECT_EQ(impostor.status().code(), absl::StatusCode::kUnauthenticated) << impostor.status();
}

TEST(ProtocolAttackTest, NamesParse) {
  EXPECT_EQ(*ParseProtocolAttack("old_round"), ProtocolAttack::kOldRound);
  EXPECT_THAT(std::string(ParseProtocolAttack("flood").status().message()),
              HasSubstr("unknown protocol attack 'flood'; known: garbage, impersonate"));
  EXPECT_EQ(ProtocolAttackNames().size(), 7u);
}

}  // namespace
}  // namespace ps::harness
