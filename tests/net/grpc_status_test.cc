// Typed refusals (core/refusal.h) through gRPC (net/grpc_status.h).
#include "net/grpc_status.h"

#include <grpcpp/support/status.h>
#include <gtest/gtest.h>

#include "core/refusal.h"

namespace ps::net {
namespace {

using core::Refusal;
using core::RefusalCode;
using core::RefusalName;
using core::RefusalOf;
using core::Refused;

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
}  // namespace ps::net
