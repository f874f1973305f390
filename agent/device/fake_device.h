// A device API (device_api.h) over host memory, for tests and CI without a
// GPU: $RESHARD_DEVICE=fake[:N[:BYTES]]. It keeps the semantics a caller can
// get wrong on a real GPU:
// - Each device has a capacity; Malloc beyond it is ResourceExhausted (as
//   cudaErrorMemoryAllocation).
// - Device memory is not host-accessible: each allocation is a memfd mapped
//   twice, once PROT_NONE (the address callers get, so that a host read or
//   write through a device pointer faults at once) and once read-write that
//   only the fake's own copies use.
// - Each stream is a FIFO run by a thread of its own: MemcpyAsync returns
//   before the bytes moved, and only StreamSynchronize guarantees them.
//   HoldStream lets a test keep a stream from running, to see that.
// - IPC across processes for real: a handle names the exporting process and
//   the allocation's memfd ("fake-ipc <pid> <fd> <device> <bytes>"), opened
//   as /proc/<pid>/fd/<fd> and mapped like an allocation. What is opened
//   must be a memfd (a file on disk or in /dev/shm is refused whoever holds
//   it open), and a handle a worker sends must name the worker's own
//   process (IpcOpenFrom: the connection's peer), so the agent never opens,
//   with its own rights, what another process holds.
// - Free and IpcClose wait for every stream first (cudaFree synchronizes).
// Thread-safe.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "agent/device/device_api.h"

namespace reshard::agent {

class FakeDeviceApi : public DeviceApi {
 public:
  struct Options {
    int devices = 1;
    int64_t capacity_bytes = int64_t{1} << 30;  // per device
  };
  explicit FakeDeviceApi(const Options& options);
  ~FakeDeviceApi() override;
  FakeDeviceApi(const FakeDeviceApi&) = delete;
  FakeDeviceApi& operator=(const FakeDeviceApi&) = delete;

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
  absl::StatusOr<void*> IpcOpenFrom(int device, const std::string& handle,
                                    int64_t peer_pid) override;
  absl::Status IpcClose(int device, void* ptr) override;
  absl::StatusOr<size_t> AllocationSize(int device, const void* ptr) override;

  /// Test hook: `stream` runs nothing queued after this call until the
  /// returned function is called (once; before the stream is destroyed).
  [[nodiscard]] std::function<void()> HoldStream(DeviceStream stream);

  /// Stream-ordered host work (like cudaLaunchHostFunc), for backends that
  /// move device bytes on the host (fake_comm.h): `work` runs on `stream`'s
  /// thread after everything queued before it, and nothing queued after it
  /// runs before it returns. A work's error is the stream's: the next
  /// StreamSynchronize returns the first one (and clears it), as an
  /// asynchronous CUDA error surfaces at synchronization.
  [[nodiscard]] absl::Status LaunchHostWork(DeviceStream stream,
                                            std::function<absl::Status()> work);
  /// The fake's read-write host view of device memory [ptr, ptr + bytes) on
  /// `device`, for LaunchHostWork (valid while the allocation lives);
  /// InvalidArgument naming `call` when the range is not device memory of
  /// that device.
  [[nodiscard]] absl::StatusOr<uint8_t*> HostView(const char* call, const void* ptr, size_t bytes,
                                                  int device) const;

  /// Bytes allocated on `device` (each allocation rounded up to
  /// kDeviceAlignment; IPC-opened memory not counted).
  int64_t used_bytes(int device) const;
  /// MallocHost calls that succeeded: each pins host memory on a real device
  /// (cudaMallocHost), which costs more than a copy, so a test counts them.
  int64_t host_registrations() const { return host_registrations_.load(); }

 private:
  struct Allocation {
    int device = -1;
    size_t bytes = 0;      // as asked (the range callers may address)
    size_t mapped = 0;     // page-rounded size of both mappings
    int64_t charged = 0;   // counted against the capacity (0 when IPC-opened)
    int fd = -1;           // the memfd (-1 when IPC-opened: closed after mapping)
    uint8_t* shadow = nullptr;  // the fake's own read-write mapping
    bool opened = false;        // by IpcOpen
  };
  class Stream;
  using Allocations = std::map<uintptr_t, Allocation>;  // by device address

  absl::Status CheckDevice(const char* call, int device) const;
  // The fake's read-write address of [ptr, ptr + bytes) when it lies within
  // an allocation on `device`; InvalidArgument naming `what` otherwise.
  absl::StatusOr<uint8_t*> Shadow(const char* call, const char* what, const void* ptr,
                                  size_t bytes, int device) const;
  // InvalidArgument when [ptr, ptr + bytes) touches device memory.
  absl::Status CheckHost(const char* call, const char* what, const void* ptr, size_t bytes,
                         int device) const;
  absl::StatusOr<Stream*> Find(const char* call, DeviceStream stream) const;
  // The allocation whose device address is `ptr`, on `device`, made by
  // IpcOpen (`opened`) or Malloc; InvalidArgument naming `call` otherwise.
  // Holds mu_.
  absl::StatusOr<Allocations::iterator> FindLocked(const char* call, int device, void* ptr,
                                                   bool opened);
  // Maps `fd` twice and records it; the device address.
  absl::StatusOr<void*> MapLocked(int device, int fd, size_t bytes, int64_t charged, bool opened);
  void Unmap(void* base, const Allocation& a);
  // The device number of memfds' file system (a probe memfd's st_dev).
  dev_t memfd_dev_ = 0;
  // Waits for every stream (before memory is unmapped).
  absl::Status SynchronizeAll();

  const Options options_;
  mutable std::mutex mu_;
  Allocations allocations_;
  std::vector<int64_t> used_;                    // per device
  std::set<Stream*> streams_;
  std::atomic<int64_t> host_registrations_{0};
};

}  // namespace reshard::agent
