// The host-row rules the prepare and transfer calls share
// (store/store_checks.h), alone: which rows a transfer or a prepare may start
// with, which operations take a host's progress report, and how a PREPARED
// report is judged from the operation's state and its host's row. The Stores' persistence of them
// runs in the contract suite (transfer_test.cc, operations_test.cc).
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/coordinator/store/store_checks.h"

namespace reshard::coordinator {
namespace {

HostProgress Row(const std::string& host_id,
                 v1::HostTaskState state = v1::HOST_TASK_STATE_ASSIGNED) {
  HostProgress h;
  h.host_id = host_id;
  h.state = state;
  return h;
}

TEST(HostRows, DistinctStorableIdsPass) {
  EXPECT_TRUE(CheckHostRows("op", {Row("a"), Row("b")}, /*check_states=*/true).ok());
  EXPECT_TRUE(CheckHostRows("op", {}, /*check_states=*/false).ok());
}

TEST(HostRows, EmptyIdIsRefusedNamingTheCallThatStartsATransfer) {
  const absl::Status transfer = CheckHostRows("op", {Row("")}, /*check_states=*/true);
  EXPECT_EQ(transfer.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(transfer.message(), "StartTransfer: empty host id");
  const absl::Status prepare = CheckHostRows("op", {Row("")}, /*check_states=*/false);
  EXPECT_EQ(prepare.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(prepare.message(), "empty host id");
}

TEST(HostRows, NulByteInAnIdIsRefused) {
  const absl::Status s = CheckHostRows("op", {Row(std::string("a\0z", 3))},
                                       /*check_states=*/false);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "host id \"a\\x00z\" contains a NUL byte");
}

TEST(HostRows, AHostListedTwiceIsRefusedNamingIt) {
  const absl::Status s = CheckHostRows("op", {Row("a"), Row("b"), Row("a")}, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "operation \"op\": host \"a\" listed twice");
}

TEST(HostRows, TaskStatesAreCheckedOnlyForATransfer) {
  const std::vector<HostProgress> prepared = {Row("a", v1::HOST_TASK_STATE_PREPARED)};
  const absl::Status s = CheckHostRows("op", prepared, /*check_states=*/true);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "host \"a\": bad task state 5");
  EXPECT_TRUE(CheckHostRows("op", prepared, /*check_states=*/false).ok());
  const absl::Status unset = CheckHostRows("op", {Row("a", v1::HOST_TASK_STATE_UNSPECIFIED)}, true);
  EXPECT_EQ(unset.message(), "host \"a\": bad task state 0");
}

TEST(HostPrepared, OnlyAPlannedOperationTakesReports) {
  EXPECT_TRUE(CheckPreparePhase("op", v1::OPERATION_STATE_PLANNED).ok());
  const absl::Status s = CheckPreparePhase("op", v1::OPERATION_STATE_TRANSFERRING);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "operation \"op\" is TRANSFERRING, not PLANNED: "
            "PREPARED reports belong to a "
            "stop-free operation's prepare phase");
}

TEST(HostPrepared, AssignedAndRunningRowsRecordTheReport) {
  EXPECT_TRUE(RecordsPrepared(v1::HOST_TASK_STATE_ASSIGNED));
  EXPECT_TRUE(RecordsPrepared(v1::HOST_TASK_STATE_RUNNING));
  EXPECT_FALSE(RecordsPrepared(v1::HOST_TASK_STATE_PREPARED));
  EXPECT_FALSE(RecordsPrepared(v1::HOST_TASK_STATE_DONE));
  EXPECT_FALSE(RecordsPrepared(v1::HOST_TASK_STATE_FAILED));
}

TEST(HostPrepared, AResentReportChangesNothing) {
  EXPECT_TRUE(UnrecordedPrepared("op", "a", v1::HOST_TASK_STATE_PREPARED).ok());
}

TEST(HostPrepared, AHostWithoutARowIsNotFound) {
  const absl::Status s = UnrecordedPrepared("op", "a", std::nullopt);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "host \"a\" takes no part in operation \"op\"");
}

TEST(HostPrepared, ARowThatEndedOtherwiseIsRefusedNamingItsState) {
  const absl::Status s = UnrecordedPrepared("op", "a", v1::HOST_TASK_STATE_FAILED);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "host \"a\" already reported HOST_TASK_STATE_FAILED "
            "for operation \"op\"");
}

TEST(HostProgressReport, AKnownTaskStatePasses) {
  EXPECT_TRUE(CheckTaskState("a", v1::HOST_TASK_STATE_RUNNING).ok());
  const absl::Status s = CheckTaskState("a", static_cast<v1::HostTaskState>(9));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "host \"a\": bad task state 9");
}

TEST(HostProgressReport, ATransferringOperationTakesEveryReport) {
  for (v1::HostTaskState reported :
       {v1::HOST_TASK_STATE_RUNNING, v1::HOST_TASK_STATE_DONE, v1::HOST_TASK_STATE_FAILED}) {
    absl::StatusOr<bool> r = ProgressOfPrepare("op", v1::OPERATION_STATE_TRANSFERRING, reported);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(*r) << v1::HostTaskState_Name(reported);
  }
}

TEST(HostProgressReport, APlannedOperationsPrepareRowsTakeAllButDone) {
  for (v1::HostTaskState reported : {v1::HOST_TASK_STATE_RUNNING, v1::HOST_TASK_STATE_FAILED}) {
    absl::StatusOr<bool> r = ProgressOfPrepare("op", v1::OPERATION_STATE_PLANNED, reported);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(*r) << v1::HostTaskState_Name(reported);
  }
  const absl::Status done =
      ProgressOfPrepare("op", v1::OPERATION_STATE_PLANNED, v1::HOST_TASK_STATE_DONE).status();
  EXPECT_EQ(done.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(done.message(), "operation \"op\" is PLANNED, not TRANSFERRING");
}

TEST(HostProgressReport, AnEndedOperationTakesNone) {
  const absl::Status s =
      ProgressOfPrepare("op", v1::OPERATION_STATE_COMMITTED, v1::HOST_TASK_STATE_RUNNING).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "operation \"op\" is COMMITTED, not TRANSFERRING");
}

TEST(HostProgressReport, RefusalsNameTheHostAndTheNumbers) {
  const absl::Status absent = HostNotInOperation("op", "a");
  EXPECT_EQ(absent.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(absent.message(), "host \"a\" takes no part in operation \"op\"");
  const absl::Status ranks = ChecksumRanksMissing("a", 3, 1, 7, "j");
  EXPECT_EQ(ranks.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ranks.message(),
            "host \"a\" reported checksums for 3 ranks, of which only 1 exist in generation 7 "
            "of job \"j\"");
}

TEST(PreparedTransfer, BrokenInvariantsAreInternalAndNameTheirNumbers) {
  const absl::Status gen = MissingPendingGeneration("op", "j", 8);
  EXPECT_EQ(gen.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(gen.message(),
            "operation \"op\": job \"j\" has no pending "
            "generation 8 (its prepare inserts it)");
  const absl::Status rows = HostsNotPrepared("op", 3, 2);
  EXPECT_EQ(rows.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(rows.message(), "operation \"op\": 3 hosts to transfer, 2 of them prepared");
}

}  // namespace
}  // namespace reshard::coordinator
