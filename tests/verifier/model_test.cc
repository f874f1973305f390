// Golden tests of the verifier's model for the kinds of issue 13: what each
// rank holds, worked out by hand from docs/partitioning.md in each test.
#include "verifier/model.h"

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "planner/planner.h"
#include "tests/support/job_builders.h"
#include "verifier/verifier.h"

namespace reshard::verifier {
namespace {

using test_support::AddGroup;
using test_support::AddTensor;
using test_support::Extra;
using test_support::MakeLayout;
using test_support::SetBucket;
using test_support::SetDp;
using test_support::SetExpert;
using test_support::SetGranularity;
using test_support::SetLayers;
using test_support::SetPadding;
using test_support::SetPipeline;
using test_support::SetTpSplit;
using test_support::With;
using Ids = std::vector<std::vector<int64_t>>;
constexpr int64_t P = kPadding;

// What every rank of `layout` holds of each tensor (buffers of the target).
std::vector<Ids> Held(const v1::Ptc& ptc, const v1::Layout& layout) {
  absl::StatusOr<Model> m = BuildModel(ptc, layout, layout, {}, {});
  EXPECT_TRUE(m.ok()) << m.status();
  std::vector<Ids> out;
  if (!m.ok()) return out;
  for (const ModelItem& item : m->items) {
    EXPECT_EQ(item.old_buffers, item.new_buffers) << item.name;
    out.push_back(item.new_buffers);
  }
  return out;
}

TEST(ModelTest, ContextParallelRanksShareTensorsAndShardOverDpTimesCp) {
  // tp 2, cp 2, dp 1: rank = tp_i + 2 * cp_i; the dp group is cp (G = 2, g = cp_i).
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  AddTensor(&ptc, "rep", {2});
  SetDp(AddTensor(&ptc, "split", {4}), v1::DP_SPLIT);
  SetTpSplit(AddTensor(&ptc, "tp", {4}), 0);
  const std::vector<Ids> h = Held(ptc, With(MakeLayout(2, 1, 1, {"a"}, 4), Extra{.cp = 2}));
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[0], (Ids{{0, 1}, {0, 1}, {0, 1}, {0, 1}}));
  EXPECT_EQ(h[1], (Ids{{0, 1}, {0, 1}, {2, 3}, {2, 3}}));
  EXPECT_EQ(h[2], (Ids{{0, 1}, {2, 3}, {0, 1}, {2, 3}}));
}

TEST(ModelTest, ContextParallelInBothRankOrders) {
  // tp 1, cp 2, dp 2, pp 2, 2 layers; "w" on stage 1, DP_SPLIT over G = 4,
  // g = cp_i + 2 * dp_i.
  v1::Ptc ptc;
  ptc.set_num_layers(2);
  v1::TensorSpec* w = AddTensor(&ptc, "w", {4});
  SetPipeline(w, v1::PIPELINE_LAYER, 1);
  SetDp(w, v1::DP_SPLIT);
  // TP_DP_PP: rank = cp_i + 2 * (dp_i + 2 * pp_i): stage 1 is ranks 4..7, g = rank - 4.
  EXPECT_EQ(Held(ptc, With(MakeLayout(1, 2, 2, {"a"}, 8), Extra{.cp = 2}))[0],
            (Ids{{}, {}, {}, {}, {0}, {1}, {2}, {3}}));
  // TP_PP_DP: rank = cp_i + 2 * (pp_i + 2 * dp_i): stage 1 is ranks 2, 3, 6, 7.
  EXPECT_EQ(Held(ptc, With(MakeLayout(1, 2, 2, {"a"}, 8, {}, v1::RANK_ORDER_TP_PP_DP),
                           Extra{.cp = 2}))[0],
            (Ids{{}, {}, {0}, {1}, {}, {}, {2}, {3}}));
}

TEST(ModelTest, InterleavedStagesOwnNonContiguousLayers) {
  // pp 2, vpp 2, 5 layers, chunk starts [0, 1, 3, 4]: chunks [0,1) [1,3) [3,4)
  // [4,5) on stages 0, 1, 0, 1. Layer 3 is on stage 0, layer 2 on stage 1.
  v1::Ptc ptc;
  ptc.set_num_layers(5);
  SetPipeline(AddTensor(&ptc, "l3", {1}), v1::PIPELINE_LAYER, 3);
  SetPipeline(AddTensor(&ptc, "l2", {1}), v1::PIPELINE_LAYER, 2);
  SetLayers(AddTensor(&ptc, "tied", {1}), {3, 4});  // stages 0 and 1
  const std::vector<Ids> h =
      Held(ptc, With(MakeLayout(1, 2, 1, {"a"}, 2, {0, 1, 3, 4}), Extra{.vpp = 2}));
  EXPECT_EQ(h[0], (Ids{{0}, {}}));
  EXPECT_EQ(h[1], (Ids{{}, {0}}));
  EXPECT_EQ(h[2], (Ids{{0}, {0}}));
  // Even split of 4 layers into 4 chunks: layer c is chunk c, on stage c % 2.
  ptc.set_num_layers(4);
  ptc.mutable_tensors(2)->mutable_partition()->mutable_pipeline()->set_layers(0, 1);
  ptc.mutable_tensors(2)->mutable_partition()->mutable_pipeline()->set_layers(1, 3);
  const std::vector<Ids> even = Held(ptc, With(MakeLayout(1, 2, 1, {"a"}, 2), Extra{.vpp = 2}));
  EXPECT_EQ(even[0], (Ids{{}, {0}}));
  EXPECT_EQ(even[1], (Ids{{0}, {}}));
  EXPECT_EQ(even[2], (Ids{{}, {0}}));  // layers 1 and 3: both on stage 1
}

TEST(ModelTest, FirstAndLastStageAndLayerSets) {
  v1::Ptc ptc;
  ptc.set_num_layers(3);
  SetPipeline(AddTensor(&ptc, "emb", {2}), v1::PIPELINE_FIRST_AND_LAST_STAGE);
  SetLayers(AddTensor(&ptc, "t5", {1}), {1});
  const std::vector<Ids> h = Held(ptc, MakeLayout(1, 3, 1, {"a"}, 3));
  EXPECT_EQ(h[0], (Ids{{0, 1}, {}, {0, 1}}));
  EXPECT_EQ(h[1], (Ids{{}, {0}, {}}));
  EXPECT_EQ(Held(ptc, MakeLayout(1, 1, 1, {"a"}, 1))[0], (Ids{{0, 1}}));  // pp 1: one stage
}

TEST(ModelTest, VocabularyPaddingDependsOnTp) {
  // 5 rows x 2, padded to a multiple of 2 * tp: 6 rows at tp 1, 8 at tp 2.
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  v1::TensorSpec* emb = AddTensor(&ptc, "emb", {5, 2});
  SetTpSplit(emb, 0);
  SetPadding(emb, 0, 2, true);
  EXPECT_EQ(Held(ptc, MakeLayout(1, 1, 1, {"a"}, 1))[0],
            (Ids{{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, P, P}}));
  EXPECT_EQ(Held(ptc, MakeLayout(2, 1, 1, {"a"}, 2))[0],
            (Ids{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, P, P, P, P, P, P}}));
  // DP_FLAT over the held rows: 12 positions at tp 1 and dp 2 -> 6 each.
  SetDp(emb, v1::DP_FLAT);
  emb->mutable_partition()->mutable_tp()->set_mode(v1::TP_REPLICATED);
  EXPECT_EQ(Held(ptc, MakeLayout(1, 1, 2, {"a"}, 2))[0],
            (Ids{{0, 1, 2, 3, 4, 5}, {6, 7, 8, 9, P, P}}));
}

