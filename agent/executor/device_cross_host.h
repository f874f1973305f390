// What the two cross-host routes of the device path share (kDeviceComm:
// device_comm_steps.h, kDeviceIpc: device_ipc_steps.h): the run's context
// (the task, this host, the agent's device store and transport, the
// callbacks), the index of every host of the operation, and the Mover
// (mover.h) each route's steps sit behind, which TaskRun (task_run.h), the
// one conductor of every route, picks with MoverFor, proves through
// (PreparePeersAndProve) and posts to, polls and cancels. Each route keeps
// only how its bytes move.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "agent/executor/device_route.h"
#include "agent/executor/mover.h"
#include "agent/transfer/transport.h"

namespace reshard::agent {

/// The cross-host steps of one run of a device route. A route subclasses it
/// with its Move. Lives for one run and holds references to its
/// constructor's arguments; not thread-safe.
class DeviceCrossHostSteps {
 public:
  DeviceCrossHostSteps(DeviceBufferStore& devices, Transport* transport,
                       const TaskExecutor::Options& options, const std::string& host_id,
                       const v1::HostTask& task, const std::function<bool()>& cancelled,
                       const std::function<void(const std::string& what)>& waiting);
  DeviceCrossHostSteps(const DeviceCrossHostSteps&) = delete;
  DeviceCrossHostSteps& operator=(const DeviceCrossHostSteps&) = delete;
  virtual ~DeviceCrossHostSteps() = default;

  /// Moves the cross-host steps `hs.remotes` once the new buffers `made`
  /// exist and the peers are reached and proven; `moved(bytes)` counts the
  /// bytes written here. On failure the task's pending messages are
  /// cancelled (CrossHostDeviceStepsFailed, device_comm_steps.h).
  [[nodiscard]] virtual absl::Status Move(const HostSteps& hs,
                                          const std::vector<DeviceRankBufferPtr>& made,
                                          const std::function<void(int64_t bytes)>& moved) = 0;

  /// Fails what the steps have in flight (the communicator's Abort); the
  /// default has nothing to end.
  virtual void Abort() {}

 protected:
  DeviceBufferStore& devices_;
  DeviceApi* api_;
  Transport* transport_;
  const TaskExecutor::Options& options_;
  const std::string& host_id_;
  const v1::HostTask& task_;
  const std::function<bool()>& cancelled_;
  const std::function<void(const std::string& what)>& waiting_;
  const uint32_t tag_key_;
  /// Every host of the operation (this one and task.peers) -> its index
  /// among them sorted by id: its communicator rank, its device IPC chunk.
  const std::map<std::string, int> host_index_;
};

/// The Mover of a device route (DeviceCommMover, DeviceIpcMover): device
/// memory at both ends, between hosts. Its one transfer per run is every
/// cross-host step (MoverTransfer::steps).
///  - Prepare reaches the task's peers over the host transport, as
///    UcxHostMover does (the routes' messages between hosts, proofs,
///    handles and seals, are host memory); FailedPrecondition without one.
///  - Post records the transfer; Poll progresses it to its end on the run's
///    thread (the steps poll cancelled() inside, a watchdog where a call may
///    block) and reports it once.
///  - Cancel fails the transfer with Cancelled, before Poll starts it or
///    while it moves (from a `landed` callback, or another thread): the
///    steps see it as cancelled(), what they have in flight is aborted and
///    the task's host messages under `tag`/`mask` are cancelled.
class DeviceStepsMover : public Mover {
 public:
  [[nodiscard]] absl::Status Prepare(const std::string& host_id, const v1::HostTask& task,
                                     const std::function<bool()>& cancelled) override;
  void Post(uint64_t id, MoverTransfer t) override;
  void Poll(std::chrono::steady_clock::duration wait, std::deque<MoverCompletion>* out) override;
  void Cancel(uint64_t tag, uint64_t mask) override;

 protected:
  /// `run_cancelled` is the run's; the steps get cancelled() (below).
  DeviceStepsMover(Transport* transport, const std::function<bool()>& run_cancelled);
  /// What the steps poll: the run's cancelled() or this mover's Cancel.
  const std::function<bool()>& cancelled() const { return cancelled_; }
  /// Set once by the route's constructor.
  void SetSteps(std::unique_ptr<DeviceCrossHostSteps> steps) { steps_ = std::move(steps); }

 private:
  Transport* const transport_;
  std::shared_ptr<std::atomic<bool>> cancel_ = std::make_shared<std::atomic<bool>>(false);
  const std::function<bool()> cancelled_;
  std::unique_ptr<DeviceCrossHostSteps> steps_;
  std::optional<std::pair<uint64_t, MoverTransfer>> posted_;
};

}  // namespace reshard::agent
