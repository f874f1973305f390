// SchedulerApi::DeleteJob with an idempotency key, against a real PostgreSQL:
// a retry answers OK again, a key of another request or method refuses.
#include "gtest/gtest.h"
#include "tests/coordinator/logic/logic_fixture.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using test_support::MakeLayout;
using test_support::TwoLayerJob;

class SchedulerDeleteTest : public LogicTest {
 protected:
  absl::Status Delete(const std::string& job_id, const std::string& key) {
    v1::DeleteJobRequest request;
    request.set_job_id(job_id);
    request.set_idempotency_key(key);
    return api_->DeleteJob(request).status();
  }
  bool Exists(const std::string& job_id) {
    v1::GetJobRequest get;
    get.set_job_id(job_id);
    return api_->GetJob(get).ok();
  }
};

TEST_P(SchedulerDeleteTest, SameKeySameRequestAnswersOkTwice) {
  const v1::Job job = Register(TwoLayerJob("doomed"));
  ASSERT_TRUE(Delete(job.id(), "dk").ok());
  EXPECT_FALSE(Exists(job.id()));
  const absl::Status again = Delete(job.id(), "dk");
  EXPECT_TRUE(again.ok()) << again;
}

TEST_P(SchedulerDeleteTest, KeyOfAResizeOfAnotherJobDeletesNothing) {
  const v1::Job a = Register(TwoLayerJob("a"));
  const v1::Job b = Register(TwoLayerJob("b"));
  ASSERT_TRUE(ResizeTo(a, MakeLayout(2, 2, 1, {"h0", "h2"}, 2), "k").ok());
  const DatabaseSnapshot before = Snapshot();
  EXPECT_THAT(Delete(b.id(), "k"),
              StatusIs(absl::StatusCode::kInvalidArgument, "idempotency key \"k\""));
  EXPECT_TRUE(Exists(b.id()));
  EXPECT_TRUE(Snapshot() == before);
}

TEST_P(SchedulerDeleteTest, SameKeyForAnotherJobIsInvalid) {
  const v1::Job a = Register(TwoLayerJob("a"));
  const v1::Job b = Register(TwoLayerJob("b"));
  ASSERT_TRUE(Delete(a.id(), "dk").ok());
  EXPECT_THAT(Delete(b.id(), "dk"),
              StatusIs(absl::StatusCode::kInvalidArgument, "idempotency key \"dk\""));
  EXPECT_TRUE(Exists(b.id()));
  // And a RegisterJob cannot reuse a DeleteJob's key either.
  v1::RegisterJobRequest reg;
  *reg.mutable_spec() = TwoLayerJob("c");
  reg.set_idempotency_key("dk");
  EXPECT_EQ(api_->RegisterJob(reg).status().code(), absl::StatusCode::kInvalidArgument);
}

RESHARD_LOGIC_ON_BOTH_STORES(SchedulerDeleteTest);

}  // namespace
}  // namespace reshard::coordinator::testing
