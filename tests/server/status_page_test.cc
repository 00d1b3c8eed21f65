// The /status page (server/status_page.h): its table, its marks, its escaping.
#include "server/status_page.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ps::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

WorkerCounts Counts(uint64_t pushes, uint64_t missed) {
  WorkerCounts w;
  w.pushes_accepted = pushes;
  w.slice_rounds_missed = missed;
  return w;
}

constexpr Membership::State kPresent = Membership::State::kPresent;

TEST(StatusPageTest, MarksSuspectsAndAbsentWorkers) {
  EXPECT_EQ(WorkerMark(Counts(10, 0), kPresent, 10), "");
  EXPECT_EQ(WorkerMark(Counts(10, 5), kPresent, 10), "") << "half is not more than half";
  EXPECT_EQ(WorkerMark(Counts(4, 6), kPresent, 10), "absent");
  EXPECT_EQ(WorkerMark(Counts(0, 0), Membership::State::kNeverJoined, 0), "absent");
  EXPECT_EQ(WorkerMark(Counts(10, 0), Membership::State::kLeft, 10), "absent");
  EXPECT_EQ(WorkerMark(Counts(10, 0), Membership::State::kExpired, 10), "absent");
  WorkerCounts bad = Counts(10, 0);
  bad.refusals[static_cast<size_t>(core::Refusal::kMalformed)] = 1;
  EXPECT_EQ(WorkerMark(bad, kPresent, 10), "suspect");
  WorkerCounts quarantined = Counts(10, 9);
  quarantined.quarantines = 1;
  EXPECT_EQ(WorkerMark(quarantined, kPresent, 10), "suspect") << "suspect wins over absent";
  WorkerCounts set_aside = Counts(10, 0);
  set_aside.suspicion.score = 0.9;
  EXPECT_EQ(WorkerMark(set_aside, kPresent, 10), "") << "the score alone is not the mark";
  set_aside.suspicion.suspected = true;
  EXPECT_EQ(WorkerMark(set_aside, kPresent, 10), "suspect");
}

TEST(StatusPageTest, OneRowPerWorkerInASelfContainedPageThatReloads) {
  StatusView v;
  v.shard_id = 1;
  v.num_shards = 2;
  v.aggregator = "clip(2)+<krum>";  // escaped, whatever the spec holds
  v.ready = true;
  v.min_version = 7;
  v.max_version = 8;
  v.workers_expected = 3;
  v.rounds_closed = 10;
  v.pushes_accepted = 25;
  v.refusals = 4;
  v.workers = {Counts(10, 0), Counts(10, 0), Counts(5, 8)};
  v.workers[1].suspicion.score = 0.375;
  v.workers[0].push_latency_seconds = 2.5;  // over its 10 pushes
  v.workers[1].pushes_accepted = 0;         // none yet: no latency
  v.workers[1].refusals[static_cast<size_t>(core::Refusal::kLate)] = 3;
  v.workers[1].refusals[static_cast<size_t>(core::Refusal::kMalformed)] = 1;
  v.states = {kPresent, kPresent, kPresent};
  const std::string page = StatusPage(v);
  EXPECT_THAT(page, HasSubstr("<meta http-equiv=\"refresh\" content=\"5\">"));
  EXPECT_THAT(page, HasSubstr("<h1>ps-server shard 1 of 2</h1>"));
  EXPECT_THAT(page, HasSubstr("clip(2)+&lt;krum&gt;"));
  EXPECT_THAT(page, Not(HasSubstr("<krum>")));
  EXPECT_THAT(page, HasSubstr("<dd>7 to 8</dd>"));
  EXPECT_THAT(page, HasSubstr("<tr><td class=\"id\">0</td><td>present</td><td>10</td><td>0</td>"
                              "<td>0</td><td>0</td><td>0</td><td>0</td><td>0</td><td>250 ms</td>"
                              "<td>-</td><td></td></tr>"));
  EXPECT_THAT(page, HasSubstr("<tr class=\"suspect\"><td class=\"id\">1</td><td>present</td>"
                              "<td>0</td><td>0</td><td>3</td><td>4</td><td>1</td><td>0</td>"
                              "<td>0</td><td>-</td><td>0.38</td><td>suspect</td></tr>"));
  EXPECT_THAT(page, HasSubstr("<tr class=\"absent\"><td class=\"id\">2</td>"));
  // No script and nothing fetched from elsewhere.
  EXPECT_THAT(page, Not(HasSubstr("<script")));
  EXPECT_THAT(page, Not(HasSubstr("http://")));
  EXPECT_THAT(page, Not(HasSubstr("https://")));
}

}  // namespace
}  // namespace ps::server
