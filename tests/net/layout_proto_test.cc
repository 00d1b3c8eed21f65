// core::ModelLayout <-> ps.v1.Layout (net/layout_proto.h), the one conversion the worker
// and the shard share.
#include "net/layout_proto.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ps::net {
namespace {

core::ModelLayout TwoTensors() {
  absl::StatusOr<core::ModelLayout> l =
      core::ModelLayout::Create({{"w", 100, 1}, {"b", 10, 0}}, /*slice_elems=*/32,
                                /*num_shards=*/2);
  EXPECT_TRUE(l.ok()) << l.status();
  return *std::move(l);
}

TEST(LayoutProtoTest, ALayoutComesBackTheSame) {
  const core::ModelLayout layout = TwoTensors();
  v1::Layout msg;
  LayoutToProto(layout, &msg);
  EXPECT_EQ(msg.slice_elems(), 32u);
  EXPECT_EQ(msg.num_shards(), 2u);
  ASSERT_EQ(msg.tensors_size(), 2);
  EXPECT_EQ(msg.tensors(0).name(), "w");
  EXPECT_EQ(msg.tensors(0).numel(), 100u);
  EXPECT_EQ(msg.tensors(0).priority(), 1);
  EXPECT_TRUE(SameLayout(layout, msg));
  absl::StatusOr<core::ModelLayout> back = LayoutFromProto(msg);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->hash(), layout.hash());
  const std::vector<core::TensorSpec> tensors = TensorsFromProto(msg);
  ASSERT_EQ(tensors.size(), 2u);
  EXPECT_EQ(tensors[1].name, "b");
  EXPECT_EQ(tensors[1].numel, 10u);
}

TEST(LayoutProtoTest, AnyDifferenceIsAnotherLayout) {
  const core::ModelLayout layout = TwoTensors();
  v1::Layout msg;
  LayoutToProto(layout, &msg);
  v1::Layout other = msg;
  other.set_slice_elems(16);
  EXPECT_FALSE(SameLayout(layout, other));
  other = msg;
  other.set_num_shards(3);
  EXPECT_FALSE(SameLayout(layout, other));
  other = msg;
  other.mutable_tensors(1)->set_priority(2);
  EXPECT_FALSE(SameLayout(layout, other));
  other = msg;
  other.mutable_tensors(0)->set_name("v");
  EXPECT_FALSE(SameLayout(layout, other));
  other = msg;
  other.mutable_tensors(0)->set_row_elems(10);
  EXPECT_FALSE(SameLayout(layout, other));
  other = msg;
  other.add_tensors()->set_name("extra");
  EXPECT_FALSE(SameLayout(layout, other));
  other = msg;
  other.mutable_tensors(0)->set_optimizer("sgd(lr=0.1)");
  EXPECT_FALSE(SameLayout(layout, other));
}

// A tensor's optimizer crosses the wire and is part of the hash; layouts without any keep
// the hash they had (checkpoints record it).
TEST(LayoutProtoTest, OptimizersComeBackAndChangeTheHash) {
  const core::ModelLayout plain = TwoTensors();
  absl::StatusOr<core::ModelLayout> with =
      core::ModelLayout::Create({{"w", 100, 1, 0, "adam(lr=0.001)"}, {"b", 10, 0}}, 32, 2);
  ASSERT_TRUE(with.ok()) << with.status();
  EXPECT_NE(with->hash(), plain.hash());
  absl::StatusOr<core::ModelLayout> other =
      core::ModelLayout::Create({{"w", 100, 1, 0, "adam(lr=0.01)"}, {"b", 10, 0}}, 32, 2);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(with->hash(), other->hash());
  v1::Layout msg;
  LayoutToProto(*with, &msg);
  EXPECT_EQ(msg.tensors(0).optimizer(), "adam(lr=0.001)");
  absl::StatusOr<core::ModelLayout> back = LayoutFromProto(msg);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->hash(), with->hash());
  EXPECT_EQ(back->tensors()[0].optimizer, "adam(lr=0.001)");
  // What a spec may be: printable ASCII, bounded (the grammar is the shard's to check).
  EXPECT_FALSE(core::ModelLayout::Create({{"w", 4, 0, 0, "adam(lr=1)\n"}}, 4, 1).ok());
  EXPECT_FALSE(core::ModelLayout::Create({{"w", 4, 0, 0, std::string(257, 'a')}}, 4, 1).ok());
  EXPECT_TRUE(core::ModelLayout::Create({{"w", 4, 0, 0, std::string(256, 'a')}}, 4, 1).ok());
}

