// SchedulerApi's idempotency keys in their callers' scopes (issue 19, defect
// 7), against a real PostgreSQL: CancelOperation keeps its key like every
// mutating call, only within the caller's scope; concurrent retries of one
// cancel all get its result.
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/coordinator/logic/logic_fixture.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using test_support::MakeLayout;
using test_support::TwoLayerJob;

const KeyScope kTeamA{{"team-a"}};
const KeyScope kTeamB{{"team-b"}};

class SchedulerIdempotencyTest : public LogicTest {
 protected:
  absl::StatusOr<v1::Operation> Cancel(const std::string& operation_id, const std::string& key,
                                       const KeyScope& scope) {
    v1::CancelOperationRequest request;
    request.set_operation_id(operation_id);
    request.set_idempotency_key(key);
    return api_->CancelOperation(request, scope);
  }
  // A PENDING resize of a new job.
  v1::Operation Pending(const std::string& name) {
    const v1::Job job = Register(TwoLayerJob(name));
    absl::StatusOr<v1::Operation> op = ResizeTo(job, MakeLayout(2, 2, 1, {"h2", "h3"}, 2));
    EXPECT_TRUE(op.ok()) << op.status();
    return op.ok() ? *op : v1::Operation();
  }
};

void ExpectKeyRefused(const absl::Status& s, const std::string& key, const std::string& method) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(absl::StrCat("idempotency key \"", key, "\"")),
            absl::string_view::npos)
      << s;
  EXPECT_NE(s.message().find(method), absl::string_view::npos) << s;
}

TEST_P(SchedulerIdempotencyTest, CancelKeepsItsKeyInTheCallersScope) {
  const v1::Operation op1 = Pending("one");
  const v1::Operation op2 = Pending("two");
  absl::StatusOr<v1::Operation> first = Cancel(op1.id(), "k", kTeamA);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->state(), v1::OPERATION_STATE_ABORTED);
  // The retry gets the operation it cancelled.
  absl::StatusOr<v1::Operation> retry = Cancel(op1.id(), "k", kTeamA);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry->id(), op1.id());
  EXPECT_EQ(retry->state(), v1::OPERATION_STATE_ABORTED);
  // The key on another operation cancels nothing.
  ExpectKeyRefused(Cancel(op2.id(), "k", kTeamA).status(), "k", "CancelOperation");
  EXPECT_EQ(Op(op2.id()).state(), v1::OPERATION_STATE_PENDING);
  // A fresh key on an operation a client cancelled gets it back (cancelling
  // is idempotent in effect), and claims nothing else.
  absl::StatusOr<v1::Operation> again = Cancel(op1.id(), "k2", kTeamA);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->state(), v1::OPERATION_STATE_ABORTED);
  // The key is free in another scope.
  absl::StatusOr<v1::Operation> other = Cancel(op2.id(), "k", kTeamB);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->id(), op2.id());
  EXPECT_EQ(other->state(), v1::OPERATION_STATE_ABORTED);
}

TEST_P(SchedulerIdempotencyTest, ConcurrentRetriesOfOneCancelAllGetItsResult) {
  const v1::Operation op = Pending("raced");
  constexpr int kCallers = 4;
  std::vector<absl::StatusOr<v1::Operation>> results(kCallers, absl::UnknownError("not run"));
  std::vector<std::thread> callers;
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&, i] { results[i] = Cancel(op.id(), "same", kTeamA); });
  }
  for (std::thread& t : callers) t.join();
  for (const absl::StatusOr<v1::Operation>& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->id(), op.id());
    EXPECT_EQ(r->state(), v1::OPERATION_STATE_ABORTED);
  }
}

RESHARD_LOGIC_ON_BOTH_STORES(SchedulerIdempotencyTest);

}  // namespace
}  // namespace reshard::coordinator::testing
