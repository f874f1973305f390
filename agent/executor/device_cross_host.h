// What the two cross-host routes of the device path share (kDeviceComm:
// device_comm_steps.h, kDeviceIpc: device_ipc_steps.h): the run's context
// (the task, this host, the agent's device store and transport, the
// callbacks), the index of every host of the operation, and how a route's
// steps plug into RunOnDevices (device_run.h) as its CrossHostMover. Each
// route keeps only how its bytes move.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "agent/executor/device_run.h"
#include "agent/transfer/transport.h"

namespace reshard::agent {

/// The cross-host steps of one run of a device route. A route subclasses it
/// with its Run. Lives for one RunOnDevices call and holds references to
/// its constructor's arguments; not thread-safe.
class DeviceCrossHostSteps {
 public:
  DeviceCrossHostSteps(DeviceBufferStore& devices, Transport* transport,
                       const TaskExecutor::Options& options, const std::string& host_id,
                       const v1::HostTask& task, const std::function<bool()>& cancelled,
                       const std::function<void(const std::string& what)>& waiting);
  DeviceCrossHostSteps(const DeviceCrossHostSteps&) = delete;
  DeviceCrossHostSteps& operator=(const DeviceCrossHostSteps&) = delete;
  virtual ~DeviceCrossHostSteps() = default;

  /// RunOnDevices (device_run.h) of `route` with these steps moving its
  /// cross-host steps.
  [[nodiscard]] absl::StatusOr<std::vector<v1::ShardChecksum>> RunWithDevices(
      ShardStore& store, const DeviceRoute& route,
      const std::function<void(int64_t done, int64_t total)>& progress);

 protected:
  /// Moves the cross-host steps `hs.remotes` once the new buffers `made`
  /// exist (a CrossHostMover).
  [[nodiscard]] virtual absl::Status Run(const HostSteps& hs,
                                         const std::vector<DeviceRankBufferPtr>& made,
                                         const std::function<void(int64_t bytes)>& moved) = 0;

  /// ConnectAndProveDevicePeers (device_comm_steps.h) of this run.
  [[nodiscard]] absl::Status ConnectAndProve(const HostSteps& hs);

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

}  // namespace reshard::agent
