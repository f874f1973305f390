#include "agent/executor/item_checks.h"

#include <utility>

#include "common/log.h"

namespace reshard::agent {

ItemChecks::ItemChecks(std::map<Key, int64_t> accesses, std::function<void(const Key&)> job)
    : left_(std::move(accesses)), job_(std::move(job)) {
  for (const auto& [key, n] : left_) {
    RESHARD_CHECK(n >= 0);
    if (n == 0) queue_.push_back(key);
  }
  thread_ = std::thread([this] {
    Key key;
    while (Take(&key, /*wait=*/true)) {
      job_(key);
      std::lock_guard<std::mutex> l(mu_);
      --running_;
      cv_.notify_all();
    }
  });
}

ItemChecks::~ItemChecks() { Stop(); }

void ItemChecks::Done(const Key& key) {
  auto it = left_.find(key);
  RESHARD_CHECK(it != left_.end() && it->second > 0);
  if (--it->second == 0) Queue(key);
}

void ItemChecks::Queue(const Key& key) {
  std::lock_guard<std::mutex> l(mu_);
  queue_.push_back(key);
  cv_.notify_all();
}

bool ItemChecks::Take(Key* key, bool wait) {
  std::unique_lock<std::mutex> l(mu_);
  if (wait) cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
  if (stop_ || queue_.empty()) return false;
  *key = queue_.front();
  queue_.pop_front();
  if (wait) ++running_;
  return true;
}

void ItemChecks::Finish() {
  for (const auto& [key, n] : left_) RESHARD_CHECK(n == 0);
  Key key;
  while (Take(&key, /*wait=*/false)) job_(key);
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return queue_.empty() && running_ == 0; });
}

void ItemChecks::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    queue_.clear();
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

}  // namespace reshard::agent
