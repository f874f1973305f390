// Mutation tests for the kinds of issue 13: small plans that are correct per
// docs/partitioning.md (built by the naive reference planner of
// reference_plan.h) are verified, then broken one way at a time; the verifier
// must reject each with a message naming the item, the rank and the position.
// The planner's own plans of the same cases are verified and broken too.
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "planner/planner.h"
#include "tests/support/job_builders.h"
#include "tests/verifier/reference_plan.h"
#include "verifier/verifier.h"

namespace reshard::verifier {
namespace {

using test_support::AddBlob;
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

struct Case {
  std::string name;
  v1::Ptc ptc;
  v1::Layout from, to;
  std::vector<std::string> lost_hosts;
  v1::TransferPlan plan;

  absl::Status Verify(const v1::TransferPlan& p) const {
    return VerifyPlan(ptc, from, to, lost_hosts, {}, p);
  }
};

Case Planned(Case c) {
  absl::StatusOr<v1::TransferPlan> plan =
      testing::ReferencePlan(c.ptc, c.from, c.to, c.lost_hosts, {});
  EXPECT_TRUE(plan.ok()) << c.name << ": " << plan.status();
  if (plan.ok()) c.plan = *plan;
  return c;
}

// Context parallelism: tp 2 x cp 2 on a -> cp 2 x dp 2 on a and c.
Case CpCase() {
  Case c;
  c.name = "cp";
  c.ptc.set_num_layers(1);
  AddTensor(&c.ptc, "rep", {2});
  SetDp(AddTensor(&c.ptc, "split", {4}), v1::DP_SPLIT);
  SetDp(AddTensor(&c.ptc, "flat", {7}), v1::DP_FLAT);  // G 4: 2 each, 1 padded
  c.from = With(MakeLayout(2, 1, 1, {"a"}, 4), Extra{.cp = 2});
  c.to = With(MakeLayout(1, 1, 2, {"a", "c"}, 2), Extra{.cp = 2});
  return Planned(c);
}

// Interleaved stages with tied embeddings: pp 2 x vpp 2 -> pp 2 on a and b.
Case VppCase() {
  Case c;
  c.name = "vpp";
  c.ptc.set_num_layers(4);
  for (int l = 0; l < 4; ++l) {
    SetPipeline(AddTensor(&c.ptc, "layer" + std::to_string(l), {3}), v1::PIPELINE_LAYER, l);
  }
  SetPipeline(AddTensor(&c.ptc, "emb", {2}), v1::PIPELINE_FIRST_AND_LAST_STAGE);
  SetLayers(AddTensor(&c.ptc, "rel", {2}), {1, 3});
  c.from = With(MakeLayout(1, 2, 1, {"a"}, 2), Extra{.vpp = 2});
  c.to = MakeLayout(1, 2, 1, {"a", "b"}, 1);
  return Planned(c);
}

// Vocabulary padding: tp 1 (6 rows held) x dp 2 on a, b -> tp 2 (8 rows) on a.
Case PaddingCase() {
  Case c;
  c.name = "padding";
  c.ptc.set_num_layers(1);
  v1::TensorSpec* emb = AddTensor(&c.ptc, "emb", {5, 2});
  SetTpSplit(emb, 0);
  SetPadding(emb, 0, 2, true);
  c.from = MakeLayout(1, 1, 2, {"a", "b"}, 1);
  c.to = MakeLayout(2, 1, 1, {"a"}, 2);
  return Planned(c);
}

// Grouped-query attention: 2 KV heads of 2 rows, tp 2 -> tp 4 (replicated) on a.
Case GqaCase() {
  Case c;
  c.name = "gqa";
  c.ptc.set_num_layers(1);
  v1::TensorSpec* qkv = AddTensor(&c.ptc, "qkv", {16});
  SetTpSplit(qkv, 0, {8, 4, 4});
  SetGranularity(qkv, 2);
  c.from = MakeLayout(2, 1, 1, {"a"}, 2);
  c.to = MakeLayout(4, 1, 1, {"a"}, 4);
  return Planned(c);
}

// Experts: 4 experts, ep 2 x dp 2 -> ep 2 x dp 4 (edp 2) on a.
Case ExpertCase() {
  Case c;
  c.name = "expert";
  c.ptc.set_num_layers(1);
  SetExpert(AddTensor(&c.ptc, "experts", {4, 2}), 0);
  c.from = With(MakeLayout(1, 1, 2, {"a"}, 2), Extra{.ep = 2});
  c.to = With(MakeLayout(1, 1, 4, {"a"}, 4), Extra{.ep = 2});
  return Planned(c);
}

// DTensor Shard(0): dp 3 on a -> dp 2 on b.
Case ChunkCase() {
  Case c;
  c.name = "chunk";
  c.ptc.set_num_layers(1);
  SetDp(AddTensor(&c.ptc, "w", {5, 2}), v1::DP_CHUNK, 0);
  c.from = MakeLayout(1, 1, 3, {"a"}, 3);
  c.to = MakeLayout(1, 1, 2, {"b"}, 2);
  return Planned(c);
}

// Buckets (align 4, >= 6 elements): dp 2 on a -> dp 3 on a and b.
Case BucketCase() {
  Case c;
  c.name = "bucket";
  c.ptc.set_num_layers(1);
  AddGroup(&c.ptc, "grads", 4, 6, 1);
  for (auto [name, n] : {std::pair<const char*, int64_t>{"a", 3}, {"b", 2}, {"c", 5}}) {
    SetBucket(AddTensor(&c.ptc, name, {n}), "grads");
  }
  c.from = MakeLayout(1, 1, 2, {"a"}, 2);
  c.to = MakeLayout(1, 1, 3, {"a", "b"}, 2);
  c.to.mutable_placement()->clear_hosts();
  c.to.mutable_placement()->clear_devices_per_host();
  for (auto [host, device] : {std::pair<const char*, int>{"a", 0}, {"a", 1}, {"b", 0}}) {
    v1::DeviceSlot* s = c.to.mutable_placement()->add_ranks();
    s->set_host(host);
    s->set_device(device);
  }
  return Planned(c);
}

// A regenerable RNG state: host b is lost, new rank 1 regenerates its value.
Case RegenCase() {
  Case c;
  c.name = "regen";
  c.ptc.set_num_layers(1);
  AddTensor(&c.ptc, "w", {3});
  AddBlob(&c.ptc, "rng", 4, v1::BLOB_PER_RANK);
  c.ptc.mutable_blobs(0)->set_regenerable(true);
  c.from = MakeLayout(1, 1, 2, {"a", "b"}, 1);
  c.to = MakeLayout(1, 1, 2, {"a", "c"}, 1);
  c.lost_hosts = {"b"};
  return Planned(c);
}

std::vector<Case> AllCases() {
  return {CpCase(),     VppCase(),   PaddingCase(), GqaCase(),
          ExpertCase(), ChunkCase(), BucketCase(),  RegenCase()};
}

// The status is a rejection naming every needle.
void ExpectCaught(const absl::Status& s, const std::vector<std::string>& needles) {
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  for (const std::string& n : needles) {
    EXPECT_NE(std::string(s.message()).find(n), std::string::npos)
        << "wanted \"" << n << "\" in: " << s.message();
  }
}

// Moves destination (rank, pos) of `item` out of its step into a step of its
// own reading old rank `src` at `src_offset`.
void Redirect(v1::TransferPlan* plan, int item, int rank, int64_t pos, int src,
              int64_t src_offset) {
  for (auto& s : *plan->mutable_steps()) {
    if (s.item() != item) continue;
    for (int d = 0; d < s.dsts_size(); ++d) {
      if (s.dsts(d).rank() != rank || s.dsts(d).region().offset() != pos) continue;
      if (s.dsts_size() == 1) {
        s.set_src_rank(src);
        s.mutable_src()->set_offset(src_offset);
        return;
      }
      v1::CopyStep moved = s;
      moved.clear_dsts();
      *moved.add_dsts() = s.dsts(d);
      moved.set_src_rank(src);
      moved.mutable_src()->set_offset(src_offset);
      s.mutable_dsts()->DeleteSubrange(d, 1);
      *plan->add_steps() = moved;
      return;
    }
  }
  ADD_FAILURE() << "no step writes position " << pos << " of new rank " << rank;
}

TEST(MutationTest, ReferencePlansOfEveryNewKindVerify) {
  for (const Case& c : AllCases()) {
    EXPECT_TRUE(c.Verify(c.plan).ok()) << c.name << ": " << c.Verify(c.plan);
    EXPECT_GT(c.plan.steps_size(), 0) << c.name;
  }
}

TEST(MutationTest, HandWrittenPaddedVocabularyPlan) {
  // emb [5, 2] fp32 padded to a multiple of 2 x tp: 6 rows on tp 1 (a:0),
  // 8 on tp 2 (a:0, a:1). Rank 0 gets rows 0..3 from its own device, rank 1
  // row 4 from a:0 and zeros for its 3 padding rows.
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  v1::TensorSpec* emb = AddTensor(&ptc, "emb", {5, 2});
  SetTpSplit(emb, 0);
  SetPadding(emb, 0, 2, true);
  const v1::Layout from = MakeLayout(1, 1, 1, {"a"}, 2);
  const v1::Layout to = MakeLayout(2, 1, 1, {"a"}, 2);
  v1::TransferPlan plan;
  *plan.mutable_source_layout() = from;
  *plan.mutable_target_layout() = to;
  v1::PlanItem* item = plan.add_items();
  item->set_name("emb");
  item->set_element_bytes(4);
  for (auto [src_offset, count, dst] : {std::tuple<int64_t, int64_t, int>{0, 8, 0}, {8, 2, 1}}) {
    v1::CopyStep* s = plan.add_steps();
    s->set_src_rank(0);
    s->mutable_src()->set_offset(src_offset);
    s->mutable_src()->add_strides(1);
    s->add_shape(count);
    v1::Destination* d = s->add_dsts();
    d->set_rank(dst);
    d->mutable_region()->add_strides(1);
    s->set_bytes(count * 4);
  }
  v1::ZeroFill* z = plan.add_zero_fills();
  z->set_rank(1);
  z->set_offset(2);
  z->set_count(6);
  v1::PlanStats* st = plan.mutable_stats();
  st->set_bytes_local(40);
  st->set_bytes_zero_filled(24);
  st->set_steps(2);
  st->set_zero_fills(1);
  v1::HostTraffic* a = st->add_hosts();
  a->set_host("a");
  a->set_bytes_local(40);
  EXPECT_TRUE(VerifyPlan(ptc, from, to, {}, {}, plan).ok())
      << VerifyPlan(ptc, from, to, {}, {}, plan);

  v1::TransferPlan bad = plan;
  bad.mutable_steps(1)->mutable_src()->set_offset(10);  // row 5: padding at tp 1
  ExpectCaught(VerifyPlan(ptc, from, to, {}, {}, bad),
               {"item 0 (tensor \"emb\")", "reads padding at position 10 of old rank 0"});
  bad = plan;
  bad.mutable_zero_fills(0)->set_offset(1);  // over row 4's second element
  ExpectCaught(VerifyPlan(ptc, from, to, {}, {}, bad),
               {"item 0 (tensor \"emb\")", "writes position 1 of new rank 1 a second time"});
}

TEST(MutationTest, CopyMovedToTheWrongElement) {
  // In every case: two single-destination copies of one item into one new
  // rank trade places.
  for (const Case& c : AllCases()) {
    SCOPED_TRACE(c.name);
    v1::TransferPlan bad = c.plan;
    bool done = false;
    for (int i = 0; i < bad.steps_size() && !done; ++i) {
      for (int j = i + 1; j < bad.steps_size() && !done; ++j) {
        v1::CopyStep &a = *bad.mutable_steps(i), &b = *bad.mutable_steps(j);
        if (a.item() != b.item() || a.dsts(0).rank() != b.dsts(0).rank()) continue;
        const int64_t pa = a.dsts(0).region().offset(), pb = b.dsts(0).region().offset();
        a.mutable_dsts(0)->mutable_region()->set_offset(pb);
        b.mutable_dsts(0)->mutable_region()->set_offset(pa);
        ExpectCaught(c.Verify(bad), {"item " + std::to_string(a.item()),
                                     "\"" + c.plan.items(a.item()).name() + "\"",
                                     "new rank " + std::to_string(a.dsts(0).rank()), "position"});
        done = true;
      }
    }
    EXPECT_TRUE(done) << "no two copies into one rank";
  }
}

TEST(MutationTest, DroppedZeroFillOfAxisPadding) {
  Case c = PaddingCase();
  // Rank 1 of tp 2 holds rows 4..7: row 4 real, positions 2..7 padding.
  ASSERT_EQ(c.plan.zero_fills_size(), 1);
  EXPECT_EQ(c.plan.zero_fills(0).rank(), 1);
  EXPECT_EQ(c.plan.zero_fills(0).offset(), 2);
  EXPECT_EQ(c.plan.zero_fills(0).count(), 6);
  v1::TransferPlan bad = c.plan;
  bad.clear_zero_fills();
  ExpectCaught(c.Verify(bad),
               {"item 0 (tensor \"emb\")", "position 2 of new rank 1 is never written", "padding"});
  bad = c.plan;
  bad.mutable_zero_fills(0)->set_count(5);  // one padding row left unwritten
  ExpectCaught(c.Verify(bad), {"\"emb\"", "position 7 of new rank 1 is never written"});
}

TEST(MutationTest, PaddingRowUsedAsSource) {
  Case c = PaddingCase();
  // Old rank 0 (tp 1) holds 6 rows: positions 10, 11 are the padding row 5.
  v1::TransferPlan bad = c.plan;
  Redirect(&bad, 0, 1, 0, 0, 10);
  ExpectCaught(c.Verify(bad), {"item 0 (tensor \"emb\")",
                               "reads padding at position 10 of old "
                               "rank 0"});
}

TEST(MutationTest, BucketRangeShiftedByTheAlignment) {
  Case c = BucketCase();
  // A planner that forgot param_align 4 lays b at 3 instead of 4, c at 5
  // instead of 8: its copies land on the wrong positions.
  v1::Ptc unaligned = c.ptc;
  unaligned.mutable_buckets(0)->set_param_align(1);
  absl::StatusOr<v1::TransferPlan> bad =
      testing::ReferencePlan(unaligned, c.from, c.to, c.lost_hosts, {});
  ASSERT_TRUE(bad.ok()) << bad.status();
  ExpectCaught(c.Verify(*bad), {"tensor \"", "rank", "position"});
  // The same shift by hand: new rank 1's range of "c" moved by 4 positions.
  v1::TransferPlan shifted = c.plan;
  int moved = 0;
  for (auto& s : *shifted.mutable_steps()) {
    for (auto& d : *s.mutable_dsts()) {
      if (s.item() == 2 && d.rank() == 1) {
        d.mutable_region()->set_offset(d.region().offset() + 4);
        ++moved;
      }
    }
  }
  ASSERT_GT(moved, 0);
  ExpectCaught(c.Verify(shifted), {"item 2 (tensor \"c\")", "new rank 1", "position"});
}

TEST(MutationTest, GqaReplicaFromTheWrongTpRank) {
  Case c = GqaCase();
  // At tp 4 new rank 1 holds q rows 2, 3 then KV unit 0: row 8 at position 2.
  // Old tp-2 rank 0 holds row 8 at position 4; old rank 1 holds row 10 there.
  v1::TransferPlan bad = c.plan;
  Redirect(&bad, 0, 1, 2, 1, 4);
  ExpectCaught(c.Verify(bad),
               {"item 0 (tensor \"qkv\")",
                "position 2 of new rank 1 holds element [10], expected element [8]"});
  // Same device first: in place at tp 4, new rank 1 must read its own old
  // rank 1, not old rank 0's replica of the same unit.
  Case same = c;
  same.from = c.to;
  same = Planned(same);
  ASSERT_TRUE(same.Verify(same.plan).ok()) << same.Verify(same.plan);
  bad = same.plan;
  Redirect(&bad, 0, 1, 2, 0, 2);
  ExpectCaught(same.Verify(bad),
               {"item 0 (tensor \"qkv\")", "new rank 1", "element [8] (position 2)",
                "old rank 1 on its own device holds it"});
}

TEST(MutationTest, ExpertSlabFromTheWrongEpRank) {
  Case c = ExpertCase();
  // New rank 2 (ep_i 0) holds experts 0, 1; old rank 1 (ep_i 1) holds 2, 3.
  v1::TransferPlan bad = c.plan;
  Redirect(&bad, 0, 2, 0, 1, 0);
  ExpectCaught(c.Verify(bad),
               {"item 0 (tensor \"experts\")",
                "position 0 of new rank 2 holds element [2, 0], expected element [0, 0]"});
}

TEST(MutationTest, MissingOrExtraRegenerateEntry) {
  Case c = RegenCase();
  ASSERT_EQ(c.plan.regenerate_size(), 1);
  EXPECT_EQ(c.plan.regenerate(0).rank(), 1);
  EXPECT_EQ(c.plan.regenerate(0).item(), 1);
  v1::TransferPlan bad = c.plan;
  bad.clear_regenerate();
  ExpectCaught(c.Verify(bad),
               {"item 1 (blob \"rng\")", "new rank 1, positions [0, 4)", "regenerate"});
  bad = c.plan;
  v1::Regenerate* extra = bad.add_regenerate();
  extra->set_rank(0);
  extra->set_item(1);
  ExpectCaught(c.Verify(bad), {"regenerate entry 1", "new rank 0", "\"rng\""});
  bad = c.plan;
  bad.clear_zero_fills();  // the regenerated value must still be zeroed
  ExpectCaught(c.Verify(bad), {"item 1 (blob \"rng\")", "position 0 of new rank 1"});
}

TEST(MutationTest, CrossHostStepAboveTheLowerBound) {
  Case c = CpCase();
  // "rep" crosses to host c once per element, for both new ranks there (2, 3).
  int step = -1;
  for (int i = 0; i < c.plan.steps_size(); ++i) {
    if (c.plan.steps(i).cross_host() && c.plan.steps(i).dsts_size() == 2) step = i;
  }
  ASSERT_GE(step, 0);
  v1::TransferPlan bad = c.plan;
  const v1::CopyStep& s = bad.steps(step);
  const int rank = s.dsts(1).rank();
  const int64_t pos = s.dsts(1).region().offset();
  Redirect(&bad, s.item(), rank, pos, s.src_rank(), s.src().offset());
  ExpectCaught(c.Verify(bad),
               {"item " + std::to_string(s.item()), "crosses to host \"c\"",
                "new rank " + std::to_string(rank) + ", position " + std::to_string(pos),
                "a second time", "lower bound"});
}

// The real planner's plans of the same cases (strided multi-element steps)
// verify, and the same kinds of break in them are caught.
TEST(MutationTest, PlannerPlansOfEveryNewKindAndTheirMutations) {
  for (const Case& c : AllCases()) {
    SCOPED_TRACE(c.name);
    planner::LostSet lost;
    lost.hosts = c.lost_hosts;
    absl::StatusOr<v1::TransferPlan> planned = planner::PlanTransfer(c.ptc, c.from, c.to, lost);
    ASSERT_TRUE(planned.ok()) << planned.status();
    const v1::TransferPlan& plan = *planned;
    EXPECT_TRUE(c.Verify(plan).ok()) << c.Verify(plan);
    for (int i = 0; i < plan.steps_size(); ++i) {
      const v1::CopyStep& s = plan.steps(i);
      const std::string item = "item " + std::to_string(s.item());
      // A copy moved by one element.
      v1::TransferPlan bad = plan;
      auto* d = bad.mutable_steps(i)->mutable_dsts(0)->mutable_region();
      d->set_offset(d->offset() + 1);
      ExpectCaught(c.Verify(bad), {item, "rank", "position"});
      // One destination of a cross-host step sent again on its own.
      if (s.cross_host() && s.dsts_size() > 1) {
        bad = plan;
        v1::CopyStep again = s;
        again.clear_dsts();
        *again.add_dsts() = s.dsts(1);
        bad.mutable_steps(i)->mutable_dsts()->DeleteSubrange(1, 1);
        *bad.add_steps() = again;
        ExpectCaught(c.Verify(bad), {item, "new rank " + std::to_string(s.dsts(1).rank()),
                                     "position", "a second time"});
      }
    }
    for (int f = 0; f < plan.zero_fills_size(); ++f) {  // axis padding, bucket gaps, regenerated
      v1::TransferPlan bad = plan;
      bad.mutable_zero_fills()->DeleteSubrange(f, 1);
      ExpectCaught(c.Verify(bad),
                   {"item " + std::to_string(plan.zero_fills(f).item()),
                    "new rank " + std::to_string(plan.zero_fills(f).rank()), "never written"});
    }
    if (plan.regenerate_size() > 0) {
      v1::TransferPlan bad = plan;
      bad.clear_regenerate();
      ExpectCaught(c.Verify(bad), {"regenerate", "new rank", "positions"});
    }
  }
}

}  // namespace
}  // namespace reshard::verifier
