// The list of channels: per shard a control and a data-plane channel, a UDP channel only
// where some tensor takes the UDP path (PushOptions::path, or its deprecated alias udp).
#include "worker_lib/transport/channels.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace ps::internal {
namespace {

// The fp32 codec's largest encoding of n values (Codec::MaxEncodedBytes).
size_t Fp32Bytes(size_t n) { return 1 + 4 * n; }

WorkerOptions TwoShards() {
  WorkerOptions o;
  // Channels connect lazily: nothing needs to listen here.
  o.shard_addresses = {"127.0.0.1:1", "127.0.0.1:2"};
  return o;
}

DataChannel* ChannelOf(const ShardLink& link, PushPath path) {
  return link.channels[static_cast<size_t>(path)].get();
}

TEST(ChannelsTest, EveryShardGetsItsControlAndADataPlaneChannel) {
  const WorkerOptions o = TwoShards();
  EXPECT_TRUE(UsesPath(o, PushPath::kDataPlane));
  EXPECT_FALSE(UsesPath(o, PushPath::kUdp));
  auto links = ConnectShards(o);
  ASSERT_TRUE(links.ok()) << links.status();
  ASSERT_EQ(links->size(), 2u);
  for (const ShardLink& link : *links) {
    EXPECT_NE(link.control, nullptr);
    ASSERT_NE(ChannelOf(link, PushPath::kDataPlane), nullptr);
    EXPECT_FALSE(ChannelOf(link, PushPath::kDataPlane)->chunked()) << "whole slices";
    EXPECT_EQ(ChannelOf(link, PushPath::kUdp), nullptr) << "no tensor takes the UDP path";
  }
}

TEST(ChannelsTest, ATensorOverUdpGivesEveryShardAUdpChannel) {
  for (bool deprecated_alias : {false, true}) {
    WorkerOptions o = TwoShards();
    PushOptions udp;
    if (deprecated_alias) {
      udp.udp = true;
    } else {
      udp.path = PushPath::kUdp;
    }
    EXPECT_EQ(udp.push_path(), PushPath::kUdp);
    o.tensor_push["w"] = udp;
    o.udp.chunk_elems = 512;
    EXPECT_TRUE(UsesPath(o, PushPath::kUdp)) << deprecated_alias;
    auto links = ConnectShards(o);
    ASSERT_TRUE(links.ok()) << links.status();
    for (const ShardLink& link : *links) {
      ASSERT_NE(ChannelOf(link, PushPath::kUdp), nullptr) << deprecated_alias;
      EXPECT_TRUE(ChannelOf(link, PushPath::kUdp)->chunked());
      EXPECT_EQ(ChannelOf(link, PushPath::kUdp)->chunk_elems(4, Fp32Bytes), 512u);
      EXPECT_FALSE(ChannelOf(link, PushPath::kDataPlane)->chunked());
    }
  }
}

TEST(ChannelsTest, BadUdpOptionsAreRefusedAtOnce) {
  WorkerOptions o = TwoShards();
  o.push.path = PushPath::kUdp;
  o.udp.loss = 1;
  const auto links = ConnectShards(o);
  EXPECT_EQ(links.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(links.status().message(), ::testing::HasSubstr("UDP loss must lie in [0, 1)"));
}

TEST(ChannelsTest, PathsHaveNames) {
  EXPECT_STREQ(PushPathName(PushPath::kDataPlane), "data plane");
  EXPECT_STREQ(PushPathName(PushPath::kUdp), "UDP");
}

}  // namespace
}  // namespace ps::internal
