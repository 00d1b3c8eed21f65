#include "server/connection_table.h"

#include <gtest/gtest.h>

#include <string>

namespace ps::server {
namespace {

using std::chrono::milliseconds;

ConnectionLimits SmallConnectionLimits() {
  ConnectionLimits l;
  l.max_connections = 8;
  l.reserved_for_proven = 2;  // unproven may use 6
  l.max_unproven_per_source = 3;
  l.max_per_identity = 2;
  l.proof_timeout = milliseconds(1000);
  l.probation_per_second = 2;
  l.probation_timeout = milliseconds(200);
  return l;
}

std::string Peer(int i) { return "ipv4:10.0.0.1:" + std::to_string(1000 + i); }

TEST(ConnectionTableTest, ASourceOverItsUnprovenBoundLosesItsOldestConnection) {
  ConnectionTable t(SmallConnectionLimits());
  core::ManualClock clock;
  std::vector<ConnectionTable::Id> ids;
  for (int i = 0; i < 3; ++i) {
    ConnectionTable::Admission a = t.Open("10.0.0.1", Peer(i), clock.Now());
    ASSERT_TRUE(a.accepted);
    EXPECT_TRUE(a.evict.empty());
    ids.push_back(a.id);
  }
  ConnectionTable::Admission a = t.Open("10.0.0.1", Peer(3), clock.Now());
  ASSERT_TRUE(a.accepted);
  ASSERT_EQ(a.evict.size(), 1u);
  EXPECT_EQ(a.evict[0].id, ids[0]);
  EXPECT_EQ(a.evict[0].reason, CloseReason::kSourceUnproven);
  // Another source is not touched by that bound.
  EXPECT_TRUE(t.Open("10.0.0.2", "ipv4:10.0.0.2:1", clock.Now()).evict.empty());
  EXPECT_EQ(t.stats().open, 4u);
}

TEST(ConnectionTableTest, UnprovenConnectionsCannotTakeTheReserveOfProvenOnes) {
  ConnectionTable t(SmallConnectionLimits());
  core::ManualClock clock;
  // Six unproven connections from six sources fill what unproven ones may use.
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(t.Open("10.0.1." + std::to_string(i), "ipv4:10.0.1." + std::to_string(i) + ":1",
                       clock.Now()).accepted);
  }
  // A seventh closes the oldest unproven one: the flood cannot grow past 6.
  ConnectionTable::Admission a = t.Open("10.0.2.1", "ipv4:10.0.2.1:1", clock.Now());
  ASSERT_TRUE(a.accepted);
  ASSERT_EQ(a.evict.size(), 1u);
  EXPECT_EQ(a.evict[0].reason, CloseReason::kUnproven);
  EXPECT_EQ(t.stats().unproven, 6u);
  // Proven connections take the reserve: prove two, and two more fit beside 6 unproven.
  EXPECT_TRUE(t.Proven("ipv4:10.0.1.1:1", "worker-1", clock.Now()).empty());
  EXPECT_TRUE(t.Proven("ipv4:10.0.1.2:1", "worker-2", clock.Now()).empty());
  EXPECT_EQ(t.stats().proven, 2u);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(t.Open("10.0.3." + std::to_string(i), "ipv4:10.0.3." + std::to_string(i) + ":1",
                       clock.Now()).accepted);
  }
  EXPECT_EQ(t.stats().open, 8u);
}

TEST(ConnectionTableTest, ANewConnectionIsRefusedOnlyWhenProvenOnesFillTheTable) {
  ConnectionLimits l = SmallConnectionLimits();
  l.max_per_identity = 0;
  ConnectionTable t(l);
  core::ManualClock clock;
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(t.Open("10.0.0." + std::to_string(i), Peer(i), clock.Now()).accepted);
    t.Proven(Peer(i), "worker-" + std::to_string(i), clock.Now());
  }
  ConnectionTable::Admission a = t.Open("10.0.9.9", "ipv4:10.0.9.9:1", clock.Now());
  EXPECT_FALSE(a.accepted);
  EXPECT_EQ(a.refused, CloseReason::kFull);
  t.Closed(1);
  EXPECT_TRUE(t.Open("10.0.9.9", "ipv4:10.0.9.9:1", clock.Now()).accepted);
}

TEST(ConnectionTableTest, UnprovenConnectionsExpireAfterTheProofTimeout) {
  ConnectionTable t(SmallConnectionLimits());
  core::ManualClock clock;
  const ConnectionTable::Id old = t.Open("10.0.0.1", Peer(0), clock.Now()).id;
  clock.Advance(milliseconds(600));
  const ConnectionTable::Id proven = t.Open("10.0.0.1", Peer(1), clock.Now()).id;
  t.Proven(Peer(1), "admin", clock.Now());
  const ConnectionTable::Id young = t.Open("10.0.0.1", Peer(2), clock.Now()).id;
  clock.Advance(milliseconds(400));
  std::vector<ConnectionTable::Victim> v = t.Expired(clock.Now());
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].id, old);
  EXPECT_EQ(v[0].reason, CloseReason::kProofTimeout);
  clock.Advance(milliseconds(600));
  v = t.Expired(clock.Now());
  ASSERT_EQ(v.size(), 1u);  // the proven one stays
  EXPECT_EQ(v[0].id, young);
  EXPECT_NE(v[0].id, proven);
  EXPECT_TRUE(t.Expired(clock.Now()).empty());
  EXPECT_EQ(t.stats().open, 1u);
}

