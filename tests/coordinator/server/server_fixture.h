// Shared pieces of the coordinator's integration tests: a fresh database per
// test on the binary's shared throwaway PostgreSQL, real reshard-coordinator
// processes on port 0, gRPC clients, simulated agents, snapshots of what the
// scheduler API shows, and polling with deadlines (never blind sleeps).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "reshard/v1/agent.grpc.pb.h"
#include "reshard/v1/coordinator.grpc.pb.h"
#include "tests/coordinator/harness/eventually.h"
#include "tests/coordinator/server/coordinator_process.h"
#include "tests/coordinator/server/fake_agent.h"
#include "tests/coordinator/server/test_channel.h"

namespace reshard::coordinator::testing {

using CoordinatorStub = v1::CoordinatorService::Stub;
using AgentStub = v1::AgentService::Stub;

/// A ClientContext with a 30 s deadline.
std::unique_ptr<grpc::ClientContext> Ctx();

/// kAdminIdentity, or kInsecureIdentity in a fixture whose Insecure() is true.
std::string DefaultIdentity();

/// Clients as `identity` (test_channel.h; empty: DefaultIdentity()).
std::unique_ptr<CoordinatorStub> CoordinatorClient(const std::string& address,
                                                   const std::string& identity = "");
/// An agent speaks for the host of its certificate: "agent:<host id>".
std::unique_ptr<AgentStub> AgentClient(const std::string& address, const std::string& identity);

/// Everything the scheduler API shows about jobs: every page of ListJobs
/// and GetJob (with its PTC) of each, serialized. Equal snapshots: nothing
/// changed.
std::string JobsSnapshot(CoordinatorStub* stub);

/// GetJob, GetOperation, Resize (to `target`'s placement and config, from
/// `generation`; two-phase when `stop_free`) and MarkPrepared that fail the
/// current test when the call fails.
v1::Job GetJob(CoordinatorStub* stub, const std::string& id);
v1::Operation GetOperation(CoordinatorStub* stub, const std::string& id);
v1::Operation Resize(CoordinatorStub* stub, const std::string& job_id, int64_t generation,
                     const v1::Layout& target, bool stop_free = false);
v1::Operation MarkPrepared(CoordinatorStub* stub, const std::string& operation_id);

/// Polls GetOperation until the operation is COMMITTED, ABORTED or FAILED.
absl::StatusOr<v1::Operation> WaitFinal(CoordinatorStub* stub, const std::string& operation_id,
                                        absl::Duration timeout = absl::Seconds(60));
/// Polls GetOperation until it is in `state` (or final: then an error).
absl::Status WaitState(CoordinatorStub* stub, const std::string& operation_id,
                       v1::OperationState state, absl::Duration timeout = absl::Seconds(60));

/// Whether `state` is COMMITTED, ABORTED or FAILED.
bool IsFinal(v1::OperationState state);

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  /// Whether this fixture's coordinators run --insecure (plaintext, no
  /// authentication): for tests that are not about security and need what
  /// a certificate cannot carry. Default: mutual TLS with the shared test CA.
  virtual bool Insecure() const { return false; }

  /// The flags every test coordinator gets: this test's database, ports 0
  /// on loopback, short ticks, lease_ms_, TLS (or --insecure); `extra` is appended (a flag given
  /// twice is refused, so tests pass only flags not set here:
  /// --max-spec-bytes, --replica-id, --transfer-timeout-ms).
  std::vector<std::string> Flags(const std::vector<std::string>& extra = {}) const;
  /// Starts a coordinator on this test's database (fails the test if it
  /// cannot).
  std::unique_ptr<CoordinatorProcess> StartCoordinator(const std::vector<std::string>& extra = {});

  /// Simulated agents on hosts `ids` (4 devices each), registered with and
  /// heartbeating to `address`.
  void StartAgents(const std::vector<std::string>& ids, const std::string& address);
  void PointAgentsAt(const std::string& address);
  void HoldAgents(bool hold);
  void StopAgents();
  FakeAgent* agent(const std::string& id);

  /// RegisterJob of `spec`; the job (fails the test on error).
  v1::Job Register(CoordinatorStub* stub, const v1::JobSpec& spec);

  std::string dsn_;
  int64_t lease_ms_ = 5000;  // --lease-ms of coordinators started from now
  std::vector<std::unique_ptr<FakeAgent>> agents_;
};

/// A ServerTest with one coordinator started (mutual TLS) and an admin
/// client of it.
class AdminServerTest : public ServerTest {
 protected:
  void SetUp() override;

  std::unique_ptr<CoordinatorProcess> coordinator_;
  std::unique_ptr<CoordinatorStub> admin_;
};

}  // namespace reshard::coordinator::testing
