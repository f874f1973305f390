#include "services/coordinator/logic/heartbeat_batcher.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "services/coordinator/store/call_class.h"

namespace reshard::coordinator {

HeartbeatBatcher::HeartbeatBatcher(AgentApi* api, Options options)
    : api_(api), options_(options) {
  flusher_ = std::thread([this] { FlushLoop(); });
}

HeartbeatBatcher::~HeartbeatBatcher() { Shutdown(); }

void HeartbeatBatcher::Submit(const v1::HeartbeatRequest& request, Done done) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!shut_down_) {
      const auto now = std::chrono::steady_clock::now();
      if (queue_.empty()) first_arrival_ = now;
      queue_.push_back({request, std::move(done), now});
      if (queue_.size() == 1 || queue_.size() >= options_.max_batch) cv_.notify_one();
      return;
    }
  }
  done(absl::UnavailableError("the coordinator is shutting down; send the heartbeat again"));
}

void HeartbeatBatcher::Shutdown() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    cv_.notify_all();
  }
  flusher_.join();
}

HeartbeatBatcher::Stats HeartbeatBatcher::stats() {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

int64_t HeartbeatBatcher::LagMs() {
  std::lock_guard<std::mutex> l(mu_);
  std::chrono::steady_clock::time_point oldest = writing_since_;
  if (!queue_.empty() && (oldest == std::chrono::steady_clock::time_point{} ||
                          queue_.front().arrived < oldest)) {
    oldest = queue_.front().arrived;
  }
  if (oldest == std::chrono::steady_clock::time_point{}) return 0;
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               oldest)
      .count();
}

void HeartbeatBatcher::FlushLoop() {
  CallClassScope agent_calls(CallClass::kAgent);
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    cv_.wait(l, [&] { return shut_down_ || !queue_.empty(); });
    if (queue_.empty()) return;  // shut down, all answered
    // Group commit: the first arrival waits a little for company.
    cv_.wait_until(l, first_arrival_ + std::chrono::milliseconds(options_.max_wait_ms),
                   [&] { return shut_down_ || queue_.size() >= options_.max_batch; });
    const size_t n = std::min(queue_.size(), options_.max_batch);
    std::vector<Pending> batch;
    batch.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    if (!queue_.empty()) first_arrival_ = std::chrono::steady_clock::now();
    writing_since_ = batch.front().arrived;
    l.unlock();
    std::vector<const v1::HeartbeatRequest*> requests;
    requests.reserve(n);
    for (const Pending& p : batch) requests.push_back(&p.request);
    std::vector<Answer> answers = api_->HeartbeatMany(requests);
    {  // counted before anyone is answered: an answered caller sees its batch
      std::lock_guard<std::mutex> counted(mu_);
      ++stats_.batches;
      stats_.heartbeats += n;
      stats_.largest_batch = std::max(stats_.largest_batch, n);
    }
    for (size_t i = 0; i < n; ++i) batch[i].done(std::move(answers[i]));
    l.lock();
    writing_since_ = {};
  }
}

}  // namespace reshard::coordinator
