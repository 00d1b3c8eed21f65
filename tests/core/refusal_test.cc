// Typed refusals (core/refusal.h); their way through gRPC is in tests/net/grpc_status_test.cc.
#include "core/refusal.h"

#include <gtest/gtest.h>

#include "core/data_plane.h"

#include <set>
#include <string>

namespace ps::core {
namespace {

TEST(RefusalTest, EveryKindHasADistinctNameThatParsesBack) {
  std::set<std::string> names;
  for (int i = 0; i < static_cast<int>(Refusal::kCount); ++i) {
    const auto r = static_cast<Refusal>(i);
    const std::string name(RefusalName(r));
    EXPECT_NE(name, "unknown") << i;
    EXPECT_TRUE(names.insert(name).second) << name;
    EXPECT_EQ(ParseRefusal(name), r);
    EXPECT_NE(RefusalCode(r), absl::StatusCode::kOk) << name;
  }
  EXPECT_EQ(ParseRefusal("no such reason"), std::nullopt);
  EXPECT_EQ(ParseRefusal(""), std::nullopt);
}

TEST(RefusalTest, TheKindTravelsInsideTheStatus) {
  const absl::Status s = Refused(Refusal::kNoLayout, "no layout registered yet");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "no layout registered yet");
  EXPECT_EQ(RefusalOf(s), Refusal::kNoLayout);
  EXPECT_EQ(RefusalOf(Refused(Refusal::kLate, "late")), Refusal::kLate);
  EXPECT_EQ(Refused(Refusal::kLate, "late").code(), absl::StatusCode::kOutOfRange);
  // The same code and message without the payload is no refusal.
  EXPECT_EQ(RefusalOf(absl::FailedPreconditionError("no layout registered yet")), std::nullopt);
  EXPECT_EQ(RefusalOf(absl::OkStatus()), std::nullopt);
}

// The data_plane refusal (a worker and a shard on different planes) and the planes' names.
TEST(RefusalTest, DataPlanesHaveNamesAndTheirMismatchARefusal) {
  EXPECT_EQ(RefusalName(Refusal::kDataPlane), "data_plane");
  EXPECT_EQ(RefusalCode(Refusal::kDataPlane), absl::StatusCode::kFailedPrecondition);
  for (DataPlane p : {DataPlane::kGrpc, DataPlane::kTcp}) {
    EXPECT_EQ(ParseDataPlane(DataPlaneName(p)).value_or(DataPlane::kGrpc), p);
  }
  const absl::StatusOr<DataPlane> udp = ParseDataPlane("udp");
  EXPECT_EQ(udp.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(udp.status().message(), "unknown data plane 'udp'; expected grpc or tcp");
}

}  // namespace
}  // namespace ps::core
