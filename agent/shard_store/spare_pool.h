// Spare shared-memory files whose pages are allocated ahead of time, so
// that a new rank buffer made from one does not pay for them (see
// docs/agent.md, "Shard store"): clean spares, allocated and zeroed by a
// background thread, and used ones, the files of rank buffers just dropped,
// kept a while with their pages (and bytes) for buffers whose writer
// overwrites them whole. Internal to the shard store. Thread-safe; the
// destructor stops the thread and removes the spare files.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace reshard::agent {

class SparePool {
 public:
  struct Options {
    std::string shm_dir;
    std::string host_id;
    /// Bytes of spare files to keep; 0: no pool, no thread.
    int64_t target_bytes = 0;
    /// Bytes the pool may hold at most right now (the memory limit less the
    /// rank buffers); called from the fill thread.
    std::function<int64_t()> room;
    /// Bytes of the host's memory the pool may still take (null: MemAvailable
    /// less a quarter of MemTotal, from /proc/meminfo). Below zero the host
    /// needs memory back: the thread frees used spares, then clean ones,
    /// until it is not, and nothing is kept or filled meanwhile.
    std::function<int64_t()> host_memory;
    /// How long a used spare (Keep) is kept before its pages are freed;
    /// 0: Keep keeps nothing.
    double keep_dropped_s = 0;
  };

  /// What TakeInto renamed.
  struct Taken {
    int64_t bytes = 0;  // 0: nothing (the pool had no spare to give)
    bool used = false;  // a used spare: its pages hold a dropped buffer's bytes
  };

  /// Removes the spare files of `host_id` that a previous agent left in
  /// `shm_dir`, then starts filling the pool in the background (at idle
  /// priority) if `shm_dir` is a tmpfs.
  explicit SparePool(Options options);
  ~SparePool();
  SparePool(const SparePool&) = delete;
  SparePool& operator=(const SparePool&) = delete;

  /// Renames the spare that best fits `bytes` (the smallest as large, else
  /// the largest; at equal size a used one when `prefer_used`, else a clean
  /// one) to `path`, which must not exist. Returns the spare's size (the
  /// caller truncates or extends it, and clears a used one as it needs), 0
  /// when the pool has none, or AlreadyExists when `path` exists (the spare
  /// stays in the pool).
  absl::StatusOr<Taken> TakeInto(int64_t bytes, const std::string& path, bool prefer_used);
  /// Whether Keep may keep anything (keep_dropped_s > 0 and a pool thread
  /// to free what expires).
  bool keeps() const { return keeping_; }
  /// A fresh name in the pool for a dropped buffer's file (the caller renames
  /// the file to it, then calls Keep or unlinks it).
  std::string NewName();
  /// Keeps the file at `path` (a NewName, `bytes` long, nobody else's) as a
  /// used spare for keep_dropped_s when the room allows; false when not (the
  /// caller unlinks it).
  bool Keep(const std::string& path, int64_t bytes);
  /// Removes spare files (a fill in progress first, then the smallest) until
  /// the pool holds at most `max_bytes`. Returns once they are gone.
  void ShrinkTo(int64_t max_bytes);
  /// Refilling waits while a pause is held (a task is moving bytes).
  void Pause();
  void Resume();
  /// The sizes of the buffers last made: the pool refills with spares of
  /// these sizes from now on.
  void NoteSizes(std::vector<int64_t> sizes);
  /// Something changed the room (a buffer dropped): look again.
  void Wake();
  /// Waits up to `timeout_s` until the pool has as many spares as it wants
  /// and room for; whether it got there.
  bool WaitFilled(double timeout_s);
  /// Bytes of spare files, those being filled included.
  int64_t bytes() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Spare {
    std::string path;
    int64_t bytes = 0;
    bool used = false;
    Clock::time_point expires;  // a used spare's
  };
  void Run();
  // The next size to fill, or 0 when the pool has what it wants. Under mu_.
  int64_t NextSize(int64_t cap) const;
  // Creates and populates one spare of `bytes`; false when it was given up.
  bool Fill(int64_t bytes);
  void RemoveStale();
  // Unlinks the used spares whose time is up and, while the host needs
  // memory back (`host`, this pass's reading of HostMemory(), below zero),
  // spares (FreeLocked's order); the next expiry (at most an hour away).
  // Under mu_.
  Clock::time_point ExpireLocked(Clock::time_point now, int64_t host);
  // Unlinks spares, the used ones first, then the smallest, while `more()`;
  // the bytes freed. Under mu_.
  int64_t FreeLocked(const std::function<bool(int64_t freed)>& more);
  int64_t HostMemory() const;

  const Options options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Spare> ready_;
  bool keeping_ = false;       // Keep keeps (set once, by the constructor)
  int64_t bytes_ = 0;          // ready_ and the fill in progress
  int64_t filling_bytes_ = 0;  // the fill in progress, 0 when none
  bool cancel_fill_ = false;   // the fill in progress must give up
  int pauses_ = 0;
  bool stop_ = false;
  bool idle_ = false;    // the thread found nothing to fill
  bool failed_ = false;  // the last fill failed; wait for a change
  uint64_t next_id_ = 0;
  std::vector<int64_t> wanted_;  // learned sizes, largest first
  std::thread thread_;
};

}  // namespace reshard::agent
