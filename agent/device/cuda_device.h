// The device API (device_api.h) over the CUDA runtime that CudaLibraries
// loaded (dlopen; cuda_api.h declares the entry points). Built only with
// RESHARD_HAVE_CUDA (library reshard_device). Everything here runs only on a
// machine with a GPU: CI covers the same contract with FakeDeviceApi, and
// cuda_device_test.cc skips without a device. Every call sets the device it
// acts on first (cudaSetDevice is per thread). Thread-safe.
#pragma once

#include <memory>
#include <string>

#include "agent/device/device_api.h"

namespace reshard::agent {

class CudaDeviceApi : public DeviceApi {
 public:
  /// FailedPrecondition, with CudaLibraries' reason, when the runtime is not
  /// loaded or sees no device.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DeviceApi>> Create();

  DeviceApiCapabilities capabilities() const override;
  absl::StatusOr<void*> Malloc(int device, size_t bytes) override;
  absl::Status Free(int device, void* ptr) override;
  absl::StatusOr<DeviceMemoryInfo> MemoryInfo(int device) override;
  absl::StatusOr<DeviceStream> CreateStream(int device) override;
  absl::Status DestroyStream(DeviceStream stream) override;
  absl::Status MemcpyAsync(void* dst, const void* src, size_t bytes, CopyKind kind,
                           DeviceStream stream) override;
  absl::Status MemcpyPeerAsync(void* dst, int dst_device, const void* src, int src_device,
                               size_t bytes, DeviceStream stream) override;
  absl::Status MemsetAsync(void* dst, int value, size_t bytes, DeviceStream stream) override;
  absl::Status StreamSynchronize(DeviceStream stream) override;
  absl::StatusOr<void*> MallocHost(size_t bytes) override;
  absl::Status FreeHost(void* ptr) override;
  absl::StatusOr<std::string> IpcExport(int device, void* ptr) override;
  absl::StatusOr<void*> IpcOpen(int device, const std::string& handle) override;
  absl::Status IpcClose(int device, void* ptr) override;
  absl::StatusOr<size_t> AllocationSize(int device, const void* ptr) override;

 private:
  explicit CudaDeviceApi(int devices) : devices_(devices) {}
  // OK, or the error of `call` on `device` moving `bytes`.
  absl::Status Check(int rc, const char* call, int device, size_t bytes) const;
  absl::Status Use(const char* call, int device) const;

  const int devices_;
};

}  // namespace reshard::agent
