// The dataset state against the real reshard-coordinator and a real
// PostgreSQL (issue 12; docs/data.md): RegisterJob stores it, GetJob returns
// it, CommitStep commits the cursor with the current generation and refuses
// stale generations, other layouts, backward or skipping cursors and bad
// values; a resize, a migrate and a recover carry it to the new generation
// (the last step committed while the transfer ran included); every
// CommitStep is audited; the C++ client's CommitStep.
#include <string>

#include "absl/strings/str_cat.h"
#include "client/cpp/coordinator_client.h"
#include "common/data/data_share.h"
#include "grpcpp/grpcpp.h"
#include "tests/coordinator/server/server_fixture.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using test_support::GptJobSpec;
using test_support::MakeLayout;
using test_support::ReplicatedGptJobSpec;

constexpr int64_t kBatch = 48;

v1::DatasetState Dataset() {
  v1::DatasetState d;
  d.mutable_dataset()->set_id("wiki-2026");
  d.mutable_dataset()->set_num_samples(1000);
  d.mutable_dataset()->set_fingerprint("sha1:abc");
  d.mutable_order()->set_seed(0xFFFFFFFFFFFFFFFFULL);  // the full uint64 range survives
  d.mutable_order()->set_shuffle(v1::SHUFFLE_BLOCK);
  d.mutable_order()->set_block_size(64);
  d.set_global_batch(kBatch);
  return d;
}

class DatasetStateTest : public AdminServerTest {
 protected:
  v1::Job RegisterWithData(const std::string& name, const v1::DatasetState& dataset,
                           v1::JobSpec spec = {}) {
    v1::RegisterJobRequest r;
    *r.mutable_spec() = spec.name().empty() ? GptJobSpec(name, "team-a") : std::move(spec);
    *r.mutable_dataset_state() = dataset;
    v1::RegisterJobResponse reply;
    const grpc::Status s = admin_->RegisterJob(Ctx().get(), r, &reply);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return reply.job();
  }

  grpc::Status Commit(const std::string& job_id, int64_t generation, int64_t step, int64_t cursor,
                      const std::string& fingerprint, v1::DatasetState* reply) {
    v1::CommitStepRequest r;
    r.set_job_id(job_id);
    r.set_generation(generation);
    r.set_step(step);
    r.set_cursor(cursor);
    r.set_layout_fingerprint(fingerprint);
    return admin_->CommitStep(Ctx().get(), r, reply);
  }

  static std::string ExpectedFingerprint() {
    const v1::DatasetState d = Dataset();
    return data::LayoutFingerprint(d.dataset().id(), d.dataset().num_samples(),
                                   d.dataset().fingerprint(),
                                   {d.order().seed(), data::Shuffle::kBlock, 64}, kBatch);
  }
};

TEST_F(DatasetStateTest, RegisterStoresItAndCommitStepAdvancesTheCursor) {
  const v1::Job registered = RegisterWithData("trained", Dataset());
  ASSERT_TRUE(registered.has_dataset_state());
  const std::string fp = ExpectedFingerprint();
  EXPECT_EQ(registered.dataset_state().layout_fingerprint(), fp);  // filled in

  v1::Job job = GetJob(admin_.get(), registered.id());
  ASSERT_TRUE(job.has_dataset_state());
  EXPECT_EQ(job.dataset_state().order().seed(), 0xFFFFFFFFFFFFFFFFULL);
  EXPECT_EQ(job.dataset_state().order().shuffle(), v1::SHUFFLE_BLOCK);
  EXPECT_EQ(job.dataset_state().cursor(), 0);
  EXPECT_EQ(job.dataset_state().committed_generation(), 1);

  v1::DatasetState state;
  grpc::Status s = Commit(job.id(), 1, 1, kBatch, fp, &state);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(state.cursor(), kBatch);
  EXPECT_EQ(state.step(), 1);
  EXPECT_EQ(state.committed_generation(), 1);
  EXPECT_GT(state.committed_unix_ms(), 0);
  // A retried commit of the same step is a no-op, not an error.
  v1::DatasetState again;
  s = Commit(job.id(), 1, 1, kBatch, fp, &again);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(again.cursor(), kBatch);
  // Committing every few steps is fine when the cursor matches.
  s = Commit(job.id(), 1, 4, 4 * kBatch, fp, &state);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(GetJob(admin_.get(), job.id()).dataset_state().cursor(), 4 * kBatch);

  // Every commit is in the audit trail, naming the job.
  v1::ListAuditRequest audit;
  audit.set_job_id(job.id());
  v1::ListAuditResponse rows;
  ASSERT_TRUE(admin_->ListAudit(Ctx().get(), audit, &rows).ok());
  int commits = 0;
  for (const v1::AuditEntry& e : rows.entries()) {
    if (e.method() == "CommitStep") {
      ++commits;
      EXPECT_EQ(e.code(), "OK");
      EXPECT_EQ(e.tenant(), "team-a");
    }
  }
  EXPECT_EQ(commits, 3);
}

