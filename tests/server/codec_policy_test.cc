// --allowed-codecs: parsing, and which push specs pass (server/codec_policy.h).
#include "server/codec_policy.h"

#include <string>

#include "core/refusal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::testing::HasSubstr;

TEST(CodecPolicyTest, EmptyAllowsEveryCodec) {
  auto p = CodecPolicy::Parse("");
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->allows_all());
  EXPECT_EQ(p->Describe(), "every codec");
  EXPECT_TRUE(p->Check("push", "topk(0.01)+bloom(p0)+polyfit").ok());
}

TEST(CodecPolicyTest, EveryStageOfASpecMustBeAllowed) {
  auto p = CodecPolicy::Parse("fp32, fp16,topk,varint,raw");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->Describe(), "fp16, fp32, raw, topk, varint");
  for (const char* ok :
       {"fp32", "fp16", "topk(0.01)+varint+fp16", "topk(ratio=0.1, level=cat)+raw+raw", "topk"}) {
    EXPECT_TRUE(p->Check("push", ok).ok()) << ok;
  }
  const absl::Status bloom =
      p->Check("push from worker 3 for slice 7", "topk(0.01)+bloom(p0)+fp16");
  EXPECT_EQ(core::RefusalOf(bloom), core::Refusal::kCodecNotAllowed);
  EXPECT_EQ(bloom.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bloom.message(),
            "push from worker 3 for slice 7: codec \"topk(0.01)+bloom(p0)+fp16\" uses 'bloom', "
            "which this shard does not decode (--allowed-codecs: fp16, fp32, raw, topk, varint)");
  EXPECT_EQ(core::RefusalOf(p->Check("push", "powersgd(rank=64)")),
            core::Refusal::kCodecNotAllowed);
  EXPECT_EQ(core::RefusalOf(p->Check("push", "topk+raw+deflate(level=9)")),
            core::Refusal::kCodecNotAllowed);
  // What does not parse (or is too long) is left to the decoder cache: unknown_codec.
  EXPECT_TRUE(p->Check("push", "topk((").ok());
  EXPECT_TRUE(p->Check("push", std::string(200, 'x')).ok());
}

TEST(CodecPolicyTest, RefusesUnknownAndRepeatedNames) {
  EXPECT_THAT(std::string(CodecPolicy::Parse("fp32,gzip").status().message()),
              HasSubstr("'gzip' is not a codec stage; known: fp32, fp16, bf16"));
  EXPECT_THAT(std::string(CodecPolicy::Parse("fp32,,fp16").status().message()),
              HasSubstr("'' is not a codec stage"));
  EXPECT_THAT(std::string(CodecPolicy::Parse("raw,raw").status().message()),
              HasSubstr("'raw' is listed twice"));
  EXPECT_THAT(std::string(CodecPolicy::Parse("topk(0.01)").status().message()),
              HasSubstr("'topk(0.01)' is not a codec stage"));
}

}  // namespace
}  // namespace ps::server
