// Heartbeats in batches (group commit; docs/coordinator.md, "Agent calls: no
// thread per agent, heartbeats in batches"): Submit queues a heartbeat; one
// flusher thread takes what queued while the previous batch was written (or
// up to max_wait_ms after the first arrival) and records the whole batch with
// one store call (AgentApi::HeartbeatMany -> Store::HeartbeatHosts). Each
// caller is answered only after its batch committed, so a lease it was
// promised survives a failover. A host's own refusal (unknown, stale epoch,
// LOST) answers that host only.
// Thread-safe; Shutdown() is idempotent (the destructor calls it).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/status/statusor.h"
#include "reshard/v1/agent.pb.h"
#include "services/coordinator/logic/agent_api.h"

namespace reshard::coordinator {

class HeartbeatBatcher {
 public:
  using Answer = absl::StatusOr<v1::HeartbeatResponse>;
  using Done = std::function<void(Answer)>;
  struct Options {
    /// How long the first heartbeat of a batch waits for others (the batch
    /// leaves earlier when full, never before the previous one is written).
    int max_wait_ms = 2;
    /// Heartbeats per store call at most.
    size_t max_batch = 2000;
  };
  struct Stats {
    uint64_t batches = 0;
    uint64_t heartbeats = 0;
    size_t largest_batch = 0;
  };

  /// `api` must outlive this.
  HeartbeatBatcher(AgentApi* api, Options options);
  ~HeartbeatBatcher();
  HeartbeatBatcher(const HeartbeatBatcher&) = delete;
  HeartbeatBatcher& operator=(const HeartbeatBatcher&) = delete;

  /// Queues a heartbeat; `done` runs once, on the flusher thread, after its
  /// batch committed (or failed). After Shutdown: Unavailable, at once.
  void Submit(const v1::HeartbeatRequest& request, Done done);
  /// Writes what is queued, answers it, and stops the flusher.
  void Shutdown();
  Stats stats();
  /// How long the oldest heartbeat not yet answered has waited, in ms (0:
  /// none waits): queued, or in the batch being written. The leader judges
  /// no lease while this is long (lease_judge.h).
  int64_t LagMs();

 private:
  struct Pending {
    v1::HeartbeatRequest request;
    Done done;
    std::chrono::steady_clock::time_point arrived;
  };
  void FlushLoop();

  AgentApi* const api_;
  const Options options_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool shut_down_ = false;
  std::deque<Pending> queue_;
  std::chrono::steady_clock::time_point first_arrival_;
  // The arrival of the oldest beat of the batch being written; {} when none.
  std::chrono::steady_clock::time_point writing_since_;
  Stats stats_;
  std::thread flusher_;
};

}  // namespace reshard::coordinator
