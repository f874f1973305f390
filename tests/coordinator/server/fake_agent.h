// A simulated host agent for integration tests: a real AgentService gRPC
// client that registers its host, heartbeats from a thread, fetches every
// operation assigned to it with GetTask and reports DONE with a checksum per
// shard it would have written (or, while held, only RUNNING). It moves no
// bytes. Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "reshard/v1/agent.grpc.pb.h"

namespace reshard::coordinator::testing {

/// What a DONE report of `task` carries: one checksum per (item, new rank)
/// the task writes on `host` (every step destination and zero fill whose new
/// rank is placed there), with its bytes; `checksum(item, rank)` gives the value.
std::vector<v1::ShardChecksum> ShardChecksumsFor(
    const v1::HostTask& task, const std::string& host,
    const std::function<uint64_t(int item, int rank)>& checksum);

class FakeAgent {
 public:
  FakeAgent(std::string host_id, int devices);
  ~FakeAgent();

  const std::string& host_id() const { return host_id_; }

  /// Where the agent's calls go from now on (host:port).
  void SetCoordinator(const std::string& address);
  /// RegisterAgent now; remembers the epoch.
  [[nodiscard]] absl::Status Register();
  /// Heartbeats every `period` from a thread and works on assigned
  /// operations; registers again when the coordinator says so.
  void Start(absl::Duration period = absl::Milliseconds(100));
  void Stop();

  /// While held, fetched operations get RUNNING reports only; releasing
  /// lets the next pass report DONE.
  void SetHold(bool hold) { hold_.store(hold); }

  /// Whether GetTask succeeded for `operation_id`.
  bool Fetched(const std::string& operation_id) const;
  /// Operations this agent reported DONE (acknowledged without abort).
  int DoneCount() const;
  int64_t epoch() const { return epoch_.load(); }
  /// Heartbeats answered OK.
  int64_t heartbeats() const { return heartbeats_.load(); }

 private:
  void Run(absl::Duration period);
  void Pass();
  std::shared_ptr<v1::AgentService::Stub> stub() const;

  const std::string host_id_;
  const int devices_;
  mutable std::mutex mu_;
  std::shared_ptr<v1::AgentService::Stub> stub_;
  std::map<std::string, v1::HostTask> tasks_;  // fetched, not yet DONE
  // A stop-free operation's prepare task, kept after PREPARED: its slice
  // names every shard the transfer-phase task (prepared) seals.
  std::map<std::string, v1::HostTask> prepared_;
  std::set<std::string> fetched_;
  std::set<std::string> done_;
  std::atomic<int64_t> epoch_{0};
  std::atomic<int64_t> heartbeats_{0};
  std::atomic<bool> hold_{false};
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace reshard::coordinator::testing
