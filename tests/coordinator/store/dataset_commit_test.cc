// CheckStepCommit (services/coordinator/store/dataset_commit.h) alone: the
// rules CommitStep applies under the job's row lock. The same refusals
// through the real server and PostgreSQL: tests/coordinator/server/
// dataset_state_test.cc.
#include "services/coordinator/store/dataset_commit.h"

#include <limits>

#include "gtest/gtest.h"

namespace reshard::coordinator {
namespace {

v1::DatasetState Committed() {
  v1::DatasetState s;
  s.set_global_batch(10);
  s.set_cursor(30);
  s.set_step(3);
  s.set_layout_fingerprint("sha256:a");
  return s;
}

StepCommit Commit(int64_t generation, int64_t step, int64_t cursor,
                  std::string fingerprint = "sha256:a") {
  return StepCommit{"job-1", generation, step, cursor, std::move(fingerprint)};
}

absl::Status Check(const v1::DatasetState& committed, const StepCommit& c,
                   StepCommitVerdict* verdict) {
  return CheckStepCommit(committed, /*current_generation=*/2, c, verdict);
}

TEST(CheckStepCommitTest, NextStepsApplyAndARepeatIsARetry) {
  StepCommitVerdict v;
  ASSERT_TRUE(Check(Committed(), Commit(2, 4, 40), &v).ok());
  EXPECT_EQ(v, StepCommitVerdict::kApply);
  ASSERT_TRUE(Check(Committed(), Commit(2, 7, 70), &v).ok());  // every few steps
  EXPECT_EQ(v, StepCommitVerdict::kApply);
  ASSERT_TRUE(Check(Committed(), Commit(2, 3, 30), &v).ok());
  EXPECT_EQ(v, StepCommitVerdict::kRetry);
}

TEST(CheckStepCommitTest, RefusalsNameTheJobAndValues) {
  StepCommitVerdict v;
  const struct {
    StepCommit commit;
    const char* message;
  } cases[] = {
      {Commit(1, 4, 40),
       "job \"job-1\": generation 1 is not the current generation 2; restore the sampler from "
       "the job's dataset state before committing"},
      {Commit(2, 4, 40, "sha256:b"),
       "job \"job-1\": layout_fingerprint \"sha256:b\" does not match the committed \"sha256:a\" "
       "(another dataset, order or global batch)"},
      {Commit(2, 4, 20), "job \"job-1\": cursor 20 would move backwards from the committed 30"},
      {Commit(2, 3, 40), "job \"job-1\": step 3 is not after the committed step 3 (cursor 30)"},
      {Commit(2, 4, 41),
       "job \"job-1\": cursor 41 is not the committed cursor 30 + (step 4 - committed step 3) x "
       "global_batch 10; samples would be skipped or repeated"},
  };
  for (const auto& c : cases) {
    const absl::Status s = Check(Committed(), c.commit, &v);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_EQ(s.message(), c.message);
  }
}

TEST(CheckStepCommitTest, HugeStepCountsDoNotOverflow) {
  StepCommitVerdict v;
  const int64_t max = std::numeric_limits<int64_t>::max();
  const absl::Status s = Check(Committed(), Commit(2, max, max), &v);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

TEST(CheckNoPendingCheckpointTest, RefusalNamesTheCheckpointItsStepAndTheRefusedStep) {
  EXPECT_TRUE(CheckNoPendingCheckpoint(Commit(2, 4, 40), 2, std::nullopt).ok());

  PendingCheckpoint with_step{"op-7", "TRANSFERRING", 3, Commit(3, 4, 40)};
  absl::Status s = CheckNoPendingCheckpoint(Commit(2, 5, 50), 2, with_step);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(s.message(),
            "job \"job-1\": checkpoint operation \"op-7\" (TRANSFERRING) publishes step 4 "
            "(cursor 40) into generation 3; step 5 (cursor 50) cannot be committed on generation "
            "2 until it ends, since a generation's cursor is the one published with its model "
            "state: commit it on generation 3 once the checkpoint commits (on generation 2 if it "
            "aborts)");

  const PendingCheckpoint plain{"op-8", "PLANNED", 3, std::nullopt};
  s = CheckNoPendingCheckpoint(Commit(2, 4, 40), 2, plain);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("checkpoint operation \"op-8\" (PLANNED) publishes the dataset "
                             "state committed when it was created into generation 3"),
            absl::string_view::npos)
      << s;
}

}  // namespace
}  // namespace reshard::coordinator