TEST(LayoutProtoTest, TheFirstDifferenceIsNamed) {
  const core::ModelLayout layout = TwoTensors();
  v1::Layout msg;
  LayoutToProto(layout, &msg);
  EXPECT_EQ(LayoutDifference(layout, msg), "");
  v1::Layout other = msg;
  other.mutable_tensors(1)->set_numel(12);
  other.set_slice_elems(16);  // a later difference: not the first
  EXPECT_EQ(LayoutDifference(layout, other),
            "tensor 1 differs: the shard's is 'b' (10 elements, priority 0), the worker's 'b' "
            "(12 elements, priority 0)");
  other = msg;
  other.mutable_tensors(0)->set_row_elems(10);
  EXPECT_EQ(LayoutDifference(layout, other),
            "tensor 0 differs: the shard's is 'w' (100 elements, priority 1), the worker's 'w' "
            "(100 elements, priority 1, rows of 10)");
  other = msg;
  other.mutable_tensors(1)->set_optimizer("adam(lr=0.001)");
  EXPECT_EQ(LayoutDifference(layout, other),
            "tensor 1 differs: the shard's is 'b' (10 elements, priority 0), the worker's 'b' "
            "(10 elements, priority 0, optimizer adam(lr=0.001))");
  other = msg;
  other.add_tensors()->set_name("head\n");
  other.mutable_tensors(2)->set_numel(4);
  EXPECT_EQ(LayoutDifference(layout, other),
            "the worker's layout has 3 tensors, the shard's 2; the worker's next is 'head\\n' (4 "
            "elements, priority 0)");
  other = msg;
  other.mutable_tensors()->RemoveLast();
  EXPECT_EQ(LayoutDifference(layout, other),
            "the worker's layout ends after 1 of the shard's 2 tensors; the shard's next is 'b' "
            "(10 elements, priority 0)");
  other = msg;
  other.set_slice_elems(16);
  EXPECT_EQ(LayoutDifference(layout, other),
            "the same tensors cut into slices of 16 elements by the worker, of 32 by the shard");
  other = msg;
  other.set_num_shards(3);
  EXPECT_EQ(LayoutDifference(layout, other),
            "the same tensors cut for 3 shards by the worker, for 2 by the shard");
  // A name from the network is cut, so the answer stays small whatever it sent.
  other = msg;
  other.mutable_tensors(0)->set_name(std::string(100000, 'x'));
  const std::string long_name = LayoutDifference(layout, other);
  EXPECT_LT(long_name.size(), 300u);
  std::string cut(64, 'x');
  cut.append("...'");
  EXPECT_NE(long_name.find(cut), std::string::npos) << long_name;
}

TEST(LayoutProtoTest, RowLengthsComeBackAndCutTheSameSlices) {
  absl::StatusOr<core::ModelLayout> layout =
      core::ModelLayout::Create({{"w", 100, 1, 10}, {"b", 10, 0}}, /*slice_elems=*/32, 2);
  ASSERT_TRUE(layout.ok()) << layout.status();
  v1::Layout msg;
  LayoutToProto(*layout, &msg);
  EXPECT_EQ(msg.tensors(0).row_elems(), 10u);
  EXPECT_EQ(msg.tensors(1).row_elems(), 0u);
  EXPECT_TRUE(SameLayout(*layout, msg));
  absl::StatusOr<core::ModelLayout> back = LayoutFromProto(msg);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->hash(), layout->hash());
  ASSERT_EQ(back->slices().size(), layout->slices().size());
  EXPECT_EQ(back->slices()[0].numel, 30u) << "three rows of 10 in a slice of 32";
}

TEST(LayoutProtoTest, AnInvalidMessageGetsTheCreateError) {
  v1::Layout msg;
  LayoutToProto(TwoTensors(), &msg);
  msg.mutable_tensors(1)->set_name("w");  // duplicate name
  EXPECT_EQ(LayoutFromProto(msg).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps::net
