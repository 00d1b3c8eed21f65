// Typed refusals (core/refusal.h) and their way through gRPC (core/grpc_status.h).
#include "core/refusal.h"

#include <grpcpp/support/status.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "core/grpc_status.h"

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

TEST(GrpcStatusTest, RefusalsKeepTheirKindThroughGrpc) {
  for (int i = 0; i < static_cast<int>(Refusal::kCount); ++i) {
    const auto r = static_cast<Refusal>(i);
    const grpc::Status wire = ToGrpc(Refused(r, "why"));
    EXPECT_EQ(static_cast<int>(wire.error_code()), static_cast<int>(RefusalCode(r)));
    EXPECT_EQ(wire.error_message(), "why");
    const absl::Status back = FromGrpc(wire);
    EXPECT_EQ(RefusalOf(back), r) << RefusalName(r);
    EXPECT_EQ(back.code(), RefusalCode(r));
    EXPECT_EQ(back.message(), "why");
  }
}

TEST(GrpcStatusTest, PlainStatusesAndForeignDetailsStayPlain) {
  EXPECT_TRUE(ToGrpc(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpc(grpc::Status::OK).ok());
  const grpc::Status plain = ToGrpc(absl::UnavailableError("draining"));
  EXPECT_EQ(plain.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(plain.error_details().empty());
  const absl::Status back = FromGrpc(plain);
  EXPECT_EQ(back.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(RefusalOf(back), std::nullopt);
  // Details from elsewhere, an unknown reason, or a reason under the wrong code.
  for (const grpc::Status& odd :
       {grpc::Status(grpc::StatusCode::INTERNAL, "x", "\x08\x0d binary google.rpc.Status"),
        grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "x", "ps-refusal:nonsense"),
        grpc::Status(grpc::StatusCode::INTERNAL, "x", "ps-refusal:no_layout")}) {
    const absl::Status s = FromGrpc(odd);
    EXPECT_EQ(static_cast<int>(s.code()), static_cast<int>(odd.error_code()));
    EXPECT_EQ(RefusalOf(s), std::nullopt) << odd.error_details();
  }
}

}  // namespace
}  // namespace ps::core
