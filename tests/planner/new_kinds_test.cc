// Golden tests of the kinds of docs/partitioning.md added by issue 13: every
// expected shard and bucket position below is computed by hand from that page.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/bucket.h"
#include "planner/layout.h"
#include "planner/shard.h"
#include "planner/validate.h"
#include "tests/planner/shard_content.h"
#include "tests/support/job_builders.h"

namespace reshard::planner {
namespace {

using test_support::MakeLayoutOnHosts;
using test_support::SetTpSplit;
using test_support::Tensor;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using testing::LocalContent;

std::vector<int64_t> Range(int64_t begin, int64_t end) {
  std::vector<int64_t> v;
  for (int64_t i = begin; i < end; ++i) v.push_back(i);
  return v;
}

v1::TensorSpec& Pad(v1::TensorSpec& t, int axis, int64_t multiple, bool times_tp) {
  v1::AxisPadding* p = t.mutable_partition()->mutable_padding();
  p->set_axis(axis);
  p->set_multiple(multiple);
  p->set_times_tp(times_tp);
  return t;
}

TEST(HeldShapeTest, MegatronVocabularyPaddingDependsOnTp) {
  v1::TensorSpec emb = Tensor("emb", {50257, 8});
  SetTpSplit(&emb, 0);
  Pad(emb, 0, 128, true);
  EXPECT_EQ(HeldShape(emb, 1)[0], 50304);  // 393 * 128
  EXPECT_EQ(HeldShape(emb, 2)[0], 50432);  // 197 * 256
  EXPECT_EQ(HeldShape(emb, 4)[0], 50688);  // 99 * 512
  EXPECT_EQ(HeldShape(emb, 4)[1], 8);
  // tp 4: 12672 rows each; rank 3 holds rows 38016..50256 and 431 rows of
  // padding at its end.
  const CoordShard last = DeriveCoordShard(emb, DenseCoord(4, 1, 3, 0));
  EXPECT_EQ(last.local_elements, 12672 * 8);
  ASSERT_EQ(last.pieces.size(), 1u);
  EXPECT_EQ(last.pieces[0].global.offset[0], 38016);
  EXPECT_EQ(last.pieces[0].global.size[0], 50257 - 38016);
  EXPECT_THAT(last.padding, ElementsAre(std::make_pair(int64_t{12241} * 8, int64_t{431} * 8)));
  EXPECT_EQ(last.padding_offset, 12241 * 8);
  // tp 1: one rank, 47 rows of padding.
  const CoordShard whole = DeriveCoordShard(emb, DenseCoord(1, 1, 0, 0));
  EXPECT_THAT(whole.padding, ElementsAre(std::make_pair(int64_t{50257} * 8, int64_t{47} * 8)));
}

TEST(HeldShapeTest, PaddingOnAnInnerAxisLeavesGapsInEveryRow) {
  // [2, 3] padded on axis 1 to 4: row-major local buffer of 2 x 4, the last
  // column is padding.
  v1::TensorSpec t = Tensor("t", {2, 3});
  Pad(t, 1, 4, false);
  EXPECT_THAT(LocalContent(t, DeriveCoordShard(t, DenseCoord(1, 1, 0, 0))),
              ElementsAre(0, 1, 2, -1, 3, 4, 5, -1));
  // DP_FLAT over 3 ranks of the 8 held positions: chunk 3.
  test_support::SetDp(&t, v1::DP_FLAT);
  EXPECT_THAT(LocalContent(t, DeriveCoordShard(t, DenseCoord(1, 3, 0, 1))), ElementsAre(-1, 3, 4));
  EXPECT_THAT(LocalContent(t, DeriveCoordShard(t, DenseCoord(1, 3, 0, 2))), ElementsAre(5, -1, -1));
}

TEST(UnitsTest, GroupedQueryAttentionWithFewerKvHeadsThanTp) {
  // 8 query heads, 2 kv heads of 2 rows each, fused [q, k, v] on rows, tp 4:
  // every rank takes 2 q heads, and kv head i * 2 / 4 of k and of v.
  v1::TensorSpec qkv = Tensor("qkv", {24, 1});
  SetTpSplit(&qkv, 0, {16, 4, 4});
  qkv.mutable_partition()->mutable_tp()->set_granularity(2);
  EXPECT_THAT(LocalContent(qkv, DeriveCoordShard(qkv, DenseCoord(4, 1, 0, 0))),
              ElementsAre(0, 1, 2, 3, 16, 17, 20, 21));
  EXPECT_THAT(LocalContent(qkv, DeriveCoordShard(qkv, DenseCoord(4, 1, 1, 0))),
              ElementsAre(4, 5, 6, 7, 16, 17, 20, 21));
  EXPECT_THAT(LocalContent(qkv, DeriveCoordShard(qkv, DenseCoord(4, 1, 3, 0))),
              ElementsAre(12, 13, 14, 15, 18, 19, 22, 23));
  // At tp 2 the kv heads are split, one each.
  EXPECT_THAT(LocalContent(qkv, DeriveCoordShard(qkv, DenseCoord(2, 1, 1, 0))),
              ElementsAre(8, 9, 10, 11, 12, 13, 14, 15, 18, 19, 22, 23));
  // Granularity 0 keeps the element-wise split: 4 kv rows at tp 8 leave
  // ranks without kv rows instead of replicating.
  v1::TensorSpec old = qkv;
  old.mutable_partition()->mutable_tp()->set_granularity(0);
  EXPECT_THAT(LocalContent(old, DeriveCoordShard(old, DenseCoord(8, 1, 7, 0))),
              ElementsAre(14, 15));
}

TEST(LayoutTest, ContextParallelCoordinateAndGroup) {
  HostTable hosts;
  v1::Layout l = MakeLayoutOnHosts(2, 1, 2, 8);
  l.mutable_config()->set_cp(2);
  test_support::Place(&l, 8);
  const ResolvedLayout rl = ResolvedLayout::Resolve(l, 1, &hosts);
  EXPECT_EQ(rl.world(), 8);
  // rank = tp_i + tp * (cp_i + cp * dp_i)
  const RankCoord c = rl.Coord(6);
  EXPECT_EQ(c.tp, 0);
  EXPECT_EQ(c.cp, 1);
  EXPECT_EQ(c.dp, 1);
  EXPECT_EQ(rl.GroupIndex(c), 3);
  for (int r = 0; r < rl.world(); ++r) EXPECT_EQ(rl.Rank(rl.Coord(r)), r);
  l.mutable_config()->set_order(v1::RANK_ORDER_TP_PP_DP);
  l.mutable_config()->set_pp(2);
  l.mutable_config()->set_dp(1);
  test_support::Place(&l, 8);
  const ResolvedLayout pd = ResolvedLayout::Resolve(l, 2, &hosts);
  // rank = tp_i + tp * (cp_i + cp * (pp_i + pp * dp_i))
  EXPECT_EQ(pd.Rank(RankCoord{1, 0, 1, 1}), 1 + 2 * (1 + 2 * 1));
  for (int r = 0; r < pd.world(); ++r) EXPECT_EQ(pd.Rank(pd.Coord(r)), r);
  // A flat shard over the dp x cp group: rank 6 is g = 3 of 4.
  v1::TensorSpec t = Tensor("w", {8, 2});
  SetTpSplit(&t, 0);
  test_support::SetDp(&t, v1::DP_FLAT);
  EXPECT_THAT(LocalContent(t, DeriveCoordShard(t, CoordOfRank(t, rl, rl.Coord(6)))),
              ElementsAre(6, 7));
}

TEST(LayoutTest, ExpertCoordinatesWithEpBelowDpAndExpertTp) {
  HostTable hosts;
  // tp 2, dp 4, ep 2, expert_tp 1: edp = 8 / 2 = 4; l = tp_i + 2 * dp_i,
  // etp 0, ep_i = l % 2, edp_i = l / 2.
  v1::Layout l = MakeLayoutOnHosts(2, 1, 4, 8);
  l.mutable_config()->set_ep(2);
  l.mutable_config()->set_expert_tp(1);
  const ResolvedLayout rl = ResolvedLayout::Resolve(l, 1, &hosts);
  EXPECT_EQ(rl.edp(), 4);
  const ExpertCoord e = rl.Expert(rl.Coord(5));
  EXPECT_EQ(e.etp, 0);
  EXPECT_EQ(e.ep, 1);
  EXPECT_EQ(e.edp, 2);
  // Experts [4, 6, 2] on axis 0, tp split on axis 1 (by expert_tp 1: whole),
  // DP_FLAT over edp 4: rank 5 holds experts 2..3 (24 elements), chunk 6,
  // range 12..17: expert 3, rows 0..2.
  v1::TensorSpec w = Tensor("experts", {4, 6, 2});
  SetTpSplit(&w, 1);
  w.mutable_partition()->mutable_expert()->set_axis(0);
  test_support::SetDp(&w, v1::DP_FLAT);
  EXPECT_THAT(LocalContent(w, DeriveCoordShard(w, CoordOfRank(w, rl, rl.Coord(5)))),
              ElementsAreArray(Range(36, 42)));
  // expert_tp 2, ep 2 on tp 2 x dp 2: etp = tp_i, ep_i = dp_i, edp 1.
  v1::Layout l2 = MakeLayoutOnHosts(2, 1, 2, 4);
  l2.mutable_config()->set_ep(2);
  const ResolvedLayout rl2 = ResolvedLayout::Resolve(l2, 1, &hosts);
  test_support::SetDp(&w, v1::DP_REPLICATED);
  // Rank 3: experts 2..3, columns 3..5 of each.
  EXPECT_THAT(LocalContent(w, DeriveCoordShard(w, CoordOfRank(w, rl2, rl2.Coord(3)))),
              ElementsAre(30, 31, 32, 33, 34, 35, 42, 43, 44, 45, 46, 47));
}

TEST(LayoutTest, InterleavedStagesEightLayersOnTwoStages) {
  HostTable hosts;
  v1::Layout l = MakeLayoutOnHosts(1, 2, 1, 2);
  l.mutable_config()->set_vpp(2);
  const ResolvedLayout rl = ResolvedLayout::Resolve(l, 8, &hosts);
  // 4 chunks of 2 layers; chunk c on stage c % 2.
  std::vector<int> stage, chunk;
  for (int layer = 0; layer < 8; ++layer) {
    stage.push_back(rl.StageOfLayer(layer));
    chunk.push_back(rl.ChunkOfLayer(layer));
  }
  EXPECT_THAT(stage, ElementsAre(0, 0, 1, 1, 0, 0, 1, 1));
  EXPECT_THAT(chunk, ElementsAre(0, 0, 1, 1, 2, 2, 3, 3));
  v1::Pipeline p;
  p.set_mode(v1::PIPELINE_LAST_STAGE);
  EXPECT_EQ(rl.ChunkOf(p, 1), 3);
  p.set_mode(v1::PIPELINE_EVERY_STAGE);
  EXPECT_EQ(rl.ChunkOf(p, 0), 0);
  EXPECT_EQ(rl.ChunkOf(p, 1), 3);
  // Explicit chunk starts.
  l.mutable_config()->add_stage_starts(0);
  l.mutable_config()->add_stage_starts(1);
  l.mutable_config()->add_stage_starts(2);
  l.mutable_config()->add_stage_starts(7);
  const ResolvedLayout ex = ResolvedLayout::Resolve(l, 8, &hosts);
  EXPECT_EQ(ex.StageOfLayer(6), 0);  // chunk 2
  EXPECT_EQ(ex.StageOfLayer(7), 1);  // chunk 3
}

TEST(LayoutTest, TiedFirstAndLastAndLayerSets) {
  HostTable hosts;
  const ResolvedLayout rl = ResolvedLayout::Resolve(MakeLayoutOnHosts(1, 4, 1, 4), 12, &hosts);
  std::vector<int> stages;
  v1::Pipeline p;
  p.set_mode(v1::PIPELINE_FIRST_AND_LAST_STAGE);
  rl.StagesHolding(p, &stages);
  EXPECT_THAT(stages, ElementsAre(0, 3));
  const ResolvedLayout one = ResolvedLayout::Resolve(MakeLayoutOnHosts(1, 1, 1, 1), 12, &hosts);
  one.StagesHolding(p, &stages);
  EXPECT_THAT(stages, ElementsAre(0));
  // T5: the first encoder layer (0) and the first decoder layer (6).
  p.set_mode(v1::PIPELINE_LAYERS);
  p.add_layers(6);
  p.add_layers(0);
  rl.StagesHolding(p, &stages);
  EXPECT_THAT(stages, ElementsAre(0, 2));
  EXPECT_EQ(rl.ChunkOf(p, 2), 2);
}

v1::Ptc BucketPtc(const v1::BucketGroup& g, const std::vector<std::vector<int64_t>>& shapes) {
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  *ptc.add_buckets() = g;
  for (size_t i = 0; i < shapes.size(); ++i) {
    v1::TensorSpec t = Tensor(std::string(1, static_cast<char>('a' + i)), shapes[i]);
    t.mutable_partition()->mutable_dp()->set_mode(v1::DP_BUCKET);
    t.mutable_partition()->mutable_dp()->set_bucket(g.name());
    *ptc.add_tensors() = t;
  }
  return ptc;
}

TEST(BucketTest, MegatronLikeAlignedPaddedReversedBuckets) {
  v1::BucketGroup g;
  g.set_name("main");
  g.set_reverse_order(true);
  g.set_param_align(64);
  g.set_pad_multiple(128);
  g.set_bucket_elements(300);
  // Members a (100), b (50), c (200), laid out c, b, a: c at 0, b at 256
  // (aligned), the bucket closes at 306 -> padded to 384 (lcm(2, 128) =
  // 128); a at 384, the last bucket of 100 padded to 128.
  const std::vector<BucketSlot> slots = LayOutBucket(g, 2, {200, 50, 100});
  ASSERT_EQ(slots.size(), 3u);
  EXPECT_EQ(slots[0].start, 0);
  EXPECT_EQ(slots[1].start, 256);
  EXPECT_EQ(slots[2].start, 384);
  EXPECT_EQ(slots[0].bucket_size, 384);
  EXPECT_EQ(slots[1].bucket_begin, 0);
  EXPECT_EQ(slots[2].bucket_begin, 384);
  EXPECT_EQ(slots[2].bucket_size, 128);
  // Over dp 2: shard 0 holds [0, 192) and [384, 448); shard 1 [192, 384)
  // and [448, 512).
  const v1::Ptc ptc = BucketPtc(g, {{10, 10}, {5, 10}, {20, 10}});
  const std::vector<v1::Shard> shards = DeriveShards(ptc, MakeLayoutOnHosts(1, 1, 2, 2));
  ASSERT_EQ(shards.size(), 6u);
  std::vector<int64_t> elements;
  for (const v1::Shard& s : shards) elements.push_back(s.local_elements());
  EXPECT_THAT(elements, ElementsAre(64, 36, 0, 50, 192, 8));
  // Rank 1's c: elements 192..199, i.e. row 19, columns 2..9.
  ASSERT_EQ(shards[5].pieces_size(), 1);
  EXPECT_THAT(shards[5].pieces(0).global().offset(), ElementsAre(19, 2));
  EXPECT_THAT(shards[5].pieces(0).global().size(), ElementsAre(1, 8));
}

TEST(BucketTest, FsdpLikeFlatParameter) {
  v1::BucketGroup g;
  g.set_name("flat");
  // x (5) and y (6) in PTC order: 11 elements padded to 12 over 3 ranks.
  const v1::Ptc ptc = BucketPtc(g, {{5}, {6}});
  const std::vector<v1::Shard> shards = DeriveShards(ptc, MakeLayoutOnHosts(1, 1, 3, 3));
  std::vector<int64_t> elements;
  for (const v1::Shard& s : shards) elements.push_back(s.local_elements());
  EXPECT_THAT(elements, ElementsAre(4, 1, 0, 0, 3, 3));
  EXPECT_EQ(shards[4].pieces(0).global().offset(0), 0);  // y on rank 1: 0..2
  EXPECT_EQ(shards[5].pieces(0).global().offset(0), 3);  // y on rank 2: 3..5
}

TEST(BucketTest, MembersPerChunkWithInterleavedStages) {
  // Each stage lays out the members of its own chunk from position 0: one
  // member of 4 elements per stage, 2 per rank over dp 2.
  v1::BucketGroup g;
  g.set_name("g");
  v1::Ptc ptc = BucketPtc(g, {{4}, {4}});
  test_support::SetPipeline(ptc.mutable_tensors(0), v1::PIPELINE_LAYER, 0);
  test_support::SetPipeline(ptc.mutable_tensors(1), v1::PIPELINE_LAYER, 1);
  ptc.set_num_layers(2);
  const std::vector<v1::Shard> shards = DeriveShards(ptc, MakeLayoutOnHosts(1, 2, 2, 4));
  std::vector<int64_t> elements;
  for (const v1::Shard& s : shards) elements.push_back(s.local_elements());
  EXPECT_THAT(elements, ElementsAre(2, 2, 2, 2));
}

}  // namespace
}  // namespace reshard::planner