TEST(ConnectionTableTest, AnIdentityOverItsBoundLosesItsLeastRecentlyUsedConnection) {
  ConnectionTable t(SmallConnectionLimits());
  core::ManualClock clock;
  std::vector<ConnectionTable::Id> ids;
  for (int i = 0; i < 3; ++i) {
    ids.push_back(t.Open("10.0.0." + std::to_string(i), Peer(i), clock.Now()).id);
  }
  EXPECT_TRUE(t.Proven(Peer(0), "worker-3", clock.Now()).empty());
  EXPECT_TRUE(t.Proven(Peer(1), "worker-3", clock.Now()).empty());
  EXPECT_TRUE(t.Proven(Peer(1), "worker-3", clock.Now()).empty());  // again: nothing changes
  std::vector<ConnectionTable::Victim> v = t.Proven(Peer(2), "worker-3", clock.Now());
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].id, ids[0]);  // all used at the same time: the oldest
  EXPECT_EQ(v[0].reason, CloseReason::kIdentity);
  // A connection that keeps serving calls outlives newer ones that went quiet: the
  // identity's next connection closes the least recently used one.
  clock.Advance(std::chrono::seconds(1));
  EXPECT_TRUE(t.Proven(Peer(1), "worker-3", clock.Now()).empty());
  clock.Advance(std::chrono::seconds(1));
  ASSERT_TRUE(t.Open("10.0.0.3", Peer(3), clock.Now()).accepted);
  v = t.Proven(Peer(3), "worker-3", clock.Now());
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].id, ids[2]);
  EXPECT_EQ(v[0].reason, CloseReason::kIdentity);
  // Anonymous calls (--insecure) prove a connection without an identity to bound.
  ASSERT_TRUE(t.Open("10.0.0.9", Peer(9), clock.Now()).accepted);
  EXPECT_TRUE(t.Proven(Peer(9), "", clock.Now()).empty());
  EXPECT_EQ(t.stats().proven, 3u);  // peers 1 and 3, and the anonymous one
}

TEST(ConnectionTableTest, APeerStringSeenAgainReplacesTheConnectionThatHeldIt) {
  ConnectionTable t(SmallConnectionLimits());
  core::ManualClock clock;
  t.Open("10.0.0.1", Peer(0), clock.Now());
  t.Proven(Peer(0), "worker-0", clock.Now());
  // The same address and port again: the first connection closed unnoticed.
  ASSERT_TRUE(t.Open("10.0.0.1", Peer(0), clock.Now()).accepted);
  EXPECT_EQ(t.stats().open, 1u);
  EXPECT_EQ(t.stats().unproven, 1u);
}

TEST(ConnectionTableTest, ShedUnprovenClosesTheOldestFirst) {
  ConnectionTable t(SmallConnectionLimits());
  core::ManualClock clock;
  const ConnectionTable::Id a = t.Open("10.0.0.1", Peer(0), clock.Now()).id;
  const ConnectionTable::Id b = t.Open("10.0.0.2", "ipv4:10.0.0.2:1", clock.Now()).id;
  t.Open("10.0.0.3", "ipv4:10.0.0.3:1", clock.Now());
  t.Proven("ipv4:10.0.0.3:1", "admin", clock.Now());
  std::vector<ConnectionTable::Victim> v = t.ShedUnproven(5);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].id, a);
  EXPECT_EQ(v[1].id, b);
  EXPECT_EQ(t.stats().open, 1u);
}

