// A stop-free resize over real gRPC against the real reshard-coordinator
// binary, with simulated agents that prepare (docs/coordinator.md, "Agents
// prepare"): WaitForTasks answers the new operation at once, the agents'
// PREPARED reports and MarkPrepared make it prepared, a checkpoint cuts it
// over, and its transfer commits the final generation the agents prepared.
#include <chrono>
#include <thread>

#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "tests/coordinator/harness/eventually.h"
#include "tests/coordinator/server/server_fixture.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using test_support::GptJobSpec;
using test_support::MakeLayout;

constexpr int64_t kBatch = 8;

using StopFreeServerTest = ServerTest;

TEST_F(StopFreeServerTest, AgentsPrepareThenTheCutOverCommitsTheGenerationTheyPrepared) {
  std::unique_ptr<CoordinatorProcess> c = StartCoordinator();
  ASSERT_NE(c, nullptr);
  auto stub = CoordinatorClient(c->address());
  // h2 waits for tasks by long poll before it has any.
  auto h2 = AgentClient(c->address(), "agent:h2");
  StartAgents({"h0", "h1", "h2"}, c->address());

  v1::RegisterJobRequest reg;
  *reg.mutable_spec() = GptJobSpec("stop-free", "team-a");
  v1::DatasetState* data = reg.mutable_dataset_state();
  data->mutable_dataset()->set_id("tokens");
  data->mutable_dataset()->set_num_samples(1000);
  data->mutable_dataset()->set_fingerprint("sha1:abc");
  data->set_global_batch(kBatch);
  v1::RegisterJobResponse registered;
  ASSERT_TRUE(stub->RegisterJob(Ctx().get(), reg, &registered).ok());
  const v1::Job job = registered.job();

  ASSERT_TRUE(Eventually([&] { return agent("h2")->epoch() > 0; }, absl::Seconds(30)));
  v1::WaitForTasksRequest wait;
  wait.set_host_id("h2");
  wait.set_wait_ms(10000);
  v1::WaitForTasksResponse woken;
  grpc::Status waited;
  std::chrono::steady_clock::duration waited_for{};
  std::thread poller([&] {
    auto context = Ctx();
    const auto start = std::chrono::steady_clock::now();
    waited = h2->WaitForTasks(context.get(), wait, &woken);
    waited_for = std::chrono::steady_clock::now() - start;
  });

  const v1::Layout target = MakeLayout(2, 2, 2, {"h1", "h2"}, 4);
  const v1::Operation op = Resize(stub.get(), job.id(), 1, target, /*stop_free=*/true);
  poller.join();  // at once, or after wait_ms when the resize failed
  ASSERT_FALSE(op.id().empty());
  EXPECT_EQ(op.to_generation(), 3);
  ASSERT_TRUE(waited.ok()) << waited.error_message();
  EXPECT_THAT(woken.assigned_operations(), ::testing::ElementsAre(op.id()));
  EXPECT_LT(waited_for, std::chrono::seconds(9)) << "WaitForTasks waited out its wait_ms";

  // The simulated agents prepare; then the workers say they are warm.
  ASSERT_TRUE(Eventually(
      [&] { return GetOperation(stub.get(), op.id()).agents_prepared_unix_ms() > 0; },
      absl::Seconds(30)));
  v1::Operation prepared = GetOperation(stub.get(), op.id());
  EXPECT_EQ(prepared.state(), v1::OPERATION_STATE_PLANNED);
  EXPECT_EQ(prepared.prepared_from_generation(), 1);
  EXPECT_GT(prepared.bytes_precopied(), 0);
  EXPECT_EQ(prepared.prepared_unix_ms(), 0);
  prepared = MarkPrepared(stub.get(), op.id());
  EXPECT_GT(prepared.prepared_unix_ms(), 0);

  v1::CheckpointRequest cut;
  cut.set_job_id(job.id());
  cut.set_expected_generation(1);
  cut.set_with_step(true);
  cut.set_step(3);
  cut.set_cursor(3 * kBatch);
  cut.set_layout_fingerprint(job.dataset_state().layout_fingerprint());
  cut.set_cut_over_operation_id(op.id());
  v1::Operation checkpoint;
  const grpc::Status cut_status = stub->Checkpoint(Ctx().get(), cut, &checkpoint);
  ASSERT_TRUE(cut_status.ok()) << cut_status.error_message();
  EXPECT_EQ(checkpoint.to_generation(), 2);
  absl::StatusOr<v1::Operation> cut_done = WaitFinal(stub.get(), checkpoint.id());
  ASSERT_TRUE(cut_done.ok()) << cut_done.status();
  EXPECT_EQ(cut_done->state(), v1::OPERATION_STATE_COMMITTED) << cut_done->error();
  absl::StatusOr<v1::Operation> done = WaitFinal(stub.get(), op.id());
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::OPERATION_STATE_COMMITTED) << done->error();
  EXPECT_EQ(done->from_generation(), 2);
  // The simulated agents name no source checksum: every step moved again.
  EXPECT_EQ(done->bytes_skipped_unchanged(), 0);
  EXPECT_EQ(done->bytes_total(), done->bytes_precopied());
  const v1::Job after = GetJob(stub.get(), job.id());
  EXPECT_EQ(after.generation(), 3);
  EXPECT_EQ(after.dataset_state().step(), 3);
}

}  // namespace
}  // namespace reshard::coordinator::testing
