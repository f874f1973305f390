#include "planner/shard.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/planner/shard_content.h"
#include "tests/support/job_builders.h"

namespace reshard::planner {
namespace {

using test_support::SetDp;
using test_support::SetTpSplit;
using test_support::Tensor;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using testing::LocalContent;

TEST(DeriveCoordShardTest, UnevenTpSplitOnRows) {
  v1::TensorSpec t = Tensor("w", {5, 2});
  SetTpSplit(&t, 0);
  // rows split 2, 2, 1 over tp 3
  EXPECT_THAT(LocalContent(t, DeriveCoordShard(t, DenseCoord(3, 1, 0, 0))),
              ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(LocalContent(t, DeriveCoordShard(t, DenseCoord(3, 1, 2, 0))), ElementsAre(8, 9));
}

TEST(DeriveCoordShardTest, ColumnSplitIsStrided) {
  v1::TensorSpec t = Tensor("w", {2, 4});
  SetTpSplit(&t, 1);
  EXPECT_THAT(LocalContent(t, DeriveCoordShard(t, DenseCoord(2, 1, 1, 0))),
              ElementsAre(2, 3, 6, 7));
}

TEST(DeriveCoordShardTest, FusedQkvWithGqaBlocks) {
  // Q has 4 rows, K and V 2 each: tp 2 gives each rank 2 Q rows, 1 K, 1 V.
  v1::TensorSpec t = Tensor("qkv", {8, 1});
  SetTpSplit(&t, 0, {4, 2, 2});
  EXPECT_THAT(LocalContent(t, DeriveCoordShard(t, DenseCoord(2, 1, 0, 0))),
              ElementsAre(0, 1, 4, 6));
  EXPECT_THAT(LocalContent(t, DeriveCoordShard(t, DenseCoord(2, 1, 1, 0))),
              ElementsAre(2, 3, 5, 7));
}

TEST(DeriveCoordShardTest, GluGateUpBlocksUneven) {
  v1::TensorSpec t = Tensor("fc1", {6, 1});
  SetTpSplit(&t, 0, {3, 3});
  // each block of 3 rows split 2 + 1
  EXPECT_THAT(LocalContent(t, DeriveCoordShard(t, DenseCoord(2, 1, 0, 0))),
              ElementsAre(0, 1, 3, 4));
  EXPECT_THAT(LocalContent(t, DeriveCoordShard(t, DenseCoord(2, 1, 1, 0))), ElementsAre(2, 5));
}

TEST(DeriveCoordShardTest, DpSplitAcrossTpBlocks) {
  v1::TensorSpec t = Tensor("qkv", {8, 1});
  SetTpSplit(&t, 0, {4, 2, 2});
  SetDp(&t, v1::DP_SPLIT, 0);
  // tp rank 0 holds rows 0,1,4,6; dp 2 splits that local tensor in halves
  EXPECT_THAT(LocalContent(t, DeriveCoordShard(t, DenseCoord(2, 2, 0, 0))), ElementsAre(0, 1));
  EXPECT_THAT(LocalContent(t, DeriveCoordShard(t, DenseCoord(2, 2, 0, 1))), ElementsAre(4, 6));
}

TEST(DeriveCoordShardTest, FlatSplitWithPadding) {
  v1::TensorSpec t = Tensor("m", {2, 5});
  SetTpSplit(&t, 1);
  SetDp(&t, v1::DP_FLAT);
  // tp rank 0 holds columns 0..2 (local 2x3 = 6 elements): 0 1 2 5 6 7
  // dp 4: chunk 2 -> [0 1] [2 5] [6 7] [pad pad]
  EXPECT_THAT(LocalContent(t, DeriveCoordShard(t, DenseCoord(2, 4, 0, 1))), ElementsAre(2, 5));
  const CoordShard last = DeriveCoordShard(t, DenseCoord(2, 4, 0, 3));
  EXPECT_EQ(last.local_elements, 2);
  EXPECT_EQ(last.padding_offset, 0);
  EXPECT_THAT(LocalContent(t, last), ElementsAre(-1, -1));
  // tp rank 1: columns 3..4 -> 3 4 8 9; dp 3: chunk 2 -> [3 4] [8 9] []
  EXPECT_THAT(LocalContent(t, DeriveCoordShard(t, DenseCoord(2, 3, 1, 1))), ElementsAre(8, 9));
}

TEST(DeriveCoordShardTest, FlatChunkCrossingRowsInThreeDims) {
  v1::TensorSpec t = Tensor("x", {2, 3, 4});
  SetDp(&t, v1::DP_FLAT);
  // 24 elements, dp 5 -> chunk 5; rank 2 holds 10..14
  EXPECT_THAT(LocalContent(t, DeriveCoordShard(t, DenseCoord(1, 5, 0, 2))),
              ElementsAre(10, 11, 12, 13, 14));
  // rank 4 holds 20..23 and one padding element
  EXPECT_THAT(LocalContent(t, DeriveCoordShard(t, DenseCoord(1, 5, 0, 4))),
              ElementsAre(20, 21, 22, 23, -1));
}

TEST(DeriveShardsTest, PipelineHoldsOnlyOwningStage) {
  v1::Ptc ptc;
  ptc.set_num_layers(4);
  v1::TensorSpec t = Tensor("layers.3.w", {4});
  test_support::SetPipeline(&t, v1::PIPELINE_LAYER, 3);
  *ptc.add_tensors() = t;
  const auto shards = DeriveShards(ptc, test_support::MakeLayoutOnHosts(1, 2, 1, 2, 0, {0, 3}));
  ASSERT_EQ(shards.size(), 1u);
  EXPECT_EQ(shards[0].rank(), 1);
  std::vector<int64_t> shape(shards[0].local_shape().begin(), shards[0].local_shape().end());
  EXPECT_THAT(shape, ElementsAreArray({4}));
}

}  // namespace
}  // namespace reshard::planner
