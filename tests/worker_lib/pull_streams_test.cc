// PullStreams against fake shards: destinations, retries of missing slices, errors,
// and PullTicket.
#include "worker_lib/pull_streams_internal.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <vector>

#include "tests/worker_lib/fake_transport.h"

namespace ps::internal {
namespace {

using std::chrono::milliseconds;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

const milliseconds kTimeout(2000);

// "a" (3 slices) and "b" (1 slice) over two shards.
core::ModelLayout PullLayout() {
  return *core::ModelLayout::Create({{"a", 10, 0}, {"b", 4, 1}}, /*slice_elems=*/4, 2);
}

// What the shards hold: element k of slice s is 100 s + k, at version 3.
v1::PullResponse SliceMessage(const core::ModelLayout& layout, uint32_t id, uint64_t version = 3) {
  std::vector<float> v(layout.slices()[id].numel);
  for (size_t k = 0; k < v.size(); ++k)
    v[k] = 100.0f * static_cast<float>(id) + static_cast<float>(k);
  v1::PullResponse m;
  m.set_slice_id(id);
  m.set_version(version);
  m.set_values(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  return m;
}

// Serves every slice asked for.
FakeDataChannel::PullHandler ServeAll(const core::ModelLayout& layout) {
  return [&layout](const v1::PullRequest& req) {
    FakeDataChannel::PullScript script;
    for (uint32_t id : req.slice_ids()) script.messages.push_back(SliceMessage(layout, id));
    return script;
  };
}

struct PullFixture {
  PullFixture()
      : c(PullLayout(), 2, FastOptions()), pulls(CallRetryPolicy(FastOptions()), c.layout, *c.client) {
    EXPECT_TRUE(c.client->Connect({}, RpcClock::now() + kTimeout).ok());
  }
  // The tensor as the shards hold it.
  std::vector<float> Expected(size_t tensor) const {
    std::vector<float> out(c.layout.tensors()[tensor].numel);
    for (uint32_t id : c.layout.SlicesOfTensor(tensor)) {
      const core::SliceInfo& s = c.layout.slices()[id];
      for (uint32_t k = 0; k < s.numel; ++k) out[s.offset + k] = 100.0f * id + k;
    }
    return out;
  }
  FakeCluster c;
  PullStreams pulls;
};

TEST(PullStreamsTest, PullAllCopiesEverySliceToItsPlace) {
  PullFixture f;
  for (auto* shard : f.c.channels) shard->SetPullHandler(ServeAll(f.c.layout));
  std::vector<float> a(10, -1), b(4, -1);
  const std::vector<std::span<float>> outs = {a, b};
  auto v = f.pulls.PullAll(2, outs, kTimeout);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 3u);
  EXPECT_THAT(a, ElementsAreArray(f.Expected(0)));
  EXPECT_THAT(b, ElementsAreArray(f.Expected(1)));
  // One stream per shard, each asking for its own slices at the version wanted.
  for (uint32_t shard = 0; shard < 2; ++shard) {
    const auto reqs = f.c.channels[shard]->pulls();
    ASSERT_EQ(reqs.size(), 1u);
    EXPECT_EQ(reqs[0].min_version(), 2u);
    EXPECT_EQ(reqs[0].session(), "session-1");
    for (uint32_t id : reqs[0].slice_ids()) EXPECT_EQ(f.c.layout.slices()[id].shard, shard);
  }
  WorkerStats s;
  f.pulls.FillStats(s);
  EXPECT_EQ(s.slices_pulled, 4u);
  EXPECT_EQ(s.pull_bytes, 14u * sizeof(float));
}

TEST(PullStreamsTest, PullOfOneTensorAsksOnlyForItsSlices) {
  PullFixture f;
  for (auto* shard : f.c.channels) shard->SetPullHandler(ServeAll(f.c.layout));
  std::vector<float> b(4, -1);
  ASSERT_TRUE(f.pulls.Pull(1, 0, b, kTimeout).ok());
  EXPECT_THAT(b, ElementsAreArray(f.Expected(1)));
  std::set<uint32_t> asked;
  for (auto* shard : f.c.channels) {
    for (const auto& r : shard->pulls()) asked.insert(r.slice_ids().begin(), r.slice_ids().end());
  }
  EXPECT_EQ(asked, std::set<uint32_t>({f.c.layout.SlicesOfTensor(1)[0]}));
}

TEST(PullStreamsTest, MissingSlicesAreAskedForAgainAfterARetriableFailure) {
  PullFixture f;
  f.c.channels[1]->SetPullHandler(ServeAll(f.c.layout));
  int calls = 0;
  f.c.channels[0]->SetPullHandler([&](const v1::PullRequest& req) {
    FakeDataChannel::PullScript script;
    if (++calls == 1) {  // the first slice, then the connection drops
      script.messages.push_back(SliceMessage(f.c.layout, req.slice_ids(0)));
      script.status = absl::UnavailableError("connection reset");
      return script;
    }
    return ServeAll(f.c.layout)(req);
  });
  std::vector<float> a(10, -1), b(4, -1);
  const std::vector<std::span<float>> outs = {a, b};
  ASSERT_TRUE(f.pulls.PullAll(0, outs, kTimeout).ok());
  EXPECT_THAT(a, ElementsAreArray(f.Expected(0)));
  EXPECT_THAT(b, ElementsAreArray(f.Expected(1)));
  const auto reqs = f.c.channels[0]->pulls();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[1].slice_ids_size(), reqs[0].slice_ids_size() - 1);  // only the missing
  EXPECT_EQ(f.c.channels[1]->pulls().size(), 1u);  // shard 1 had delivered everything
  EXPECT_EQ(f.pulls.retries(), 1u);
}

TEST(PullStreamsTest, ALostSessionIsJoinedAgainBeforeTheRetry) {
  PullFixture f;
  f.c.channels[1]->SetPullHandler(ServeAll(f.c.layout));
  f.c.channels[0]->SetPullHandler([&](const v1::PullRequest& req) {
    if (req.session() == "session-1") {
      return FakeDataChannel::PullScript{{}, absl::UnauthenticatedError("unknown session")};
    }
    return ServeAll(f.c.layout)(req);
  });
  std::vector<float> a(10), b(4);
  const std::vector<std::span<float>> outs = {a, b};
  ASSERT_TRUE(f.pulls.PullAll(0, outs, kTimeout).ok());
  EXPECT_EQ(f.c.controls[0]->joins(), 2);
  EXPECT_EQ(f.c.controls[1]->joins(), 1);
}

TEST(PullStreamsTest, AFinalFailureIsReportedWithItsContext) {
  PullFixture f;
  f.c.channels[0]->SetPullHandler(ServeAll(f.c.layout));
  f.c.channels[1]->SetPullHandler([](const v1::PullRequest&) {
    return FakeDataChannel::PullScript{{}, absl::PermissionDeniedError("not yours")};
  });
  std::vector<float> a(10), b(4);
  const std::vector<std::span<float>> outs = {a, b};
  auto v = f.pulls.PullAll(2, outs, kTimeout);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(v.status().message(),
              HasSubstr("pull of 4 slices at version >= 2 from shard 1 (fake1:1) ("));
  EXPECT_THAT(v.status().message(), HasSubstr(" missing): not yours"));
  EXPECT_EQ(f.c.channels[1]->pulls().size(), 1u);  // not retried
}

TEST(PullStreamsTest, RetriesEndAfterMaxAttempts) {
  PullFixture f;
  for (auto* shard : f.c.channels) {
    shard->SetPullHandler([](const v1::PullRequest&) {
      return FakeDataChannel::PullScript{{}, absl::UnavailableError("down")};
    });
  }
  std::vector<float> b(4);
  EXPECT_EQ(f.pulls.Pull(1, 0, b, kTimeout).status().code(), absl::StatusCode::kUnavailable);
  size_t streams = 0;
  for (auto* shard : f.c.channels) streams += shard->pulls().size();
  EXPECT_EQ(streams, 3u);  // max_attempts
}

TEST(PullStreamsTest, AMalformedOrUnaskedSliceIsAProtocolError) {
  for (int kind = 0; kind < 3; ++kind) {
    PullFixture f;
    for (auto* shard : f.c.channels) {
      shard->SetPullHandler([&f, kind](const v1::PullRequest& req) {
        v1::PullResponse m = SliceMessage(f.c.layout, req.slice_ids(0));
        if (kind == 0) m.mutable_values()->pop_back();  // wrong size
        if (kind == 1) m.set_version(1);                // older than asked
        if (kind == 2) m.set_slice_id(99);              // not asked for
        return FakeDataChannel::PullScript{{m}, absl::OkStatus()};
      });
    }
    std::vector<float> a(10), b(4);
    const std::vector<std::span<float>> outs = {a, b};
    auto v = f.pulls.PullAll(2, outs, kTimeout);
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInternal) << kind;
    EXPECT_THAT(v.status().message(), HasSubstr("unexpected or malformed slice")) << kind;
  }
}

