// The pure rules of deadlines (logic/deadlines.h): the request's field,
// the placement offered as an alternative, the ETA and when the driver
// aborts.
#include "gtest/gtest.h"
#include "services/coordinator/logic/deadlines.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator {
namespace {

using test_support::MakeLayout;
using test_support::SlotsOf;

v1::Layout OnSlots(const v1::ParallelConfig& config,
                   const std::vector<std::pair<std::string, int>>& slots) {
  v1::Layout l;
  *l.mutable_config() = config;
  for (const auto& [host, device] : slots) {
    v1::DeviceSlot* s = l.mutable_placement()->add_ranks();
    s->set_host(host);
    s->set_device(device);
  }
  return l;
}

TEST(DeadlineFieldTest, UnsetIsFineAndAPastOrPresentTimeIsNamed) {
  EXPECT_TRUE(CheckDeadlineField(v1::Deadline(), 1000).ok());
  v1::Deadline d;
  d.set_unix_ms(1001);
  EXPECT_TRUE(CheckDeadlineField(d, 1000).ok());
  d.set_unix_ms(1000);
  absl::Status s = CheckDeadlineField(d, 1000);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "deadline.unix_ms 1000 (1970-01-01T00:00:01.000Z) is not in the future: the "
            "coordinator's clock reads 1000 (1970-01-01T00:00:01.000Z)");
  v1::Deadline abort_only;
  abort_only.set_abort_past(true);
  s = CheckDeadlineField(abort_only, 1000);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "deadline.abort_past needs deadline.unix_ms");
}

TEST(RanksKeptInPlaceTest, RanksKeepTheirDevicesAndTheRestFillTheFreeSlotsInOrder) {
  // Now: ranks 0..3 on h0:0 h0:1 h1:0 h1:1. The target drops h0 for h2 but
  // lists h2 first: ranks 2 and 3 keep h1, ranks 0 and 1 take h2.
  const v1::Layout current = MakeLayout(1, 1, 4, {"h0", "h1"}, 2);
  const v1::Layout target = OnSlots(current.config(), {{"h2", 0}, {"h2", 1}, {"h1", 0}, {"h1", 1}});
  const v1::Layout kept = RanksKeptInPlace(current, target);
  EXPECT_EQ(SlotsOf(kept), (std::vector<std::string>{"h2:0", "h2:1", "h1:0", "h1:1"}));
  // Reversed on h1: rank 2 and 3 swapped back to their own devices.
  const v1::Layout swapped =
      OnSlots(current.config(), {{"h1", 1}, {"h1", 0}, {"h2", 0}, {"h2", 1}});
  EXPECT_EQ(SlotsOf(RanksKeptInPlace(current, swapped)),
            (std::vector<std::string>{"h2:0", "h2:1", "h1:0", "h1:1"}));
}

TEST(RanksKeptInPlaceTest, ATargetThatKeepsThemAlreadyComesBackAsItIs) {
  const v1::Layout current = MakeLayout(1, 1, 4, {"h0", "h1"}, 2);
  const v1::Layout target = MakeLayout(2, 1, 2, {"h0", "h1"}, 2);  // compact form kept
  const v1::Layout kept = RanksKeptInPlace(current, target);
  EXPECT_EQ(kept.SerializeAsString(), target.SerializeAsString());
}

TEST(EtaTest, FromTheRateSoFarOrThePrediction) {
  v1::Operation op;
  op.set_state(v1::OPERATION_STATE_PENDING);
  EXPECT_EQ(EtaUnixMs(op, 5000), 0);  // not planned
  op.set_state(v1::OPERATION_STATE_TRANSFERRING);
  op.set_planned_unix_ms(1000);
  op.mutable_prediction()->set_seconds(2.5);
  EXPECT_EQ(EtaUnixMs(op, 1500), 3500);  // planned + predicted
  EXPECT_EQ(EtaUnixMs(op, 4000), 4000);  // overdue: at least now
  op.set_bytes_total(100);
  op.set_bytes_done(25);
  EXPECT_EQ(EtaUnixMs(op, 2000), 5000);  // 25 bytes in 1 s: 75 more take 3 s
  op.set_state(v1::OPERATION_STATE_COMMITTED);
  EXPECT_EQ(EtaUnixMs(op, 2000), 0);
}

TEST(DeadlineAbortTest, OnlyPastADeadlineThatAsksForItAndBeforeItIsMet) {
  v1::Operation op;
  op.set_state(v1::OPERATION_STATE_TRANSFERRING);
  op.set_phase("TRANSFERRING");
  op.mutable_deadline()->set_unix_ms(10000);
  EXPECT_FALSE(DeadlineAbort(op, 20000).has_value());  // goes on past it
  op.mutable_deadline()->set_abort_past(true);
  EXPECT_FALSE(DeadlineAbort(op, 10000).has_value());  // not past yet
  op.set_planned_unix_ms(4000);
  op.mutable_prediction()->set_seconds(2);
  op.set_bytes_total(100);
  op.set_bytes_done(40);
  const std::optional<std::string> why = DeadlineAbort(op, 10001);
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(*why,
            "deadline 1970-01-01T00:00:10.000Z passed (abort_past) in TRANSFERRING: predicted "
            "2.0 s (rates not all learned yet), running 6.0 s, 40 of 100 bytes moved");
  // A stop-free operation meets it once its agents prepared.
  op.set_stop_free(true);
  op.set_agents_prepared_unix_ms(9000);
  EXPECT_FALSE(DeadlineAbort(op, 10001).has_value());
  op.set_stop_free(false);
  op.set_state(v1::OPERATION_STATE_COMMITTED);
  EXPECT_FALSE(DeadlineAbort(op, 10001).has_value());
}

}  // namespace
}  // namespace reshard::coordinator
