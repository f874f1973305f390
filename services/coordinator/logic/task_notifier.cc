#include "services/coordinator/logic/task_notifier.h"

namespace reshard::coordinator {

TaskNotifier::Host& TaskNotifier::HostLocked(const std::string& host_id) {
  std::unique_ptr<Host>& host = hosts_[host_id];
  if (host == nullptr) host = std::make_unique<Host>();
  return *host;
}

void TaskNotifier::Notify(const std::string& host_id) {
  std::lock_guard<std::mutex> l(mu_);
  Host& host = HostLocked(host_id);
  ++host.version;
  host.cv.notify_all();
}

void TaskNotifier::NotifyAll() {
  std::lock_guard<std::mutex> l(mu_);
  ++all_;
  for (auto& [id, host] : hosts_) host->cv.notify_all();
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

void TaskNotifier::Shutdown() {
  std::lock_guard<std::mutex> l(mu_);
  shut_down_ = true;
  for (auto& [id, host] : hosts_) host->cv.notify_all();
}

}  // namespace reshard::coordinator
