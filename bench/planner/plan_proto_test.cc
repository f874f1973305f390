// ToProto by value and on an arena build the same TransferPlan, field for
// field, from a real plan (GPT-3 XL dp 4 -> 2).
#include <string>

#include "bench/planner/gpt_model.h"
#include "google/protobuf/arena.h"
#include "gtest/gtest.h"
#include "planner/planner.h"

namespace reshard::bench {
namespace {

TEST(PlanProtoTest, ArenaAndHeapMessagesAreEqual) {
  const v1::Ptc ptc = BuildGptPtc(kGpt3Xl, 2);
  const v1::Layout from = MakeLayout(2, 2, 4, "host-", 0, 8);
  const v1::Layout to = MakeLayout(2, 2, 2, "host-", 0, 8);
  absl::StatusOr<planner::Plan> plan = planner::MakePlan(ptc, from, to, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  const v1::TransferPlan heap = planner::ToProto(*plan, from, to);
  google::protobuf::Arena arena;
  const v1::TransferPlan* on_arena = planner::ToProto(*plan, from, to, &arena);
  ASSERT_EQ(on_arena->GetArena(), &arena);
  std::string a, b;
  ASSERT_TRUE(heap.SerializeToString(&a));
  ASSERT_TRUE(on_arena->SerializeToString(&b));
  EXPECT_EQ(a, b);

  ASSERT_EQ(heap.steps_size(), static_cast<int>(plan->steps.size()));
  for (int i = 0; i < heap.steps_size(); ++i) {
    const v1::CopyStep& s = heap.steps(i);
    const planner::Plan::Step& p = plan->steps[i];
    ASSERT_EQ(s.index(), i);
    ASSERT_EQ(s.shape_size(), p.ndim);
    ASSERT_EQ(s.src().strides_size(), p.ndim);
    ASSERT_EQ(s.dsts_size(), p.dst_end - p.dst_begin);
    for (const v1::Destination& d : s.dsts()) ASSERT_EQ(d.region().strides_size(), p.ndim);
    ASSERT_EQ(s.src_rank(), p.src_rank);
    ASSERT_EQ(s.bytes(), p.bytes);
  }
  EXPECT_EQ(heap.stats().steps(), heap.steps_size());
  EXPECT_EQ(heap.items_size(), ptc.tensors_size() + ptc.blobs_size());
}

}  // namespace
}  // namespace reshard::bench
