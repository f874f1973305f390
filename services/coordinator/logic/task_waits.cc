#include "services/coordinator/logic/task_waits.h"

#include <algorithm>
#include <utility>

#include "services/coordinator/store/call_class.h"

namespace reshard::coordinator {
namespace {

// Safety re-reads are rounded up to a multiple of this (ReadBatch then reads
// the hosts of all polls due at once with one query).
constexpr std::chrono::steady_clock::duration kRereadGrid = std::chrono::milliseconds(100);

v1::WaitForTasksResponse AnswerOf(const std::vector<std::string>& assigned) {
  v1::WaitForTasksResponse response;
  for (const std::string& id : assigned) response.add_assigned_operations(id);
  return response;
}

}  // namespace

TaskWaits::TaskWaits(AgentApi* api, int workers) : api_(api), notifier_(api->options().notifier) {
  for (int i = 0; i < std::max(workers, 1); ++i) workers_.emplace_back([this] { WorkerLoop(); });
  timer_ = std::thread([this] { TimerLoop(); });
}

TaskWaits::~TaskWaits() { Shutdown(); }

void TaskWaits::Post(std::function<void()> work) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!shut_down_) {
      work_.push_back(std::move(work));
      work_cv_.notify_one();
      return;
    }
  }
  work();
}

uint64_t TaskWaits::Start(const v1::WaitForTasksRequest& request, Done done) {
  auto poll = std::make_shared<Poll>();
  poll->host_id = request.host_id();
  poll->known.insert(request.known_operations().begin(), request.known_operations().end());
  poll->request = request;
  poll->done = std::move(done);
  std::unique_lock<std::mutex> l(mu_);
  if (shut_down_) {
    l.unlock();
    poll->done(absl::UnavailableError("the coordinator is shutting down; call WaitForTasks again"));
    return 0;
  }
  poll->id = next_id_++;
  polls_.emplace(poll->id, poll);
  QueueReadLocked(poll);
  return poll->id;
}

void TaskWaits::Cancel(uint64_t id) {
  std::function<void()> answer;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = polls_.find(id);
    if (it == polls_.end()) return;
    answer = FinishLocked(it->second, absl::CancelledError("WaitForTasks: the call was cancelled"));
  }
  answer();
}

size_t TaskWaits::waiting() {
  std::lock_guard<std::mutex> l(mu_);
  return polls_.size();
}

uint64_t TaskWaits::store_reads() {
  std::lock_guard<std::mutex> l(mu_);
  return store_reads_;
}

void TaskWaits::Shutdown() {
  std::vector<std::function<void()>> answers;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    while (!polls_.empty()) {
      PollPtr poll = polls_.begin()->second;
      Answer answer = poll->checked ? Answer(AnswerOf(poll->last))
                                    : Answer(absl::UnavailableError(
                                          "the coordinator is shutting down; call "
                                          "WaitForTasks again"));
      answers.push_back(FinishLocked(poll, std::move(answer)));
    }
    work_cv_.notify_all();
    timer_cv_.notify_all();
  }
  for (auto& answer : answers) answer();
  // Workers finish the queue (reads of finished polls return at once).
  for (std::thread& t : workers_) t.join();
  timer_.join();
}

std::function<void()> TaskWaits::FinishLocked(PollPtr poll, Answer answer) {
  polls_.erase(poll->id);
  if (poll->subscription != 0) notifier_->Unsubscribe(poll->subscription);
  poll->subscription = 0;
  poll->reread = Clock::time_point::max();
  return [done = std::move(poll->done), answer = std::move(answer)]() mutable {
    done(std::move(answer));
  };
}

void TaskWaits::QueueReadLocked(const PollPtr& poll) {
  if (poll->read_queued) return;
  poll->read_queued = true;
  poll->reread = Clock::time_point::max();  // its timer entry is stale now
  if (poll->subscription != 0) notifier_->Unsubscribe(poll->subscription);
  poll->subscription = 0;
  reads_.push_back(poll);
  if (!read_posted_) PostReadLocked();
}

void TaskWaits::PostReadLocked() {
  read_posted_ = true;
  work_.push_back([this] { ReadBatch(); });
  work_cv_.notify_one();
}

