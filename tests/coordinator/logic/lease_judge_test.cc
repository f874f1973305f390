// LeaseJudge: when the leader may judge leases and stalls (issue 32). Pure:
// times and counts in, a verdict out.
#include "services/coordinator/logic/lease_judge.h"

#include "gtest/gtest.h"

namespace reshard::coordinator {
namespace {

constexpr int64_t kLease = 10000;
constexpr int64_t kTick = 200;
constexpr int64_t kStart = 1'000'000;

LeaseJudge MakeJudge() {
  LeaseJudge judge(LeaseJudge::Options{kLease, kTick});
  judge.Reset(kStart);
  return judge;
}

TEST(LeaseJudgeTest, PassesOnTimeAreJudged) {
  LeaseJudge judge = MakeJudge();
  for (int64_t t = kStart + kTick; t < kStart + 10 * kLease; t += kTick) {
    const LeaseJudge::Verdict v = judge.BeginPass(t, /*heartbeat_lag_ms=*/5);
    ASSERT_TRUE(v.judge) << t << ": " << v.why;
    ASSERT_FALSE(judge.last_pass_was_late());
  }
}

TEST(LeaseJudgeTest, APassLaterThanAQuarterLeaseSuspendsForOneHeartbeatPeriod) {
  LeaseJudge judge = MakeJudge();
  // Exactly tick + lease/4 late is still on time; one ms more is late.
  ASSERT_TRUE(judge.BeginPass(kStart + kTick + kLease / 4, 0).judge);
  const int64_t late_at = kStart + 2 * (kTick + kLease / 4) + 1;
  const LeaseJudge::Verdict late = judge.BeginPass(late_at, 0);
  EXPECT_FALSE(late.judge);
  EXPECT_EQ(late.reason, LeaseJudge::Reason::kLatePass);
  EXPECT_EQ(std::string(LeaseJudge::Label(late.reason)), "late_pass");
  EXPECT_TRUE(judge.last_pass_was_late());
  EXPECT_EQ(late.why,
            "this pass began 2701 ms after the previous one (tick 200 ms): the coordinator itself "
            "was not running; leases and stalls are judged again after one heartbeat period "
            "(3333 ms)");
  // On time again, but within one heartbeat period (lease/3) of the late pass.
  int64_t t = late_at;
  while (t + kTick < late_at + kLease / 3) {
    t += kTick;
    const LeaseJudge::Verdict v = judge.BeginPass(t, 0);
    ASSERT_FALSE(v.judge) << t - late_at;
    ASSERT_FALSE(judge.last_pass_was_late());
  }
  EXPECT_TRUE(judge.BeginPass(late_at + kLease / 3, 0).judge);
}

TEST(LeaseJudgeTest, NoTickMeansNoPassIsLate) {
  LeaseJudge judge(LeaseJudge::Options{kLease, /*tick_ms=*/0});
  judge.Reset(kStart);
  EXPECT_TRUE(judge.BeginPass(kStart + 5 * kLease, 0).judge);
  EXPECT_FALSE(judge.last_pass_was_late());
}

TEST(LeaseJudgeTest, HeartbeatsWaitingOverAQuarterLeaseSuspendWhileTheyWait) {
  LeaseJudge judge = MakeJudge();
  EXPECT_TRUE(judge.BeginPass(kStart + kTick, kLease / 4).judge);
  const LeaseJudge::Verdict v = judge.BeginPass(kStart + 2 * kTick, kLease / 4 + 1);
  EXPECT_FALSE(v.judge);
  EXPECT_EQ(v.reason, LeaseJudge::Reason::kHeartbeatBacklog);
  EXPECT_EQ(v.why,
            "the oldest heartbeat not yet recorded has waited 2501 ms (over a quarter lease, 2500 "
            "ms): leases are not judged until the coordinator catches up");
  // Caught up: judged at once (the beats it recorded renewed their leases).
  EXPECT_TRUE(judge.BeginPass(kStart + 3 * kTick, 0).judge);
}

TEST(LeaseJudgeTest, AFewHostsOrAMinorityExpireAtOnce) {
  LeaseJudge judge = MakeJudge();
  EXPECT_TRUE(judge.Expiries(kStart, 1, 1).judge);  // the only host
  EXPECT_TRUE(judge.Expiries(kStart, 2, 2).judge);  // below kMassExpiryMinHosts
  EXPECT_TRUE(judge.Expiries(kStart, 5, 10).judge);  // half, not more
  EXPECT_EQ(judge.Expiries(kStart, 5, 10).reason, LeaseJudge::Reason::kNone);
}

TEST(LeaseJudgeTest, AMassExpiryIsDeferredOneLeaseThenJudged) {
  LeaseJudge judge = MakeJudge();
  const LeaseJudge::Verdict first = judge.Expiries(kStart, 6, 10);
  EXPECT_FALSE(first.judge);
  EXPECT_EQ(first.reason, LeaseJudge::Reason::kMassExpiry);
  EXPECT_EQ(first.why,
            "6 of 10 live hosts' leases ended together: suspecting this coordinator or its "
            "network rather than the hosts; deferred 0 ms of at most one lease (10000 ms)");
  EXPECT_FALSE(judge.Expiries(kStart + kLease, 6, 10).judge);
  const LeaseJudge::Verdict judged = judge.Expiries(kStart + kLease + 1, 6, 10);
  EXPECT_TRUE(judged.judge);
  EXPECT_EQ(judged.reason, LeaseJudge::Reason::kMassExpiry);
  EXPECT_EQ(judged.why, "6 of 10 hosts stayed silent through a deferral of 10001 ms: marking "
                        "them LOST");
  // A new mass expiry later is deferred afresh.
  EXPECT_FALSE(judge.Expiries(kStart + 5 * kLease, 3, 3).judge);
}

TEST(LeaseJudgeTest, AMassExpiryThatClearsStartsNoClock) {
  LeaseJudge judge = MakeJudge();
  EXPECT_FALSE(judge.Expiries(kStart, 4, 4).judge);
  // The hosts beat again (nothing expired), then expire together later: that
  // deferral counts from its own start, not from the first.
  EXPECT_TRUE(judge.Expiries(kStart + kLease / 2, 0, 4).judge);
  EXPECT_FALSE(judge.Expiries(kStart + 2 * kLease, 4, 4).judge);
  EXPECT_FALSE(judge.Expiries(kStart + 3 * kLease, 4, 4).judge);
  EXPECT_TRUE(judge.Expiries(kStart + 3 * kLease + 1, 4, 4).judge);
}

}  // namespace
}  // namespace reshard::coordinator
