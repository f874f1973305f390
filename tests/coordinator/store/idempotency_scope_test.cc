// Idempotency keys are scoped to the caller's tenants (issue 19, defect 7;
// migrations/0012): a key is looked up and claimed only among its scope's
// keys, so a key one scope used is free in another and answers nothing
// there; a reused key within a scope still returns the first result or
// InvalidArgument; a transition claims a key with its move
// (CancelOperation); rows from before 0012 keep working.
#include <gtest/gtest.h>

#include <pqxx/pqxx>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/coordinator/store/migrator.h"
#include "tests/coordinator/store/store_fixture.h"

namespace reshard::coordinator::store_test {
namespace {

// Key() in the scope of `tenants` (empty: the admin's).
Idempotency Scoped(const std::vector<std::string>& tenants, const std::string& key,
                   const std::string& method, const std::string& hash) {
  Idempotency idem = Key(key, method, hash);
  idem.tenants = tenants;
  return idem;
}

const std::vector<std::string> kA = {"tenant-a"};
const std::vector<std::string> kB = {"tenant-b"};
const std::vector<std::string> kAdmin = {};

void ExpectRefused(const absl::Status& s, const std::string& key, const std::string& method) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("idempotency key \"" + key + "\""), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find(method), absl::string_view::npos) << s;
}

using IdempotencyScopeTest = StoreContractTest;

TEST_P(IdempotencyScopeTest, RegisterKeyOfAnotherScopeIsFree) {
  absl::StatusOr<v1::Job> a = store_->CreateJob(
      "job-a", test_support::StoreSmallSpec("a", "tenant-a"), Scoped(kA, "k", "RegisterJob", "ha"));
  ASSERT_TRUE(a.ok()) << a.status();
  // Another tenant, another request, the same key: a job of its own.
  absl::StatusOr<v1::Job> b = store_->CreateJob(
      "job-b", test_support::StoreSmallSpec("b", "tenant-b"), Scoped(kB, "k", "RegisterJob", "hb"));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->id(), "job-b");
  EXPECT_EQ(b->tenant(), "tenant-b");
  // The admin's scope and a scope of two tenants are scopes of their own.
  absl::StatusOr<v1::Job> c =
      store_->CreateJob("job-c", test_support::StoreSmallSpec("c", "tenant-a"),
                        Scoped(kAdmin, "k", "RegisterJob", "hc"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->id(), "job-c");
  absl::StatusOr<v1::Job> d =
      store_->CreateJob("job-d", test_support::StoreSmallSpec("d", "tenant-b"),
                        Scoped({"tenant-a", "tenant-b"}, "k", "RegisterJob", "hd"));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->id(), "job-d");
  if (IsPostgres()) {
    EXPECT_EQ(CountRows("SELECT count(*) FROM idempotency_keys WHERE key = $1", "k"), 4);
  }
  EXPECT_EQ(**store_->LookupIdempotencyKey(Scoped(kA, "k", "RegisterJob", "ha")), "job-a");
  EXPECT_EQ(**store_->LookupIdempotencyKey(Scoped(kB, "k", "RegisterJob", "hb")), "job-b");
  EXPECT_EQ(**store_->LookupIdempotencyKey(Scoped(kAdmin, "k", "RegisterJob", "hc")), "job-c");

  // Within a scope the rules are unchanged: a retry gets the first job...
  absl::StatusOr<v1::Job> retry = store_->CreateJob(
      "job-x", test_support::StoreSmallSpec("a", "tenant-a"), Scoped(kA, "k", "RegisterJob", "ha"));
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry->id(), "job-a");
  absl::StatusOr<v1::Job> retry_b = store_->CreateJob(
      "job-y", test_support::StoreSmallSpec("b", "tenant-b"), Scoped(kB, "k", "RegisterJob", "hb"));
  ASSERT_TRUE(retry_b.ok()) << retry_b.status();
  EXPECT_EQ(retry_b->id(), "job-b");
  // ... and another request with the key is refused, naming the method.
  ExpectRefused(store_
                    ->CreateJob("job-z", test_support::StoreSmallSpec("z", "tenant-a"),
                                Scoped(kA, "k", "RegisterJob", "other"))
                    .status(),
                "k", "RegisterJob");
  EXPECT_EQ(store_->GetJob("job-z", false).status().code(), absl::StatusCode::kNotFound);
}

