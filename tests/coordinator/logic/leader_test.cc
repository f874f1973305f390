// LeaderLoop: with a lock the test controls (taking, losing and stopping
// leadership), and with two real PostgreSQL advisory locks (failover).
#include "services/coordinator/logic/leader.h"

#include <atomic>
#include <memory>

#include "gtest/gtest.h"
#include "tests/coordinator/logic/logic_fixture.h"
#include "tests/support/job_builders.h"
#include "tests/support/jobs.h"
#include "tests/support/wait.h"

namespace reshard::coordinator::testing {
namespace {

/// A LeaderLock whose answers the test sets. Thread-safe.
class ScriptedLock : public LeaderLock {
 public:
  struct State {
    std::atomic<bool> available{false};  // TryAcquire succeeds
    std::atomic<bool> held{false};
    std::atomic<int> releases{0};
    std::atomic<int> refusals{0};  // TryAcquire calls that did not take it
  };
  explicit ScriptedLock(std::shared_ptr<State> state) : state_(std::move(state)) {}
  absl::StatusOr<bool> TryAcquire() override {
    if (state_->available) state_->held = true;
    if (!state_->held) ++state_->refusals;
    return state_->held.load();
  }
  bool StillHeld() override { return state_->held; }
  void Release() override {
    state_->held = false;
    ++state_->releases;
  }

 private:
  std::shared_ptr<State> state_;
};

/// Counts the refused TryAcquire calls of a real lock: each is one pass of
/// a loop that does not lead (the loop tries the lock once per pass).
class CountingLock : public LeaderLock {
 public:
  CountingLock(std::unique_ptr<LeaderLock> inner, std::atomic<int>* refusals)
      : inner_(std::move(inner)), refusals_(refusals) {}
  absl::StatusOr<bool> TryAcquire() override {
    absl::StatusOr<bool> taken = inner_->TryAcquire();
    if (taken.ok() && !*taken) ++*refusals_;
    return taken;
  }
  bool StillHeld() override { return inner_->StillHeld(); }
  void Release() override { inner_->Release(); }

 private:
  std::unique_ptr<LeaderLock> inner_;
  std::atomic<int>* refusals_;
};

// The loops run on their own threads in real time, a pass every 5 ms.
constexpr absl::Duration kDeadline = absl::Seconds(20);
constexpr absl::Duration kPoll = absl::Milliseconds(5);

class LeaderLoopTest : public LogicTest {
 protected:
  static constexpr LeaderLoop::Options kFast{/*tick_ms=*/5, /*retry_ms=*/5};
};

TEST_F(LeaderLoopTest, DrivesOnlyWhileHoldingTheLock) {
  const v1::Job job = Register(test_support::TwoLayerJob("led"));
  RegisterAgents({"h0", "h1", "h2"});
  absl::StatusOr<v1::Operation> op =
      ResizeTo(job, test_support::MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  ASSERT_TRUE(op.ok()) << op.status();

  auto state = std::make_shared<ScriptedLock::State>();
  LeaderLoop loop(std::make_unique<ScriptedLock>(state), driver_.get(), metrics_.get(), kFast);
  loop.Start();
  // Three passes refused the lock: none of them may have driven.
  ASSERT_TRUE(test_support::Eventually([&] { return state->refusals >= 3; }, kDeadline, kPoll));
  EXPECT_FALSE(loop.IsLeader());
  EXPECT_EQ(Op(op->id()).state(), v1::OPERATION_STATE_PENDING);  // nobody drives

  state->available = true;
  ASSERT_TRUE(test_support::Eventually([&] { return loop.IsLeader(); }, kDeadline, kPoll));
  ASSERT_TRUE(test_support::Eventually(
      [&] { return Op(op->id()).state() == v1::OPERATION_STATE_TRANSFERRING; }, kDeadline, kPoll));
  EXPECT_EQ(MetricValue("reshard_coordinator_leader", {}), 1);

  // The lock's connection dropped: stop driving at once.
  state->available = false;
  state->held = false;
  ASSERT_TRUE(test_support::Eventually([&] { return !loop.IsLeader(); }, kDeadline, kPoll));
  EXPECT_EQ(MetricValue("reshard_coordinator_leader", {}), 0);
  for (const std::string& host : Participants(op->id())) CompleteTask(host, op->id());
  // Two more refused passes after the tasks completed: a whole pass ran
  // between them, and it did not commit.
  const int refused = state->refusals;
  ASSERT_TRUE(
      test_support::Eventually([&] { return state->refusals >= refused + 2; }, kDeadline, kPoll));
  EXPECT_EQ(Op(op->id()).state(), v1::OPERATION_STATE_TRANSFERRING);

  // Leading again resumes and commits.
  state->available = true;
  ASSERT_TRUE(test_support::Eventually(
      [&] { return Op(op->id()).state() == v1::OPERATION_STATE_COMMITTED; }, kDeadline, kPoll));

  loop.Stop();
  EXPECT_FALSE(loop.IsLeader());
  EXPECT_FALSE(state->held);
  loop.Stop();  // idempotent
}

TEST_F(LeaderLoopTest, StopWithoutStartAndTwice) {
  auto state = std::make_shared<ScriptedLock::State>();
  LeaderLoop loop(std::make_unique<ScriptedLock>(state), driver_.get(), nullptr, kFast);
  loop.Stop();
  loop.Stop();
  EXPECT_FALSE(loop.IsLeader());
}

TEST_F(LeaderLoopTest, AnotherReplicaTakesOverWhenTheLeaderStops) {
  std::unique_ptr<OperationDriver> other_driver = MakeDriver(ConnectStore());
  auto a = std::make_unique<LeaderLoop>(MakePgLeaderLock(dsn_), driver_.get(), nullptr, kFast);
  std::atomic<int> b_refusals{0};
  LeaderLoop b(std::make_unique<CountingLock>(MakePgLeaderLock(dsn_), &b_refusals),
               other_driver.get(), nullptr, kFast);
  a->Start();
  ASSERT_TRUE(test_support::Eventually([&] { return a->IsLeader(); }, kDeadline, kPoll));
  b.Start();
  // PostgreSQL refused b the lock on three passes while a holds it.
  ASSERT_TRUE(test_support::Eventually([&] { return b_refusals >= 3; }, kDeadline, kPoll));
  EXPECT_FALSE(b.IsLeader());

  const v1::Job job = Register(test_support::TwoLayerJob("failover"));
  RegisterAgents({"h0", "h1", "h2"});
  absl::StatusOr<v1::Operation> op =
      ResizeTo(job, test_support::MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  ASSERT_TRUE(op.ok()) << op.status();
  ASSERT_TRUE(test_support::Eventually(
      [&] { return Op(op->id()).state() == v1::OPERATION_STATE_TRANSFERRING; }, kDeadline, kPoll));

  a->Stop();
  a.reset();
  ASSERT_TRUE(test_support::Eventually([&] { return b.IsLeader(); }, kDeadline, kPoll));
  for (const std::string& host : Participants(op->id())) CompleteTask(host, op->id());
  ASSERT_TRUE(test_support::Eventually(
      [&] { return Op(op->id()).state() == v1::OPERATION_STATE_COMMITTED; }, kDeadline, kPoll));
  b.Stop();
}

}  // namespace
}  // namespace reshard::coordinator::testing
