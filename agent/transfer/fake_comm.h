// The fake device communicator (device_comm.h) for tests and CI: NCCL's
// semantics over host TCP sockets between processes, moving the bytes of
// fake device memory (fake_device.h) in stream order.
// - An id is "fake-comm <ipv4> <port> <token>": the rendezvous listener that
//   NewId opened in rank 0's process, and a random token every rank shows.
//   Rank 0 must Init on the factory that made the id.
// - Init: every rank connects to rank 0 and learns the others' listeners,
//   then each pair of ranks opens one connection; until the deadline (the
//   factory's init_timeout without one), else Unavailable naming the ranks
//   that never came; Cancelled (polled every few ms) when cancelled().
// - Send/Recv (and groups) run as host work on the stream (LaunchHostWork):
//   they complete only by StreamSynchronize, where a peer that died (its
//   connection closed) fails them with Unavailable naming the peer rank.
//   After one failure the communicator is broken: every later transfer
//   fails, as an NCCL communicator with an asynchronous error.
// - Sends to and receives from this rank itself are refused
//   (InvalidArgument): local copies use the device API.
// Thread contract as device_comm.h; the factory is thread-safe.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "agent/device/fake_device.h"
#include "agent/transfer/device_comm.h"

namespace reshard::agent {

class FakeCommFactory : public DeviceCommFactory {
 public:
  struct Options {
    std::chrono::milliseconds init_timeout{30000};
    std::string address = "127.0.0.1";  // where every rank listens
  };
  /// `device` must outlive the factory and its communicators.
  FakeCommFactory(FakeDeviceApi* device, Options options);
  explicit FakeCommFactory(FakeDeviceApi* device) : FakeCommFactory(device, Options()) {}
  ~FakeCommFactory() override;

  DeviceCommCapabilities capabilities() const override;
  absl::StatusOr<std::string> NewId() override;
  using DeviceCommFactory::Init;
  absl::StatusOr<std::unique_ptr<DeviceComm>> Init(
      const std::string& id, int nranks, int rank, int device,
      const std::function<bool()>& cancelled,
      std::chrono::steady_clock::time_point deadline) override;

 private:
  FakeDeviceApi* const device_;
  const Options options_;
  std::mutex mu_;
  std::map<std::string, int> listeners_;  // by id: rendezvous sockets not yet taken by rank 0
};

}  // namespace reshard::agent
