// LeaderLoop's retention rounds (issue 9, defect 10): the leader prunes what
// the policy allows through the real PgStore, and
// reshard_coordinator_retention_pruned_rows_total{table} counts it.
#include <chrono>
#include <functional>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/coordinator/logic/leader.h"
#include "tests/coordinator/harness/eventually.h"
#include "tests/coordinator/logic/logic_fixture.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using test_support::MakeLayout;
using test_support::TwoLayerJob;

// Always free: this replica leads at once.
class FreeLock : public LeaderLock {
 public:
  absl::StatusOr<bool> TryAcquire() override { return true; }
  bool StillHeld() override { return true; }
  void Release() override {}
};

class LeaderRetentionTest : public LogicTest {
 protected:
  // Commits `n` resizes of `job` straight through the store: generations
  // 1..n RETIRED, n finished operations.
  void CommitResizes(const v1::Job& job, int n) {
    for (int g = 1; g <= n; ++g) {
      NewOperation op;
      op.operation_id = absl::StrCat(job.id().substr(0, 8), "-op", g);
      op.job_id = job.id();
      op.kind = v1::OPERATION_KIND_RESIZE;
      op.expected_generation = g;
      op.target_layout = MakeLayout(2, 2, 1, {g % 2 == 0 ? "h0" : "h2", "h3"}, 2);
      ASSERT_TRUE(store_->CreateOperation(op).ok());
      ASSERT_TRUE(store_
                      ->TransitionOperation(op.operation_id, v1::OPERATION_STATE_PENDING,
                                            v1::OPERATION_STATE_PLANNED, {})
                      .ok());
      HostProgress p;
      p.host_id = "h3";
      ASSERT_TRUE(store_->StartTransfer(op.operation_id, {p}).ok());
      ASSERT_TRUE(store_->CommitOperation(op.operation_id).ok());
    }
  }
};

TEST_P(LeaderRetentionTest, LeaderPrunesInBatchesAndCountsRows) {
  const v1::Job a = Register(TwoLayerJob("a"));
  const v1::Job b = Register(TwoLayerJob("b"));
  CommitResizes(a, 4);
  CommitResizes(b, 2);

  LeaderLoop::Retention retention;
  retention.policy.keep_retired_generations = 1;
  retention.policy.retired_min_age_ms = 0;
  retention.policy.keep_operations = 1;
  retention.policy.operation_min_age_ms = 0;
  retention.policy.batch_rows = 1;  // many small batches
  retention.batches_per_round = 2;
  retention.interval_ms = 0;
  LeaderLoop loop(std::make_unique<FreeLock>(), driver_.get(), metrics_.get(),
                  LeaderLoop::Options{/*tick_ms=*/5, /*retry_ms=*/5});
  loop.EnableRetention(store_, retention);
  loop.Start();
  // a: RETIRED 1..4, keep 1 -> 3; b: RETIRED 1..2 -> 1. Operations the same.
  const auto pruned = [&](const char* table) {
    return MetricValue("reshard_coordinator_retention_pruned_rows_total", {{"table", table}});
  };
  EXPECT_TRUE(Eventually([&] { return pruned("generations") == 4 && pruned("operations") == 4; },
                         absl::Seconds(20), absl::Milliseconds(5)))
      << pruned("generations") << " " << pruned("operations");
  loop.Stop();

  EXPECT_EQ(store_->ListOperationsForJob(a.id())->size(), 1u);
  EXPECT_EQ(store_->ListOperationsForJob(b.id())->size(), 1u);
  // Current generations and jobs are untouched.
  EXPECT_EQ(Job(a.id()).generation(), 5);
  EXPECT_EQ(Job(b.id()).generation(), 3);
  EXPECT_EQ(pruned("generations"), 4);
  EXPECT_EQ(pruned("operations"), 4);
}

RESHARD_LOGIC_ON_BOTH_STORES(LeaderRetentionTest);

}  // namespace
}  // namespace reshard::coordinator::testing
