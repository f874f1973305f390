// TaskNotifier (services/coordinator/logic/task_notifier.h): a change before
// the wait, a wait that ends at its deadline, a change from another thread,
// NotifyAll and Shutdown; the same for subscriptions (no thread held).
#include "services/coordinator/logic/task_notifier.h"

#include <chrono>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace reshard::coordinator {
namespace {

using Clock = std::chrono::steady_clock;
using Wake = TaskNotifier::Wake;

TEST(TaskNotifierTest, ANotifyBeforeTheWaitIsNotMissed) {
  TaskNotifier notifier;
  const uint64_t seen = notifier.Version("h0");
  notifier.Notify("h0");
  // Far deadline: a missed change would block the test for an hour.
  EXPECT_EQ(notifier.WaitChanged("h0", seen, Clock::now() + std::chrono::hours(1)), Wake::kChanged);
  EXPECT_EQ(notifier.Version("h0"), seen + 1);
}

TEST(TaskNotifierTest, AnotherHostsChangeDoesNotWake) {
  TaskNotifier notifier;
  const uint64_t seen = notifier.Version("h0");
  notifier.Notify("h1");
  const auto until = Clock::now() + std::chrono::milliseconds(50);
  EXPECT_EQ(notifier.WaitChanged("h0", seen, until), Wake::kTimedOut);
  EXPECT_GE(Clock::now(), until);
  EXPECT_EQ(notifier.Version("h0"), seen);
}

TEST(TaskNotifierTest, AChangeFromAnotherThreadWakesTheWaiter) {
  TaskNotifier notifier;
  const uint64_t seen = notifier.Version("h0");
  std::thread other([&] { notifier.Notify("h0"); });
  EXPECT_EQ(notifier.WaitChanged("h0", seen, Clock::now() + std::chrono::hours(1)), Wake::kChanged);
  other.join();
}

TEST(TaskNotifierTest, NotifyAllWakesEveryHost) {
  TaskNotifier notifier;
  const uint64_t h0 = notifier.Version("h0");
  const uint64_t h1 = notifier.Version("h1");
  notifier.NotifyAll();
  EXPECT_EQ(notifier.WaitChanged("h0", h0, Clock::now() + std::chrono::hours(1)), Wake::kChanged);
  EXPECT_EQ(notifier.WaitChanged("h1", h1, Clock::now() + std::chrono::hours(1)), Wake::kChanged);
  // A host first seen after it counts it in its version from the start.
  const uint64_t h2 = notifier.Version("h2");
  EXPECT_EQ(notifier.WaitChanged("h2", h2, Clock::now()), Wake::kTimedOut);
}

TEST(TaskNotifierTest, ShutdownEndsWaitsNowAndLater) {
  TaskNotifier notifier;
  const uint64_t seen = notifier.Version("h0");
  std::thread other([&] { notifier.Shutdown(); });
  EXPECT_EQ(notifier.WaitChanged("h0", seen, Clock::now() + std::chrono::hours(1)),
            Wake::kShutDown);
  other.join();
  EXPECT_EQ(notifier.WaitChanged("h1", notifier.Version("h1"),
                                 Clock::now() + std::chrono::hours(1)),
            Wake::kShutDown);
  notifier.Shutdown();  // idempotent
}

TEST(TaskNotifierTest, ASubscriptionRunsOnceOnTheHostsChange) {
  TaskNotifier notifier;
  std::vector<Wake> wakes;
  uint64_t id = 0;
  const uint64_t seen = notifier.Version("h0");
  EXPECT_EQ(notifier.Subscribe("h0", seen, [&](Wake w) { wakes.push_back(w); }, &id),
            std::nullopt);
  EXPECT_NE(id, 0u);
  EXPECT_EQ(notifier.subscribers(), 1u);
  notifier.Notify("h1");
  EXPECT_TRUE(wakes.empty());
  notifier.Notify("h0");
  notifier.Notify("h0");
  EXPECT_EQ(wakes, std::vector<Wake>{Wake::kChanged});
  EXPECT_EQ(notifier.subscribers(), 0u);
}

TEST(TaskNotifierTest, ASubscriptionAfterTheChangeWakesAtOnce) {
  TaskNotifier notifier;
  const uint64_t seen = notifier.Version("h0");
  notifier.NotifyAll();
  uint64_t id = 0;
  EXPECT_EQ(notifier.Subscribe("h0", seen, [](Wake) { ADD_FAILURE() << "called"; }, &id),
            Wake::kChanged);
  EXPECT_EQ(id, 0u);
  EXPECT_EQ(notifier.subscribers(), 0u);
}

TEST(TaskNotifierTest, UnsubscribedIsNeverCalledAndShutdownWakesTheRest) {
  TaskNotifier notifier;
  int dropped = 0;
  std::vector<Wake> kept;
  uint64_t a = 0;
  uint64_t b = 0;
  ASSERT_EQ(notifier.Subscribe("h0", notifier.Version("h0"), [&](Wake) { ++dropped; }, &a),
            std::nullopt);
  ASSERT_EQ(notifier.Subscribe("h1", notifier.Version("h1"), [&](Wake w) { kept.push_back(w); },
                               &b),
            std::nullopt);
  notifier.Unsubscribe(a);
  notifier.Unsubscribe(a);  // twice: nothing
  EXPECT_EQ(notifier.subscribers(), 1u);
  notifier.Notify("h0");
  notifier.Shutdown();
  EXPECT_EQ(dropped, 0);
  EXPECT_EQ(kept, std::vector<Wake>{Wake::kShutDown});
  uint64_t c = 0;
  EXPECT_EQ(notifier.Subscribe("h2", notifier.Version("h2"), [](Wake) {}, &c), Wake::kShutDown);
  EXPECT_EQ(notifier.subscribers(), 0u);
}

// A callback may subscribe again from inside (the lock is not held).
TEST(TaskNotifierTest, ACallbackMaySubscribeAgain) {
  TaskNotifier notifier;
  int calls = 0;
  uint64_t id = 0;
  std::function<void(Wake)> again = [&](Wake) {
    ++calls;
    uint64_t next = 0;
    EXPECT_EQ(notifier.Subscribe("h0", notifier.Version("h0"), again, &next), std::nullopt);
  };
  ASSERT_EQ(notifier.Subscribe("h0", notifier.Version("h0"), again, &id), std::nullopt);
  notifier.Notify("h0");
  notifier.Notify("h0");
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(notifier.subscribers(), 1u);
}

}  // namespace
}  // namespace reshard::coordinator