TEST_F(DatasetStateTest, CommitStepRefusals) {
  const v1::Job job = RegisterWithData("guarded", Dataset());
  const std::string fp = ExpectedFingerprint();
  v1::DatasetState state;
  ASSERT_TRUE(Commit(job.id(), 1, 2, 2 * kBatch, fp, &state).ok());

  struct Case {
    const char* what;
    int64_t generation, step, cursor;
    std::string fingerprint;
    grpc::StatusCode code;
    std::string message_part;
  };
  const Case cases[] = {
      {"stale generation", 2, 3, 3 * kBatch, fp, grpc::StatusCode::FAILED_PRECONDITION,
       "generation 2 is not the current generation 1"},
      {"other layout", 1, 3, 3 * kBatch, "sha256:other", grpc::StatusCode::FAILED_PRECONDITION,
       "layout_fingerprint \"sha256:other\" does not match"},
      {"backwards cursor", 1, 3, kBatch, fp, grpc::StatusCode::FAILED_PRECONDITION,
       "cursor 48 would move backwards from the committed 96"},
      {"skipping cursor", 1, 3, 3 * kBatch + 1, fp, grpc::StatusCode::FAILED_PRECONDITION,
       "samples would be skipped or repeated"},
      {"old step", 1, 1, 2 * kBatch + kBatch, fp, grpc::StatusCode::FAILED_PRECONDITION,
       "step 1 is not after the committed step 2"},
      {"step 0", 1, 0, 0, fp, grpc::StatusCode::INVALID_ARGUMENT, "step: 0 must be >= 1"},
      {"negative cursor", 1, 3, -1, fp, grpc::StatusCode::INVALID_ARGUMENT,
       "cursor: -1 must be >= 0"},
      {"no generation", 0, 3, 3 * kBatch, fp, grpc::StatusCode::INVALID_ARGUMENT,
       "generation: 0 must be >= 1"},
      {"no fingerprint", 1, 3, 3 * kBatch, "", grpc::StatusCode::INVALID_ARGUMENT,
       "layout_fingerprint is empty"},
  };
  for (const Case& c : cases) {
    const grpc::Status s = Commit(job.id(), c.generation, c.step, c.cursor, c.fingerprint, &state);
    EXPECT_EQ(s.error_code(), c.code) << c.what << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(c.message_part), std::string::npos)
        << c.what << ": " << s.error_message();
  }
  // Nothing moved.
  EXPECT_EQ(GetJob(admin_.get(), job.id()).dataset_state().cursor(), 2 * kBatch);
  EXPECT_EQ(GetJob(admin_.get(), job.id()).dataset_state().step(), 2);

  EXPECT_EQ(Commit("no-such-job", 1, 1, kBatch, fp, &state).error_code(),
            grpc::StatusCode::NOT_FOUND);
  const v1::Job plain = Register(admin_.get(), GptJobSpec("no-data", "team-a"));
  EXPECT_FALSE(GetJob(admin_.get(), plain.id()).has_dataset_state());
  const grpc::Status s = Commit(plain.id(), 1, 1, kBatch, fp, &state);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("has no dataset state"), std::string::npos);
}

TEST_F(DatasetStateTest, RegisterRefusesABadDatasetStateNamingTheField) {
  struct Case {
    std::string field;
    std::function<void(v1::DatasetState*)> spoil;
  };
  const Case cases[] = {
      {"dataset_state.dataset.id", [](v1::DatasetState* d) { d->mutable_dataset()->clear_id(); }},
      {"dataset_state.dataset.num_samples: 0",
       [](v1::DatasetState* d) { d->mutable_dataset()->set_num_samples(0); }},
      {"dataset_state.order.block_size: 0",
       [](v1::DatasetState* d) { d->mutable_order()->set_block_size(0); }},
      {"dataset_state.order.shuffle: 7",
       [](v1::DatasetState* d) {
         d->mutable_order()->set_shuffle(static_cast<v1::SampleShuffle>(7));
       }},
      {"dataset_state.global_batch: 0", [](v1::DatasetState* d) { d->set_global_batch(0); }},
      {"dataset_state.cursor: -5", [](v1::DatasetState* d) { d->set_cursor(-5); }},
  };
  int serial = 0;
  for (const Case& c : cases) {
    v1::DatasetState d = Dataset();
    c.spoil(&d);
    v1::RegisterJobRequest r;
    *r.mutable_spec() = GptJobSpec(absl::StrCat("bad-", ++serial), "team-a");
    *r.mutable_dataset_state() = d;
    v1::RegisterJobResponse reply;
    const grpc::Status s = admin_->RegisterJob(Ctx().get(), r, &reply);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_NE(s.error_message().find(c.field), std::string::npos) << s.error_message();
  }
  v1::ListJobsRequest list;
  list.set_tenant("team-a");
  v1::ListJobsResponse jobs;
  ASSERT_TRUE(admin_->ListJobs(Ctx().get(), list, &jobs).ok());
  EXPECT_EQ(jobs.jobs_size(), 0);  // nothing half-registered
}

