// What the worker service remembers of the jobs placed on this host, so that
// a worker's call needs no GetJob at the coordinator: each (job,
// generation)'s PTC and layout (a rank buffer's item sizes, names and
// shapes) and each job's worker-token hash (docs/agent.md, "Worker service
// memory"). Bounded by bytes, least recently used out first, and emptied of
// what the host no longer holds: Forget when the shard store drops a
// generation (released after its successor committed, retired, discarded),
// ForgetJob when it drops a job's last buffer (DeleteJob, or the job moved
// away). Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "reshard/v1/ptc.pb.h"

namespace reshard::agent {

class JobCache {
 public:
  struct Generation {
    v1::Ptc ptc;
    v1::Layout layout;
  };
  using GenerationPtr = std::shared_ptr<const Generation>;

  struct Stats {
    int64_t bytes = 0;        // what the entries take (JobCache::BytesOf)
    int64_t generations = 0;  // (job, generation) entries
    int64_t tokens = 0;       // job token-hash entries
  };
  /// Called with the new stats after every change, under the cache's lock:
  /// it must not call the cache.
  using Observer = std::function<void(const Stats&)>;

  /// Keeps at most `max_bytes` (> 0) of entries; an entry larger than that
  /// alone is not kept (every call for it asks the coordinator again).
  explicit JobCache(int64_t max_bytes, Observer observer = nullptr);
  JobCache(const JobCache&) = delete;
  JobCache& operator=(const JobCache&) = delete;

  /// The entry of (job, generation), or null; marks it recently used.
  GenerationPtr Find(const std::string& job_id, int64_t generation);
  /// Remembers `generation` (> 0) of `job_id`, replacing what was there.
  void Put(const std::string& job_id, int64_t generation, GenerationPtr entry);
  /// The SHA-256 of `job_id`'s worker token, if remembered.
  std::optional<std::string> FindToken(const std::string& job_id);
  void PutToken(const std::string& job_id, std::string sha256);

  /// Forgets (job, generation): the host holds none of its buffers any more.
  void Forget(const std::string& job_id, int64_t generation);
  /// Forgets every generation and the token hash of `job_id`.
  void ForgetJob(const std::string& job_id);

  Stats stats() const;
  int64_t max_bytes() const { return max_bytes_; }

  /// What an entry of `g` is counted as: the protos' in-memory size
  /// (SpaceUsedLong) and the entry's bookkeeping.
  static int64_t BytesOf(const std::string& job_id, const Generation& g);
  static int64_t TokenBytesOf(const std::string& job_id, const std::string& sha256);

 private:
  // generation 0: the job's token hash (generations are > 0).
  using Key = std::pair<std::string, int64_t>;
  struct Entry {
    GenerationPtr generation;
    std::string token_sha256;
    int64_t bytes = 0;
    std::list<Key>::iterator lru;  // in lru_
  };

  void InsertLocked(const Key& key, Entry entry);
  void EraseLocked(std::map<Key, Entry>::iterator it);
  void NotifyLocked();

  const int64_t max_bytes_;
  const Observer observer_;
  mutable std::mutex mu_;
  std::map<Key, Entry> entries_;
  std::list<Key> lru_;  // most recently used first
  Stats stats_;
};

}  // namespace reshard::agent
