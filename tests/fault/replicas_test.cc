// Two coordinator replicas on one database: exactly one is the leader (the
// reshard_coordinator_leader gauge, scraped from both), either serves the
// API while the leader drives; when the leader is killed, the other takes
// over and drives a new operation to completion.
#include "grpcpp/grpcpp.h"
#include "tests/coordinator/server/scrape.h"
#include "tests/coordinator/server/server_fixture.h"
#include "tests/coordinator/server/test_jobs.h"

namespace reshard::coordinator::testing {
namespace {

class ReplicasTest : public ServerTest {
 protected:
  absl::StatusOr<v1::Operation> ResizeAndWait(CoordinatorStub* stub, const std::string& job_id,
                                              int64_t generation, const v1::Layout& target) {
    v1::ResizeRequest request;
    request.set_job_id(job_id);
    request.set_expected_generation(generation);
    *request.mutable_placement() = target.placement();
    *request.mutable_config() = target.config();
    v1::Operation op;
    const grpc::Status s = stub->Resize(Ctx().get(), request, &op);
    if (!s.ok()) return absl::InternalError(s.error_message());
    return WaitFinal(stub, op.id());
  }
};

TEST_F(ReplicasTest, OneLeaderAndFailover) {
  std::unique_ptr<CoordinatorProcess> a = StartCoordinator({"--replica-id", "replica-a"});
  ASSERT_NE(a, nullptr);
  std::unique_ptr<CoordinatorProcess> b = StartCoordinator({"--replica-id", "replica-b"});
  ASSERT_NE(b, nullptr);

  // Exactly one leader, and it stays that way.
  ASSERT_TRUE(Eventually([&] {
    const std::optional<double> la = ScrapeLeader(a->metrics_port());
    const std::optional<double> lb = ScrapeLeader(b->metrics_port());
    return la.has_value() && lb.has_value() && *la + *lb == 1;
  }));
  CoordinatorProcess* leader = ScrapeLeader(a->metrics_port()) == 1 ? a.get() : b.get();
  CoordinatorProcess* follower = leader == a.get() ? b.get() : a.get();
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(ScrapeLeader(leader->metrics_port()).value_or(-1), 1);
    EXPECT_EQ(ScrapeLeader(follower->metrics_port()).value_or(-1), 0);
  }

  // Everything goes through the follower; the leader drives.
  auto stub = CoordinatorClient(follower->address());
  StartAgents({"h0", "h1", "h2", "h3"}, follower->address());
  const v1::Job job = Register(stub.get(), test_support::GptJobSpec("replicated", "t"));
  absl::StatusOr<v1::Operation> op =
      ResizeAndWait(stub.get(), job.id(), 1, MakeLayout(2, 2, 1, {"h2"}, 4));
  ASSERT_TRUE(op.ok()) << op.status();
  EXPECT_EQ(op->state(), v1::OPERATION_STATE_COMMITTED) << op->error();
  EXPECT_EQ(ScrapeLeader(follower->metrics_port()).value_or(-1), 0);

  // The leader dies: the follower takes over.
  leader->Kill();
  CoordinatorProcess* survivor = follower;
  ASSERT_TRUE(Eventually([&] { return ScrapeLeader(survivor->metrics_port()) == 1; }));

  // A third replica joining now follows.
  std::unique_ptr<CoordinatorProcess> c = StartCoordinator({"--replica-id", "replica-c"});
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(Eventually([&] { return ScrapeLeader(c->metrics_port()).has_value(); }));
  EXPECT_EQ(ScrapeLeader(c->metrics_port()).value_or(-1), 0);

  // The new leader drives a new operation, asked for through the newcomer.
  auto stub_c = CoordinatorClient(c->address());
  op = ResizeAndWait(stub_c.get(), job.id(), 2, MakeLayout(2, 2, 1, {"h3"}, 4));
  ASSERT_TRUE(op.ok()) << op.status();
  EXPECT_EQ(op->state(), v1::OPERATION_STATE_COMMITTED) << op->error();
  v1::GetJobRequest get;
  get.set_job_id(job.id());
  v1::Job after;
  ASSERT_TRUE(stub_c->GetJob(Ctx().get(), get, &after).ok());
  EXPECT_EQ(after.generation(), 3);
}

}  // namespace
}  // namespace reshard::coordinator::testing