TEST(ModelTest, MegatronVocabularyExampleOfTheSpec) {
  // 50257 rows, make-vocab-size-divisible-by 128: held 50304 rows at tp 1,
  // 50432 at tp 2, 50688 at tp 4 (12672 per rank; the last holds 12241 real
  // rows and 431 padding rows).
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  v1::TensorSpec* emb = AddTensor(&ptc, "word_embeddings", {50257, 1});
  SetTpSplit(emb, 0);
  SetPadding(emb, 0, 128, true);
  for (auto [tp, held] : {std::pair<int, int64_t>{1, 50304}, {2, 50432}, {4, 50688}}) {
    const Ids h = Held(ptc, MakeLayout(tp, 1, 1, {"a"}, tp))[0];
    ASSERT_EQ(h.size(), static_cast<size_t>(tp));
    int64_t total = 0, padding = 0;
    for (const auto& buf : h) {
      EXPECT_EQ(static_cast<int64_t>(buf.size()), held / tp);
      total += static_cast<int64_t>(buf.size());
      padding += std::count(buf.begin(), buf.end(), P);
    }
    EXPECT_EQ(total, held) << "tp " << tp;
    EXPECT_EQ(padding, held - 50257) << "tp " << tp;
  }
  const Ids tp4 = Held(ptc, MakeLayout(4, 1, 1, {"a"}, 4))[0];
  EXPECT_EQ(tp4[3][12240], 50256);  // the last real row
  EXPECT_EQ(tp4[3][12241], P);
  EXPECT_EQ(std::count(tp4[3].begin(), tp4[3].end(), P), 431);
}

