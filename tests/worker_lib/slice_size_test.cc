// The job's slice size resolved through shard 0's control (worker_lib/slice_size_internal.h)
// against a fake shard: adopted when registered, else chosen from the measured link.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "core/layout.h"
#include "core/refusal.h"
#include "fake_transport.h"
#include "worker_lib/slice_size_internal.h"

namespace ps::internal {
namespace {

using ::testing::HasSubstr;

WorkerOptions Options() {
  WorkerOptions o;
  o.shard_addresses = {"127.0.0.1:1"};
  o.worker_id = 3;
  o.run_id = "run-7";
  o.data_plane = core::DataPlane::kTcp;
  return o;
}

RpcClock::time_point Soon() { return RpcClock::now() + std::chrono::seconds(10); }

// A model large enough for large slices on Options()'s one shard.
constexpr uint64_t kBig = kLargeSlicesPerShard * kLargeSliceElems;

TEST(SliceElemsForLinkTest, LargeSlicesFromOneGigabitOn) {
  EXPECT_EQ(SliceElemsForLink(0), core::kDefaultSliceElems);
  EXPECT_EQ(SliceElemsForLink(12.5e6), core::kDefaultSliceElems);  // 100 Mbit/s
  EXPECT_EQ(SliceElemsForLink(124.9e6), core::kDefaultSliceElems);
  EXPECT_EQ(SliceElemsForLink(125e6), kLargeSliceElems);  // 1 Gbit/s
  EXPECT_EQ(SliceElemsForLink(5e9), kLargeSliceElems);
}

// A registered layout's size is adopted without a measure; the open join says who asks,
// for which plane and run, and names no layout.
TEST(ResolveJobSliceElemsTest, AdoptsTheRegisteredSizeWithoutProbing) {
  v1::JoinResponse join;
  join.set_layout_registered(true);
  join.set_slice_elems(32768);
  FakeControl control(join);
  absl::StatusOr<JobSliceElems> got = ResolveJobSliceElems(control, Options(), kBig, Soon());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->slice_elems, 32768u);
  EXPECT_TRUE(got->adopted);
  EXPECT_EQ(control.probes(), 0);
  ASSERT_EQ(control.join_requests().size(), 1u);
  const v1::JoinRequest req = control.join_requests()[0];
  EXPECT_TRUE(req.job_slice_elems());
  EXPECT_EQ(req.layout_hash(), 0u);
  EXPECT_EQ(req.worker_id(), 3u);
  EXPECT_EQ(req.run_id(), "run-7");
  EXPECT_EQ(req.data_plane(), v1::DATA_PLANE_TCP);
}

// Nothing registered: a link the probes cross at 40 MB/s (320 Mbit/s) gets the default,
// one they cross without delay the large slices.
TEST(ResolveJobSliceElemsTest, ChoosesByTheMeasuredRate) {
  FakeControl slow{v1::JoinResponse()};
  slow.SetProbe(40e6);
  absl::StatusOr<JobSliceElems> got = ResolveJobSliceElems(slow, Options(), kBig, Soon());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->adopted);
  EXPECT_EQ(got->slice_elems, core::kDefaultSliceElems);
  EXPECT_GT(got->link_bytes_per_second, 20e6);
  EXPECT_LT(got->link_bytes_per_second, 45e6);
  EXPECT_EQ(slow.probes(), 1 + kProbeWarmups + 2 * kProbeRepeats);

  FakeControl fast{v1::JoinResponse()};
  got = ResolveJobSliceElems(fast, Options(), kBig, Soon());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->slice_elems, kLargeSliceElems);
}

// A model that would give a shard fewer than kLargeSlicesPerShard large slices keeps
// the default without a measure, however fast the link.
TEST(ResolveJobSliceElemsTest, ASmallModelKeepsTheDefaultWithoutProbing) {
  EXPECT_TRUE(LargeSlicesFit(kBig, 1));
  EXPECT_FALSE(LargeSlicesFit(kBig - 1, 1));
  EXPECT_FALSE(LargeSlicesFit(kBig, 2));
  FakeControl fast{v1::JoinResponse()};
  absl::StatusOr<JobSliceElems> got = ResolveJobSliceElems(fast, Options(), kBig - 1, Soon());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->slice_elems, core::kDefaultSliceElems);
  EXPECT_EQ(fast.probes(), 0);
}

// A worker that starts from the root's values (may_register false) never chooses: it
// joins again until the root registered, and adopts that size; without a root it says
// what it waited for.
TEST(ResolveJobSliceElemsTest, AWorkerThatDoesNotRegisterWaitsForTheRootsSize) {
  WorkerOptions o = Options();
  o.may_register = false;
  o.initial_backoff = std::chrono::milliseconds(5);
  o.max_backoff = std::chrono::milliseconds(20);
  FakeControl control{v1::JoinResponse()};
  std::thread root([&control] {
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    v1::JoinResponse registered;
    registered.set_layout_registered(true);
    registered.set_slice_elems(131072);
    control.SetJoinResponse(registered);
  });
  absl::StatusOr<JobSliceElems> got = ResolveJobSliceElems(control, o, kBig, Soon());
  root.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->slice_elems, 131072u);
  EXPECT_TRUE(got->adopted);
  EXPECT_GT(control.joins(), 1);
  EXPECT_EQ(control.probes(), 0);

  FakeControl alone{v1::JoinResponse()};
  got = ResolveJobSliceElems(alone, o, kBig, RpcClock::now() + std::chrono::milliseconds(100));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(got.status().message()),
              HasSubstr("shard 0 (127.0.0.1:1) has no parameters yet, and worker 3 does not "
                        "register them (it starts from the root worker's)"));
  EXPECT_EQ(alone.probes(), 0);
}

// A probe the shard refuses (a --max-message-bytes below it would refuse large slices
// too) leaves the default; a refused join is the error, with context.
TEST(ResolveJobSliceElemsTest, ARefusedProbeKeepsTheDefaultAndARefusedJoinFails) {
  FakeControl control{v1::JoinResponse()};
  control.SetProbe(0, absl::ResourceExhaustedError("message larger than max"));
  absl::StatusOr<JobSliceElems> got = ResolveJobSliceElems(control, Options(), kBig, Soon());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->slice_elems, core::kDefaultSliceElems);
  EXPECT_EQ(got->link_bytes_per_second, 0);

  FakeControl refusing{v1::JoinResponse()};
  refusing.FailJoins({core::Refused(core::Refusal::kWrongRun, "worker 3 belongs to run-7")});
  got = ResolveJobSliceElems(refusing, Options(), kBig, Soon());
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(core::RefusalOf(got.status()), core::Refusal::kWrongRun);
  EXPECT_THAT(std::string(got.status().message()),
              HasSubstr("joining shard 0 (127.0.0.1:1) for the job's slice size as worker 3"));
  EXPECT_EQ(refusing.probes(), 0);
}

}  // namespace
}  // namespace ps::internal
