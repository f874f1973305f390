// LeaderLoop: with a lock the test controls (taking, losing and stopping
// leadership), and with two real PostgreSQL advisory locks (failover).
#include "services/coordinator/logic/leader.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>

#include "gtest/gtest.h"
#include "tests/coordinator/harness/eventually.h"
#include "tests/coordinator/logic/job_builders.h"
#include "tests/coordinator/logic/logic_fixture.h"

namespace reshard::coordinator::testing {
namespace {

/// A LeaderLock whose answers the test sets. Thread-safe.
class ScriptedLock : public LeaderLock {
 public:
  struct State {
    std::atomic<bool> available{false};  // TryAcquire succeeds
    std::atomic<bool> held{false};
    std::atomic<int> releases{0};
  };
  explicit ScriptedLock(std::shared_ptr<State> state) : state_(std::move(state)) {}
  absl::StatusOr<bool> TryAcquire() override {
    if (state_->available) state_->held = true;
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

// Polls `done` for up to 20 s of real time (the loop runs on its own thread).
bool Eventually(const std::function<bool()>& done) {
  return testing::Eventually(done, absl::Seconds(20), absl::Milliseconds(5));
}

class LeaderLoopTest : public LogicTest {
 protected:
  static constexpr LeaderLoop::Options kFast{/*tick_ms=*/5, /*retry_ms=*/5};
};

TEST_F(LeaderLoopTest, DrivesOnlyWhileHoldingTheLock) {
  const v1::Job job = Register(SmallJob("led"));
  RegisterAgents({"h0", "h1", "h2"});
  absl::StatusOr<v1::Operation> op = ResizeTo(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  ASSERT_TRUE(op.ok()) << op.status();

  auto state = std::make_shared<ScriptedLock::State>();
  LeaderLoop loop(std::make_unique<ScriptedLock>(state), driver_.get(), metrics_.get(), kFast);
  loop.Start();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(loop.IsLeader());
  EXPECT_EQ(Op(op->id()).state(), v1::OPERATION_STATE_PENDING);  // nobody drives

  state->available = true;
  ASSERT_TRUE(Eventually([&] { return loop.IsLeader(); }));
  ASSERT_TRUE(Eventually([&] { return Op(op->id()).state() == v1::OPERATION_STATE_TRANSFERRING; }));
  EXPECT_EQ(MetricValue("reshard_coordinator_leader", {}), 1);

  // The lock's connection dropped: stop driving at once.
  state->available = false;
  state->held = false;
  ASSERT_TRUE(Eventually([&] { return !loop.IsLeader(); }));
  EXPECT_EQ(MetricValue("reshard_coordinator_leader", {}), 0);
  for (const std::string& host : Participants(op->id())) CompleteTask(host, op->id());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(Op(op->id()).state(), v1::OPERATION_STATE_TRANSFERRING);

  // Leading again resumes and commits.
  state->available = true;
  ASSERT_TRUE(Eventually([&] { return Op(op->id()).state() == v1::OPERATION_STATE_COMMITTED; }));

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
  LeaderLoop b(MakePgLeaderLock(dsn_), other_driver.get(), nullptr, kFast);
  a->Start();
  ASSERT_TRUE(Eventually([&] { return a->IsLeader(); }));
  b.Start();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(b.IsLeader());

  const v1::Job job = Register(SmallJob("failover"));
  RegisterAgents({"h0", "h1", "h2"});
  absl::StatusOr<v1::Operation> op = ResizeTo(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  ASSERT_TRUE(op.ok()) << op.status();
  ASSERT_TRUE(Eventually([&] { return Op(op->id()).state() == v1::OPERATION_STATE_TRANSFERRING; }));

  a->Stop();
  a.reset();
  ASSERT_TRUE(Eventually([&] { return b.IsLeader(); }));
  for (const std::string& host : Participants(op->id())) CompleteTask(host, op->id());
  ASSERT_TRUE(Eventually([&] { return Op(op->id()).state() == v1::OPERATION_STATE_COMMITTED; }));
  b.Stop();
}

}  // namespace
}  // namespace reshard::coordinator::testing
