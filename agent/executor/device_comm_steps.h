// Cross-host steps over a device communicator (issue 23 item 3; device_comm.h):
// the kDeviceComm route of device_route.h.
//  - Route: taken by every host of an operation or by none. The agent has a
//    device store and a communicator factory, the task is a plain one (not
//    two-phase, no regenerated item in the plan), the job's state lives in
//    device memory (task.device_resident: JobSpec.state_memory DEVICE), the
//    operation has other hosts (task.peers: the coordinator lists every host
//    of the operation), and every one of them advertises this host's communicator name
//    (AdvertisedCommName) in PeerHost.transports. Everything in that rule
//    is the same on every host, so all join one communicator. Otherwise the
//    cross-host task is host-staged, its `why` naming what is missing.
//  - Run: TaskRun on the devices (device sources read in place, host sources copied
//    host to device run by run, new buffers made on the devices and, when
//    the placement keeps them in host memory, staged there at the end),
//    with DeviceCommMover (below) as the mover of its cross-host steps.
//    The peers are reached and proven by TaskRun (PreparePeersAndProve,
//    peer_proof.h, same tags), then one communicator among all the hosts of
//    the operation (BootstrapDeviceComm) on device 0.
//  - Cross-host steps: for each (sender, receiver) pair, both ends list the
//    pair's steps in plan-step order cut into StepChunks (chunk_bytes), and
//    group them into windows of at most peer_window_bytes (at least one
//    chunk). Round k issues, inside one GroupStart/GroupEnd, window k of
//    every pair this host is in, both ways; the stream is synchronized per
//    round. Both ends of a pair put the same chunks in the same round, so no
//    cycle of hosts can deadlock (every agent of an operation must use the
//    same chunk_bytes and peer_window_bytes). A chunk is gathered run by run
//    (ForEachRun) into device-0 staging in row-major order, and scattered
//    from it likewise; other devices' bytes come by peer copies.
//  - Integrity: with a transfer secret, both ends tag every chunk as the
//    host path does (step_seal.h: ChunkKey / StepSeals) over a pinned host
//    copy of the staged chunk (the sender's after packing, the receiver's
//    after receiving), the sender seals each step over UCX (SealTag) and the
//    receiver refuses with DATA_LOSS. Cost: one extra device-to-host copy of
//    the cross-host bytes on each side.
//  - Staging: device-0 staging per peer and direction, as large as its
//    largest window, charged to the device store's limit of device 0
//    (DeviceBufferStore::Reserve). On a failure after a round queued work
//    (GroupEnd, Send/Recv, a scatter copy), the communicator is aborted and
//    the stream drained before the staging is freed.
//  - Cancel: polled between rounds, and while a round issues its group or
//    waits for its stream (a watchdog: NCCL may block in GroupEnd, and a
//    transfer whose peer hung never completes); the communicator is
//    aborted, which fails what is in flight.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/executor/device_cross_host.h"
#include "agent/executor/device_route.h"
#include "agent/transfer/device_comm.h"
#include "agent/transfer/transport.h"

namespace reshard::agent {

/// What an agent with `factory` advertises in Host.transports: "nccl" for
/// NCCL, "fake-nccl" for the fake communicator.
std::string AdvertisedCommName(const DeviceCommFactory& factory);

/// Makes `route` (RouteTask's) kDeviceComm when the rule above holds; else,
/// for a task with other hosts that involves device memory here, leaves it
/// host-staged with `why` naming what is missing ("the job's state_memory is
/// not DEVICE", "host \"h2\" does not advertise fake-nccl", "no device
/// communicator: <comm_why_not>").
/// `comm` may be null.
/// Before that, with `device_ipc` (this agent advertises its IPC entry,
/// --device-ipc auto): when every other host of the operation advertises
/// this host's exact DeviceIpcEntry (backend.h), the route is kDeviceIpc
/// (device_ipc_steps.h) instead, every new rank with a device as here.
void RouteOverDeviceComm(const DeviceBufferStore& devices, const DeviceCommFactory* comm,
                         const std::string& comm_why_not, const std::string& host_id,
                         const v1::HostTask& task, DeviceRoute* route, bool device_ipc = false);

/// The mover of a kDeviceComm route (device_cross_host.h): its one transfer
/// moves every cross-host step of the run over one communicator among all
/// the hosts of the operation (bootstrapped on the transfer's first Poll,
/// after the proofs), in rounds as above, then finishes the step seals.
/// Capabilities: named AdvertisedCommName(comm), device memory, remote.
/// Errors: those of the bootstrap (device_comm_bootstrap.h), of the
/// communicator (a dead peer: Unavailable), of the seals (DATA_LOSS).
class DeviceCommMover final : public DeviceStepsMover {
 public:
  /// All outlive the mover.
  DeviceCommMover(DeviceBufferStore& devices, DeviceCommFactory& comm, Transport* transport,
                  const TaskExecutor::Options& options, const std::string& host_id,
                  const v1::HostTask& task, const std::function<bool()>& cancelled,
                  const std::function<void(const std::string& what)>& waiting);
  MoverCapabilities capabilities() const override;

 private:
  DeviceCommFactory& comm_;
};

/// `s`, a failure of a task's cross-host device steps, once the task's
/// pending transfers are cancelled (the host mover's Cancel of its tag key); CANCELLED
/// (saying `s`) when `cancelled()` says so, as a cancelled peer's end fails
/// too.
[[nodiscard]] absl::Status CrossHostDeviceStepsFailed(Transport* transport,
                                                      const v1::HostTask& task,
                                                      const std::function<bool()>& cancelled,
                                                      absl::Status s);

}  // namespace reshard::agent
