// Store::PruneRetention (issue 9, defect 10): rows beyond the policy are
// pruned, rows within it are kept, each call is bounded by batch_rows, and
// nothing current, pending or active is touched. Ages are made real by
// moving the rows' timestamps back in the database, or the in-memory
// store's clock on (both stores: the contract suite).
#include <gtest/gtest.h>

#include <pqxx/pqxx>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/coordinator/store/store_fixture.h"

namespace reshard::coordinator::store_test {
namespace {

class RetentionTest : public StoreContractTest {
 protected:
  void Sql(const std::string& sql) {
    ASSERT_TRUE(IsPostgres());
    pqxx::connection conn(dsn_);
    pqxx::nontransaction n(conn);
    n.exec(sql);
  }
  // Runs operation `op` of `job_id` from generation `from` through a
  // transfer and commits it (from becomes RETIRED) or aborts it (its pending
  // generation becomes DISCARDED).
  void Run(const std::string& job_id, const std::string& op, int64_t from, bool commit) {
    const v1::Layout target =
        test_support::MakeLayout(2, 2, 1, {from % 2 == 0 ? "h0" : "h2", "h3"}, 2);
    ASSERT_TRUE(
        store_->CreateOperation(Resize(op, job_id, from, target, Key("key-" + op, "Resize", op)))
            .ok());
    ASSERT_TRUE(
        store_
            ->TransitionOperation(op, v1::OPERATION_STATE_PENDING, v1::OPERATION_STATE_PLANNED, {})
            .ok());
    ASSERT_TRUE(store_->StartTransfer(op, {Progress("h3", v1::HOST_TASK_STATE_ASSIGNED)}).ok());
    if (commit) {
      ASSERT_TRUE(store_->CommitOperation(op).ok());
    } else {
      ASSERT_TRUE(store_
                      ->TransitionOperation(op, v1::OPERATION_STATE_TRANSFERRING,
                                            v1::OPERATION_STATE_ABORTED, {})
                      .ok());
    }
  }
  // A job with `commits` committed resizes: generations 1..commits RETIRED.
  void JobWithCommits(const std::string& job_id, int commits) {
    ASSERT_TRUE(store_->CreateJob(job_id, test_support::StoreSmallSpec(job_id), {}).ok());
    for (int g = 1; g <= commits; ++g) Run(job_id, absl::StrCat(job_id, "-op", g), g, true);
  }
  // Every generation's and operation's time `interval` ("2 hours", `ms`)
  // earlier: the database's rows moved back, or the in-memory store's clock
  // moved on (the same thing to an age).
  void AgeEverything(const std::string& interval, int64_t ms) {
    if (!IsPostgres()) {
      AdvanceMemoryClock(ms);
      return;
    }
    Sql("UPDATE generations SET committed_at = committed_at - interval '" + interval +
        "', created_at = created_at - interval '" + interval + "'");
    Sql("UPDATE operations SET finished_at = finished_at - interval '" + interval + "'");
  }
  // The job's generations in `state` (CURRENT, RETIRED or DISCARDED), read
  // through the Store: every generation here places ranks on h0..h3.
  std::set<int64_t> GenerationsIn(const std::string& job_id, int state) {
    std::set<int64_t> out;
    if (state == 1) {
      absl::StatusOr<v1::Job> job = store_->GetJob(job_id, false);
      v1::GenerationRef current;
      current.set_job_id(job_id);
      current.set_generation(job.ok() ? job->generation() : 0);
      if (job.ok() && store_->StaleGenerations({current})->empty()) out.insert(job->generation());
      return out;
    }
    for (const char* host : {"h0", "h1", "h2", "h3"}) {
      absl::StatusOr<std::vector<v1::GenerationRef>> refs =
          state == 3 ? store_->GenerationsToRelease(host) : store_->GenerationsToDiscard(host);
      EXPECT_TRUE(refs.ok()) << refs.status();
      for (const v1::GenerationRef& g : *refs) {
        if (g.job_id() == job_id) out.insert(g.generation());
      }
    }
    return out;
  }
  int64_t Generations(const std::string& job_id, int state) {
    return static_cast<int64_t>(GenerationsIn(job_id, state).size());
  }
  std::string RetiredList(const std::string& job_id) {
    return absl::StrJoin(GenerationsIn(job_id, 3), ",");
  }
  static RetentionPolicy Policy() {
    RetentionPolicy p;
    p.keep_retired_generations = 2;
    p.retired_min_age_ms = 3600 * 1000;
    p.discarded_min_age_ms = 600 * 1000;
    p.keep_operations = 2;
    p.operation_min_age_ms = 7LL * 24 * 3600 * 1000;
    p.batch_rows = 500;
    return p;
  }
};

TEST_P(RetentionTest, OldRetiredGenerationsBeyondTheNewestNArePruned) {
  JobWithCommits("job-old", 5);  // 1..5 RETIRED, 6 CURRENT
  AgeEverything("2 hours", 2 * 3600 * 1000);
  JobWithCommits("job-young", 5);  // retired just now: within the age
  ASSERT_EQ(RetiredList("job-old"), "1,2,3,4,5");

  RetentionPolicy policy = Policy();
  policy.keep_operations = 1000;  // generations only here
  absl::StatusOr<PrunedRows> pruned = store_->PruneRetention(policy);
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_EQ(pruned->generations, 3);
  EXPECT_EQ(pruned->operations, 0);
  EXPECT_EQ(RetiredList("job-old"), "4,5");  // the newest 2 kept
  EXPECT_EQ(Generations("job-old", 1), 1);   // CURRENT untouched
  EXPECT_EQ(RetiredList("job-young"), "1,2,3,4,5");
  if (IsPostgres()) {
    EXPECT_EQ(CountRows("SELECT count(*) FROM generation_ranks WHERE job_id = $1 AND generation "
                        "<= 3",
                        "job-old"),
              0);  // their rank rows went with them
  }

  // Nothing more is due.
  pruned = store_->PruneRetention(policy);
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_EQ(pruned->generations, 0);
}

TEST_P(RetentionTest, RetiredWithinTheAgeAreKeptEvenBeyondN) {
  JobWithCommits("job-1", 4);
  AgeEverything("30 minutes", 30 * 60 * 1000);  // retired, but not an hour ago
  RetentionPolicy policy = Policy();
  policy.keep_retired_generations = 0;
  policy.keep_operations = 1000;
  absl::StatusOr<PrunedRows> pruned = store_->PruneRetention(policy);
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_EQ(pruned->generations, 0);
  EXPECT_EQ(RetiredList("job-1"), "1,2,3,4");
}

TEST_P(RetentionTest, DiscardedGenerationsArePrunedAfterTheirAge) {
  ASSERT_TRUE(store_->CreateJob("job-1", test_support::StoreSmallSpec("job-1"), {}).ok());
  Run("job-1", "op-a", 1, false);  // generation 2 DISCARDED
  AgeEverything("20 minutes", 20 * 60 * 1000);
  Run("job-1", "op-b", 1, false);  // generation 3 DISCARDED just now
  ASSERT_EQ(Generations("job-1", 4), 2);
  RetentionPolicy policy = Policy();
  policy.keep_operations = 1000;
  absl::StatusOr<PrunedRows> pruned = store_->PruneRetention(policy);
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_EQ(pruned->generations, 1);
  EXPECT_EQ(GenerationsIn("job-1", 4), std::set<int64_t>{3});
  EXPECT_EQ(Generations("job-1", 1), 1);
}

TEST_P(RetentionTest, FinishedOperationsBeyondTheNewestNAndOldArePruned) {
  JobWithCommits("job-1", 5);
  AgeEverything("8 days", 8LL * 24 * 3600 * 1000);
  // An active operation, as old as can be, is never pruned.
  const v1::Layout target = test_support::MakeLayout(2, 2, 1, {"h5", "h6"}, 2);
  ASSERT_TRUE(store_->CreateOperation(Resize("op-active", "job-1", 6, target)).ok());
  if (IsPostgres()) Sql("UPDATE operations SET created_at = created_at - interval '30 days'");

  RetentionPolicy policy = Policy();
  policy.keep_retired_generations = 1000;
  absl::StatusOr<PrunedRows> pruned = store_->PruneRetention(policy);
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  // 6 operations, the newest 2 kept (op-active and job-1-op5).
  EXPECT_EQ(pruned->operations, 4);
  absl::StatusOr<std::vector<v1::Operation>> left = store_->ListOperationsForJob("job-1");
  ASSERT_TRUE(left.ok()) << left.status();
  ASSERT_EQ(left->size(), 2u);
  EXPECT_EQ((*left)[0].id(), "op-active");
  EXPECT_EQ((*left)[1].id(), "job-1-op5");
  // Their keys and progress rows went with them; the kept one's stayed.
  if (IsPostgres()) {
    EXPECT_EQ(
        CountRows("SELECT count(*) FROM idempotency_keys WHERE key LIKE $1", "key-job-1-op%"), 1);
    EXPECT_EQ(
        CountRows("SELECT count(*) FROM operation_hosts WHERE operation_id LIKE $1", "job-1-op%"),
        1);
  }
  EXPECT_FALSE(
      store_->LookupIdempotencyKey(Key("key-job-1-op1", "Resize", "job-1-op1"))->has_value());
  EXPECT_EQ(**store_->LookupIdempotencyKey(Key("key-job-1-op5", "Resize", "job-1-op5")),
            "job-1-op5");
  EXPECT_EQ(store_->GetHostProgress("job-1-op5")->size(), 1u);
  // Generations keep their numbers: a new operation still gets a fresh one.
  EXPECT_EQ(store_->GetOperation("op-active", false)->op.to_generation(), 7);
}

TEST_P(RetentionTest, RecentOperationsAreKept) {
  JobWithCommits("job-1", 5);
  AgeEverything("6 days", 6LL * 24 * 3600 * 1000);
  absl::StatusOr<PrunedRows> pruned = store_->PruneRetention(Policy());
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_EQ(pruned->operations, 0);
  EXPECT_EQ(store_->ListOperationsForJob("job-1")->size(), 5u);
}

TEST_P(RetentionTest, EachCallIsBoundedByBatchRows) {
  JobWithCommits("job-a", 5);
  JobWithCommits("job-b", 4);
  AgeEverything("8 days", 8LL * 24 * 3600 * 1000);
  RetentionPolicy policy = Policy();
  policy.keep_retired_generations = 0;
  policy.keep_operations = 0;
  policy.batch_rows = 3;
  // 9 RETIRED generations and 9 finished operations, 3 of each per call.
  for (int call = 0; call < 3; ++call) {
    absl::StatusOr<PrunedRows> pruned = store_->PruneRetention(policy);
    ASSERT_TRUE(pruned.ok()) << pruned.status();
    EXPECT_EQ(pruned->generations, 3) << "call " << call;
    EXPECT_EQ(pruned->operations, 3) << "call " << call;
  }
  absl::StatusOr<PrunedRows> pruned = store_->PruneRetention(policy);
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_EQ(pruned->generations, 0);
  EXPECT_EQ(pruned->operations, 0);
  EXPECT_EQ(Generations("job-a", 1), 1);
  EXPECT_EQ(Generations("job-b", 1), 1);
}

TEST_P(RetentionTest, InvalidPolicyIsRefused) {
  RetentionPolicy policy = Policy();
  policy.batch_rows = 0;
  EXPECT_EQ(store_->PruneRetention(policy).status().code(), absl::StatusCode::kInvalidArgument);
}

RESHARD_STORE_CONTRACT(RetentionTest);

}  // namespace
}  // namespace reshard::coordinator::store_test
