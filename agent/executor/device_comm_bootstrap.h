// One device communicator (agent/transfer/device_comm.h) per operation,
// among the task's hosts that hold device buffers, bootstrapped through the
// task exchange the way the UCX peer proofs are (peer_proof.h):
//  - the hosts sorted by id; a host's rank is its index;
//  - rank 0 makes the communicator id (DeviceCommFactory::NewId) and sends
//    it to every other host over the UCX transport, as message DeviceCommTag
//    of the operation, MACed with the operation's transfer secret:
//    HMAC-SHA256(secret, "reshard-device-comm" | operation | sender | id);
//  - the others check the MAC (PERMISSION_DENIED naming the host the
//    message claims to come from), then every host joins (Init).
// Thread-safe: no state.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/transfer/device_comm.h"
#include "agent/transfer/transport.h"

namespace reshard::agent {

/// The tag of an operation's communicator id message: step kProofStepIndex
/// (never a plan step's), chunk 1 (the proofs use chunk 0), under the
/// operation's tag key (transfer_tags.h).
uint64_t DeviceCommTag(uint32_t key);

/// The id message: fixed kDeviceCommIdMessageBytes: the sender host id and
/// the id (each length-prefixed), the MAC, zero padding. InvalidArgument
/// when the host id (at most kMaxProofHostBytes) or the id does not fit.
inline constexpr size_t kDeviceCommIdMessageBytes = 512;
[[nodiscard]] absl::StatusOr<std::string> MakeDeviceCommIdMessage(const std::string& secret,
                                                                  const std::string& operation_id,
                                                                  const std::string& sender,
                                                                  const std::string& id);

struct DeviceCommIdMessage {
  std::string sender;
  std::string id;
};
/// UNAUTHENTICATED for a malformed message; PERMISSION_DENIED naming the
/// claimed sender when the MAC does not check (another secret or operation).
[[nodiscard]] absl::StatusOr<DeviceCommIdMessage> CheckDeviceCommIdMessage(
    const std::string& secret, const std::string& operation_id, const std::string& message);

/// The communicator of operation `operation_id` on `host_id`, one of
/// `hosts` (the task's hosts with device buffers, any order, each once), on
/// `device`. Every other host must be reachable as a transport peer by its
/// id (Transport::Connect). Rank 0 returns once its sends completed and
/// every rank joined; the others once the id checked and they joined.
/// Failures: InvalidArgument when `host_id` is not in `hosts`;
/// PERMISSION_DENIED as CheckDeviceCommIdMessage, or for a message from a
/// host that is not rank 0; UNAVAILABLE naming rank 0's host when its id
/// did not arrive within `timeout`, or a transport's failure; CANCELLED when
/// `cancelled()` (polled while waiting for the id, and while Init waits for
/// the other ranks) says so; Init's errors (UNAVAILABLE when not every rank
/// joined within `timeout`, counted from the id). On failure
/// the message's pending transfers are cancelled (CancelTags(tag, all bits)).
[[nodiscard]] absl::StatusOr<std::unique_ptr<DeviceComm>> BootstrapDeviceComm(
    Transport* transport, DeviceCommFactory* factory, const std::string& secret,
    const std::string& operation_id, const std::string& host_id, std::vector<std::string> hosts,
    int device, uint64_t tag, const std::function<bool()>& cancelled,
    std::chrono::milliseconds timeout);

}  // namespace reshard::agent
