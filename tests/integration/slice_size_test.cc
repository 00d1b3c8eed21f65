// The job's slice size (docs/data-plane.md, "The job's slice size"): workers started
// with Worker::Start(options, tensors, kJobSliceElems) against real shards. The first
// chooses from the link to shard 0 as it measures it (loopback: large slices; a link
// shaped to 100 Mbit/s: the default), the others adopt what it registered, and the shard
// answers the open join and the probes as the protocol says.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "cluster_util.h"
#include "absl/strings/str_cat.h"
#include "core/refusal.h"
#include "net/shaper.h"
#include "ps/v1/ps.grpc.pb.h"
#include "worker_lib/worker.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using std::chrono::milliseconds;

constexpr uint32_t kJobLarge = 262144;
// Nine slices of 262,144 (the last partial), 34 of 65,536: large enough for large slices
// on two shards (worker_lib/slice_size_internal.h, kLargeSlicesPerShard).
constexpr uint64_t kJobNumel = 2200000;

server::ServerOptions JobShard() {
  server::ServerOptions o;
  o.num_workers = 2;
  o.aggregator = "mean";
  o.aggregate_only = true;
  o.threads = 2;
  return o;
}

std::vector<core::TensorSpec> JobTensors() { return {{"w", kJobNumel, 0}}; }

WorkerOptions JobShaped(WorkerOptions o, const char* spec) {
  absl::StatusOr<net::LinkShaping> shaping = net::ParseLinkShaping(spec);
  EXPECT_TRUE(shaping.ok()) << shaping.status();
  if (shaping.ok()) o.shaping = *shaping;
  return o;
}

// The first worker chooses (on loopback large slices where the machine is not loaded:
// ps-bench e2e's line "slices of 262144 (the job's)"; the choice from a measured rate is
// ResolveJobSliceElemsTest's, against a fake shard, since a loaded machine may time
// loopback below 1 Gbit/s) and registers its size; a worker that names another size is
// refused naming both, and one of the job's size adopts the registered one. The two then
// train together over the layout they share.
TEST(JobSliceSizeTest, TheFirstWorkerChoosesFromTheLinkAndTheOthersAdopt) {
  testing::Cluster c = testing::StartCluster(2, JobShard());
  ASSERT_EQ(c.num_shards(), 2u);
  absl::StatusOr<std::unique_ptr<Worker>> first =
      Worker::Start(testing::ClientOptions(c, 0), JobTensors(), kJobSliceElems);
  ASSERT_TRUE(first.ok()) << first.status();
  const uint32_t chosen = (*first)->layout().slice_elems();
  ASSERT_TRUE(chosen == kJobLarge || chosen == core::kDefaultSliceElems) << chosen;
  EXPECT_EQ((*first)->layout().slices().size(), chosen == kJobLarge ? 9u : 34u);
  EXPECT_EQ(c.shard(1).shard().registered_layout()->slice_elems(), chosen);

  const uint32_t another = chosen == kJobLarge ? core::kDefaultSliceElems : kJobLarge;
  absl::StatusOr<std::unique_ptr<Worker>> other =
      Worker::Start(testing::ClientOptions(c, 1), JobTensors(), another);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(core::RefusalOf(other.status()), core::Refusal::kLayoutMismatch) << other.status();
  EXPECT_THAT(std::string(other.status().message()),
              HasSubstr(absl::StrCat("the same tensors cut into slices of ", another,
                                     " elements by the worker, of ", chosen, " by the shard")));

  absl::StatusOr<std::unique_ptr<Worker>> second =
      Worker::Start(testing::ClientOptions(c, 1), JobTensors(), kJobSliceElems);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*second)->layout().slice_elems(), chosen);
  EXPECT_EQ((*second)->layout().hash(), (*first)->layout().hash());

  ASSERT_TRUE((*first)->Push(0, 0, std::vector<float>(kJobNumel, 1.0f)).ok());
  ASSERT_TRUE((*second)->Push(0, 0, std::vector<float>(kJobNumel, 3.0f)).ok());
  std::vector<float> mean(kJobNumel);
  absl::StatusOr<uint64_t> v = (*first)->Pull(0, 1, mean, milliseconds(20000));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_FLOAT_EQ(mean.front(), 2.0f);
  EXPECT_FLOAT_EQ(mean.back(), 2.0f);
}

