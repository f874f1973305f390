#include <vector>

#include "agent/shard_store/shard_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/shard.h"
#include "planner/validate.h"
#include "tests/support/job_builders.h"

namespace reshard::agent {
namespace {

using ::testing::ElementsAre;

using ::reshard::test_support::MakeLayout;
using ::reshard::test_support::SetDp;
using ::reshard::test_support::SetTpSplit;
using ::reshard::test_support::Tensor;

// tp 2 x pp 2 x dp 2 (rank = tp + 2 dp + 4 pp), two layers, one per stage.
struct SmallJob {
  v1::Ptc ptc;
  v1::Layout layout;
};

SmallJob MakeSmallJob() {
  SmallJob j;
  j.ptc.set_num_layers(2);
  // [10, 6] fp32 split over tp along rows, first stage only: [5, 6] x 4 bytes.
  v1::TensorSpec embed = Tensor("embed", {10, 6}, v1::DTYPE_FLOAT32);
  SetTpSplit(&embed, 0);
  embed.mutable_partition()->mutable_pipeline()->set_mode(v1::PIPELINE_FIRST_STAGE);
  // [3, 6] bf16 split over tp along columns ([3, 3] = 9 elements), at layer 1
  // (stage 1), flattened over dp 2: 5 elements each, the second with one of
  // padding: 10 bytes.
  v1::TensorSpec w = Tensor("layers.1.w", {3, 6}, v1::DTYPE_BFLOAT16);
  SetTpSplit(&w, 1);
  w.mutable_partition()->mutable_pipeline()->set_mode(v1::PIPELINE_LAYER);
  w.mutable_partition()->mutable_pipeline()->set_layer(1);
  SetDp(&w, v1::DP_FLAT);
  // [8] fp64 on every stage, split over dp: 4 x 8 bytes.
  v1::TensorSpec norm = Tensor("norm", {8}, v1::DTYPE_FLOAT64);
  SetDp(&norm, v1::DP_SPLIT, 0);
  *j.ptc.add_tensors() = embed;
  *j.ptc.add_tensors() = w;
  *j.ptc.add_tensors() = norm;
  v1::BlobSpec* step = j.ptc.add_blobs();
  step->set_name("step");
  step->set_size_bytes(8);
  v1::BlobSpec* rng = j.ptc.add_blobs();
  rng->set_name("rng");
  rng->set_size_bytes(100);
  rng->set_scope(v1::BLOB_PER_RANK);

  j.layout = MakeLayout(2, 2, 2, {"h0", "h1"}, 4);
  return j;
}

TEST(RankItemBytesTest, SmallSpecGivesExactSizes) {
  const SmallJob j = MakeSmallJob();
  ASSERT_TRUE(planner::ValidatePtc(j.ptc).ok());
  ASSERT_TRUE(planner::ValidateLayout(j.ptc, j.layout, "layout").ok());
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_THAT(RankItemBytes(j.ptc, j.layout, rank), ElementsAre(120, 0, 32, 8, 100))
        << "rank " << rank;
  }
  for (int rank = 4; rank < 8; ++rank) {
    EXPECT_THAT(RankItemBytes(j.ptc, j.layout, rank), ElementsAre(0, 10, 32, 8, 100))
        << "rank " << rank;
  }
}

TEST(RankItemBytesTest, AllRanksMatchesOneRankAtATime) {
  const SmallJob j = MakeSmallJob();
  const std::vector<std::vector<int64_t>> all = AllRankItemBytes(j.ptc, j.layout);
  ASSERT_EQ(all.size(), 8u);
  for (int rank = 0; rank < 8; ++rank) {
    EXPECT_EQ(all[rank], RankItemBytes(j.ptc, j.layout, rank)) << "rank " << rank;
  }
}

TEST(RankItemBytesTest, DpFlatPaddingIsCounted) {
  const SmallJob j = MakeSmallJob();
  // Rank 5 is (tp 1, dp 0, pp 1), rank 6 is (tp 0, dp 1, pp 1): the second
  // flat range holds 4 elements and 1 of padding.
  const planner::CoordShard last =
      planner::DeriveCoordShard(j.ptc.tensors(1), planner::DenseCoord(2, 2, 0, 1));
  EXPECT_EQ(last.local_elements, 5);
  EXPECT_EQ(last.padding_offset, 4);
  EXPECT_EQ(RankItemBytes(j.ptc, j.layout, 6)[1], 10);
}

TEST(LayoutItemsTest, AlignsEveryItemTo64Bytes) {
  int64_t total = 0;
  const std::vector<ItemSlot> slots = LayoutItems({120, 0, 32, 8, 100}, &total);
  ASSERT_EQ(slots.size(), 5u);
  EXPECT_EQ(slots[0].offset, 0);
  EXPECT_EQ(slots[1].offset, 128);
  EXPECT_EQ(slots[1].bytes, 0);
  EXPECT_EQ(slots[2].offset, 128);
  EXPECT_EQ(slots[3].offset, 192);
  EXPECT_EQ(slots[4].offset, 256);
  EXPECT_EQ(slots[4].bytes, 100);
  EXPECT_EQ(total, 384);
  LayoutItems({}, &total);
  EXPECT_EQ(total, 0);
}

TEST(ChecksumTest, IsXxh3OfTheBytes) {
  const std::vector<uint8_t> a(100, 7), b(100, 7);
  EXPECT_EQ(Checksum(a.data(), a.size()), Checksum(b.data(), b.size()));
  EXPECT_NE(Checksum(a.data(), a.size()), Checksum(a.data(), a.size() - 1));
}

}  // namespace
}  // namespace reshard::agent