TEST_F(DatasetStateTest, ResizeAndMigrateCarryTheCommittedState) {
  StartAgents({"h0", "h1", "h2"}, coordinator_->address());
  const v1::Job job = RegisterWithData("elastic", Dataset());
  const std::string fp = ExpectedFingerprint();
  v1::DatasetState state;
  ASSERT_TRUE(Commit(job.id(), 1, 3, 3 * kBatch, fp, &state).ok());

  const v1::Operation resize = Resize(admin_.get(), job.id(), 1, MakeLayout(2, 2, 1, {"h0"}, 4));
  absl::StatusOr<v1::Operation> done = WaitFinal(admin_.get(), resize.id());
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::OPERATION_STATE_COMMITTED) << done->error();

  v1::Job resized = GetJob(admin_.get(), job.id());
  ASSERT_EQ(resized.generation(), 2);
  ASSERT_TRUE(resized.dataset_state().has_dataset());
  EXPECT_EQ(resized.dataset_state().cursor(), 3 * kBatch);
  EXPECT_EQ(resized.dataset_state().step(), 3);
  EXPECT_EQ(resized.dataset_state().layout_fingerprint(), fp);
  EXPECT_EQ(resized.dataset_state().committed_generation(), 1);

  // The old generation can no longer commit; the new one goes on from there.
  grpc::Status s = Commit(job.id(), 1, 4, 4 * kBatch, fp, &state);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  s = Commit(job.id(), 2, 4, 4 * kBatch, fp, &state);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(state.committed_generation(), 2);

  v1::MigrateRequest migrate;
  migrate.set_job_id(job.id());
  migrate.set_expected_generation(2);
  *migrate.mutable_placement() = MakeLayout(2, 2, 1, {"h2"}, 4).placement();
  v1::Operation op;
  s = admin_->Migrate(Ctx().get(), migrate, &op);
  ASSERT_TRUE(s.ok()) << s.error_message();
  done = WaitFinal(admin_.get(), op.id());
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::OPERATION_STATE_COMMITTED) << done->error();
  const v1::Job migrated = GetJob(admin_.get(), job.id());
  EXPECT_EQ(migrated.generation(), 3);
  EXPECT_EQ(migrated.dataset_state().cursor(), 4 * kBatch);
  EXPECT_EQ(migrated.dataset_state().step(), 4);
  EXPECT_EQ(migrated.dataset_state().committed_generation(), 2);
}

TEST_F(DatasetStateTest, RecoverCarriesTheStepCommittedDuringTheTransfer) {
  StartAgents({"h0", "h1", "h2", "h3"}, coordinator_->address());
  const v1::Job job =
      RegisterWithData("survivor", Dataset(), ReplicatedGptJobSpec("survivor", "team-a"));
  const std::string fp = ExpectedFingerprint();
  // The C++ client library's CommitStep.
  client::CoordinatorClient::Options options;
  client::CoordinatorClient cpp(TestChannel(coordinator_->address(), kAdminIdentity), options);
  v1::CommitStepRequest commit;
  commit.set_job_id(job.id());
  commit.set_generation(1);
  commit.set_step(1);
  commit.set_cursor(kBatch);
  commit.set_layout_fingerprint(fp);
  absl::StatusOr<v1::DatasetState> committed = cpp.CommitStep(commit);
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(committed->cursor(), kBatch);
  commit.set_generation(7);
  EXPECT_EQ(cpp.CommitStep(commit).status().code(), absl::StatusCode::kFailedPrecondition);

  // The agents hold the recovery in TRANSFERRING; the old generation is
  // still current and keeps committing (a stop-free loop would).
  HoldAgents(true);
  v1::RecoverFromFailureRequest recover;
  recover.set_job_id(job.id());
  recover.set_expected_generation(1);
  recover.add_lost_hosts("h1");
  *recover.mutable_target() = MakeLayout(2, 2, 1, {"h0", "h2"}, 2);
  recover.set_accept_degraded(true);  // dp 1: one copy left, accepted
  v1::Operation op;
  grpc::Status s = admin_->RecoverFromFailure(Ctx().get(), recover, &op);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_TRUE(WaitState(admin_.get(), op.id(), v1::OPERATION_STATE_TRANSFERRING).ok());
  v1::DatasetState state;
  s = Commit(job.id(), 1, 2, 2 * kBatch, fp, &state);
  ASSERT_TRUE(s.ok()) << s.error_message();
  HoldAgents(false);
  absl::StatusOr<v1::Operation> done = WaitFinal(admin_.get(), op.id());
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::OPERATION_STATE_COMMITTED) << done->error();

  const v1::Job recovered = GetJob(admin_.get(), job.id());
  EXPECT_EQ(recovered.generation(), 2);
  EXPECT_EQ(recovered.dataset_state().cursor(), 2 * kBatch);
  EXPECT_EQ(recovered.dataset_state().step(), 2);
  EXPECT_EQ(recovered.dataset_state().committed_generation(), 1);
}

}  // namespace
}  // namespace reshard::coordinator::testing
