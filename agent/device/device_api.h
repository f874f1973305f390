// The few calls the agent needs from a GPU runtime, as one interface with
// stated capabilities (NIXL's shape): devices, allocations, streams with
// asynchronous copies, and IPC handles that another process opens. Two
// implementations: FakeDeviceApi (fake_device.h: host memory behind the same
// semantics, for tests and CI) and CudaDeviceApi (cuda_device.h: the
// dlopen'ed CUDA runtime, built only with RESHARD_HAVE_CUDA). MakeDeviceApi
// picks one from $RESHARD_DEVICE. No CUDA header appears here.
//
// Contract of every implementation:
// - A device pointer (Malloc, IpcOpen) is never dereferenced by the caller;
//   bytes reach it only through MemcpyAsync / MemsetAsync.
// - Allocations are aligned to kDeviceAlignment bytes.
// - A stream runs its operations in the order they were queued; an
//   asynchronous call may return before its bytes moved, and only
//   StreamSynchronize guarantees them (then the host may read a destination
//   or reuse a source).
// - Errors are absl::Status naming the call, the device and the bytes:
//   ResourceExhausted when an allocation does not fit, InvalidArgument for
//   pointers that are not what the call needs, Unavailable when the runtime
//   fails.
// Thread-safe: calls may come from any thread; one stream is used by one
// thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace reshard::agent {

/// Byte alignment of every device allocation (cudaMalloc guarantees 256).
inline constexpr int64_t kDeviceAlignment = 256;

/// An ordered queue of device work on one device. A value handle: `impl` is
/// the implementation's (a cudaStream_t, or the fake's queue).
struct DeviceStream {
  void* impl = nullptr;
  int device = -1;
};

/// What a device API offers (NIXL: getSupportedMems and friends).
struct DeviceApiCapabilities {
  std::string name;          // "fake", "cuda"
  int device_count = 0;
  bool ipc = false;          // IpcExport / IpcOpen between processes
  bool peer_copy = false;    // MemcpyPeerAsync between two devices
  int64_t alignment = kDeviceAlignment;
};

struct DeviceMemoryInfo {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };

class DeviceApi {
 public:
  virtual ~DeviceApi() = default;
  virtual DeviceApiCapabilities capabilities() const = 0;

  /// `bytes` of device memory on `device` (nullptr for 0 bytes).
  /// ResourceExhausted naming the device, the bytes and what is free.
  [[nodiscard]] virtual absl::StatusOr<void*> Malloc(int device, size_t bytes) = 0;
  /// Frees what Malloc returned (not what IpcOpen returned: IpcClose).
  [[nodiscard]] virtual absl::Status Free(int device, void* ptr) = 0;
  [[nodiscard]] virtual absl::StatusOr<DeviceMemoryInfo> MemoryInfo(int device) = 0;

  [[nodiscard]] virtual absl::StatusOr<DeviceStream> CreateStream(int device) = 0;
  /// Waits for the stream's work, then destroys it.
  [[nodiscard]] virtual absl::Status DestroyStream(DeviceStream stream) = 0;
  /// Queues a copy of `bytes` on `stream` (host pointers: any host memory;
  /// device pointers: on the stream's device).
  [[nodiscard]] virtual absl::Status MemcpyAsync(void* dst, const void* src, size_t bytes,
                                                 CopyKind kind, DeviceStream stream) = 0;
  /// Queues a copy between two devices' memory (peer copy).
  [[nodiscard]] virtual absl::Status MemcpyPeerAsync(void* dst, int dst_device, const void* src,
                                                     int src_device, size_t bytes,
                                                     DeviceStream stream) = 0;
  [[nodiscard]] virtual absl::Status MemsetAsync(void* dst, int value, size_t bytes,
                                                 DeviceStream stream) = 0;
  /// Returns when every operation queued on `stream` has completed.
  [[nodiscard]] virtual absl::Status StreamSynchronize(DeviceStream stream) = 0;

  /// Host memory that copies reach at full speed (cudaMallocHost); plain
  /// host memory may be used too, slower.
  [[nodiscard]] virtual absl::StatusOr<void*> MallocHost(size_t bytes) = 0;
  [[nodiscard]] virtual absl::Status FreeHost(void* ptr) = 0;

  /// An opaque handle (bytes) of the allocation that Malloc returned as
  /// `ptr`, which another process (or this one) opens with IpcOpen while the
  /// allocation lives.
  [[nodiscard]] virtual absl::StatusOr<std::string> IpcExport(int device, void* ptr) = 0;
  /// A device pointer to the exported allocation, valid until IpcClose.
  [[nodiscard]] virtual absl::StatusOr<void*> IpcOpen(int device, const std::string& handle) = 0;
  /// IpcOpen of a handle that a local process sent over a connection whose
  /// peer the kernel names (`peer_pid`; 0: unknown). A handle that names
  /// some process's memory (the fake device's) must name that peer, or the
  /// agent would open, with its own rights, what another process holds
  /// (PermissionDenied). CUDA's driver checks its own handles: the default
  /// is IpcOpen.
  [[nodiscard]] virtual absl::StatusOr<void*> IpcOpenFrom(int device, const std::string& handle,
                                                          int64_t peer_pid) {
    (void)peer_pid;
    return IpcOpen(device, handle);
  }
  [[nodiscard]] virtual absl::Status IpcClose(int device, void* ptr) = 0;

  /// Bytes from `ptr` to the end of the allocation on `device` that holds it
  /// (made by Malloc or IpcOpen; cuMemGetAddressRange), so that a caller
  /// bounds offsets it was given into memory it opened. InvalidArgument when
  /// `ptr` lies in no allocation of that device.
  [[nodiscard]] virtual absl::StatusOr<size_t> AllocationSize(int device, const void* ptr) = 0;
};

/// The device API `spec` names: "fake" or "fake:N" (N fake devices, default
/// 1, each with 1 GiB; "fake:N:BYTES" sets the capacity), "cuda" (the CUDA
/// runtime must be loaded with a device: else FailedPrecondition saying
/// why), "none" (nullptr); "" picks CUDA when it is loaded and sees a device,
/// else nullptr. InvalidArgument for anything else, naming it.
[[nodiscard]] absl::StatusOr<std::unique_ptr<DeviceApi>> MakeDeviceApi(const std::string& spec);
/// MakeDeviceApi($RESHARD_DEVICE, "" when unset).
[[nodiscard]] absl::StatusOr<std::unique_ptr<DeviceApi>> MakeDeviceApiFromEnvironment();

}  // namespace reshard::agent
