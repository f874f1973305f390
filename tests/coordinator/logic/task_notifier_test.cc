// TaskNotifier (services/coordinator/logic/task_notifier.h): a change before
// the wait, a wait that ends at its deadline, a change from another thread,
// NotifyAll and Shutdown.
#include "services/coordinator/logic/task_notifier.h"

#include <chrono>
#include <thread>

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

}  // namespace
}  // namespace reshard::coordinator