TEST_P(IdempotencyScopeTest, OperationAndDeleteKeysOfAnotherScopeAreFree) {
  ASSERT_TRUE(store_->CreateJob("job-a", test_support::StoreSmallSpec("a", "tenant-a"), {}).ok());
  ASSERT_TRUE(store_->CreateJob("job-b", test_support::StoreSmallSpec("b", "tenant-b"), {}).ok());
  const v1::Layout target = test_support::MakeLayout(2, 2, 1, {"h0", "h2"}, 2);
  ASSERT_TRUE(
      store_->CreateOperation(Resize("op-a", "job-a", 1, target, Scoped(kA, "r", "Resize", "ra")))
          .ok());
  // Tenant B's operation may carry the same key (operations no longer hold
  // a cluster-wide unique key).
  absl::StatusOr<v1::Operation> b =
      store_->CreateOperation(Resize("op-b", "job-b", 1, target, Scoped(kB, "r", "Resize", "rb")));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->id(), "op-b");
  absl::StatusOr<v1::Operation> retry =
      store_->CreateOperation(Resize("op-c", "job-b", 1, target, Scoped(kB, "r", "Resize", "rb")));
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry->id(), "op-b");
  ExpectRefused(store_->CreateOperation(
                          Resize("op-d", "job-a", 1, target, Scoped(kA, "r", "Migrate", "ra")))
                    .status(),
                "r", "Resize");

  // DeleteJob: tenant A's delete key, then tenant B's delete with it.
  ASSERT_TRUE(store_->CreateJob("job-a2", test_support::StoreSmallSpec("a2", "tenant-a"), {}).ok());
  ASSERT_TRUE(store_->CreateJob("job-b2", test_support::StoreSmallSpec("b2", "tenant-b"), {}).ok());
  ASSERT_TRUE(store_->DeleteJob("job-a2", Scoped(kA, "d", "DeleteJob", "da")).ok());
  const absl::Status deleted_b = store_->DeleteJob("job-b2", Scoped(kB, "d", "DeleteJob", "db"));
  EXPECT_TRUE(deleted_b.ok()) << deleted_b;
  EXPECT_EQ(store_->GetJob("job-b2", false).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store_->DeleteJob("job-a2", Scoped(kA, "d", "DeleteJob", "da")).ok());  // a retry
  // Tenant A's Resize key used for a delete in tenant A deletes nothing.
  ExpectRefused(store_->DeleteJob("job-a", Scoped(kA, "r", "DeleteJob", "x")), "r", "Resize");
}

