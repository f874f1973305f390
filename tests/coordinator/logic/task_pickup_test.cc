// WaitForTasks woken by the task notifier (docs/coordinator.md, "Agents are
// told"), against the real PostgreSQL: a task this replica creates wakes it
// directly, one another replica creates wakes it through NOTIFY and the
// listener (also after the listener's connection was killed), a lost
// notification is caught by the safety re-read, and a cancelled call ends.
// Each safety re-read is set far beyond the deadline the test allows, unless
// it is the thing tested.
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/coordinator/logic/task_notifier.h"
#include "services/coordinator/store/pg_listener.h"
#include "tests/coordinator/harness/eventually.h"
#include "tests/coordinator/logic/feed_fixture.h"
#include "tests/coordinator/logic/logic_fixture.h"
#include "tests/support/job_builders.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using Clock = std::chrono::steady_clock;
using ::testing::Contains;

constexpr int kNeverMs = 600000;  // a safety re-read that never comes in a test
// Far below WaitForTasks' 10 s wait and any heartbeat, far above a wake-up.
constexpr auto kPickupDeadline = std::chrono::seconds(3);

class TaskPickupTest : public LogicTest {
 protected:
  /// A store on this test's database whose task-creating calls signal
  /// `notifier` (null: none) and NOTIFY when `notify`.
  std::shared_ptr<PgStore> StoreSignalling(TaskNotifier* notifier, bool notify) {
    PgStoreOptions options;
    options.dsn = dsn_;
    options.pool_size = 4;
    options.notify_tasks = notify;
    if (notifier != nullptr) {
      options.on_tasks_changed = [notifier](const std::vector<std::string>& hosts) {
        for (const std::string& host : hosts) notifier->Notify(host);
      };
    }
    absl::StatusOr<std::shared_ptr<PgStore>> store = PgStore::Connect(options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *store : nullptr;
  }

  std::unique_ptr<AgentApi> AgentsOn(StorePtr store, TaskNotifier* notifier, int safety_ms) {
    AgentApi::Options options;
    options.lease_ms = kLeaseMs;
    options.notifier = notifier;
    options.safety_reread_ms = safety_ms;
    return std::make_unique<AgentApi>(std::move(store), &clock_, metrics_.get(), options);
  }

  /// What a WaitForTasks call shows through its cancel check. The call
  /// asks it once after reading the store and finding nothing new, then
  /// after every wait on the notifier that ended without a change (each
  /// 100 ms at most): a second check proves the call sleeps on the notifier.
  struct CallProbe {
    std::atomic<int> checks{0};
    std::atomic<bool> cancelled{false};
  };

  /// WaitForTasks on `api` for `host` (nothing known), on another thread.
  std::future<absl::StatusOr<v1::WaitForTasksResponse>> Wait(AgentApi* api, const std::string& host,
                                                             std::shared_ptr<CallProbe> probe) {
    return std::async(std::launch::async, [api, host, probe] {
      v1::WaitForTasksRequest request;
      request.set_host_id(host);
      request.set_wait_ms(10000);
      return api->WaitForTasks(request, [probe] {
        ++probe->checks;
        return probe->cancelled.load();
      });
    });
  }

  /// The call read the store before the task existed and sleeps on the
  /// notifier: only a wake-up (or a re-read) can bring the task now.
  static void ExpectAsleep(std::future<absl::StatusOr<v1::WaitForTasksResponse>>& answer,
                           const CallProbe& probe) {
    ASSERT_TRUE(Eventually([&] {
      return probe.checks >= 2 ||
             answer.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    }));
    ASSERT_EQ(answer.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
        << "WaitForTasks answered before any task existed";
  }

  /// A resize whose tasks go to h0..h2, planned (PENDING -> PLANNED) but
  /// with no task yet; the driver's next tick creates them.
  v1::Operation PlannedResize() {
    const v1::Job job = Register(test_support::TwoLayerJob("pickup"));
    RegisterAgents({"h0", "h1", "h2"});
    absl::StatusOr<v1::Operation> op =
        ResizeTo(job, test_support::MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
    EXPECT_TRUE(op.ok()) << op.status();
    return op.ok() ? *op : v1::Operation();
  }

  /// The driver on `store` ticks: the resize's tasks are created through it.
  void CreateTasksThrough(StorePtr store) {
    std::unique_ptr<OperationDriver> driver = MakeDriver(std::move(store));
    ASSERT_TRUE(driver->Tick().ok());
  }

  /// The call answers within kPickupDeadline of `created` and lists `op`.
  static void ExpectPickedUp(std::future<absl::StatusOr<v1::WaitForTasksResponse>>& answer,
                             Clock::time_point created, const v1::Operation& op) {
    ASSERT_EQ(answer.wait_until(created + kPickupDeadline), std::future_status::ready)
        << "WaitForTasks still waits " << kPickupDeadline.count() << " s after the task";
    absl::StatusOr<v1::WaitForTasksResponse> response = answer.get();
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_THAT(response->assigned_operations(), Contains(op.id()));
  }
};

TEST_F(TaskPickupTest, ATaskThisReplicaCreatesWakesTheWaitAtOnce) {
  TaskNotifier notifier;
  std::shared_ptr<PgStore> store = StoreSignalling(&notifier, /*notify=*/false);
  std::unique_ptr<AgentApi> api = AgentsOn(store, &notifier, kNeverMs);
  const v1::Operation op = PlannedResize();
  auto probe = std::make_shared<CallProbe>();
  auto answer = Wait(api.get(), "h1", probe);
  // The call is asleep on the notifier before the task exists.
  ExpectAsleep(answer, *probe);
  const auto created = Clock::now();
  CreateTasksThrough(store);
  ExpectPickedUp(answer, created, op);
}

TEST_F(TaskPickupTest, ATaskAnotherReplicaCreatesArrivesThroughNotify) {
  // Replica B: its own store, notifier and listener; it creates nothing.
  TaskNotifier notifier_b;
  std::shared_ptr<PgStore> store_b = StoreSignalling(&notifier_b, /*notify=*/true);
  PgListenerOptions listener_options;
  listener_options.dsn = dsn_;
  listener_options.channels = {kTasksChannel};
  PgListener listener(
      listener_options,
      [&](const std::string&, const std::string& host) { notifier_b.Notify(host); },
      [&] { notifier_b.NotifyAll(); });
  listener.Start();
  ASSERT_TRUE(Eventually([&] { return listener.connections() == 1; }));
  std::unique_ptr<AgentApi> api_b = AgentsOn(store_b, &notifier_b, kNeverMs);
  const v1::Operation op = PlannedResize();
  auto probe = std::make_shared<CallProbe>();
  auto answer = Wait(api_b.get(), "h2", probe);
  ExpectAsleep(answer, *probe);
  // Replica A (a store that signals nothing in B's process) creates it.
  const auto created = Clock::now();
  CreateTasksThrough(StoreSignalling(nullptr, /*notify=*/true));
  ExpectPickedUp(answer, created, op);
  listener.Stop();
}

// The listener's connection is killed (pg_terminate_backend): it connects
// again, and a task created after that still wakes the other replica's wait.
TEST_F(TaskPickupTest, TheListenerReconnectsAfterItsConnectionIsKilled) {
  TaskNotifier notifier_b;
  std::shared_ptr<PgStore> store_b = StoreSignalling(&notifier_b, /*notify=*/true);
  PgListenerOptions listener_options;
  listener_options.dsn = dsn_;
  listener_options.channels = {kTasksChannel};
  listener_options.min_backoff_ms = 10;
  PgListener listener(
      listener_options,
      [&](const std::string&, const std::string& host) { notifier_b.Notify(host); },
      [&] { notifier_b.NotifyAll(); });
  listener.Start();
  ASSERT_TRUE(Eventually([&] { return listener.connections() == 1; }));
  ASSERT_EQ(TerminateListeners(dsn_), 1u);
  ASSERT_TRUE(Eventually([&] { return listener.connections() == 2; }));
  std::unique_ptr<AgentApi> api_b = AgentsOn(store_b, &notifier_b, kNeverMs);
  const v1::Operation op = PlannedResize();
  auto probe = std::make_shared<CallProbe>();
  auto answer = Wait(api_b.get(), "h1", probe);
  ExpectAsleep(answer, *probe);
  const auto created = Clock::now();
  CreateTasksThrough(StoreSignalling(nullptr, /*notify=*/true));
  ExpectPickedUp(answer, created, op);
  listener.Stop();
}

TEST_F(TaskPickupTest, ALostNotificationIsCaughtByTheSafetyReread) {
  TaskNotifier notifier;  // nothing signals it: every notification is lost
  constexpr int kSafetyMs = 500;
  std::unique_ptr<AgentApi> api = AgentsOn(store_, &notifier, kSafetyMs);
  const v1::Operation op = PlannedResize();
  auto probe = std::make_shared<CallProbe>();
  auto answer = Wait(api.get(), "h1", probe);
  ExpectAsleep(answer, *probe);
  const auto created = Clock::now();
  CreateTasksThrough(StoreSignalling(nullptr, /*notify=*/false));
  ExpectPickedUp(answer, created, op);
}

TEST_F(TaskPickupTest, ACancelledCallEndsWithoutATask) {
  TaskNotifier notifier;
  std::unique_ptr<AgentApi> api = AgentsOn(store_, &notifier, kNeverMs);
  RegisterAgents({"h0"});
  auto probe = std::make_shared<CallProbe>();
  auto answer = Wait(api.get(), "h0", probe);
  ExpectAsleep(answer, *probe);
  const auto cancel_at = Clock::now();
  probe->cancelled = true;
  ASSERT_EQ(answer.wait_until(cancel_at + std::chrono::seconds(2)), std::future_status::ready);
  absl::StatusOr<v1::WaitForTasksResponse> response = answer.get();
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->assigned_operations_size(), 0);
}

TEST_F(TaskPickupTest, ShutdownEndsTheWait) {
  TaskNotifier notifier;
  std::unique_ptr<AgentApi> api = AgentsOn(store_, &notifier, kNeverMs);
  RegisterAgents({"h0"});
  auto probe = std::make_shared<CallProbe>();
  auto answer = Wait(api.get(), "h0", probe);
  ExpectAsleep(answer, *probe);
  const auto shut_at = Clock::now();
  notifier.Shutdown();
  ASSERT_EQ(answer.wait_until(shut_at + std::chrono::seconds(2)), std::future_status::ready);
  EXPECT_TRUE(answer.get().ok());
}

}  // namespace
}  // namespace reshard::coordinator::testing
