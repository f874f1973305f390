#include "agent/process/job_cache.h"

#include <limits>

#include "common/log.h"

namespace reshard::agent {
namespace {

// Bookkeeping of one entry beyond its contents: the map node, the LRU node,
// the key's copies.
constexpr int64_t kEntryOverhead = 256;

}  // namespace

JobCache::JobCache(int64_t max_bytes, Observer observer)
    : max_bytes_(max_bytes), observer_(std::move(observer)) {
  RESHARD_CHECK(max_bytes > 0) << "JobCache: max_bytes " << max_bytes;
}

int64_t JobCache::BytesOf(const std::string& job_id, const Generation& g) {
  return static_cast<int64_t>(sizeof(Generation) + g.ptc.SpaceUsedLong() +
                              g.layout.SpaceUsedLong() + 2 * job_id.size()) +
         kEntryOverhead;
}

int64_t JobCache::TokenBytesOf(const std::string& job_id, const std::string& sha256) {
  return static_cast<int64_t>(2 * job_id.size() + sha256.size()) + kEntryOverhead;
}

JobCache::GenerationPtr JobCache::Find(const std::string& job_id, int64_t generation) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = entries_.find({job_id, generation});
  if (it == entries_.end() || it->second.generation == nullptr) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return it->second.generation;
}

void JobCache::Put(const std::string& job_id, int64_t generation, GenerationPtr entry) {
  RESHARD_CHECK(generation > 0) << generation;
  RESHARD_CHECK(entry != nullptr);
  Entry e;
  e.bytes = BytesOf(job_id, *entry);
  e.generation = std::move(entry);
  std::lock_guard<std::mutex> l(mu_);
  InsertLocked({job_id, generation}, std::move(e));
}

std::optional<std::string> JobCache::FindToken(const std::string& job_id) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = entries_.find({job_id, 0});
  if (it == entries_.end()) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return it->second.token_sha256;
}

void JobCache::PutToken(const std::string& job_id, std::string sha256) {
  Entry e;
  e.bytes = TokenBytesOf(job_id, sha256);
  e.token_sha256 = std::move(sha256);
  std::lock_guard<std::mutex> l(mu_);
  InsertLocked({job_id, 0}, std::move(e));
}

void JobCache::Forget(const std::string& job_id, int64_t generation) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = entries_.find({job_id, generation});
  if (it == entries_.end()) return;
  EraseLocked(it);
  NotifyLocked();
}

void JobCache::ForgetJob(const std::string& job_id) {
  std::lock_guard<std::mutex> l(mu_);
  bool forgot = false;
  auto it = entries_.lower_bound({job_id, std::numeric_limits<int64_t>::min()});
  while (it != entries_.end() && it->first.first == job_id) {
    auto next = std::next(it);
    EraseLocked(it);
    it = next;
    forgot = true;
  }
  if (forgot) NotifyLocked();
}

JobCache::Stats JobCache::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

void JobCache::InsertLocked(const Key& key, Entry entry) {
  if (auto old = entries_.find(key); old != entries_.end()) EraseLocked(old);
  if (entry.bytes <= max_bytes_) {
    // Room first, least recently used out first.
    while (!lru_.empty() && stats_.bytes + entry.bytes > max_bytes_) {
      EraseLocked(entries_.find(lru_.back()));
    }
    lru_.push_front(key);
    entry.lru = lru_.begin();
    stats_.bytes += entry.bytes;
    ++(entry.generation != nullptr ? stats_.generations : stats_.tokens);
    entries_.emplace(key, std::move(entry));
  }
  NotifyLocked();
}

void JobCache::EraseLocked(std::map<Key, Entry>::iterator it) {
  stats_.bytes -= it->second.bytes;
  --(it->second.generation != nullptr ? stats_.generations : stats_.tokens);
  lru_.erase(it->second.lru);
  entries_.erase(it);
}

void JobCache::NotifyLocked() {
  if (observer_) observer_(stats_);
}

}  // namespace reshard::agent