TEST(ModelTest, UnitsAndReplicationForGroupedQueryAttention) {
  // Fused QKV of 12 rows, heads of 2 rows: q 4 heads, k and v 1 head each.
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  v1::TensorSpec* qkv = AddTensor(&ptc, "qkv", {12});
  SetTpSplit(qkv, 0, {8, 2, 2});
  SetGranularity(qkv, 2);
  // tp 2: q 2 heads each; k, v (1 unit < 2) replicated on both ranks.
  EXPECT_EQ(Held(ptc, MakeLayout(2, 1, 1, {"a"}, 2))[0],
            (Ids{{0, 1, 2, 3, 8, 9, 10, 11}, {4, 5, 6, 7, 8, 9, 10, 11}}));
  // tp 4: one q head each, k and v on all four.
  EXPECT_EQ(
      Held(ptc, MakeLayout(4, 1, 1, {"a"}, 4))[0],
      (Ids{
          {0, 1, 8, 9, 10, 11}, {2, 3, 8, 9, 10, 11}, {4, 5, 8, 9, 10, 11}, {6, 7, 8, 9, 10, 11}}));
  // 2 KV heads at tp 4: ranks 0, 1 hold unit 0 and ranks 2, 3 unit 1.
  qkv->mutable_partition()->mutable_tp()->clear_blocks();
  for (int64_t b : {8, 4, 4}) qkv->mutable_partition()->mutable_tp()->add_blocks(b);
  qkv->set_shape(0, 16);
  EXPECT_EQ(Held(ptc, MakeLayout(4, 1, 1, {"a"}, 4))[0], (Ids{{0, 1, 8, 9, 12, 13},
                                                              {2, 3, 8, 9, 12, 13},
                                                              {4, 5, 10, 11, 14, 15},
                                                              {6, 7, 10, 11, 14, 15}}));
  // Granularity 0 keeps the element-wise split: block [1] at tp 2 -> rank 1 empty.
  v1::Ptc old;
  old.set_num_layers(1);
  v1::TensorSpec* b = AddTensor(&old, "b", {3});
  SetTpSplit(b, 0, {2, 1});
  b->mutable_partition()->set_allow_empty(true);
  EXPECT_EQ(Held(old, MakeLayout(2, 1, 1, {"a"}, 2))[0], (Ids{{0, 2}, {1}}));
}