// Through a relay that shapes the link to 100 Mbit/s (as `ps-bench p3 --bandwidth 100`
// runs), the measure finds a slow link and the worker keeps the default slices, which
// P3 preempts at.
TEST(JobSliceSizeTest, AShapedLinkOfAHundredMegabitsKeepsTheDefault) {
  testing::Cluster c = testing::StartCluster(1, JobShard());
  ASSERT_EQ(c.num_shards(), 1u);
  absl::StatusOr<std::unique_ptr<Worker>> w = Worker::Start(
      JobShaped(testing::ClientOptions(c, 0), "rate=100mbps"), JobTensors(), kJobSliceElems);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->layout().slice_elems(), core::kDefaultSliceElems);
}

// Two workers of the job's size at once, one behind a slow link and one on loopback,
// may both find nothing registered and choose differently: whichever registers first,
// both end with its size.
TEST(JobSliceSizeTest, WorkersThatChooseAtOnceEndWithOneSize) {
  testing::Cluster c = testing::StartCluster(1, JobShard());
  ASSERT_EQ(c.num_shards(), 1u);
  absl::StatusOr<std::unique_ptr<Worker>> started[2] = {absl::UnknownError("unset"),
                                                        absl::UnknownError("unset")};
  std::thread slow([&] {
    started[0] = Worker::Start(JobShaped(testing::ClientOptions(c, 0), "rate=100mbps"), JobTensors(),
                               kJobSliceElems);
  });
  started[1] = Worker::Start(testing::ClientOptions(c, 1), JobTensors(), kJobSliceElems);
  slow.join();
  ASSERT_TRUE(started[0].ok()) << started[0].status();
  ASSERT_TRUE(started[1].ok()) << started[1].status();
  EXPECT_EQ((*started[0])->layout().slice_elems(), (*started[1])->layout().slice_elems());
  EXPECT_EQ(c.shard(0).shard().registered_layout()->slice_elems(),
            (*started[1])->layout().slice_elems());
}

// The shard's side, over a raw stub: the open join answers with a session and the
// registered size (0 before any), a join that is open and names a hash is refused, and a
// probe is answered with its size, refused over 1 MiB and refused without a session.
TEST(JobSliceSizeTest, TheShardAnswersOpenJoinsAndProbes) {
  server::ServerOptions o = JobShard();
  o.insecure = true;
  o.data_plane = core::DataPlane::kGrpc;
  testing::Cluster c = testing::StartCluster(1, o);
  ASSERT_EQ(c.num_shards(), 1u);
  auto stub = v1::WorkerService::NewStub(
      grpc::CreateChannel(c.addresses()[0], grpc::InsecureChannelCredentials()));
  const auto join = [&](uint64_t hash, v1::JoinResponse* resp) {
    v1::JoinRequest req;
    req.set_worker_id(1);
    req.set_job_slice_elems(true);
    req.set_layout_hash(hash);
    grpc::ClientContext ctx;
    return stub->Join(&ctx, req, resp);
  };
  const auto probe = [&](const std::string& session, size_t bytes, v1::ProbeResponse* resp) {
    v1::ProbeRequest req;
    req.set_session(session);
    req.set_payload(std::string(bytes, 'x'));
    grpc::ClientContext ctx;
    return stub->Probe(&ctx, req, resp);
  };
  v1::JoinResponse joined;
  grpc::Status s = join(0, &joined);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(joined.layout_registered());
  EXPECT_EQ(joined.slice_elems(), 0u);

  s = join(12345, &joined);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("names a layout hash"));

  v1::ProbeResponse answered;
  s = probe(joined.session(), size_t{1} << 20, &answered);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(answered.received_bytes(), uint64_t{1} << 20);
  s = probe(joined.session(), (size_t{1} << 20) + 1, &answered);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("a probe of 1048577 bytes; at most 1048576"));
  s = probe("not a session", 16, &answered);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);

  WorkerOptions wo;
  wo.shard_addresses = c.addresses();
  wo.worker_id = 0;
  absl::StatusOr<std::unique_ptr<Worker>> w = Worker::Start(wo, JobTensors(), 131072);
  ASSERT_TRUE(w.ok()) << w.status();
  s = join(0, &joined);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(joined.layout_registered());
  EXPECT_EQ(joined.slice_elems(), 131072u);
}

}  // namespace
}  // namespace ps
