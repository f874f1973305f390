// WatchJob streams for control_plane_bench: N streams over a set of jobs,
// each a ClientReadReactor (gRPC's callback API) multiplexed over a few
// shared channels; no thread per stream. Counts every Job message
// delivered; a stream that ends with an error (not cancelled by Close) is
// counted and its status kept. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "reshard/v1/coordinator.grpc.pb.h"

namespace reshard::bench {

class WatchSet {
 public:
  /// `on_job(job, when)`: every message of every stream (from gRPC's threads).
  using JobFn = std::function<void(const v1::Job&, std::chrono::steady_clock::time_point)>;
  WatchSet(std::vector<v1::CoordinatorService::Stub*> stubs, JobFn on_job = nullptr);
  ~WatchSet();  // Close()

  /// Opens `count` streams, stream i watching job_ids[i % size] over stub
  /// i % stubs, and waits until each has delivered its first message.
  /// Fails on the first stream that ends, or after `timeout` (saying how
  /// many opened).
  [[nodiscard]] absl::Status Open(const std::vector<std::string>& job_ids, int count,
                                  std::chrono::milliseconds timeout);
  /// Cancels every stream and waits (30 s) until each has ended.
  void Close();

  int open() const { return first_messages_.load(); }
  int64_t events() const { return events_.load(); }
  int64_t errors() const { return errors_.load(); }
  std::string first_error() const;

 private:
  class Stream;
  void Ended(const grpc::Status& status, bool cancelled_by_us);

  std::vector<v1::CoordinatorService::Stub*> stubs_;
  JobFn on_job_;
  std::vector<std::unique_ptr<Stream>> streams_;
  std::atomic<bool> closing_{false};
  std::atomic<int> first_messages_{0};
  std::atomic<int> ended_{0};
  std::atomic<int64_t> events_{0}, errors_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string first_error_;
};

}  // namespace reshard::bench
