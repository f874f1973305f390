// Cross-host steps between agents of one machine through device IPC handles
// (issue 23 item 5): the kDeviceIpc route of device_route.h. Two agents on one
// GPU cannot join one NCCL communicator (NCCL refuses two ranks on a
// device), and agents that share a machine need no network library: one
// opens the other's device buffer and copies device to device.
//  - Route (RouteOverDeviceComm, device_comm_steps.h, checks it first): a
//    plain task (the communicator route's exclusions), other hosts, this
//    agent advertises its IPC entry (--device-ipc auto), and every other
//    host of the operation advertises this host's exact DeviceIpcEntry
//    (backend.h: "<api>-ipc:<boot id>:<pid ns>:<ipc ns>"). Everyone decides alike.
//  - Run: TaskRun on the devices with DeviceIpcMover (below) as the mover of its
//    cross-host steps, which move as follows once the peers are reached
//    and proven (PreparePeersAndProve, mover.h).
//    Senders: every old rank of this host that a receiver reads is a device
//    buffer (a host-resident one is staged to device 0 with StageToDevice
//    for the run and dropped after); each receiver gets ONE message: a
//    random nonce, then (old rank, device, IPC handle, size, item offsets)
//    of the ranks it reads; then the sender waits for every receiver's
//    "done" echoing that nonce (one of an earlier attempt is skipped) before
//    it drops the staged copies and returns; when the run fails after
//    handles went out, it still waits for those "done"s (proof timeout,
//    cancel-aware) first. Receivers: check each sender's
//    message (its size and item offsets must be the source layout's, the
//    IPC allocation at least that size, each step's source region inside
//    its item), IpcOpen every handle (on device 0), copy each cross-host step
//    run by run (ForEachRun) into the new buffers (device to device, peer
//    copies across devices), synchronize, IpcClose, send "done"; the new
//    buffers are then sealed as TaskRun seals a device route's.
//  - Messages: UCX tag messages under the operation's tag key, step
//    kProofStepIndex, chunk DeviceIpcChunk (transfer_tags.h), of a size both
//    ends derive from the task; MACed with the transfer secret:
//    HMAC-SHA256(secret, "reshard-device-ipc" | operation | sender | receiver
//    | payload), the "done" payload being "done <hex nonce>". A message
//    that does not check is PERMISSION_DENIED naming the host it claims to
//    come from.
//  - Failures: a sender whose message (or a receiver whose "done") does not
//    come within the proof timeout (seal timeout for "done") is UNAVAILABLE
//    naming it; cancelled() is polled while waiting (CANCELLED). The
//    operation's pending messages are cancelled on any failure.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/executor/device_cross_host.h"
#include "agent/executor/device_route.h"
#include "agent/transfer/transport.h"

namespace reshard::agent {

/// The chunk (under step kProofStepIndex; the proofs use 0, the device
/// communicator id 1) of the IPC handles message that the host of index
/// `host_index` (among the operation's hosts sorted by id) sends, or of
/// the "done" message it sends as a receiver. InvalidArgument past the
/// chunks a tag names.
[[nodiscard]] absl::StatusOr<int64_t> DeviceIpcChunk(int host_index, bool done);

/// A device IPC message of exactly `bytes` (DeviceIpcMessageBytes):
/// sender, receiver and payload (each length-prefixed), the MAC, zero
/// padding. InvalidArgument when it does not fit.
[[nodiscard]] absl::StatusOr<std::string> MakeDeviceIpcMessage(
    const std::string& secret, const std::string& operation_id, const std::string& sender,
    const std::string& receiver, const std::string& payload, size_t bytes);

/// The size of a message listing `ranks` old ranks of `items` items each
/// (0 ranks: a "done" message).
size_t DeviceIpcMessageBytes(size_t ranks, size_t items);

struct DeviceIpcMessage {
  std::string sender;
  std::string receiver;
  std::string payload;
};
/// UNAUTHENTICATED for a malformed message; PERMISSION_DENIED naming the
/// claimed sender when the MAC does not check (another secret or operation).
[[nodiscard]] absl::StatusOr<DeviceIpcMessage> CheckDeviceIpcMessage(
    const std::string& secret, const std::string& operation_id, const std::string& message);

/// The payload of a receiver's "done" for the handles message that carried
/// `nonce` (each handles message carries a random one).
std::string DeviceIpcDonePayload(const std::string& nonce);
/// OK when `done` (checked) is the "done" for the handles message of
/// `nonce`; FAILED_PRECONDITION, naming the sender, when it is a "done" of
/// another nonce (an earlier attempt's: the sender waits on); InvalidArgument
/// when it is no "done".
[[nodiscard]] absl::Status CheckDeviceIpcDone(const std::string& operation_id,
                                              const DeviceIpcMessage& done,
                                              const std::string& nonce);

/// The mover of a kDeviceIpc route (device_cross_host.h): its one transfer
/// moves every cross-host step of the run through device IPC handles as
/// above. Capabilities: "device-ipc", device memory, remote (between the
/// agents of one machine). Errors: those of the messages (above) and of the
/// device API's IPC calls.
class DeviceIpcMover final : public DeviceStepsMover {
 public:
  /// All outlive the mover.
  DeviceIpcMover(ShardStore& store, DeviceBufferStore& devices, Transport* transport,
                 const TaskExecutor::Options& options, const std::string& host_id,
                 const v1::HostTask& task, const std::function<bool()>& cancelled,
                 const std::function<void(const std::string& what)>& waiting);
  MoverCapabilities capabilities() const override;
};

}  // namespace reshard::agent