TEST(ConnectionTableTest, AnAbusiveConnectionPenalizesItsSourceAndIdentityLongerEachTime) {
  ConnectionTable t(SmallConnectionLimits());  // penalty 500 ms, at most 4 s
  core::ManualClock clock;
  ASSERT_TRUE(t.Open("10.0.0.1", Peer(0), clock.Now()).accepted);
  t.Proven(Peer(0), "worker-3", clock.Now());
  std::vector<ConnectionTable::Victim> v = t.Abusive(Peer(0), CloseReason::kResets, clock.Now());
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].reason, CloseReason::kResets);
  EXPECT_TRUE(t.Abusive(Peer(0), CloseReason::kResets, clock.Now()).empty());  // gone
  // The source's connections are on probation for the penalty; another source's are not.
  ConnectionTable::Admission a = t.Open("10.0.0.1", Peer(1), clock.Now());
  ASSERT_TRUE(a.accepted);
  EXPECT_TRUE(a.probation);
  EXPECT_EQ(t.OnProbation(), std::vector<ConnectionTable::Id>{a.id});
  EXPECT_EQ(t.Abusive(Peer(1), CloseReason::kUnprovenBytes, clock.Now()).size(), 1u);
  ConnectionTable::Admission other = t.Open("10.0.0.2", "ipv4:10.0.0.2:1", clock.Now());
  ASSERT_TRUE(other.accepted);
  EXPECT_FALSE(other.probation);
  // The identity's new connection from elsewhere is closed at its first call.
  v = t.Proven("ipv4:10.0.0.2:1", "worker-3", clock.Now());
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].reason, CloseReason::kPenalized);
  // The probation connection's abuse renewed the penalty, doubled (1 s from then);
  // after it, connections are no longer on probation. A repeat within a minute doubles
  // it again.
  clock.Advance(std::chrono::milliseconds(999));
  EXPECT_TRUE(t.Open("10.0.0.1", Peer(2), clock.Now()).probation);
  EXPECT_EQ(t.Abusive(Peer(2), CloseReason::kUnprovenBytes, clock.Now()).size(), 1u);
  clock.Advance(std::chrono::milliseconds(1999));
  EXPECT_TRUE(t.Open("10.0.0.1", Peer(3), clock.Now()).probation);
  clock.Advance(std::chrono::milliseconds(1));
  a = t.Open("10.0.0.1", Peer(4), clock.Now());
  ASSERT_TRUE(a.accepted);
  EXPECT_FALSE(a.probation);
  // Unproven connections are listed for the byte check; proven ones are not.
  ASSERT_TRUE(t.Open("10.0.0.5", "ipv4:10.0.0.5:1", clock.Now()).accepted);
  t.Proven("ipv4:10.0.0.5:1", "admin", clock.Now());
  EXPECT_EQ(t.Unproven().size(), 2u);  // Peer(3) on probation and Peer(4)
  EXPECT_EQ(t.OnProbation().size(), 1u);
}

TEST(ConnectionTableTest, APenalizedSourceGetsAFewConnectionsASecondOnProbation) {
  ConnectionTable t(SmallConnectionLimits());  // 2 a second on probation, for 200 ms each; penalty 500 ms
  core::ManualClock clock;
  ASSERT_TRUE(t.Open("10.0.0.1", Peer(0), clock.Now()).accepted);
  ASSERT_EQ(t.Abusive(Peer(0), CloseReason::kUnprovenBytes, clock.Now()).size(), 1u);
  // Two are admitted on probation; the third in the same second is refused.
  ConnectionTable::Admission first = t.Open("10.0.0.1", Peer(1), clock.Now());
  ASSERT_TRUE(first.accepted);
  EXPECT_TRUE(first.probation);
  ConnectionTable::Admission second = t.Open("10.0.0.1", Peer(2), clock.Now());
  ASSERT_TRUE(second.accepted);
  ConnectionTable::Admission third = t.Open("10.0.0.1", Peer(3), clock.Now());
  EXPECT_FALSE(third.accepted);
  EXPECT_EQ(third.refused, CloseReason::kPenalized);
  EXPECT_EQ(t.stats().probation, 2u);
  // One proves itself: it leaves probation and stays past the probation timeout.
  EXPECT_TRUE(t.Proven(Peer(2), "worker-1", clock.Now()).empty());
  EXPECT_EQ(t.OnProbation(), std::vector<ConnectionTable::Id>{first.id});
  EXPECT_EQ(t.Unproven(), std::vector<ConnectionTable::Id>{first.id});
  clock.Advance(milliseconds(199));
  EXPECT_TRUE(t.Expired(clock.Now()).empty());
  clock.Advance(milliseconds(1));
  std::vector<ConnectionTable::Victim> v = t.Expired(clock.Now());
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].id, first.id);
  EXPECT_EQ(v[0].reason, CloseReason::kPenalized);
  EXPECT_EQ(v[0].source, "10.0.0.1");
  const ConnectionTable::Stats s = t.stats();
  EXPECT_EQ(s.open, 1u);
  EXPECT_EQ(s.proven, 1u);
  EXPECT_EQ(s.probation, 0u);
  // The second's two admissions are used; after the penalty (500 ms) connections are
  // admitted as usual.
  clock.Advance(milliseconds(99));  // 299 ms
  EXPECT_FALSE(t.Open("10.0.0.1", Peer(4), clock.Now()).accepted);
  clock.Advance(milliseconds(201));  // 500 ms
  ConnectionTable::Admission free = t.Open("10.0.0.1", Peer(5), clock.Now());
  ASSERT_TRUE(free.accepted);
  EXPECT_FALSE(free.probation);
}

}  // namespace
}  // namespace ps::server
