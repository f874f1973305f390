// Where a job's state lives (JobSpec.state_memory; docs/coordinator.md,
// "Where a job's state lives"), on both stores: RegisterJob keeps it
// (UNSPECIFIED as HOST), refuses a value outside the enum, and an
// idempotent retry with another value; GetJob / ListJobs show it, also
// from a reopened store; every host's task of a resize, a checkpoint and a
// recovery carries it as HostTask.device_resident.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/coordinator/logic/logic_fixture.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using test_support::MakeLayout;
using test_support::ReplicatedTwoLayerJob;
using test_support::TwoLayerJob;

class StateMemoryTest : public LogicTest {
 protected:
  static v1::JobSpec WithMemory(v1::JobSpec spec, v1::StateMemory memory) {
    spec.set_state_memory(memory);
    return spec;
  }

  absl::StatusOr<v1::RegisterJobResponse> TryRegister(const v1::JobSpec& spec,
                                                      const std::string& key) {
    v1::RegisterJobRequest request;
    *request.mutable_spec() = spec;
    request.set_idempotency_key(key);
    return api_->RegisterJob(request);
  }

  absl::StatusOr<v1::Job> Read(StorePtr store, const std::string& job_id) {
    return store->GetJob(job_id, /*include_ptc=*/false);
  }

  /// device_resident of the task of every participant of `op_id`, in the
  /// order of Participants (at least one host).
  std::vector<bool> DeviceResident(const std::string& op_id) {
    std::vector<bool> flags;
    const std::vector<std::string> hosts = Participants(op_id);
    EXPECT_FALSE(hosts.empty()) << op_id;
    for (const std::string& host : hosts) {
      v1::GetTaskRequest request;
      request.set_host_id(host);
      request.set_operation_id(op_id);
      absl::StatusOr<v1::HostTask> task = agents_->GetTask(request);
      EXPECT_TRUE(task.ok()) << host << ": " << task.status();
      if (!task.ok()) continue;
      EXPECT_GT(task->plan().steps_size() + task->plan().zero_fills_size(), 0) << host;
      flags.push_back(task->device_resident());
    }
    return flags;
  }

  /// A resize of a `memory` job to other hosts, in TRANSFERRING.
  v1::Operation Resize(v1::StateMemory memory) {
    const v1::Job job = Register(WithMemory(TwoLayerJob("resize"), memory));
    RegisterAgents({"h0", "h1", "h2"});
    const v1::Operation op = StartTransfer(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
    EXPECT_EQ(Op(op.id()).state(), v1::OPERATION_STATE_TRANSFERRING) << Op(op.id()).error();
    return op;
  }

  /// A checkpoint of a `memory` job, in TRANSFERRING.
  v1::Operation Checkpoint(v1::StateMemory memory) {
    const v1::Job job = Register(WithMemory(TwoLayerJob("checkpoint"), memory));
    RegisterAgents({"h0", "h1"});
    v1::CheckpointRequest request;
    request.set_job_id(job.id());
    request.set_expected_generation(1);
    absl::StatusOr<v1::Operation> started = api_->Checkpoint(request);
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return v1::Operation();
    Tick();
    EXPECT_EQ(Op(started->id()).state(), v1::OPERATION_STATE_TRANSFERRING)
        << Op(started->id()).error();
    return *started;
  }
};

TEST_P(StateMemoryTest, RegisterKeepsDeviceAndStoresUnspecifiedAsHost) {
  const v1::Job device = Register(WithMemory(TwoLayerJob("device"), v1::STATE_MEMORY_DEVICE));
  const v1::Job host = Register(WithMemory(TwoLayerJob("host"), v1::STATE_MEMORY_HOST));
  const v1::Job unspecified = Register(TwoLayerJob("unspecified"));
  EXPECT_EQ(device.state_memory(), v1::STATE_MEMORY_DEVICE);
  EXPECT_EQ(host.state_memory(), v1::STATE_MEMORY_HOST);
  EXPECT_EQ(unspecified.state_memory(), v1::STATE_MEMORY_HOST);

  v1::GetJobRequest get;
  get.set_job_id(device.id());
  absl::StatusOr<v1::Job> read = api_->GetJob(get);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->state_memory(), v1::STATE_MEMORY_DEVICE);
  get.set_job_id(unspecified.id());
  read = api_->GetJob(get);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->state_memory(), v1::STATE_MEMORY_HOST);

  absl::StatusOr<v1::ListJobsResponse> list = api_->ListJobs(v1::ListJobsRequest());
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->jobs_size(), 3);
  for (const v1::Job& job : list->jobs()) {
    EXPECT_EQ(job.state_memory(),
              job.id() == device.id() ? v1::STATE_MEMORY_DEVICE : v1::STATE_MEMORY_HOST)
        << job.name();
  }

  // What a restarted replica reads (on PostgreSQL, a new connection pool).
  StorePtr reopened = ConnectStore();
  absl::StatusOr<v1::Job> again = Read(reopened, device.id());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->state_memory(), v1::STATE_MEMORY_DEVICE);
  again = Read(reopened, host.id());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->state_memory(), v1::STATE_MEMORY_HOST);
}