TEST(PullStreamsTest, AStreamThatEndsEarlyIsAnError) {
  PullFixture f;
  for (auto* shard : f.c.channels) {
    shard->SetPullHandler([](const v1::PullRequest&) { return FakeDataChannel::PullScript{}; });
  }
  std::vector<float> b(4);
  auto v = f.pulls.Pull(1, 0, b, kTimeout);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(v.status().message(), HasSubstr("stream ended early"));
}

TEST(PullStreamsTest, BadBuffersAreRefused) {
  PullFixture f;
  std::vector<float> a(10), small(3);
  EXPECT_EQ(f.pulls.Pull(2, 0, a, kTimeout).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.pulls.Pull(1, 0, small, kTimeout).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<std::span<float>> one = {a};
  EXPECT_EQ(f.pulls.PullAll(0, one, kTimeout).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.pulls.StartPullAll(0, one, kTimeout).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (auto* shard : f.c.channels) EXPECT_TRUE(shard->pulls().empty());
}

TEST(PullStreamsTest, ATicketReportsEveryTensorAndTheVersion) {
  PullFixture f;
  for (auto* shard : f.c.channels) shard->SetPullHandler(ServeAll(f.c.layout));
  std::vector<float> a(10), b(4);
  const std::vector<std::span<float>> outs = {a, b};
  auto ticket = f.pulls.StartPullAll(1, outs, kTimeout);
  ASSERT_TRUE(ticket.ok());
  EXPECT_TRUE((*ticket)->WaitTensor(1).ok());
  EXPECT_TRUE((*ticket)->WaitTensor(0).ok());
  EXPECT_TRUE((*ticket)->TensorReady(0));
  EXPECT_FALSE((*ticket)->TensorReady(2));
  EXPECT_EQ((*ticket)->WaitTensor(2).code(), absl::StatusCode::kInvalidArgument);
  auto v = (*ticket)->Wait();
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 3u);
  EXPECT_THAT(a, ElementsAreArray(f.Expected(0)));
}

TEST(PullStreamsTest, ATicketReportsTheFailureToTheTensorsThatMissedIt) {
  PullFixture f;
  const uint32_t b_shard = f.c.layout.slices()[f.c.layout.SlicesOfTensor(1)[0]].shard;
  for (uint32_t s = 0; s < 2; ++s) {
    if (s == b_shard) {
      f.c.channels[s]->SetPullHandler([](const v1::PullRequest&) {
        return FakeDataChannel::PullScript{{}, absl::PermissionDeniedError("no")};
      });
    } else {
      f.c.channels[s]->SetPullHandler(ServeAll(f.c.layout));
    }
  }
  std::vector<float> a(10), b(4);
  const std::vector<std::span<float>> outs = {a, b};
  auto ticket = f.pulls.StartPullAll(0, outs, kTimeout);
  ASSERT_TRUE(ticket.ok());
  EXPECT_EQ((*ticket)->WaitTensor(1).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE((*ticket)->TensorReady(1));
  EXPECT_EQ((*ticket)->Wait().status().code(), absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace ps::internal
