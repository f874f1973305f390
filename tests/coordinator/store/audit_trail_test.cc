// The audit trail (both stores; migrations/0005_audit.sql): a mutation made
// under an AuditScope writes the scope's record in its own transaction, so a
// mutation that fails leaves none; AppendAudit stores what the network sent
// safely (NUL bytes, huge ids); ListAudit filters and pages newest first;
// retention prunes rows past their age. Ages are made real by moving rows'
// times back in the database.
#include <gtest/gtest.h>

#include <pqxx/pqxx>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/coordinator/store/store_fixture.h"

namespace reshard::coordinator::store_test {
namespace {

class AuditStoreTest : public StoreContractTest {
 protected:
  int64_t AuditRows() {
    AuditQuery all;
    all.page_size = 10000;
    absl::StatusOr<AuditPage> page = store_->ListAudit(all);
    EXPECT_TRUE(page.ok()) << page.status();
    return page.ok() ? static_cast<int64_t>(page->records.size()) : -1;
  }
  AuditRecord Record(const std::string& method, const std::string& tenant = "") {
    AuditRecord r;
    r.identity = "scheduler:s@" + tenant;
    r.role = "scheduler";
    r.tenant = tenant;
    r.method = method;
    r.code = "PERMISSION_DENIED";
    return r;
  }
};

TEST_P(AuditStoreTest, MutationWritesTheScopeRecordInItsTransaction) {
  AuditRecord record = Record("RegisterJob");
  {
    AuditScope scope(&record);
    ASSERT_TRUE(store_->CreateJob("job-1", test_support::StoreSmallSpec("one", "team-a"), {}).ok());
  }
  EXPECT_TRUE(record.committed);
  EXPECT_GT(record.id, 0);
  AuditQuery all;
  absl::StatusOr<AuditPage> page = store_->ListAudit(all);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->records.size(), 1u);
  EXPECT_EQ(page->records[0].job_id, "job-1");
  EXPECT_EQ(page->records[0].tenant, "team-a");  // from the job the transaction wrote
  EXPECT_EQ(page->records[0].code, "OK");

  // Without a scope (the operation driver), no row.
  ASSERT_TRUE(store_
                  ->CreateOperation(
                      Resize("op-1", "job-1", 1, test_support::MakeLayout(2, 2, 1, {"h1"}, 4), {}))
                  .ok());
  EXPECT_EQ(AuditRows(), 1);

  // DeleteJob writes its row, then finds the active operation: the refusal
  // rolls the row back with the delete.
  AuditRecord del = Record("DeleteJob");
  {
    AuditScope scope(&del);
    EXPECT_TRUE(absl::IsFailedPrecondition(store_->DeleteJob("job-1")));
  }
  EXPECT_FALSE(del.committed);
  EXPECT_EQ(AuditRows(), 1);
}

TEST_P(AuditStoreTest, AppendStoresWhatTheNetworkSentSafely) {
  AuditRecord r = Record("DeleteJob", "team-a");
  r.job_id = std::string("bad\0id", 6);
  r.target = std::string(100000, 'x');
  r.message = std::string(5000, 'm');
  ASSERT_TRUE(store_->AppendAudit(r).ok());
  absl::StatusOr<AuditPage> page = store_->ListAudit(AuditQuery());
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->records.size(), 1u);
  EXPECT_EQ(page->records[0].job_id, "bad\\0id");
  EXPECT_LE(page->records[0].target.size(), 300u);
  EXPECT_LE(page->records[0].message.size(), kMaxAuditMessageBytes + 3);
}

TEST_P(AuditStoreTest, ListFiltersAndPagesNewestFirst) {
  for (int i = 0; i < 5; ++i) {
    AuditRecord r = Record("Resize", i % 2 == 0 ? "team-a" : "team-b");
    r.job_id = absl::StrCat("job-", i);
    ASSERT_TRUE(store_->AppendAudit(r).ok());
  }
  AuditQuery q;
  q.tenants = {"team-a"};
  q.page_size = 2;
  std::vector<std::string> jobs;
  for (;;) {
    absl::StatusOr<AuditPage> page = store_->ListAudit(q);
    ASSERT_TRUE(page.ok()) << page.status();
    for (const AuditRecord& r : page->records) jobs.push_back(r.job_id);
    if (page->next_before_id == 0) break;
    q.before_id = page->next_before_id;
  }
  EXPECT_EQ(jobs, (std::vector<std::string>{"job-4", "job-2", "job-0"}));

  AuditQuery by_job;
  by_job.job_id = "job-3";
  absl::StatusOr<AuditPage> page = store_->ListAudit(by_job);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->records.size(), 1u);
  EXPECT_EQ(page->records[0].tenant, "team-b");

  AuditQuery future;
  future.since_unix_ms = int64_t{4102444800000};  // 2100
  EXPECT_TRUE(store_->ListAudit(future)->records.empty());

  AuditQuery bad;
  bad.page_size = 0;
  const absl::Status s = store_->ListAudit(bad).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("page_size 0"), std::string::npos) << s;
}

TEST_P(AuditStoreTest, RetentionPrunesOldRowsInBatches) {
  if (!IsPostgres()) GTEST_SKIP() << "ages rows with SQL";
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(store_->AppendAudit(Record("Resize")).ok());
  RetentionPolicy policy;
  policy.audit_min_age_ms = 60 * 60 * 1000;
  policy.batch_rows = 2;
  absl::StatusOr<PrunedRows> pruned = store_->PruneRetention(policy);
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_EQ(pruned->audit, 0);  // all young

  {
    pqxx::connection conn(dsn_);
    pqxx::nontransaction n(conn);
    n.exec(
        "UPDATE audit_log SET at_unix_ms = at_unix_ms - 2 * 3600 * 1000 WHERE id IN "
        "(SELECT id FROM audit_log ORDER BY id LIMIT 3)");
  }
  pruned = store_->PruneRetention(policy);
  ASSERT_TRUE(pruned.ok());
  EXPECT_EQ(pruned->audit, 2);  // one batch
  pruned = store_->PruneRetention(policy);
  ASSERT_TRUE(pruned.ok());
  EXPECT_EQ(pruned->audit, 1);
  EXPECT_EQ(AuditRows(), 2);

  policy.audit_min_age_ms = -1;
  EXPECT_TRUE(absl::IsInvalidArgument(store_->PruneRetention(policy).status()));
}

RESHARD_STORE_CONTRACT(AuditStoreTest);

}  // namespace
}  // namespace reshard::coordinator::store_test
