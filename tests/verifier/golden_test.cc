// Hand-built transitions with stats worked out by hand; every plan is also
// checked by the independent verifier.
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "planner/planner.h"
#include "tests/support/job_builders.h"
#include "tests/verifier/jobs.h"
#include "verifier/verifier.h"

namespace reshard::verifier {
namespace {

using test_support::AddBlob;
using test_support::AddTensor;
using test_support::MakeLayout;
using test_support::SetDp;
using test_support::SetPipeline;
using test_support::SetTpSplit;
using testing::CopiedBytes;
using testing::SlotOf;

struct Expected {
  int64_t bytes_local;
  int64_t bytes_cross_host;
  int64_t bytes_zero_filled;
};

// Plans, verifies, and checks the stats every golden case asserts.
v1::TransferPlan PlanAndVerify(const v1::Ptc& ptc, const v1::Layout& from, const v1::Layout& to,
                               const Expected& want, const planner::LostSet& lost = {}) {
  absl::StatusOr<v1::TransferPlan> plan = planner::PlanTransfer(ptc, from, to, lost);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return {};
  const absl::Status verified = VerifyPlan(ptc, from, to, lost.hosts, lost.ranks, *plan);
  EXPECT_TRUE(verified.ok()) << verified;
  const v1::PlanStats& s = plan->stats();
  EXPECT_EQ(s.bytes_local(), want.bytes_local);
  EXPECT_EQ(s.bytes_cross_host(), want.bytes_cross_host);
  EXPECT_EQ(s.lower_bound_cross_host(), want.bytes_cross_host);  // rule 4
  EXPECT_EQ(s.bytes_zero_filled(), want.bytes_zero_filled);
  return *plan;
}

const v1::HostTraffic* HostStats(const v1::TransferPlan& plan, const std::string& host) {
  for (const auto& h : plan.stats().hosts()) {
    if (h.host() == host) return &h;
  }
  return nullptr;
}

TEST(GoldenTest, TensorParallelTwoToFour) {
  // w [8, 4] fp32 split on rows. Old tp 2 on a:0, a:1: rows 0-3 | 4-7.
  // New tp 4 on a:0, a:1, b:0, b:1: rows 0-1 | 2-3 | 4-5 | 6-7 (32 B each).
  //   new 0 (a:0): old 0 on its device        -> local 32
  //   new 1 (a:1): old 1 lacks rows 2-3, old 0 on host a has them -> local 32
  //   new 2, 3 (b): host b holds nothing       -> cross 32 + 32
  // Blob "step" (8 B, replicated): a ranks copy on-device (16 local), host b
  // receives it once for both its ranks (8 cross).
  // local 32 + 32 + 16 = 80; cross 64 + 8 = 72 = lower bound (b needs 72).
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  SetTpSplit(AddTensor(&ptc, "w", {8, 4}), 0);
  AddBlob(&ptc, "step", 8, v1::BLOB_REPLICATED);
  const v1::TransferPlan plan = PlanAndVerify(ptc, MakeLayout(2, 1, 1, {"a"}, 2),
                                              MakeLayout(4, 1, 1, {"a", "b"}, 2), {80, 72, 0});
  const v1::HostTraffic* a = HostStats(plan, "a");
  const v1::HostTraffic* b = HostStats(plan, "b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->bytes_out(), 72);
  EXPECT_EQ(a->bytes_local(), 80);
  EXPECT_EQ(b->bytes_in(), 72);
  EXPECT_EQ(b->bytes_out(), 0);
  int blob_cross_steps = 0;
  for (const auto& s : plan.steps()) {
    if (s.item() == 1 && s.cross_host()) {
      ++blob_cross_steps;
      EXPECT_EQ(s.dsts_size(), 2);  // rule 3: one step for both ranks on b
    }
  }
  EXPECT_EQ(blob_cross_steps, 1);
}

TEST(GoldenTest, TensorParallelFourToTwo) {
  // w [8, 4] fp32 split on rows. Old tp 4 on a:0, a:1, b:0, b:1 (rows 0-1 |
  // 2-3 | 4-5 | 6-7); new tp 2 on a:0, a:1 (rows 0-3 | 4-7).
  //   new 0 (a:0): rows 0-1 from old 0 (same device), 2-3 from old 1 (host a): local 64
  //   new 1 (a:1): rows 4-7 only on host b -> cross 64
  // Blob "rng" (8 B per rank): new r takes old r mod 4 = r, on its device: local 16.
  // local 80; cross 64 = lower bound; nothing padded.
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  SetTpSplit(AddTensor(&ptc, "w", {8, 4}), 0);
  AddBlob(&ptc, "rng", 8, v1::BLOB_PER_RANK);
  const v1::TransferPlan plan = PlanAndVerify(ptc, MakeLayout(4, 1, 1, {"a", "b"}, 2),
                                              MakeLayout(2, 1, 1, {"a"}, 2), {80, 64, 0});
  const v1::HostTraffic* b = HostStats(plan, "b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->bytes_out(), 64);
}

TEST(GoldenTest, PipelineTwoToFourUnevenStages) {
  // 8 layers, "layers.L.w" [10] fp16 = 20 B each, plus "embed" (first stage)
  // and "head" (last stage), [4, 4] fp32 = 64 B each.
  // Old pp 2, stage_starts [0, 5]: old 0 (a:0) layers 0-4 + embed,
  //   old 1 (a:1) layers 5-7 + head.
  // New pp 4, stage_starts [0, 1, 3, 6] on a:0, a:1, b:0, b:1:
  //   new 0 (a:0) layer 0 + embed: on its device        -> local 20 + 64
  //   new 1 (a:1) layers 1-2: old 0 on host a            -> local 40
  //   new 2 (b:0) layers 3-5                             -> cross 60
  //   new 3 (b:1) layers 6-7 + head                      -> cross 40 + 64
  // local 124; cross 164 = lower bound.
  v1::Ptc ptc;
  ptc.set_num_layers(8);
  for (int l = 0; l < 8; ++l) {
    SetPipeline(AddTensor(&ptc, "layers." + std::to_string(l) + ".w", {10}, v1::DTYPE_FLOAT16),
                v1::PIPELINE_LAYER, l);
  }
  SetPipeline(AddTensor(&ptc, "embed", {4, 4}), v1::PIPELINE_FIRST_STAGE);
  SetPipeline(AddTensor(&ptc, "head", {4, 4}), v1::PIPELINE_LAST_STAGE);
  PlanAndVerify(ptc, MakeLayout(1, 2, 1, {"a"}, 2, {0, 5}),
                MakeLayout(1, 4, 1, {"a", "b"}, 2, {0, 1, 3, 6}), {124, 164, 0});
}

TEST(GoldenTest, DataParallelOneToTwo) {
  // "w" [6, 5] fp32 dp-replicated (120 B); "m" [6, 5] fp32 dp-split on
  // axis 1. Old dp 1 on a:0; new dp 2 on a:0 and b:0.
  //   new 0 (a:0): all of w (120) and m's columns 0-2 (18 el = 72) on-device
  //   new 1 (b:0): all of w (120) and m's columns 3-4 (12 el = 48) cross
  // local 192; cross 168 = lower bound.
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  AddTensor(&ptc, "w", {6, 5});
  SetDp(AddTensor(&ptc, "m", {6, 5}), v1::DP_SPLIT, 1);
  PlanAndVerify(ptc, MakeLayout(1, 1, 1, {"a"}, 1), MakeLayout(1, 1, 2, {"a", "b"}, 1),
                {192, 168, 0});
}

TEST(GoldenTest, ZeroFlatFourToTwoWithPadding) {
  // "exp_avg" [11] fp32, DP_FLAT. Old dp 4 on a:0-3: chunk 3, old 0: 0-2,
  // old 1: 3-5, old 2: 6-8, old 3: 9, 10, pad.
  // New dp 2 on a:0 and b:0: chunk 6, new 0: 0-5, new 1: 6-10, pad.
  //   new 0 (a:0): 0-2 on-device, 3-5 from old 1 on host a -> local 24
  //   new 1 (b:0): 6-10 cross (20), one padding element zero-filled (4)
  // local 24; cross 20 = lower bound; zero-filled 4.
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  SetDp(AddTensor(&ptc, "exp_avg", {11}), v1::DP_FLAT);
  const v1::TransferPlan plan = PlanAndVerify(ptc, MakeLayout(1, 1, 4, {"a"}, 4),
                                              MakeLayout(1, 1, 2, {"a", "b"}, 1), {24, 20, 4});
  ASSERT_EQ(plan.zero_fills_size(), 1);
  EXPECT_EQ(plan.zero_fills(0).rank(), 1);
  EXPECT_EQ(plan.zero_fills(0).offset(), 5);
  EXPECT_EQ(plan.zero_fills(0).count(), 1);
}

TEST(GoldenTest, MigrationToAllNewHosts) {
  // "w" [8, 8] fp32 tp-split on columns, dp-replicated; blob "step" 8 B.
  // Old tp 2 x dp 2 on a, b (2 devices each); new the same config on four
  // new hosts c, d, e, f with one device each. Each new rank needs its whole
  // buffer from elsewhere: 32 el = 128 B + 8 B blob = 136 B per host.
  // local 0; cross 4 * 136 = 544 = every byte written.
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  SetTpSplit(AddTensor(&ptc, "w", {8, 8}), 1);
  AddBlob(&ptc, "step", 8, v1::BLOB_REPLICATED);
  const v1::TransferPlan plan =
      PlanAndVerify(ptc, MakeLayout(2, 1, 2, {"a", "b"}, 2),
                    MakeLayout(2, 1, 2, {"c", "d", "e", "f"}, 1), {0, 544, 0});
  EXPECT_EQ(CopiedBytes(plan), 544);
  for (const auto& s : plan.steps()) EXPECT_TRUE(s.cross_host());
  for (const char* h : {"c", "d", "e", "f"}) {
    const v1::HostTraffic* t = HostStats(plan, h);
    ASSERT_NE(t, nullptr) << h;
    EXPECT_EQ(t->bytes_in(), 136) << h;
  }
}

TEST(GoldenTest, IdentityCopiesOnSameDevice) {
  // tp 2 x pp 2 x dp 2 on a, b (4 devices each); the same layout again.
  // "layers.0.w" [6, 4] fp32, tp rows, layer 0: 4 stage-0 ranks x 12 el = 192 B
  // "layers.1.w" [7, 2] fp32, tp columns, DP_FLAT, layer 1: a tp piece has 7
  //   el, dp chunk 4, so dp 1 holds 3 + 1 pad: 2 tp pieces x 7 el = 56 B real,
  //   2 x 1 pad = 8 B zero-filled
  // "rng" 16 B per rank x 8 = 128 B
  // local 192 + 56 + 128 = 376; nothing crosses.
  v1::Ptc ptc;
  ptc.set_num_layers(2);
  v1::TensorSpec* w0 = AddTensor(&ptc, "layers.0.w", {6, 4});
  SetTpSplit(w0, 0);
  SetPipeline(w0, v1::PIPELINE_LAYER, 0);
  v1::TensorSpec* w1 = AddTensor(&ptc, "layers.1.w", {7, 2});
  SetTpSplit(w1, 1);
  SetPipeline(w1, v1::PIPELINE_LAYER, 1);
  SetDp(w1, v1::DP_FLAT);
  AddBlob(&ptc, "rng", 16, v1::BLOB_PER_RANK);
  const v1::Layout l = MakeLayout(2, 2, 2, {"a", "b"}, 4);
  const v1::TransferPlan plan = PlanAndVerify(ptc, l, l, {376, 0, 8});
  for (const auto& s : plan.steps()) {
    EXPECT_FALSE(s.cross_host());
    for (const auto& d : s.dsts()) EXPECT_EQ(SlotOf(l, s.src_rank()), SlotOf(l, d.rank()));
  }
}

TEST(GoldenTest, FailureWithSurvivingReplica) {
  // "w" [4, 4] fp32 dp-replicated (64 B); blob "step" 8 B replicated.
  // Old dp 2 on a:0, b:0; host b lost. New dp 2 on a:0, c:0.
  //   new 0 (a:0): on-device from old 0         -> local 64 + 8
  //   new 1 (c:0): from old 0, the only survivor -> cross 64 + 8
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  AddTensor(&ptc, "w", {4, 4});
  AddBlob(&ptc, "step", 8, v1::BLOB_REPLICATED);
  planner::LostSet lost;
  lost.hosts = {"b"};
  const v1::TransferPlan plan =
      PlanAndVerify(ptc, MakeLayout(1, 1, 2, {"a", "b"}, 1), MakeLayout(1, 1, 2, {"a", "c"}, 1),
                    {72, 72, 0}, lost);
  for (const auto& s : plan.steps()) EXPECT_EQ(s.src_rank(), 0);
  ASSERT_EQ(plan.lost_ranks_size(), 1);
  EXPECT_EQ(plan.lost_ranks(0), 1);
}

TEST(GoldenTest, FailureWithoutReplicaNamesLostTensors) {
  // Old tp 2 on a:0, b:0; host b lost. "layers.0.mlp.weight" split on rows
  // loses rows 2-3; "layers.0.mlp.bias" is tp-replicated and survives;
  // per-rank blob "rng_state" loses old rank 1's value, which new rank 1 needs.
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  SetTpSplit(AddTensor(&ptc, "layers.0.mlp.weight", {4, 4}), 0);
  AddTensor(&ptc, "layers.0.mlp.bias", {4});
  AddBlob(&ptc, "rng_state", 8, v1::BLOB_PER_RANK);
  const v1::Layout from = MakeLayout(2, 1, 1, {"a", "b"}, 1);
  const v1::Layout to = MakeLayout(2, 1, 1, {"a", "c"}, 1);
  planner::LostSet lost;
  lost.hosts = {"b"};
  absl::StatusOr<std::vector<std::string>> unrecoverable =
      UnrecoverableItems(ptc, from, to, lost.hosts, lost.ranks);
  ASSERT_TRUE(unrecoverable.ok()) << unrecoverable.status();
  EXPECT_EQ(*unrecoverable, (std::vector<std::string>{"layers.0.mlp.weight", "rng_state"}));

  absl::StatusOr<v1::TransferPlan> plan = planner::PlanTransfer(ptc, from, to, lost);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition) << plan.status();
  const std::string msg(plan.status().message());
  EXPECT_NE(msg.find("layers.0.mlp.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rng_state"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("layers.0.mlp.bias"), std::string::npos) << msg;
}

}  // namespace
}  // namespace reshard::verifier