TEST_P(StateMemoryTest, AValueOutsideTheEnumIsRefusedNamingTheFieldAndStoresNothing) {
  const DatabaseSnapshot before = Snapshot();
  v1::JobSpec spec = TwoLayerJob("bad");
  spec.set_state_memory(static_cast<v1::StateMemory>(7));
  EXPECT_THAT(TryRegister(spec, "").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "spec.state_memory 7 is not a known StateMemory (0 UNSPECIFIED, 1 HOST, "
                       "2 DEVICE)"));
  EXPECT_TRUE(Snapshot() == before);
  // The store refuses it too (PostgreSQL's CHECK would; the message is the same).
  EXPECT_THAT(store_->CreateJob("job-bad", spec, Idempotency()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "spec.state_memory 7"));
  EXPECT_TRUE(Snapshot() == before);
}

TEST_P(StateMemoryTest, ARetryWithAnotherStateMemoryIsRefused) {
  const v1::JobSpec device = WithMemory(TwoLayerJob("keyed"), v1::STATE_MEMORY_DEVICE);
  const v1::Job first = Register(device, "k");
  absl::StatusOr<v1::RegisterJobResponse> retry = TryRegister(device, "k");
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry->job().id(), first.id());
  EXPECT_EQ(retry->job().state_memory(), v1::STATE_MEMORY_DEVICE);
  for (v1::StateMemory other : {v1::STATE_MEMORY_HOST, v1::STATE_MEMORY_UNSPECIFIED}) {
    EXPECT_THAT(TryRegister(WithMemory(device, other), "k").status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         "idempotency key \"k\" was already used for a different RegisterJob"))
        << v1::StateMemory_Name(other);
  }
  EXPECT_EQ(Job(first.id()).state_memory(), v1::STATE_MEMORY_DEVICE);
}

TEST_P(StateMemoryTest, EveryTaskOfADeviceJobsResizeIsDeviceResident) {
  const v1::Operation op = Resize(v1::STATE_MEMORY_DEVICE);
  EXPECT_EQ(DeviceResident(op.id()), (std::vector<bool>{true, true, true}));
}

TEST_P(StateMemoryTest, NoTaskOfAHostJobsResizeIsDeviceResident) {
  const v1::Operation op = Resize(v1::STATE_MEMORY_HOST);
  EXPECT_EQ(DeviceResident(op.id()), (std::vector<bool>{false, false, false}));
}

TEST_P(StateMemoryTest, ACheckpointsTasksFollowTheJob) {
  const v1::Operation op = Checkpoint(v1::STATE_MEMORY_DEVICE);
  EXPECT_EQ(DeviceResident(op.id()), (std::vector<bool>{true, true}));
}

TEST_P(StateMemoryTest, AnUnspecifiedJobsCheckpointIsNotDeviceResident) {
  const v1::Operation op = Checkpoint(v1::STATE_MEMORY_UNSPECIFIED);
  EXPECT_EQ(DeviceResident(op.id()), (std::vector<bool>{false, false}));
}

TEST_P(StateMemoryTest, ARecoverysTasksFollowTheJob) {
  // Every item on both hosts: losing h1 loses nothing.
  const v1::Job job =
      Register(WithMemory(ReplicatedTwoLayerJob("recover"), v1::STATE_MEMORY_DEVICE));
  RegisterAgents({"h0", "h1", "h2"});
  v1::RecoverFromFailureRequest request;
  request.set_job_id(job.id());
  request.set_expected_generation(1);
  request.add_lost_hosts("h1");
  request.set_accept_degraded(true);  // h0 alone: one copy left, accepted
  absl::StatusOr<v1::Operation> recover = api_->RecoverFromFailure(request);
  ASSERT_TRUE(recover.ok()) << recover.status();
  Tick();
  ASSERT_EQ(Op(recover->id()).state(), v1::OPERATION_STATE_TRANSFERRING)
      << Op(recover->id()).error();
  const std::vector<bool> flags = DeviceResident(recover->id());
  EXPECT_EQ(flags, std::vector<bool>(Participants(recover->id()).size(), true));
}

RESHARD_LOGIC_ON_BOTH_STORES(StateMemoryTest);

}  // namespace
}  // namespace reshard::coordinator::testing
