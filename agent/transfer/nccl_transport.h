// The GPU path: NCCL send/receive between device buffers. Compiled only when
// configured with CUDA (RESHARD_CUDA; library reshard_transfer_nccl, linked
// only by what uses it). The CUDA runtime and NCCL are loaded at run time
// (cuda_libraries.h): without them, or without a CUDA device, every call
// reports Unavailable (naming what is not loaded) and NcclDeviceCount() is 0. No execution path uses it
// yet, so the agent neither links nor advertises it (backend.h). Backend headers (cuda,
// nccl) stay in the .cc. Thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace reshard::agent {

/// CUDA devices visible to this process (cudaGetDeviceCount of the linked
/// runtime); 0 without a GPU or driver.
int NcclDeviceCount();

/// A device buffer (cudaMalloc) on one GPU; freed on destruction.
class DeviceBuffer {
 public:
  [[nodiscard]] static absl::StatusOr<DeviceBuffer> Allocate(int device, size_t bytes);
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  ~DeviceBuffer();
  int device() const { return device_; }
  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  [[nodiscard]] absl::Status CopyFromHost(const void* src, size_t bytes);
  [[nodiscard]] absl::Status CopyToHost(void* dst, size_t bytes) const;

 private:
  int device_ = -1;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

/// Moves `bytes` from `src` (on one GPU) to `dst` (on another) with
/// ncclSend/ncclRecv over a 2-rank communicator (ncclCommInitAll), then
/// waits. Unavailable without two devices or when NCCL fails.
[[nodiscard]] absl::Status NcclPeerCopy(const DeviceBuffer& src, DeviceBuffer* dst, size_t bytes);

}  // namespace reshard::agent
