// The routing of a task (docs/agent.md, "GPU / memory kinds"): where its
// new buffers live on this host (host or device memory), which route runs
// it when device memory is involved (RouteTask, RouteName), and the
// host-staged run around TaskRun (RunHostStaged).
//  - Placement: the new buffers of this host live in device memory iff the
//    agent has a device store and either one of the host's sources of the
//    task (old ranks of the source layout placed here) is a device buffer, or
//    the host holds no source buffer of the task at all. A new rank goes to
//    the device of the same-numbered old rank when that is a device buffer
//    here, else to (its index among the host's new ranks) mod device_count.
//  - Device-direct (kDevice) and the cross-host device routes (kDeviceComm,
//    kDeviceIpc with their movers; device_comm_steps.h, device_ipc_steps.h):
//    TaskRun (task_run.h), the one conductor of every route, runs them on
//    the devices: every step of this host is local (kDevice) or its
//    cross-host steps go to the route's mover, and the task is a plain one
//    (not two-phase, no regenerated item here). The new device buffers are
//    made (zeroed, so zero fills cost nothing) and every local copy moves
//    through the device API (device_buffers.h), run by run (contiguous
//    pieces of the strided regions, coalesced), on one stream per
//    destination device: device to device on one device, peer copies
//    across devices, host to device from host sources. Then each buffer is
//    sealed (its checksums are those of a host buffer with the same bytes).
//  - Host-staged (RunHostStaged): everything else. The device sources the
//    task reads are staged into host buffers (device_staging.h), the ordinary
//    host run (TaskRun) runs, the staged copies go, and the new buffers
//    placed on a device are staged there (their host copies dropped). Tasks
//    of a two-phase operation (prepare / prepared) and tasks whose new ranks
//    here have regenerated items keep their new buffers in host memory: the
//    prepared phase writes into what its prepare left unsealed, and only the
//    host store records regenerated items.
// Device sources are sealed device buffers, which the store never writes
// again: they need no lease; host sources are leased as in TaskRun.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/executor/device_buffers.h"
#include "agent/executor/executor.h"
#include "agent/executor/host_steps.h"
#include "agent/shard_store/device_buffer.h"
#include "agent/shard_store/shard_store.h"
#include "reshard/v1/agent.pb.h"

namespace reshard::agent {

/// How one host runs one task when the agent has a device store.
struct DeviceRoute {
  enum class Kind {
    kHost,        // today's TaskRun: nothing on a device
    kDevice,      // TaskRun on the devices, every step local
    kHostStaged,  // RunHostStaged
    kDeviceComm,  // TaskRun on the devices with DeviceCommMover (device_comm_steps.h)
    kDeviceIpc,   // the same with DeviceIpcMover (device_ipc_steps.h): agents of one machine
  };
  Kind kind = Kind::kHost;
  /// Why a task that involves device memory is host-staged ("cross-host
  /// steps: ..."); empty otherwise.
  std::string why;
  /// Whether the new buffers end in device memory, and each new rank's
  /// device (new ranks of this host only).
  bool on_device = false;
  std::map<int, int> device_of;
  /// Old ranks of this host, read by the task, that are device buffers.
  std::vector<int> device_sources;
};

/// The route's name as the operation's report shows it
/// (ReportProgressRequest.route, Operation.hosts[].route; docs/agent.md, "GPU
/// / memory kinds"): "host", "device-direct", "device-comm <comm>" (`comm`:
/// the communicator's AdvertisedCommName, "nccl" or "fake-nccl"),
/// "device-ipc", "host-staged". The one place these names are spelled: a new Kind adds
/// its case here.
std::string RouteName(DeviceRoute::Kind kind, const std::string& comm = "");

/// The route of `task` on host `host_id` (the placement rule above). A task
/// that does not parse (bad phase flags, ranks outside the layouts) routes
/// to kHost, whose checks report it.
DeviceRoute RouteTask(ShardStore& store, const DeviceBufferStore& devices,
                      const std::string& host_id, const v1::HostTask& task);

/// The host-staged run of a kHostStaged route around `run_on_host` (the
/// ordinary TaskRun): calls `waiting("host-staged: <route.why>")` first.
/// On failure nothing of the new generation is left in either store here
/// (nor the staged copies of the sources).
[[nodiscard]] absl::StatusOr<std::vector<v1::ShardChecksum>> RunHostStaged(
    ShardStore& store, DeviceBufferStore& devices, const std::string& host_id,
    const v1::HostTask& task, const DeviceRoute& route,
    const std::function<void(const std::string& what)>& waiting,
    const std::function<absl::StatusOr<std::vector<v1::ShardChecksum>>()>& run_on_host);

}  // namespace reshard::agent
