// WaitForTasks long polls that hold no thread (docs/coordinator.md, "Agent
// calls: no thread per agent, heartbeats in batches"): a poll is a record
// here, woken by the TaskNotifier's callback (TaskNotifier::Subscribe) or by
// one timer thread (a deadline heap: the poll's end, or its safety re-read),
// and its store reads run on a small fixed pool of workers, so 10,000 agents
// each holding a poll cost 10,000 records, not 10,000 threads. The polls due
// for a read at the same time share one store read (up to kReadBatch hosts:
// AgentApi::AssignedOperationsOfHosts), so the safety re-reads of 10,000
// polls are tens of queries a second, not 10,000.
// Each poll answers the way AgentApi::WaitForTasks does, through `done`,
// exactly once, on a worker or on the thread that ends it (Cancel,
// Shutdown, a notifier shutting down).
// Thread-safe; Shutdown() is idempotent (the destructor calls it).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "reshard/v1/agent.pb.h"
#include "services/coordinator/logic/agent_api.h"
#include "services/coordinator/logic/task_notifier.h"

namespace reshard::coordinator {

class TaskWaits {
 public:
  /// Polls read by one store call at most.
  static constexpr size_t kReadBatch = 500;

  using Answer = absl::StatusOr<v1::WaitForTasksResponse>;
  using Done = std::function<void(Answer)>;

  /// `api` (its notifier, safety_reread_ms and wait_poll_ms) must outlive
  /// this; `workers` threads run the store reads.
  TaskWaits(AgentApi* api, int workers);
  ~TaskWaits();
  TaskWaits(const TaskWaits&) = delete;
  TaskWaits& operator=(const TaskWaits&) = delete;

  /// Runs `work` on a worker (in call order; after Shutdown on the caller).
  void Post(std::function<void()> work);
  /// Starts a poll (its checks and first read run on a worker); returns its
  /// id for Cancel. `done` gets the answer AgentApi::WaitForTasks would
  /// give; Unavailable after Shutdown.
  uint64_t Start(const v1::WaitForTasksRequest& request, Done done);
  /// Ends poll `id` (if it still waits) with Cancelled: the client left.
  void Cancel(uint64_t id);
  /// Polls waiting now.
  size_t waiting();
  /// Store reads of assigned operations made so far (each for up to
  /// kReadBatch polls).
  uint64_t store_reads();
  /// Answers every poll (with the operations last read; Unavailable when
  /// none was read yet) and stops the threads.
  void Shutdown();

 private:
  using Clock = std::chrono::steady_clock;
  struct Poll {
    uint64_t id = 0;
    std::string host_id;
    std::set<std::string> known;
    v1::WaitForTasksRequest request;  // until checked
    bool checked = false;
    Clock::time_point deadline = Clock::time_point::max();
    Done done;
    uint64_t subscription = 0;   // the notifier's, 0: none
    uint64_t subscribed_as = 0;  // which Subscribe a callback answers
    Clock::time_point reread = Clock::time_point::max();  // the live timer
    bool read_queued = false;
    std::vector<std::string> last;  // the operations last read
  };
  using PollPtr = std::shared_ptr<Poll>;

  /// Takes up to kReadBatch queued polls, checks each one's request (its
  /// first read), reads all their hosts' operations with one store call,
  /// and answers each poll or lets it wait again.
  void ReadBatch();
  /// After `poll->last` was read with the notifier at `seen`: its answer
  /// (to run after unlocking), or null when it waits again.
  std::function<void()> AfterReadLocked(const PollPtr& poll, uint64_t seen,
                                        Clock::time_point now);
  void QueueReadLocked(const PollPtr& poll);
  void PostReadLocked();
  void OnWake(uint64_t id, uint64_t subscribed_as, TaskNotifier::Wake wake);
  /// Removes `poll`, drops its subscription, and returns its `done` bound to
  /// `answer`, for the caller to run after unlocking. `poll` by value: a
  /// caller may pass the map's own element, which this erases.
  std::function<void()> FinishLocked(PollPtr poll, Answer answer);
  void WorkerLoop();
  void TimerLoop();

  AgentApi* const api_;
  TaskNotifier* const notifier_;

  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable timer_cv_;
  bool shut_down_ = false;
  uint64_t next_id_ = 1;
  uint64_t next_subscribe_ = 1;
  std::map<uint64_t, PollPtr> polls_;
  std::multimap<Clock::time_point, uint64_t> timers_;  // may hold stale entries
  std::deque<std::function<void()>> work_;
  std::deque<PollPtr> reads_;  // polls waiting for ReadBatch
  bool read_posted_ = false;   // a ReadBatch is queued in work_
  uint64_t store_reads_ = 0;
  std::vector<std::thread> workers_;
  std::thread timer_;
};

}  // namespace reshard::coordinator
