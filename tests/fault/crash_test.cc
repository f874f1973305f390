// A coordinator killed with SIGKILL in the middle of an operation, then
// restarted on the same database: the operation is resumed to COMMITTED or
// aborted with a recorded reason, and the job is never half-changed (its
// generation and layout are both the old ones or both the new ones).
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/grpcpp.h"
#include "services/coordinator/store/pg_store.h"
#include "tests/coordinator/server/scrape.h"
#include "tests/coordinator/server/server_fixture.h"
#include "tests/coordinator/server/test_jobs.h"

namespace reshard::coordinator::testing {
namespace {

using ::google::protobuf::util::MessageDifferencer;

class CrashTest : public ServerTest {
 protected:
  // The job after `op` ended: generation and layout both old or both new,
  // and no operation left active.
  void ExpectWhole(CoordinatorStub* stub, const v1::Job& before, const v1::Operation& op) {
    const v1::Job after = GetJob(stub, before.id());
    EXPECT_TRUE(after.active_operation_id().empty());
    EXPECT_NE(after.state(), v1::JOB_STATE_RECONFIGURING);
    if (op.state() == v1::OPERATION_STATE_COMMITTED) {
      EXPECT_EQ(after.generation(), before.generation() + 1);
      EXPECT_TRUE(MessageDifferencer::Equivalent(after.layout(), op.target_layout()))
          << after.layout().DebugString();
    } else {
      EXPECT_FALSE(op.error().empty()) << "aborted without a reason";
      EXPECT_EQ(after.generation(), before.generation());
      EXPECT_TRUE(MessageDifferencer::Equivalent(after.layout(), before.layout()))
          << after.layout().DebugString();
    }
  }
};

TEST_F(CrashTest, KilledWhileTransferringResumesAfterRestart) {
  std::unique_ptr<CoordinatorProcess> first = StartCoordinator({"--replica-id", "first"});
  ASSERT_NE(first, nullptr);
  auto stub = CoordinatorClient(first->address());
  StartAgents({"h0", "h1", "h2"}, first->address());
  HoldAgents(true);  // they fetch their tasks but do not finish
  const v1::Job job = Register(stub.get(), test_support::GptJobSpec("crash", "t"));
  const v1::Operation op =
      Resize(stub.get(), job.id(), job.generation(), MakeLayout(2, 2, 1, {"h2"}, 4));
  ASSERT_TRUE(WaitState(stub.get(), op.id(), v1::OPERATION_STATE_TRANSFERRING).ok());
  ASSERT_TRUE(Eventually([&] { return agent("h2")->Fetched(op.id()); }));

  first->Kill();

  std::unique_ptr<CoordinatorProcess> second = StartCoordinator({"--replica-id", "second"});
  ASSERT_NE(second, nullptr);
  stub = CoordinatorClient(second->address());
  // Before the agents finish, the job still shows its old generation whole.
  {
    const v1::Job during = GetJob(stub.get(), job.id());
    EXPECT_EQ(during.generation(), job.generation());
    EXPECT_TRUE(MessageDifferencer::Equivalent(during.layout(), job.layout()));
    EXPECT_EQ(during.active_operation_id(), op.id());
  }
  PointAgentsAt(second->address());
  HoldAgents(false);

  absl::StatusOr<v1::Operation> final_op = WaitFinal(stub.get(), op.id());
  ASSERT_TRUE(final_op.ok()) << final_op.status();
  // The agents were back well within their lease: it commits.
  EXPECT_EQ(final_op->state(), v1::OPERATION_STATE_COMMITTED) << final_op->error();
  ExpectWhole(stub.get(), job, *final_op);
}

TEST_F(CrashTest, KilledWhilePendingResumesAfterRestart) {
  // The test holds the leader lock, so no replica drives: the operation
  // stays PENDING for certain until the test lets go.
  std::unique_ptr<LeaderLock> lock = MakePgLeaderLock(dsn_);
  absl::StatusOr<bool> held = lock->TryAcquire();
  ASSERT_TRUE(held.ok() && *held) << held.status();

  std::unique_ptr<CoordinatorProcess> first = StartCoordinator({"--replica-id", "first"});
  ASSERT_NE(first, nullptr);
  auto stub = CoordinatorClient(first->address());
  StartAgents({"h0", "h1", "h2"}, first->address());
  const v1::Job job = Register(stub.get(), test_support::GptJobSpec("pending", "t"));
  const v1::Operation op =
      Resize(stub.get(), job.id(), job.generation(), MakeLayout(2, 2, 1, {"h2"}, 4));
  EXPECT_EQ(op.state(), v1::OPERATION_STATE_PENDING);
  EXPECT_EQ(ScrapeLeader(first->metrics_port()).value_or(-1), 0);

  first->Kill();

  std::unique_ptr<CoordinatorProcess> second = StartCoordinator({"--replica-id", "second"});
  ASSERT_NE(second, nullptr);
  stub = CoordinatorClient(second->address());
  PointAgentsAt(second->address());
  {
    v1::GetOperationRequest request;
    request.set_operation_id(op.id());
    v1::Operation still;
    ASSERT_TRUE(stub->GetOperation(Ctx().get(), request, &still).ok());
    EXPECT_EQ(still.state(), v1::OPERATION_STATE_PENDING);
  }
  lock->Release();
  ASSERT_TRUE(Eventually([&] { return ScrapeLeader(second->metrics_port()) == 1; }));

  absl::StatusOr<v1::Operation> final_op = WaitFinal(stub.get(), op.id());
  ASSERT_TRUE(final_op.ok()) << final_op.status();
  EXPECT_EQ(final_op->state(), v1::OPERATION_STATE_COMMITTED) << final_op->error();
  ExpectWhole(stub.get(), job, *final_op);
}

TEST_F(CrashTest, AgentsGoneDuringTheCrashAbortWithAReason) {
  lease_ms_ = 1000;
  std::unique_ptr<CoordinatorProcess> first = StartCoordinator({"--replica-id", "first"});
  ASSERT_NE(first, nullptr);
  auto stub = CoordinatorClient(first->address());
  StartAgents({"h0", "h1", "h2"}, first->address());
  HoldAgents(true);
  const v1::Job job = Register(stub.get(), test_support::GptJobSpec("orphan", "t"));
  const v1::Operation op =
      Resize(stub.get(), job.id(), job.generation(), MakeLayout(2, 2, 1, {"h2"}, 4));
  ASSERT_TRUE(WaitState(stub.get(), op.id(), v1::OPERATION_STATE_TRANSFERRING).ok());

  // The coordinator and every agent die; the new coordinator finds the
  // leases expired and must not wait for agents that will never report.
  StopAgents();
  first->Kill();
  std::unique_ptr<CoordinatorProcess> second = StartCoordinator({"--replica-id", "second"});
  ASSERT_NE(second, nullptr);
  stub = CoordinatorClient(second->address());

  absl::StatusOr<v1::Operation> final_op = WaitFinal(stub.get(), op.id());
  ASSERT_TRUE(final_op.ok()) << final_op.status();
  EXPECT_EQ(final_op->state(), v1::OPERATION_STATE_ABORTED);
  ExpectWhole(stub.get(), job, *final_op);
}

}  // namespace
}  // namespace reshard::coordinator::testing
