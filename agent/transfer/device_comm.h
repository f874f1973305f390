// Device communicators: point-to-point sends and receives of device memory
// between the agents of one operation (issue 23), in NCCL's shape. Two
// implementations behind one seam: NCCL over the dlopen'ed library
// (nccl_comm.h, real GPUs) and the fake (fake_comm.h: host sockets over the
// fake device, for tests and CI). One communicator per operation, among the
// hosts that hold device buffers, bootstrapped through the task exchange
// (agent/executor/device_comm_bootstrap.h). No NCCL header appears here.
//
// Contract of every implementation (NCCL's):
// - Send/Recv queue work on a DeviceStream and return before bytes moved;
//   only StreamSynchronize of that stream guarantees them, and an error of
//   the transfer (a peer that died: Unavailable naming the peer rank)
//   surfaces there (or from the call itself when it is refused at once).
// - A Send to peer p and the Recv that p posts for this rank match in the
//   order they were issued, with the same byte count. 0-byte calls are
//   no-ops on both sides.
// - Between GroupStart and GroupEnd, sends and receives are issued together
//   at GroupEnd: none blocks another (a ring's send and receive cannot
//   deadlock). Outside a group, each call is a group of its own.
// - Abort fails every transfer in flight and makes later calls fail
//   (Aborted); destroying a communicator waits for nothing it queued.
// - Errors are absl::Status naming the call, the peer rank and the bytes.
// Thread contract: one thread uses a communicator at a time; Abort may come
// from any thread (to end transfers another thread waits on).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/device/device_api.h"

namespace reshard::agent {

/// What a communicator backend offers. Memory kind: CUDA device memory of
/// the DeviceApi it was made for.
struct DeviceCommCapabilities {
  std::string name;     // "nccl", "fake"
  bool remote = true;   // between hosts (agents)
  bool local = false;   // between devices of one process
};

class DeviceComm {
 public:
  virtual ~DeviceComm() = default;
  virtual int rank() const = 0;
  virtual int nranks() const = 0;
  virtual int device() const = 0;
  /// Queues sending `bytes` at device memory `data` to rank `peer`.
  [[nodiscard]] virtual absl::Status Send(const void* data, size_t bytes, int peer,
                                          DeviceStream stream) = 0;
  /// Queues receiving `bytes` from rank `peer` into device memory `data`.
  [[nodiscard]] virtual absl::Status Recv(void* data, size_t bytes, int peer,
                                          DeviceStream stream) = 0;
  [[nodiscard]] virtual absl::Status GroupStart() = 0;
  [[nodiscard]] virtual absl::Status GroupEnd() = 0;
  /// Fails what is in flight; idempotent.
  virtual void Abort() = 0;
};

class DeviceCommFactory {
 public:
  virtual ~DeviceCommFactory() = default;
  virtual DeviceCommCapabilities capabilities() const = 0;
  /// A new communicator's id (opaque bytes: an ncclUniqueId, or the fake's
  /// rendezvous address), made by the process that will be rank 0 and sent
  /// to the others.
  [[nodiscard]] virtual absl::StatusOr<std::string> NewId() = 0;
  /// Joins communicator `id` as `rank` of `nranks` on `device`; returns when
  /// every rank joined (collective, like ncclCommInitRank). A host that never
  /// joins must not hold the others forever: while waiting, Init polls
  /// `cancelled()` (may be empty), CANCELLED when it says so, and gives up
  /// at `deadline`, UNAVAILABLE (naming the ranks that did not join when the
  /// backend knows them); either way what was joined is aborted.
  /// deadline == kNoDeadline: the backend's own (the fake's init_timeout;
  /// NCCL: none).
  static constexpr std::chrono::steady_clock::time_point kNoDeadline =
      std::chrono::steady_clock::time_point::max();
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<DeviceComm>> Init(
      const std::string& id, int nranks, int rank, int device,
      const std::function<bool()>& cancelled, std::chrono::steady_clock::time_point deadline) = 0;
  /// Init without cancel, with the backend's own deadline.
  [[nodiscard]] absl::StatusOr<std::unique_ptr<DeviceComm>> Init(const std::string& id, int nranks,
                                                                 int rank, int device) {
    return Init(id, nranks, rank, device, nullptr, kNoDeadline);
  }
};

/// The communicator backend for `device`: NCCL when its capabilities name
/// "cuda" and NCCL is loaded, the fake when they name "fake"; else nullptr,
/// and `*why_not` says why (for the fallback's report: "NCCL not loaded:
/// ..."). `device` must outlive the factory and its communicators.
std::unique_ptr<DeviceCommFactory> MakeDeviceCommFactory(DeviceApi* device, std::string* why_not);

}  // namespace reshard::agent
