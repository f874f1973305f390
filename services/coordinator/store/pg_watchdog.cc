#include "services/coordinator/store/pg_watchdog.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

namespace reshard::coordinator::pg {

SocketWatchdog::SocketWatchdog() : thread_([this] { Run(); }) {}

SocketWatchdog::~SocketWatchdog() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (auto& [id, watch] : watches_) close(watch.fd);
}

uint64_t SocketWatchdog::Arm(int socket, Clock::time_point deadline) {
  if (socket < 0) return 0;
  const int fd = fcntl(socket, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return 0;
  uint64_t id;
  {
    std::lock_guard<std::mutex> l(mu_);
    id = next_id_++;
    watches_.emplace(id, Watch{fd, deadline});
  }
  cv_.notify_all();
  return id;
}

void SocketWatchdog::Extend(uint64_t id, Clock::time_point deadline) {
  if (id == 0) return;
  std::lock_guard<std::mutex> l(mu_);
  auto it = watches_.find(id);
  if (it != watches_.end() && !it->second.fired) {
    it->second.deadline = std::max(it->second.deadline, deadline);
  }
}

bool SocketWatchdog::Disarm(uint64_t id) {
  if (id == 0) return false;
  int fd = -1;
  bool fired = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = watches_.find(id);
    if (it == watches_.end()) return false;
    fd = it->second.fd;
    fired = it->second.fired;
    watches_.erase(it);
  }
  close(fd);
  return fired;
}

void SocketWatchdog::Run() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    const Clock::time_point now = Clock::now();
    Clock::time_point next = Clock::time_point::max();
    for (auto& [id, watch] : watches_) {
      if (watch.fired) continue;
      if (watch.deadline <= now) {
        // Both directions: a blocked recv() returns 0 and a send() fails,
        // so libpq reports the connection broken.
        shutdown(watch.fd, SHUT_RDWR);
        watch.fired = true;
      } else {
        next = std::min(next, watch.deadline);
      }
    }
    if (next == Clock::time_point::max()) {
      cv_.wait(l);
    } else {
      cv_.wait_until(l, next);
    }
  }
}

}  // namespace reshard::coordinator::pg
