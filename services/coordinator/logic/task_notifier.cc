#include "services/coordinator/logic/task_notifier.h"

#include <utility>

namespace reshard::coordinator {

TaskNotifier::Host& TaskNotifier::HostLocked(const std::string& host_id) {
  std::unique_ptr<Host>& host = hosts_[host_id];
  if (host == nullptr) host = std::make_unique<Host>();
  return *host;
}

void TaskNotifier::TakeSubscribersLocked(Host* host, std::vector<Callback>* out) {
  auto take = [&](Host& h) {
    for (auto& [id, callback] : h.subscribers) {
      subscribed_.erase(id);
      out->push_back(std::move(callback));
    }
    h.subscribers.clear();
  };
  if (host != nullptr) {
    take(*host);
    return;
  }
  for (auto& [id, h] : hosts_) take(*h);
}

void TaskNotifier::Notify(const std::string& host_id) {
  std::vector<Callback> woken;
  {
    std::lock_guard<std::mutex> l(mu_);
    Host& host = HostLocked(host_id);
    ++host.version;
    host.cv.notify_all();
    TakeSubscribersLocked(&host, &woken);
  }
  for (Callback& callback : woken) callback(Wake::kChanged);
}

void TaskNotifier::NotifyAll() {
  std::vector<Callback> woken;
  {
    std::lock_guard<std::mutex> l(mu_);
    ++all_;
    for (auto& [id, host] : hosts_) host->cv.notify_all();
    TakeSubscribersLocked(nullptr, &woken);
  }
  for (Callback& callback : woken) callback(Wake::kChanged);
}

uint64_t TaskNotifier::Version(const std::string& host_id) {
  std::lock_guard<std::mutex> l(mu_);
  return HostLocked(host_id).version + all_;
}

TaskNotifier::Wake TaskNotifier::WaitChanged(const std::string& host_id, uint64_t seen,
                                             TimePoint until) {
  std::unique_lock<std::mutex> l(mu_);
  Host& host = HostLocked(host_id);  // stable: entries are never erased
  host.cv.wait_until(l, until, [&] { return shut_down_ || host.version + all_ != seen; });
  if (shut_down_) return Wake::kShutDown;
  return host.version + all_ != seen ? Wake::kChanged : Wake::kTimedOut;
}

std::optional<TaskNotifier::Wake> TaskNotifier::Subscribe(const std::string& host_id,
                                                          uint64_t seen, Callback callback,
                                                          uint64_t* subscription) {
  std::lock_guard<std::mutex> l(mu_);
  if (shut_down_) return Wake::kShutDown;
  Host& host = HostLocked(host_id);
  if (host.version + all_ != seen) return Wake::kChanged;
  const uint64_t id = next_subscription_++;
  host.subscribers.emplace(id, std::move(callback));
  subscribed_.emplace(id, &host);
  *subscription = id;
  return std::nullopt;
}

void TaskNotifier::Unsubscribe(uint64_t subscription) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = subscribed_.find(subscription);
  if (it == subscribed_.end()) return;
  it->second->subscribers.erase(subscription);
  subscribed_.erase(it);
}

size_t TaskNotifier::subscribers() {
  std::lock_guard<std::mutex> l(mu_);
  return subscribed_.size();
}

void TaskNotifier::Shutdown() {
  std::vector<Callback> woken;
  {
    std::lock_guard<std::mutex> l(mu_);
    shut_down_ = true;
    for (auto& [id, host] : hosts_) host->cv.notify_all();
    TakeSubscribersLocked(nullptr, &woken);
  }
  for (Callback& callback : woken) callback(Wake::kShutDown);
}

}  // namespace reshard::coordinator
