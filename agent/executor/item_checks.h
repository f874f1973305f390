// Runs a job for each item once its last access is done, on a background
// thread, while the transfers go on: the checksum of a new item once every
// write to it has landed, the check of a source item against its sealed
// checksum once every read of it has finished. Without it both were extra
// passes over every byte after the network was done. The jobs of items that
// are finished early overlap the transfer; Finish runs what is left on the
// calling thread too. Done and Finish: one thread (the executor's); the jobs
// run on the background thread or in Finish.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

namespace reshard::agent {

class ItemChecks {
 public:
  /// (kind, rank, item); the kind is the caller's (e.g. source or new).
  using Key = std::tuple<int, int, int>;

  /// `job(key)` runs once `Done(key)` was called `accesses[key]` times; keys
  /// counted 0 are queued at once.
  ItemChecks(std::map<Key, int64_t> accesses, std::function<void(const Key&)> job);
  /// Stop().
  ~ItemChecks();

  /// One access of `key` is over. Checked: `key` was counted and is not over.
  void Done(const Key& key);
  /// Runs the queued jobs here as well and waits for the background thread.
  /// Every key must be over (checked).
  void Finish();
  /// Drops queued jobs and waits for a running one (a failed task). Idempotent.
  void Stop();

 private:
  void Queue(const Key& key);
  // Takes a queued key; false when none and (`wait` false or stopping).
  bool Take(Key* key, bool wait);

  std::map<Key, int64_t> left_;
  std::function<void(const Key&)> job_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Key> queue_;
  bool stop_ = false;
  int running_ = 0;  // jobs being run by the background thread
  std::thread thread_;
};

}  // namespace reshard::agent