void TaskWaits::ReadBatch() {
  CallClassScope agent_calls(CallClass::kAgent);
  std::vector<PollPtr> batch;
  {
    std::lock_guard<std::mutex> l(mu_);
    while (!reads_.empty() && batch.size() < kReadBatch) {
      if (polls_.count(reads_.front()->id) != 0) batch.push_back(reads_.front());
      reads_.pop_front();
    }
    read_posted_ = false;
    // The rest on another worker, in parallel with this batch.
    if (!reads_.empty()) PostReadLocked();
  }
  // A poll's first read checks its request; only this batch touches a
  // queued poll's request (read_queued).
  std::vector<int> wait_ms(batch.size(), 0);
  std::vector<bool> refused(batch.size(), false);  // answered by its check alone
  std::vector<std::function<void()>> answers;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i]->checked) continue;
    absl::StatusOr<int> checked = api_->CheckWaitForTasks(batch[i]->request);
    if (checked.ok()) {
      wait_ms[i] = *checked;
      continue;
    }
    refused[i] = true;
    std::lock_guard<std::mutex> l(mu_);
    if (polls_.count(batch[i]->id) != 0) answers.push_back(FinishLocked(batch[i], checked.status()));
  }
  for (auto& answer : answers) answer();
  answers.clear();
  // The versions before the read: a change committed after it wakes the poll.
  std::vector<uint64_t> seen(batch.size(), 0);
  std::vector<std::string> hosts;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (refused[i]) continue;
    if (notifier_ != nullptr) seen[i] = notifier_->Version(batch[i]->host_id);
    hosts.push_back(batch[i]->host_id);
  }
  // One store read for every host of the batch whose request passed its
  // check: a refused request is its caller's answer, never the batch's.
  absl::StatusOr<std::map<std::string, std::vector<std::string>>> assigned =
      api_->AssignedOperationsOfHosts(hosts);
  {
    std::lock_guard<std::mutex> l(mu_);
    ++store_reads_;
    const auto now = Clock::now();
    for (size_t i = 0; i < batch.size(); ++i) {
      const PollPtr& poll = batch[i];
      poll->read_queued = false;
      if (polls_.count(poll->id) == 0) continue;  // answered meanwhile
      if (!poll->checked) {
        poll->checked = true;
        poll->deadline = now + std::chrono::milliseconds(wait_ms[i]);
        poll->request.Clear();
      }
      if (!assigned.ok()) {
        answers.push_back(FinishLocked(poll, assigned.status()));
        continue;
      }
      poll->last = (*assigned)[poll->host_id];
      std::function<void()> answer = AfterReadLocked(poll, seen[i], now);
      if (answer) answers.push_back(std::move(answer));
    }
  }
  for (auto& answer : answers) answer();
}

std::function<void()> TaskWaits::AfterReadLocked(const PollPtr& poll, uint64_t seen,
                                                 Clock::time_point now) {
  const bool news = std::any_of(poll->last.begin(), poll->last.end(),
                                [&](const std::string& id) { return poll->known.count(id) == 0; });
  if (news || now >= poll->deadline) return FinishLocked(poll, AnswerOf(poll->last));
  const AgentApi::Options& options = api_->options();
  int period_ms = options.wait_poll_ms;
  if (notifier_ != nullptr) {
    period_ms = options.safety_reread_ms;
    const uint64_t as = next_subscribe_++;
    poll->subscribed_as = as;
    const uint64_t id = poll->id;
    std::optional<TaskNotifier::Wake> at_once = notifier_->Subscribe(
        poll->host_id, seen, [this, id, as](TaskNotifier::Wake wake) { OnWake(id, as, wake); },
        &poll->subscription);
    if (at_once == TaskNotifier::Wake::kShutDown) return FinishLocked(poll, AnswerOf(poll->last));
    if (at_once == TaskNotifier::Wake::kChanged) {
      QueueReadLocked(poll);
      return nullptr;
    }
  }
  Clock::time_point due = now + std::chrono::milliseconds(period_ms);
  if (notifier_ != nullptr) {
    // Safety re-reads come due on a grid, so that they share store reads.
    const Clock::duration since = due.time_since_epoch() + kRereadGrid - Clock::duration(1);
    due = Clock::time_point((since / kRereadGrid) * kRereadGrid);
  }
  poll->reread = std::min(poll->deadline, due);
  const bool earliest = timers_.empty() || poll->reread < timers_.begin()->first;
  timers_.emplace(poll->reread, poll->id);
  if (earliest) timer_cv_.notify_one();
  return nullptr;
}

void TaskWaits::OnWake(uint64_t id, uint64_t subscribed_as, TaskNotifier::Wake wake) {
  std::function<void()> answer;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = polls_.find(id);
    if (it == polls_.end()) return;
    const PollPtr poll = it->second;  // a copy: FinishLocked erases the map's
    if (poll->subscribed_as != subscribed_as || poll->subscription == 0) return;  // stale
    poll->subscription = 0;  // the notifier dropped it
    if (wake == TaskNotifier::Wake::kShutDown) {
      // As the blocking form: answer with the list as it is.
      answer = FinishLocked(poll, AnswerOf(poll->last));
    } else {
      QueueReadLocked(poll);
    }
  }
  if (answer) answer();
}

void TaskWaits::WorkerLoop() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    work_cv_.wait(l, [&] { return shut_down_ || !work_.empty(); });
    if (work_.empty()) return;  // shut down, queue drained
    std::function<void()> work = std::move(work_.front());
    work_.pop_front();
    l.unlock();
    work();
    l.lock();
  }
}

void TaskWaits::TimerLoop() {
  std::unique_lock<std::mutex> l(mu_);
  while (!shut_down_) {
    if (timers_.empty()) {
      timer_cv_.wait(l);
      continue;
    }
    const auto next = timers_.begin()->first;
    if (Clock::now() < next) {
      timer_cv_.wait_until(l, next);
      continue;
    }
    const uint64_t id = timers_.begin()->second;
    timers_.erase(timers_.begin());
    auto it = polls_.find(id);
    if (it == polls_.end() || it->second->reread != next) continue;  // stale entry
    QueueReadLocked(it->second);
  }
}

}  // namespace reshard::coordinator
