// ReportRankFailure against the real reshard-coordinator over real
// PostgreSQL (issue 20): a training process holding only its job's worker
// token reports a dead rank; the job's watchers (WatchJob, here another
// rank's worker token) receive it on the open stream, well before a lease
// would expire; the audit trail records it; a rank outside the world is
// INVALID_ARGUMENT naming `rank` and its value; a scheduler may report too;
// a new generation starts with no failed ranks.
#include <chrono>

#include "grpcpp/grpcpp.h"
#include "planner/layout.h"
#include "tests/coordinator/server/server_fixture.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using test_support::GptJobSpec;
using test_support::MakeLayout;

class RankFailureTest : public AdminServerTest {
 protected:
  // A context for `token` (a worker token) with a deadline `seconds` away.
  static std::unique_ptr<grpc::ClientContext> WorkerCtx(const std::string& token,
                                                        int seconds = 20) {
    std::unique_ptr<grpc::ClientContext> c = Ctx();
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
    c->AddMetadata("authorization", "Bearer " + token);
    return c;
  }

  std::string WorkerToken(const std::string& job_id) {
    v1::GetWorkerTokenRequest r;
    r.set_job_id(job_id);
    v1::GetWorkerTokenResponse reply;
    const grpc::Status s = admin_->GetWorkerToken(Ctx().get(), r, &reply);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return reply.worker_token();
  }
};

TEST_F(RankFailureTest, WatchersSeeItAtOnceAndTheAuditRecordsIt) {
  const std::string address = coordinator_->address();
  StartAgents({"h0", "h1"}, address);
  const v1::Job job = Register(admin_.get(), GptJobSpec("rf", "team-a"));
  const int64_t world = planner::WorldSize(job.layout().config());
  ASSERT_EQ(world, 8);
  const std::string token = WorkerToken(job.id());
  // A worker-token client: what a training process holds, and nothing else.
  std::unique_ptr<CoordinatorStub> worker = CoordinatorClient(address, kAnonymousIdentity);

  // Another rank watches the job (deadline: the watcher's bound on the wait).
  std::unique_ptr<grpc::ClientContext> watch_ctx = WorkerCtx(token, 30);
  v1::WatchJobRequest watch;
  watch.set_job_id(job.id());
  std::unique_ptr<CoordinatorStub> watcher = CoordinatorClient(address, kAnonymousIdentity);
  auto reader = watcher->WatchJob(watch_ctx.get(), watch);
  v1::Job update;
  ASSERT_TRUE(reader->Read(&update));
  EXPECT_EQ(update.failed_ranks_size(), 0);

  v1::ReportRankFailureRequest report;
  report.set_job_id(job.id());
  report.set_rank(5);
  report.set_reason("exit status 137 (SIGKILL)");
  v1::RankFailure recorded;
  const auto reported = std::chrono::steady_clock::now();
  grpc::Status s = worker->ReportRankFailure(WorkerCtx(token).get(), report, &recorded);
  ASSERT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
  EXPECT_EQ(recorded.rank(), 5);
  EXPECT_EQ(recorded.reason(), "exit status 137 (SIGKILL)");
  EXPECT_EQ(recorded.generation(), job.generation());
  EXPECT_EQ(recorded.reported_by(), "worker:" + job.id());
  EXPECT_GT(recorded.reported_unix_ms(), job.created_unix_ms() - 1);

  // The watcher's next update carries it (the stream's deadline bounds the wait).
  ASSERT_TRUE(reader->Read(&update)) << reader->Finish().error_message();
  const double seen_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - reported).count();
  ASSERT_EQ(update.failed_ranks_size(), 1);
  EXPECT_EQ(update.failed_ranks(0).rank(), 5);
  EXPECT_EQ(update.failed_ranks(0).reason(), "exit status 137 (SIGKILL)");
  EXPECT_EQ(update.failed_ranks(0).reported_unix_ms(), recorded.reported_unix_ms());
  // Well before the host's lease would have told anyone.
  EXPECT_LT(seen_s, lease_ms_ / 1000.0) << seen_s;
  watch_ctx->TryCancel();
  while (reader->Read(&update)) {
  }
  reader->Finish();

  // A rank outside the world, either side: INVALID_ARGUMENT naming it.
  for (int bad : {8, -1}) {
    report.set_rank(bad);
    s = worker->ReportRankFailure(WorkerCtx(token).get(), report, &recorded);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_NE(s.error_message().find(absl::StrCat("rank ", bad, " ")), std::string::npos)
        << s.error_message();
  }
  // An unknown job: NOT_FOUND for a scheduler (a worker is refused first).
  report.set_job_id("no-such-job");
  report.set_rank(0);
  s = admin_->ReportRankFailure(Ctx().get(), report, &recorded);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();

  // A scheduler (here the admin) reports another rank: both are listed, by rank.
  report.set_job_id(job.id());
  report.set_rank(2);
  report.set_reason("host h0 unreachable");
  s = admin_->ReportRankFailure(Ctx().get(), report, &recorded);
  ASSERT_TRUE(s.ok()) << s.error_message();
  v1::Job now = GetJob(admin_.get(), job.id());
  ASSERT_EQ(now.failed_ranks_size(), 2);
  EXPECT_EQ(now.failed_ranks(0).rank(), 2);
  EXPECT_EQ(now.failed_ranks(0).reported_by(), recorded.reported_by());
  EXPECT_EQ(now.failed_ranks(1).rank(), 5);

  // The audit trail: the worker's report, with its rank and reason.
  v1::ListAuditRequest audit;
  audit.set_job_id(job.id());
  v1::ListAuditResponse entries;
  s = admin_->ListAudit(Ctx().get(), audit, &entries);
  ASSERT_TRUE(s.ok()) << s.error_message();
  int worker_reports = 0;
  for (const v1::AuditEntry& e : entries.entries()) {
    if (e.method() != "ReportRankFailure" || e.role() != "worker" || e.code() != "OK") continue;
    ++worker_reports;
    EXPECT_EQ(e.identity(), "worker:" + job.id());
    EXPECT_EQ(e.tenant(), "team-a");
    EXPECT_EQ(e.target(), "rank 5: exit status 137 (SIGKILL)");
  }
  EXPECT_EQ(worker_reports, 1);

  // A new generation (the scheduler's recovery) starts with none.
  const v1::Operation op =
      Resize(admin_.get(), job.id(), job.generation(), MakeLayout(2, 2, 1, {"h1"}, 4));
  const absl::StatusOr<v1::Operation> final_op = WaitFinal(admin_.get(), op.id());
  ASSERT_TRUE(final_op.ok()) << final_op.status();
  ASSERT_EQ(final_op->state(), v1::OPERATION_STATE_COMMITTED) << final_op->error();
  now = GetJob(admin_.get(), job.id());
  EXPECT_EQ(now.generation(), job.generation() + 1);
  EXPECT_EQ(now.failed_ranks_size(), 0);
}

}  // namespace
}  // namespace reshard::coordinator::testing