TEST(ModelTest, ExpertSlabsWithExpertTpAndExpertDataParallel) {
  // 4 experts x 2 columns. tp 2, dp 2, ep 2, expert_tp 1: l = rank,
  // ep_i = l % 2, edp_i = l / 2 (edp 2).
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  v1::TensorSpec* e = AddTensor(&ptc, "experts", {4, 2});
  SetExpert(e, 0);
  SetTpSplit(e, 1);
  EXPECT_EQ(Held(ptc, With(MakeLayout(2, 1, 2, {"a"}, 4), Extra{.ep = 2, .expert_tp = 1}))[0],
            (Ids{{0, 1, 2, 3}, {4, 5, 6, 7}, {0, 1, 2, 3}, {4, 5, 6, 7}}));
  // expert_tp 2, ep 2 (edp 1): etp_i = l % 2, ep_i = l / 2.
  EXPECT_EQ(Held(ptc, With(MakeLayout(2, 1, 2, {"a"}, 4), Extra{.ep = 2, .expert_tp = 2}))[0],
            (Ids{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  // ep 2, expert_tp 1, DP_SPLIT on columns over edp 2.
  SetDp(e, v1::DP_SPLIT, 1);
  e->mutable_partition()->mutable_tp()->set_mode(v1::TP_REPLICATED);
  EXPECT_EQ(Held(ptc, With(MakeLayout(1, 1, 4, {"a"}, 4), Extra{.ep = 2}))[0],
            (Ids{{0, 2}, {4, 6}, {1, 3}, {5, 7}}));
}

TEST(ModelTest, EmptyExpertSlabNeedsAllowEmptyExceptInABucket) {
  // One expert over ep 2 (tp 1, dp 2, edp 1): expert rank 1 holds nothing.
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  AddGroup(&ptc, "g", 1, 0, 1);
  v1::TensorSpec* e = AddTensor(&ptc, "experts", {1, 2});
  SetExpert(e, 0);
  SetDp(e, v1::DP_FLAT);
  const v1::Layout l = With(MakeLayout(1, 1, 2, {"a"}, 2), Extra{.ep = 2});
  const absl::Status s = BuildModel(ptc, l, l, {}, {}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("rank 1 holds no element"), std::string::npos) << s;
  EXPECT_EQ(planner::PlanTransfer(ptc, l, l, {}).status().code(),
            absl::StatusCode::kInvalidArgument);  // the planner agrees
  e->mutable_partition()->set_allow_empty(true);
  EXPECT_EQ(Held(ptc, l)[0], (Ids{{0, 1}, {}}));
  // A bucket member needs no allow_empty; expert rank 0 holds all (edp 1).
  e->mutable_partition()->set_allow_empty(false);
  SetBucket(e, "g");
  EXPECT_EQ(Held(ptc, l)[0], (Ids{{0, 1}, {}}));
  EXPECT_TRUE(planner::PlanTransfer(ptc, l, l, {}).ok());
}

TEST(ModelTest, DataParallelChunkHasTorchChunkSizes) {
  // 5 rows over 4 ranks: chunks of ceil(5 / 4) = 2: [0,2) [2,4) [4,5) [5,5).
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  v1::TensorSpec* w = AddTensor(&ptc, "w", {5, 1});
  SetDp(w, v1::DP_CHUNK, 0);
  w->mutable_partition()->set_allow_empty(true);
  EXPECT_EQ(Held(ptc, MakeLayout(1, 1, 4, {"a"}, 4))[0], (Ids{{0, 1}, {2, 3}, {4}, {}}));
  w->mutable_partition()->set_allow_empty(false);
  const v1::Layout l = MakeLayout(1, 1, 4, {"a"}, 4);
  EXPECT_EQ(BuildModel(ptc, l, l, {}, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelTest, BucketLayoutWithAlignmentBucketSizeAndPadding) {
  // a [3], b [2], c [5]; align 4, buckets of >= 6 elements, dp 2 (q = 2):
  // a at 0, b at 4 -> pos 6 closes bucket [0, 6); c at 8 -> pos 13, last
  // bucket [6, 14). Shards: g0 [0,3) + [6,10), g1 [3,6) + [10,14).
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  AddGroup(&ptc, "grads", 4, 6, 1);
  for (auto [name, n] : {std::pair<const char*, int64_t>{"a", 3}, {"b", 2}, {"c", 5}}) {
    SetBucket(AddTensor(&ptc, name, {n}), "grads");
  }
  std::vector<Ids> h = Held(ptc, MakeLayout(1, 1, 2, {"a"}, 2));
  EXPECT_EQ(h[0], (Ids{{0, 1, 2}, {}}));
  EXPECT_EQ(h[1], (Ids{{}, {0, 1}}));
  EXPECT_EQ(h[2], (Ids{{0, 1}, {2, 3, 4}}));
  // Reversed (Megatron): c at 0, b at 8 -> pos 10 closes [0, 10); a at 12 ->
  // pos 15, bucket [10, 16). g0 [0,5) + [10,13), g1 [5,10) + [13,16).
  ptc.mutable_buckets(0)->set_reverse_order(true);
  h = Held(ptc, MakeLayout(1, 1, 2, {"a"}, 2));
  EXPECT_EQ(h[0], (Ids{{0}, {1, 2}}));
  EXPECT_EQ(h[1], (Ids{{}, {0, 1}}));
  EXPECT_EQ(h[2], (Ids{{0, 1, 2, 3, 4}, {}}));
  // pad_multiple 8 (q = lcm(2, 8) = 8), one bucket: a 0, b 4, c 8 -> 13 -> 16.
  // g0 [0, 8), g1 [8, 16).
  ptc.mutable_buckets(0)->set_reverse_order(false);
  ptc.mutable_buckets(0)->set_bucket_elements(0);
  ptc.mutable_buckets(0)->set_pad_multiple(8);
  h = Held(ptc, MakeLayout(1, 1, 2, {"a"}, 2));
  EXPECT_EQ(h[0], (Ids{{0, 1, 2}, {}}));
  EXPECT_EQ(h[1], (Ids{{0, 1}, {}}));
  EXPECT_EQ(h[2], (Ids{{}, {0, 1, 2, 3, 4}}));
}

TEST(ModelTest, MegatronAndFsdpBucketSettingsOfTheSpec) {
  // Megatron: reverse order, align 64, pad 128, dp 2 (q = 128). w2 [30] at 0,
  // w1 [100] at 64 -> 164 -> one bucket of 256: g0 [0, 128), g1 [128, 256).
  v1::Ptc mega;
  mega.set_num_layers(1);
  AddGroup(&mega, "main_params", 64, 0, 128, /*reverse_order=*/true);
  SetBucket(AddTensor(&mega, "w1", {100}), "main_params");
  SetBucket(AddTensor(&mega, "w2", {30}), "main_params");
  std::vector<Ids> h = Held(mega, MakeLayout(1, 1, 2, {"a"}, 2));
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0][0].size(), 64u);  // w1 positions 64..127
  EXPECT_EQ(h[0][0].front(), 0);
  EXPECT_EQ(h[0][1].size(), 36u);  // w1 positions 128..163
  EXPECT_EQ(h[0][1].front(), 64);
  EXPECT_EQ(h[1][0].size(), 30u);  // w2 whole on g0
  EXPECT_TRUE(h[1][1].empty());
  // FSDP flat parameter: PTC order, align 1, pad 1, dp 4 (q = 4): a [5] at 0,
  // b [4] at 5 -> 9 -> 12; shards of 3.
  v1::Ptc fsdp;
  fsdp.set_num_layers(1);
  AddGroup(&fsdp, "unit0", 1, 0, 1);
  SetBucket(AddTensor(&fsdp, "a", {5}), "unit0");
  SetBucket(AddTensor(&fsdp, "b", {4}), "unit0");
  h = Held(fsdp, MakeLayout(1, 1, 4, {"a"}, 4));
  EXPECT_EQ(h[0], (Ids{{0, 1, 2}, {3, 4}, {}, {}}));
  EXPECT_EQ(h[1], (Ids{{}, {0}, {1, 2, 3}, {}}));
}

TEST(ModelTest, BucketMembersOfEachChunkAreLaidOutSeparately) {
  // pp 1, vpp 2, 2 layers: x on chunk 0, y on chunk 1, both on stage 0; each
  // chunk's buffer is [0, 2), split over dp 2. Shared, y would be all on g1.
  v1::Ptc ptc;
  ptc.set_num_layers(2);
  AddGroup(&ptc, "g", 1, 0, 1);
  v1::TensorSpec* x = AddTensor(&ptc, "x", {2});
  SetPipeline(x, v1::PIPELINE_LAYER, 0);
  SetBucket(x, "g");
  v1::TensorSpec* y = AddTensor(&ptc, "y", {2});
  SetPipeline(y, v1::PIPELINE_LAYER, 1);
  SetBucket(y, "g");
  const std::vector<Ids> h = Held(ptc, With(MakeLayout(1, 1, 2, {"a"}, 2), Extra{.vpp = 2}));
  EXPECT_EQ(h[0], (Ids{{0}, {1}}));
  EXPECT_EQ(h[1], (Ids{{0}, {1}}));
}

TEST(ModelTest, BucketMembersDependOnTheRanksTpPiece) {
  // w [4] tp-split over 2, then v [2]: per tp rank, w contributes 2 elements,
  // v starts at 2; dp 2, one bucket of 4: g0 holds w, g1 holds v.
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  AddGroup(&ptc, "g", 1, 0, 1);
  v1::TensorSpec* w = AddTensor(&ptc, "w", {4});
  SetTpSplit(w, 0);
  SetBucket(w, "g");
  SetBucket(AddTensor(&ptc, "v", {2}), "g");
  const std::vector<Ids> h = Held(ptc, MakeLayout(2, 1, 2, {"a"}, 4));
  EXPECT_EQ(h[0], (Ids{{0, 1}, {2, 3}, {}, {}}));
  EXPECT_EQ(h[1], (Ids{{}, {}, {0, 1}, {0, 1}}));
}

TEST(ModelTest, RegenerableBlobWithoutHolderIsListedAndZeroed) {
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  test_support::AddBlob(&ptc, "rng", 2, v1::BLOB_PER_RANK);
  ptc.mutable_blobs(0)->set_regenerable(true);
  test_support::AddBlob(&ptc, "sched", 1, v1::BLOB_PER_RANK);
  const v1::Layout from = MakeLayout(1, 1, 2, {"a", "b"}, 1);
  const v1::Layout to = MakeLayout(1, 1, 2, {"a", "c"}, 1);
  absl::StatusOr<Model> m = BuildModel(ptc, from, to, {"b"}, {});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->regenerate, (std::vector<std::pair<int, int>>{{1, 0}}));
  EXPECT_EQ(m->items[0].new_buffers, (Ids{{0, 1}, {P, P}}));
  // The required blob has no holder: unrecoverable; the regenerable one is not.
  EXPECT_EQ(*UnrecoverableItems(ptc, from, to, {"b"}, {}), std::vector<std::string>{"sched"});
}

// Each bad input is refused with INVALID_ARGUMENT naming the field and value.
TEST(ModelTest, InvalidInputsOfTheNewKinds) {
  struct Bad {
    const char* needle;
    std::function<void(v1::Ptc*, v1::Layout*)> mutate;
  };
  const std::vector<Bad> bad = {
      {"the PTC holds no tensor and no blob", [](v1::Ptc* p, v1::Layout*) { p->clear_tensors(); }},
      {"cp is -1", [](v1::Ptc*, v1::Layout* l) { l->mutable_config()->set_cp(-1); }},
      {"vpp is -2", [](v1::Ptc*, v1::Layout* l) { l->mutable_config()->set_vpp(-2); }},
      {"not a multiple of expert_tp 2 x ep 3",
       [](v1::Ptc*, v1::Layout* l) { l->mutable_config()->set_ep(3); }},
      {"expert_tp is -1", [](v1::Ptc*, v1::Layout* l) { l->mutable_config()->set_expert_tp(-1); }},
      {"stage_starts [0, 1] for pp 2 x vpp 2",
       [](v1::Ptc*, v1::Layout* l) {
         l->mutable_config()->set_pp(2);
         l->mutable_config()->set_dp(1);
         l->mutable_config()->set_vpp(2);
         l->mutable_config()->add_stage_starts(0);
         l->mutable_config()->add_stage_starts(1);
       }},
      {"padding multiple 0",
       [](v1::Ptc* p, v1::Layout*) { SetPadding(p->mutable_tensors(0), 0, 0, true); }},
      {"padding axis 2 out of range",
       [](v1::Ptc* p, v1::Layout*) { SetPadding(p->mutable_tensors(0), 2, 2, false); }},
      {"padding with tp blocks [2, 2]",
       [](v1::Ptc* p, v1::Layout*) {
         SetTpSplit(p->mutable_tensors(0), 0, {2, 2});
         SetPadding(p->mutable_tensors(0), 0, 2, false);
       }},
      {"granularity -1",
       [](v1::Ptc* p, v1::Layout*) {
         SetTpSplit(p->mutable_tensors(0), 0);
         SetGranularity(p->mutable_tensors(0), -1);
       }},
      {"tp block 4 is not a multiple of granularity 3",
       [](v1::Ptc* p, v1::Layout*) {
         SetTpSplit(p->mutable_tensors(0), 0);
         SetGranularity(p->mutable_tensors(0), 3);
       }},
      {"tp block 0 has 2 units, fewer than tp 3 and not a divisor",
       [](v1::Ptc* p, v1::Layout* l) {
         SetTpSplit(p->mutable_tensors(0), 0);
         SetGranularity(p->mutable_tensors(0), 2);
         l->mutable_config()->set_tp(3);
         l->mutable_config()->set_dp(1);
       }},
      {"tp axis 0 is the expert axis",
       [](v1::Ptc* p, v1::Layout*) {
         SetTpSplit(p->mutable_tensors(0), 0);
         SetExpert(p->mutable_tensors(0), 0);
       }},
      {"expert axis 5 out of range",
       [](v1::Ptc* p, v1::Layout*) { SetExpert(p->mutable_tensors(0), 5); }},
      {"padding axis 1 is the expert axis",
       [](v1::Ptc* p, v1::Layout*) {
         SetExpert(p->mutable_tensors(0), 1);
         SetPadding(p->mutable_tensors(0), 1, 2, false);
       }},
      {"PIPELINE_LAYERS with no layers",
       [](v1::Ptc* p, v1::Layout*) { SetLayers(p->mutable_tensors(0), {}); }},
      {"layers has 7 outside [0, 2)",
       [](v1::Ptc* p, v1::Layout*) { SetLayers(p->mutable_tensors(0), {0, 7}); }},
      {"dp axis 3 out of range",
       [](v1::Ptc* p, v1::Layout*) { SetDp(p->mutable_tensors(0), v1::DP_CHUNK, 3); }},
      {"dp bucket \"nope\" is not in Ptc.buckets",
       [](v1::Ptc* p, v1::Layout*) { SetBucket(p->mutable_tensors(0), "nope"); }},
      {"bucket group \"g\": param_align is -4",
       [](v1::Ptc* p, v1::Layout*) { AddGroup(p, "g", -4, 0, 1); }},
      {"bucket group \"g\": name empty or repeated",
       [](v1::Ptc* p, v1::Layout*) {
         AddGroup(p, "g", 1, 0, 1);
         AddGroup(p, "g", 1, 0, 1);
       }},
      {"bucket group \"g\": has 1 dense and 1 expert members",
       [](v1::Ptc* p, v1::Layout*) {
         AddGroup(p, "g", 1, 0, 1);
         SetBucket(p->mutable_tensors(0), "g");
         v1::TensorSpec* e = AddTensor(p, "e", {2, 2});
         SetExpert(e, 0);
         SetBucket(e, "g");
       }},
  };
  for (const Bad& b : bad) {
    v1::Ptc ptc;
    ptc.set_num_layers(2);
    AddTensor(&ptc, "w", {4, 2});
    v1::Layout l = MakeLayout(2, 1, 2, {"a"}, 4);
    b.mutate(&ptc, &l);
    const absl::Status s = BuildModel(ptc, l, l, {}, {}).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << b.needle << ": " << s;
    EXPECT_NE(std::string(s.message()).find(b.needle), std::string::npos)
        << "wanted \"" << b.needle << "\" in: " << s.message();
    EXPECT_EQ(VerifyPlan(ptc, l, l, {}, {}, {}).code(), absl::StatusCode::kInvalidArgument)
        << b.needle;
    EXPECT_EQ(planner::PlanTransfer(ptc, l, l, {}).status().code(),
              absl::StatusCode::kInvalidArgument)
        << "the planner accepts what the verifier refuses: " << b.needle;
  }
}

}  // namespace
}  // namespace reshard::verifier
