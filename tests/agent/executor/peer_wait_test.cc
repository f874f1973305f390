// The rule of timers that wait on peers (peer_wait.h), on a fake clock: time
// the coordinator did not answer is not counted, and a wait never expires
// while it does not answer.
#include "agent/executor/peer_wait.h"

#include <chrono>

#include "gtest/gtest.h"

namespace reshard::agent {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class PeerWaitTest : public ::testing::Test {
 protected:
  std::chrono::steady_clock::time_point now_{seconds(1000)};
  CoordinatorReach reach_{[this] { return now_; }};
};

TEST_F(PeerWaitTest, WithoutSilenceExpiresAfterTheTimeout) {
  const PeerWait wait(PeerWaitBudget(seconds(3), &reach_));
  now_ += milliseconds(2999);
  EXPECT_FALSE(wait.Expired());
  now_ += milliseconds(1);
  EXPECT_TRUE(wait.Expired());
  EXPECT_EQ(wait.Waited(), "3 s");
}

TEST_F(PeerWaitTest, NeverExpiresWhileTheCoordinatorDoesNotAnswer) {
  const PeerWait wait(PeerWaitBudget(seconds(3), &reach_));
  now_ += seconds(1);
  reach_.Unanswered(now_);  // a heartbeat sent now gets UNAVAILABLE
  now_ += seconds(60);
  EXPECT_TRUE(reach_.Silent());
  EXPECT_FALSE(wait.Expired());
  reach_.Answered();
  EXPECT_FALSE(wait.Expired());  // 1 s counted of 3
  now_ += milliseconds(1999);
  EXPECT_FALSE(wait.Expired());
  now_ += milliseconds(1);
  EXPECT_TRUE(wait.Expired());
  EXPECT_EQ(wait.Waited(), "3 s (not counting 60 s while the coordinator did not answer)");
}

TEST_F(PeerWaitTest, ASilenceBeforeTheWaitCountsOnlyFromItsStart) {
  reach_.Unanswered(now_);
  now_ += seconds(10);
  const PeerWait wait(PeerWaitBudget(seconds(3), &reach_));
  now_ += seconds(5);
  EXPECT_FALSE(wait.Expired());
  reach_.Answered();
  now_ += milliseconds(2999);
  EXPECT_FALSE(wait.Expired());
  now_ += milliseconds(1);
  EXPECT_TRUE(wait.Expired());
  EXPECT_EQ(reach_.SilentSoFar(), seconds(15));
}

TEST_F(PeerWaitTest, ASilenceStartsAtTheLastAnswer) {
  reach_.Answered();
  now_ += seconds(1);
  reach_.Unanswered(now_);  // nothing answered since the last answer
  now_ += seconds(4);
  reach_.Answered();
  EXPECT_EQ(reach_.SilentSoFar(), seconds(5));
}

TEST_F(PeerWaitTest, ACallSentBeforeTheLastAnswerIsSilentOnlySinceThatAnswer) {
  const auto poll_sent = now_;  // a long poll
  const PeerWait wait(PeerWaitBudget(seconds(3), &reach_));
  now_ += seconds(14);
  reach_.Answered();  // heartbeats answered meanwhile
  now_ += seconds(1);
  reach_.Unanswered(poll_sent);  // the poll ends without an answer
  now_ += seconds(1);
  EXPECT_EQ(reach_.SilentSoFar(), seconds(2));
  reach_.Answered();
  EXPECT_TRUE(wait.Expired());  // 14 s counted
  EXPECT_EQ(wait.Waited(), "3 s (not counting 2 s while the coordinator did not answer)");
}

TEST_F(PeerWaitTest, ASecondUnansweredCallKeepsTheFirstStart) {
  reach_.Unanswered(now_);
  now_ += seconds(2);
  reach_.Unanswered(now_);
  now_ += seconds(2);
  reach_.Answered();
  EXPECT_EQ(reach_.SilentSoFar(), seconds(4));
  EXPECT_FALSE(reach_.Silent());
}

TEST(PeerWaitBudgetTest, WithoutReachCountsAllTime) {
  const PeerWait wait(milliseconds(0));
  EXPECT_TRUE(wait.Expired());
}

}  // namespace
}  // namespace reshard::agent
