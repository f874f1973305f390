// What one task run (task_run.h) holds while it moves bytes: the staging
// buffers of chunks that are not contiguous at one end, the background
// prefault of its new buffers, read leases on its sealed sources, and the
// chunks it handed to the transport. Not thread-safe, except Completions
// (shared with transport callbacks) and Prefaulter::Stop.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/executor/host_steps.h"
#include "agent/executor/transfer_lanes.h"
#include "agent/shard_store/shard_store.h"
#include "reshard/v1/agent.pb.h"

namespace reshard::agent {

/// Completions reported by transport callbacks; shared with them so a late
/// callback after the run returned touches nothing freed.
struct Completions {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<uint64_t, absl::Status>> done;  // (transfer sequence number, status)
};

/// A staging buffer for a chunk that is not contiguous at one end. Left
/// uninitialised: Pack or the receive overwrites every byte used.
struct Staging {
  explicit Staging(int64_t n) : bytes(new uint8_t[n]), capacity(n) {}
  std::unique_ptr<uint8_t[]> bytes;
  int64_t capacity;
};
using StagingPtr = std::shared_ptr<Staging>;

/// Reused staging buffers: fresh memory costs a page fault per 4 KiB.
class StagingPool {
 public:
  explicit StagingPool(int64_t chunk_bytes) : chunk_bytes_(chunk_bytes) {}
  /// A buffer of at least `bytes` (and at least the chunk size).
  StagingPtr Take(int64_t bytes);
  void Give(StagingPtr s);

 private:
  int64_t chunk_bytes_;
  std::vector<StagingPtr> free_;
};

/// Maps the pages of new buffers in the background, in the order they are
/// laid out (which is roughly the order receives and copies fill them), a
/// slice at a time so that Stop() returns soon. Failures are ignored: the
/// pages are reserved, and a write maps its page anyway. Stop() is idempotent.
class Prefaulter {
 public:
  explicit Prefaulter(std::vector<RankBufferPtr> buffers);
  ~Prefaulter() { Stop(); }
  void Stop();

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

/// One chunk handed to the transport.
struct InFlight {
  TransferLanes::Chunk lane_chunk;
  size_t remote = 0;
  int64_t bytes = 0;
  std::vector<int64_t> start, shape;  // the chunk within its step
  StagingPtr staging;                 // null when the transfer is in place
  const uint8_t* data = nullptr;      // the bytes sent or received
};

/// What a run waits on, as its `waiting` callback reports it: the earliest
/// chunk still in flight (the lowest sequence number of `inflight`) as
/// "step 17 (receive from host \"h1\")" or "step 17 (send to host ...)",
/// `remotes` indexed by InFlight::remote; with nothing in flight "local
/// copies" while `locals_left`, else "" (checksums).
std::string DescribeWait(const std::unordered_map<uint64_t, InFlight>& inflight,
                         const std::vector<RemoteStep>& remotes, bool locals_left);

/// A read lease on one sealed source buffer for the whole task.
struct SourceLease {
  int rank = 0;
  std::unique_ptr<ReadLease> lease;
};

/// "sealed source of job "j" generation g rank r".
std::string DescribeSource(const v1::HostTask& task, int rank);

/// A read lease on every old buffer of `hs`: a truncate or an open for
/// writing waits while it is held, and breaks it.
[[nodiscard]] absl::StatusOr<std::vector<SourceLease>> LeaseSources(const HostSteps& hs);

/// DataLoss naming the first source whose lease another process broke.
[[nodiscard]] absl::Status CheckLeases(const std::vector<SourceLease>& leases,
                                       const v1::HostTask& task);

}  // namespace reshard::agent