TEST_P(IdempotencyScopeTest, TransitionClaimsTheKeyWithItsMove) {
  const v1::Layout target = test_support::MakeLayout(2, 2, 1, {"h0", "h2"}, 2);
  for (const char* j : {"1", "2", "3"}) {
    ASSERT_TRUE(
        store_->CreateJob(absl::StrCat("job-", j), test_support::StoreSmallSpec(j, "tenant-a"), {})
            .ok());
    ASSERT_TRUE(store_
                    ->CreateOperation(Resize(absl::StrCat("op-", j), absl::StrCat("job-", j), 1,
                                             target))
                    .ok());
  }
  OperationUpdate cancel;
  cancel.error = "cancelled by client";
  cancel.idempotency = Scoped(kA, "c", "CancelOperation", "cancel-op-1");
  ASSERT_TRUE(store_
                  ->TransitionOperation("op-1", v1::OPERATION_STATE_PENDING,
                                        v1::OPERATION_STATE_ABORTED, cancel)
                  .ok());
  absl::StatusOr<std::optional<std::string>> found =
      store_->LookupIdempotencyKey(cancel.idempotency);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->value_or(""), "op-1");
  // Unused in another scope; used for another request in this one.
  found = store_->LookupIdempotencyKey(Scoped(kB, "c", "CancelOperation", "cancel-op-1"));
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_FALSE(found->has_value());
  ExpectRefused(
      store_->LookupIdempotencyKey(Scoped(kA, "c", "CancelOperation", "cancel-op-2")).status(),
      "c", "CancelOperation");
  EXPECT_FALSE(store_->LookupIdempotencyKey(Scoped(kA, "", "CancelOperation", "x"))->has_value());

  // The key taken in its scope: the move is refused and nothing moves.
  OperationUpdate again = cancel;
  again.idempotency.request_hash = "cancel-op-2";
  const absl::Status taken = store_->TransitionOperation("op-2", v1::OPERATION_STATE_PENDING,
                                                         v1::OPERATION_STATE_ABORTED, again);
  EXPECT_EQ(taken.code(), absl::StatusCode::kAborted) << taken;
  absl::StatusOr<OperationRecord> op2 = store_->GetOperation("op-2", false);
  ASSERT_TRUE(op2.ok()) << op2.status();
  EXPECT_EQ(op2->op.state(), v1::OPERATION_STATE_PENDING);
  EXPECT_EQ(op2->op.error(), "");
  EXPECT_EQ(store_->GetJob("job-2", false)->state(), v1::JOB_STATE_RECONFIGURING);

  // The same key in another scope moves op-3.
  OperationUpdate other = cancel;
  other.idempotency = Scoped(kB, "c", "CancelOperation", "cancel-op-3");
  ASSERT_TRUE(store_
                  ->TransitionOperation("op-3", v1::OPERATION_STATE_PENDING,
                                        v1::OPERATION_STATE_ABORTED, other)
                  .ok());
  EXPECT_EQ(store_->GetOperation("op-3", false)->op.state(), v1::OPERATION_STATE_ABORTED);
}

// Rows written before migration 0012 (no scope): a row of a job goes to the
// job's tenant, a DeleteJob's row (its job gone) to the admin's scope.
TEST(IdempotencyScopeMigrationTest, RowsFromBefore0012KeepWorking) {
  absl::StatusOr<std::string> dsn = testing::CreateFreshDatabase("idem_scope_migration");
  ASSERT_TRUE(dsn.ok()) << dsn.status();
  std::vector<Migration> before;
  for (const Migration& m : EmbeddedMigrations()) {
    if (m.version < 12) before.push_back(m);
  }
  ASSERT_TRUE(MigrateWith(*dsn, before).ok());
  {
    pqxx::connection conn(*dsn);
    pqxx::work tx(conn);
    tx.exec(
        "INSERT INTO jobs (id, tenant, name, state, generation, num_layers, tensor_count, "
        "total_bytes) VALUES ('job-1', 'tenant-a', 'n', 1, 1, 1, 0, 0)");
    tx.exec(
        "INSERT INTO idempotency_keys (key, method, request_hash, resource_id, job_id) VALUES "
        "('k-job', 'Resize', convert_to('h1', 'UTF8'), 'op-x', 'job-1'), "
        "('k-del', 'DeleteJob', convert_to('h2', 'UTF8'), 'job-gone', NULL)");
    tx.commit();
  }
  ASSERT_TRUE(Migrate(*dsn).ok());

  PgStoreOptions options;
  options.dsn = *dsn;
  options.pool_size = 2;
  absl::StatusOr<std::shared_ptr<PgStore>> store = PgStore::Connect(options);
  ASSERT_TRUE(store.ok()) << store.status();
  auto lookup = [&](const std::vector<std::string>& tenants, const std::string& key,
                    const std::string& method, const std::string& hash) {
    absl::StatusOr<std::optional<std::string>> r =
        (*store)->LookupIdempotencyKey(Scoped(tenants, key, method, hash));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->value_or("(unused)") : "(error)";
  };
  EXPECT_EQ(lookup(kA, "k-job", "Resize", "h1"), "op-x");
  EXPECT_EQ(lookup(kB, "k-job", "Resize", "h1"), "(unused)");
  EXPECT_EQ(lookup(kAdmin, "k-job", "Resize", "h1"), "(unused)");
  EXPECT_EQ(lookup(kAdmin, "k-del", "DeleteJob", "h2"), "job-gone");
  EXPECT_EQ(lookup(kA, "k-del", "DeleteJob", "h2"), "(unused)");
}

RESHARD_STORE_CONTRACT(IdempotencyScopeTest);

}  // namespace
}  // namespace reshard::coordinator::store_test
