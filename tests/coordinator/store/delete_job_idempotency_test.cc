// Store::DeleteJob with an idempotency key (both stores: the contract suite): recorded with the delete,
// outlives the job, a retry answers OK, a key of another request refuses.
#include <gtest/gtest.h>

#include "tests/coordinator/store/store_fixture.h"

namespace reshard::coordinator::store_test {
namespace {

using DeleteIdempotencyTest = StoreContractTest;

TEST_P(DeleteIdempotencyTest, RetryWithTheSameKeyAnswersOkAgain) {
  ASSERT_TRUE(store_->CreateJob("job-1", test_support::StoreSmallSpec("llama"), {}).ok());
  const Idempotency key = Key("dk", "DeleteJob", "hash-of-delete-job-1");
  ASSERT_TRUE(store_->DeleteJob("job-1", key).ok());
  EXPECT_EQ(store_->GetJob("job-1", false).status().code(), absl::StatusCode::kNotFound);
  // The row is written, without a job (it outlives it).
  if (IsPostgres()) {
    EXPECT_EQ(CountRows("SELECT count(*) FROM idempotency_keys WHERE key = 'dk' AND "
                        "method = 'DeleteJob' AND resource_id = $1 AND job_id IS NULL",
                        "job-1"),
              1);
  }
  EXPECT_EQ(store_->LookupIdempotencyKey(key)->value_or("(unused)"), "job-1");
  const absl::Status again = store_->DeleteJob("job-1", key);
  EXPECT_TRUE(again.ok()) << again;
  // Without the key the job is simply gone.
  EXPECT_EQ(store_->DeleteJob("job-1").code(), absl::StatusCode::kNotFound);
}

TEST_P(DeleteIdempotencyTest, KeyOfAnotherRequestDeletesNothing) {
  ASSERT_TRUE(store_->CreateJob("job-a", test_support::StoreSmallSpec("a"), {}).ok());
  ASSERT_TRUE(store_->CreateJob("job-b", test_support::StoreSmallSpec("b"), {}).ok());
  const v1::Layout target = test_support::MakeLayout(2, 2, 1, {"h0", "h2"}, 2);
  ASSERT_TRUE(
      store_->CreateOperation(Resize("op-1", "job-a", 1, target, Key("k", "Resize", "h1"))).ok());

  // A key that a Resize of job A used.
  const absl::Status s = store_->DeleteJob("job-b", Key("k", "DeleteJob", "h2"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("idempotency key \"k\""), absl::string_view::npos) << s;
  EXPECT_TRUE(store_->GetJob("job-b", false).ok());

  // A DeleteJob key reused for a different DeleteJob request.
  ASSERT_TRUE(store_->DeleteJob("job-b", Key("dk", "DeleteJob", "delete-b")).ok());
  ASSERT_TRUE(store_->CreateJob("job-c", test_support::StoreSmallSpec("c"), {}).ok());
  EXPECT_EQ(store_->DeleteJob("job-c", Key("dk", "DeleteJob", "delete-c")).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(store_->GetJob("job-c", false).ok());
}

TEST_P(DeleteIdempotencyTest, RefusedDeleteRecordsNoKey) {
  const v1::JobSpec spec = test_support::StoreSmallSpec("llama");
  ASSERT_TRUE(store_->CreateJob("job-1", spec, {}).ok());
  ASSERT_TRUE(store_->CreateOperation(Resize("op-1", "job-1", 1, spec.layout())).ok());
  EXPECT_EQ(store_->DeleteJob("job-1", Key("dk", "DeleteJob", "h")).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->DeleteJob("nope", Key("dk2", "DeleteJob", "h")).code(),
            absl::StatusCode::kNotFound);
  if (IsPostgres()) {
    EXPECT_EQ(CountRows("SELECT count(*) FROM idempotency_keys WHERE key <> $1", ""), 0);
  }
  EXPECT_FALSE(store_->LookupIdempotencyKey(Key("dk", "DeleteJob", "h"))->has_value());
  EXPECT_FALSE(store_->LookupIdempotencyKey(Key("dk2", "DeleteJob", "h"))->has_value());
}

RESHARD_STORE_CONTRACT(DeleteIdempotencyTest);

}  // namespace
}  // namespace reshard::coordinator::store_test
