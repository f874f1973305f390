// Moving bytes between hosts: one interface, implemented by UCX
// (ucx_transport.h) between host memories. What each backend supports, and
// which ones loaded: backend.h. Backend headers (ucp, nccl) never appear
// here. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace reshard::agent {

/// Called once when a transfer finished (its buffer may be reused) or failed.
using TransferDone = std::function<void(absl::Status)>;

/// A tag transports keep for their own messages; no transfer may use it.
inline constexpr uint64_t kReservedTag = ~uint64_t{0};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string name() const = 0;
  /// This endpoint's address, which peers pass to Connect (opaque bytes).
  virtual std::string LocalAddress() const = 0;
  /// Makes `peer_id` reachable; idempotent for the same address.
  [[nodiscard]] virtual absl::Status Connect(const std::string& peer_id,
                                             const std::string& address) = 0;
  /// Sends `bytes` at `data` to `peer_id` as message `tag`. `data` must stay
  /// valid until `done`.
  virtual void Send(const std::string& peer_id, uint64_t tag, const void* data, size_t bytes,
                    TransferDone done) = 0;
  /// Receives message `tag` (from any peer) of exactly `bytes` into `data`.
  virtual void Receive(uint64_t tag, void* data, size_t bytes, TransferDone done) = 0;
  /// Fails with Cancelled every pending transfer whose tag agrees with `tag`
  /// on the bits of `mask` (e.g. one operation's transfers). Messages under
  /// that tag and mask that peers send us later are dropped.
  virtual void CancelTags(uint64_t tag, uint64_t mask) = 0;
  /// Stops; pending transfers fail with Cancelled. Idempotent.
  virtual void Shutdown() = 0;
};

struct UcxOptions {
  /// UCX_NET_DEVICES-style device list ("lo" on one machine); empty: UCX default.
  std::string net_devices;
  /// UCX_TLS-style transport list; empty: UCX default.
  std::string transports;
  /// Listen on the network devices' IPv4 address, when they have one, and
  /// advertise that (ucx_address.h). false: peers connect by worker address,
  /// which UCX 1.13 makes abort this process when a connecting peer dies
  /// (docs/agent.md, "Known UCX defect"); for tests that show it.
  bool listen = true;
};

/// A UCX context + worker with its own progress thread; tag send/receive.
[[nodiscard]] absl::StatusOr<std::unique_ptr<Transport>> MakeUcxTransport(
    const UcxOptions& options);

}  // namespace reshard::agent
