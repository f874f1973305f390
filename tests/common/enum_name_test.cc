// Unit tests of common/rpc/enum_name.h: the derived prefix, both cases,
// unknown values, and an enum whose values do not share the prefix.
#include "common/rpc/enum_name.h"

#include "gtest/gtest.h"
#include "reshard/v1/agent.pb.h"
#include "reshard/v1/coordinator.pb.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::rpc {
namespace {

TEST(EnumNameTest, EveryOperationState) {
  EXPECT_EQ(EnumShortName(v1::OPERATION_STATE_UNSPECIFIED), "UNSPECIFIED");
  EXPECT_EQ(EnumShortName(v1::OPERATION_STATE_PENDING), "PENDING");
  EXPECT_EQ(EnumShortName(v1::OPERATION_STATE_PLANNED), "PLANNED");
  EXPECT_EQ(EnumShortName(v1::OPERATION_STATE_TRANSFERRING), "TRANSFERRING");
  EXPECT_EQ(EnumShortName(v1::OPERATION_STATE_COMMITTED), "COMMITTED");
  EXPECT_EQ(EnumShortName(v1::OPERATION_STATE_ABORTED), "ABORTED");
  EXPECT_EQ(EnumShortName(v1::OPERATION_STATE_FAILED), "FAILED");
  EXPECT_EQ(EnumShortName(v1::OPERATION_STATE_COMMITTED, NameCase::kLower), "committed");
  EXPECT_EQ(EnumShortName(v1::OPERATION_STATE_TRANSFERRING, NameCase::kLower), "transferring");
}

TEST(EnumNameTest, OtherEnumsOfTheApi) {
  EXPECT_EQ(EnumShortName(v1::OPERATION_KIND_CHECKPOINT), "CHECKPOINT");
  EXPECT_EQ(EnumShortName(v1::OPERATION_KIND_RESIZE, NameCase::kLower), "resize");
  EXPECT_EQ(EnumShortName(v1::JOB_STATE_RECONFIGURING), "RECONFIGURING");
  EXPECT_EQ(EnumShortName(v1::JOB_STATE_DEGRADED, NameCase::kLower), "degraded");
  EXPECT_EQ(EnumShortName(v1::HOST_STATE_LOST), "LOST");
  EXPECT_EQ(EnumShortName(v1::HOST_TASK_STATE_PREPARED), "PREPARED");
  EXPECT_EQ(EnumShortName(v1::STEP_BOUNDARY_TIMED_OUT), "TIMED_OUT");
  EXPECT_EQ(EnumShortName(v1::STEP_BOUNDARY_CHECKPOINT_ENDED, NameCase::kLower),
            "checkpoint_ended");
}

TEST(EnumNameTest, UnknownValue) {
  EXPECT_EQ(EnumShortName(static_cast<v1::OperationState>(999)), "UNKNOWN_999");
  EXPECT_EQ(EnumShortName(static_cast<v1::OperationState>(999), NameCase::kLower), "unknown_999");
  EXPECT_EQ(EnumShortName(static_cast<v1::HostState>(-3)), "UNKNOWN_-3");
  EXPECT_EQ(EnumShortName(v1::OperationState_descriptor(), 7), "UNKNOWN_7");
}

TEST(EnumNameTest, TpModeKeepsFullNames) {
  // TpMode's values start with TP_, not the derived TP_MODE_: nothing is cut.
  EXPECT_EQ(EnumShortName(v1::TP_REPLICATED), "TP_REPLICATED");
  EXPECT_EQ(EnumShortName(v1::TP_SPLIT), "TP_SPLIT");
  EXPECT_EQ(EnumShortName(v1::TP_SPLIT, NameCase::kLower), "tp_split");
}

TEST(EnumNameTest, ByDescriptor) {
  EXPECT_EQ(EnumShortName(v1::HostTaskState_descriptor(), 3), "DONE");
  EXPECT_EQ(EnumShortName(v1::HostTaskState_descriptor(), 3, NameCase::kLower), "done");
}

}  // namespace
}  // namespace reshard::rpc
