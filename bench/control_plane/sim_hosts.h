// Simulated host agents for control_plane_bench: H hosts in one process,
// each doing what a reshard-agent does towards the coordinator (agent/process/
// coordinator_session.cc): RegisterAgent, a Heartbeat every lease/3, and one
// WaitForTasks long poll kept open (re-issued as soon as it answers). An
// operation named by either is picked up: GetTask, then ReportProgress DONE
// with one checksum per shard the host's slice writes, and no byte moved.
//
// Every call goes through gRPC's callback API over a few shared channels
// (hosts are spread over them); the only threads are gRPC's and one Timer.
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "reshard/v1/agent.grpc.pb.h"

namespace reshard::bench {

using Clock = std::chrono::steady_clock;

/// Runs callbacks at given times from one thread. They must not block.
class Timer {
 public:
  Timer();
  ~Timer();  // Stop()
  void At(Clock::time_point when, std::function<void()> fn);
  /// Drops what is pending and joins the thread. Idempotent.
  void Stop();

 private:
  struct Entry {
    Clock::time_point when;
    uint64_t seq;
    bool operator>(const Entry& o) const { return when != o.when ? when > o.when : seq > o.seq; }
  };
  void Run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue_;
  std::map<uint64_t, std::function<void()>> fns_;
  uint64_t next_seq_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

/// The checksum a simulated host reports for a shard: a function of the job
/// and the item only, so that every replica of a tensor and every
/// generation holding the same bytes carries the same checksum, as real
/// content checksums would (the benchmark's PTCs are replicated, unsplit).
uint64_t SimChecksum(const std::string& job_id, int item);

class SimHosts {
 public:
  /// `on_pickup(operation_id, host_id, when, by_poll)`: the first time a host
  /// learns of an operation (by_poll: from WaitForTasks, else a heartbeat).
  using PickupFn = std::function<void(const std::string&, const std::string&, Clock::time_point,
                                      bool)>;
  /// Hosts "h0".."h<hosts-1>", spread over `channels`.
  SimHosts(const std::vector<std::shared_ptr<grpc::Channel>>& channels, int hosts, Timer* timer,
           PickupFn on_pickup);
  ~SimHosts();  // Stop()

  static std::string HostId(int i);

  /// Registers every host (64 calls in flight at a time), then starts its
  /// heartbeats and long poll. Fails on the first failed registration or
  /// after `timeout`.
  [[nodiscard]] absl::Status Start(std::chrono::milliseconds timeout);
  /// Stops re-issuing calls, cancels the long polls and waits (10 s) for
  /// every call in flight to end. Idempotent.
  void Stop();

  int64_t heartbeats() const { return heartbeats_.load(); }
  int64_t polls() const { return polls_.load(); }
  int64_t done_reports() const { return done_reports_.load(); }
  int64_t lease_ms() const { return lease_ms_.load(); }
  /// Calls that failed (not counting those Stop() cancelled); the first one's text.
  int64_t errors() const { return errors_.load(); }
  std::string first_error() const;

 private:
  struct Host;
  void RegisterNext();
  void Heartbeat(Host* host);
  void Poll(Host* host);
  void Listed(Host* host, const google::protobuf::RepeatedPtrField<std::string>& assigned,
              bool by_poll);
  void RunTask(Host* host, const std::string& operation_id);
  void Report(Host* host, const v1::HostTask& task);
  void Failed(const std::string& what, const grpc::Status& s);
  // A call started / ended (Stop() waits for none in flight).
  void Began() { in_flight_.fetch_add(1); }
  void Ended();

  Timer* const timer_;
  const PickupFn on_pickup_;
  std::vector<std::unique_ptr<v1::AgentService::Stub>> stubs_;
  std::vector<std::unique_ptr<Host>> hosts_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> next_register_{0};
  std::atomic<int> registered_{0};
  std::atomic<int64_t> lease_ms_{0};
  std::atomic<int64_t> heartbeats_{0}, polls_{0}, done_reports_{0}, errors_{0};
  std::atomic<int64_t> in_flight_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string first_error_;
};

}  // namespace reshard::bench
